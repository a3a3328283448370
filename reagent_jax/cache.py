"""Where reagent_jax keeps what it builds once per machine (tokenizers, converted checkpoints)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def cache_root() -> Path:
    """$REAGENT_JAX_CACHE, else $XDG_CACHE_HOME/reagent_jax, else ~/.cache/reagent_jax."""
    if os.environ.get("REAGENT_JAX_CACHE"):
        return Path(os.environ["REAGENT_JAX_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "reagent_jax"


def build_once(target: Path, build: Callable[[Path], None]) -> Path:
    """`build(tmp_dir)` then an atomic rename to `target`, unless `target` exists: concurrent
    builders (test workers, hosts sharing a disk) never see a half-written directory."""
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not target.is_dir():  # else another process won the race: use its copy
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
