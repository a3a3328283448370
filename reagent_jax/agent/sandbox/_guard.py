"""Audit-hook guard: the fallback layer when kernel isolation (namespaces, a separate uid) is missing.

An audit hook cannot be a real security boundary (native code can bypass it), so the guard also
forbids ctypes, the usual way around it. It blocks, inside the sandbox child:
sockets, subprocesses and exec, signals to other processes, and any filesystem change outside the
work directory. Installed only in the sandbox child, after its own setup is done.
"""

from __future__ import annotations

import mmap
import os
import struct
import sys

_BLOCKED_EVENTS = {
    "socket.__new__": "network access", "socket.connect": "network access",
    "socket.bind": "network access", "socket.sendto": "network access",
    "socket.getaddrinfo": "network access", "socket.gethostbyname": "network access",
    "subprocess.Popen": "starting processes", "os.system": "starting processes",
    "os.exec": "starting processes", "os.posix_spawn": "starting processes",
    "os.spawn": "starting processes", "os.startfile": "starting processes",
    "ctypes.dlopen": "ctypes", "ctypes.dlsym": "ctypes", "ctypes.cdata": "ctypes",
    "ctypes.call_function": "ctypes", "os.setuid": "changing identity",
}
# Events whose first argument is a path that must stay inside the work directory.
_PATH_EVENTS = {
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
    "os.symlink", "os.link", "os.utime", "shutil.rmtree", "shutil.move", "shutil.copyfile",
}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def install(workdir: str, max_forks: int) -> None:
    """Install the guard; `max_forks` bounds os.fork calls (RLIMIT_NPROC does not bind root)."""
    root = os.path.realpath(workdir)
    forks = mmap.mmap(-1, 8)  # shared with every forked descendant, so the bound is for the whole tree
    allowed_devices = {"/dev/null", "/dev/stdout", "/dev/stderr"}

    def inside(path) -> bool:
        if isinstance(path, int):
            return True  # operations on already-open descriptors
        try:
            real = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return False
        return real == root or real.startswith(root + os.sep) or real in allowed_devices

    def hook(event: str, args: tuple) -> None:
        reason = _BLOCKED_EVENTS.get(event)
        if reason is not None:
            raise PermissionError(f"sandbox: {reason} is not allowed ({event})")
        if event == "open":
            path, mode, flags = args
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
                isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and path is not None and not inside(path):
                raise PermissionError(f"sandbox: writing outside the work directory is not allowed: {path}")
        elif event in _PATH_EVENTS:
            paths = [a for a in args[:2] if isinstance(a, (str, bytes, os.PathLike))]
            for path in paths[: 2 if event in ("os.rename", "shutil.move", "os.symlink", "os.link") else 1]:
                if not inside(path):
                    raise PermissionError(f"sandbox: changing files outside the work directory is not allowed: {path}")
        elif event in ("os.kill", "os.killpg"):
            pid = args[0]
            if event == "os.killpg" or pid != os.getpid():
                raise PermissionError("sandbox: signalling other processes is not allowed")
        elif event in ("os.fork", "os.forkpty"):
            count = struct.unpack_from("q", forks)[0] + 1
            struct.pack_into("q", forks, 0, count)
            if count > max_forks:
                raise PermissionError(f"sandbox: more than {max_forks} processes is not allowed")

    sys.addaudithook(hook)
    _forbid_new_sessions()


def _forbid_new_sessions() -> None:
    """Keep every descendant in the host's kill group: setsid/setpgid have no audit events."""
    import posix

    def refuse(*_args, **_kwargs):
        raise PermissionError("sandbox: leaving the process group is not allowed")

    for module in (os, posix):
        for name in ("setsid", "setpgid", "setpgrp"):
            if hasattr(module, name):
                setattr(module, name, refuse)
