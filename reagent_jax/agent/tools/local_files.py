"""Which local files the file tools (file_reader, image2text, audio2text, browse) may open.

The model chooses these paths, so they are untrusted input and the tools run in the trainer's own
process, outside the sandbox. With roots configured (a tool's `root=`, or REAGENT_FILES_ROOT; several
joined by os.pathsep) a path must resolve inside one of them after following `..` and symlinks;
relative paths are taken from the first root. Without roots any file the process can read is
allowed except the kernel's pseudo-filesystems (/proc, /sys, /dev): `/proc/self/environ` alone
would hand the model every API key of the run. Set a root for anything but trusted local use.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence, Union

from reagent_jax.agent.tools.base import BAD_ARGUMENTS, PERMISSION_DENIED, ToolError

ENV_VAR = "REAGENT_FILES_ROOT"
PSEUDO_FILESYSTEMS = ("/proc", "/sys", "/dev")

Roots = Union[None, str, Sequence[str]]


def roots_from_env() -> Optional[str]:
    """REAGENT_FILES_ROOT as set (None when unset or empty), for the tool configs' `root` field."""
    return os.environ.get(ENV_VAR) or None


def _split_roots(roots: Roots) -> list[str]:
    if roots is None:
        return []
    items = roots.split(os.pathsep) if isinstance(roots, str) else list(roots)
    return [os.path.realpath(os.path.expanduser(r)) for r in items if r]


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def resolve_local_path(path: str, roots: Roots = None) -> str:
    """The real path a tool may open for the model's `path` (a `file://` URL or a path), or a
    ToolError saying why not. Existence is left to the caller (its not_found message)."""
    raw = path
    path = path.strip()
    if path.startswith("file://"):
        path = path[len("file://"):]
    if "\x00" in path:
        raise ToolError(BAD_ARGUMENTS, "argument 'path' contains a NUL byte")
    folders = _split_roots(roots)
    path = os.path.expanduser(path)
    if not os.path.isabs(path):
        path = os.path.join(folders[0], path) if folders else os.path.abspath(path)
    real = os.path.realpath(path)
    if folders:
        if not any(_inside(real, f) for f in folders):
            raise ToolError(PERMISSION_DENIED, f"{raw!r} is outside the folders the file tools may read "
                                               f"({os.pathsep.join(folders)}); use a path inside them")
    elif any(_inside(real, f) for f in PSEUDO_FILESYSTEMS):
        raise ToolError(PERMISSION_DENIED, f"{raw!r} is on a system pseudo-filesystem "
                                           f"({', '.join(PSEUDO_FILESYSTEMS)}), which the file tools do not read")
    return real
