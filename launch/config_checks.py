"""Command-line side of the config checks (the checks themselves: reagent_jax/pipelines/config_checks.py):
absl flag parsing that names a misspelt `--config.<key>`, and a check that ends the program with
its message instead of a traceback."""
from __future__ import annotations

import re
import sys
from typing import Any, Callable, Optional, Sequence

from absl import app

from reagent_jax.pipelines.config_checks import (  # noqa: F401  (re-exported for the launch scripts)
    ConfigError, check_eval_config, check_train_config)


def _exit_unknown_field(error: Exception, argv: Sequence[str]) -> None:
    inner: Any = error
    while isinstance(inner, BaseException) and inner.args:  # AttributeError(KeyError("'key'\nDid you..."))
        inner = inner.args[0]
    text = " ".join(str(inner).split())
    bad = re.match(r"'([^']+)'", text)
    names = [a.split("=", 1)[0] for a in argv[1:] if re.match(r"--?(no)?config\.", a)]
    names = [n for n in names if bad and bad.group(1) in n.split(".")] or names
    sys.stderr.write(f"FATAL Flags parsing error: {', '.join(names) or '--config'}: no such config field ({text}); "
                     "docs/configs.md lists every field\n")
    sys.exit(1)


def parse_flags(argv: Sequence[str]) -> list[str]:
    """`app.run(..., flags_parser=parse_flags)`: absl's parser, but a misspelt `--config.<key>` ends
    the program with a flags error naming the whole key (ml_collections raises a bare
    AttributeError / KeyError, which absl shows as a traceback)."""
    try:
        return app.parse_flags_with_usage(list(argv))
    except (AttributeError, KeyError) as e:
        _exit_unknown_field(e, argv)
        raise


def define_config_file(name: str, default: Optional[str], help_string: str) -> None:
    """`config_flags.DEFINE_config_file(..., lock_config=True)`; with a default file the overrides
    are applied right here, at import, so a misspelt key is reported here too."""
    from ml_collections import config_flags
    try:
        config_flags.DEFINE_config_file(name, default, help_string, lock_config=True)
    except (AttributeError, KeyError) as e:
        _exit_unknown_field(e, sys.argv)
        raise


def run_checked(check: Callable[[], None]) -> None:
    """Runs a config check; a ConfigError, or a config file that did not load (ml_collections
    reports that on first use), ends the program with one message (no traceback)."""
    try:
        check()
    except ConfigError as e:
        print(f"FATAL invalid config: {e}", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        if "config" not in str(e).lower():
            raise
        reason = [line.strip() for line in str(e).splitlines() if line.strip()]
        attempted = [line for line in reason if line.endswith(".py") or line.startswith("[Errno")]
        print(f"FATAL cannot load the config file: {' '.join(attempted) or reason[-1]}", file=sys.stderr)
        sys.exit(1)


def writable_dir_or_exit(flag: str, path: str) -> None:
    """Creates `path` (and parents) and checks a file can be written there, else one FATAL line."""
    import os
    import tempfile
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        print(f"FATAL --{flag}={path}: not a writable directory ({e.strerror or e})", file=sys.stderr)
        sys.exit(1)
