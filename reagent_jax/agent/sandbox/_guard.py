"""Audit-hook guard: the fallback layer when kernel isolation (namespaces, a separate uid) is missing.

An audit hook cannot be a real security boundary (native code can bypass it), so the guard also
forbids ctypes, the usual way around it. It blocks, inside the sandbox child:
sockets, subprocesses and exec, signals to other processes, any filesystem change outside the
work directory, and reading what an unrelated unprivileged user could not read (the cell often runs
with the host's identity here, so /proc/<host pid>/environ or ~/.ssh would otherwise be open to it);
the work dir and the interpreter's own directories stay readable. Native paths around the hooks are
closed where cheap (``_posixsubprocess.fork_exec``, sub-interpreters, which have no hooks,
re-importing ``posix`` to get ``setsid`` back); others (importlib loading an extension file
directly, raw memory writes) remain. Installed only in the sandbox child, after its own setup.
"""

from __future__ import annotations

import mmap
import os
import re
import stat
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
# Native modules that run code without the hooks: never loaded (again) once the guard is on.
_BLOCKED_IMPORTS = frozenset({"_xxsubinterpreters", "_xxinterpchannels", "_testcapi", "_testinternalcapi",
                              "_posixsubprocess", "posix"})
_PROC_PID = re.compile(r"^/proc/(\d+)(/|$)")


def install(workdir: str, max_forks: int, readable: tuple[str, ...] = ()) -> None:
    """Install the guard; `max_forks` bounds os.fork calls (RLIMIT_NPROC does not bind root);
    `readable` lists directories (the interpreter's) readable even under a private ancestor."""
    root = os.path.realpath(workdir)
    forks = mmap.mmap(-1, 8)  # shared with every forked descendant, so the bound is for the whole tree
    allowed_devices = {"/dev/null", "/dev/stdout", "/dev/stderr"}
    open_roots = tuple(os.path.realpath(p) for p in (root, *readable))
    public: dict[str, bool] = {}

    def real_path(path) -> str | None:
        try:
            return os.path.realpath(os.fsdecode("." if path is None else path))
        except (TypeError, ValueError):
            return None

    def inside(path) -> bool:
        if isinstance(path, int):
            return True  # operations on already-open descriptors
        real = real_path(path)
        return real is not None and (real == root or real.startswith(root + os.sep) or real in allowed_devices)

    def readable_by_others(path) -> bool:
        """Whether an unrelated unprivileged uid could read `path` (what the namespaces mode allows)."""
        if isinstance(path, int):
            return True
        real = real_path(path)
        if real is None:
            return False
        if any(real == r or real.startswith(r + os.sep) for r in open_roots):
            return True
        pid = _PROC_PID.match(real)
        if pid:
            return int(pid.group(1)) == os.getpid()  # only the cell's own /proc entry
        parts = [p for p in real.split("/") if p]
        for depth in range(len(parts)):
            current = "/" + "/".join(parts[: depth + 1])
            if current not in public:
                try:
                    mode = os.stat(current).st_mode
                except OSError:
                    return True  # does not exist: let the call fail on its own
                last = depth == len(parts) - 1
                public[current] = bool(mode & stat.S_IROTH) if last else bool(mode & stat.S_IXOTH)
            if not public[current]:
                return False
        return True

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
            if not writing and path is not None and not readable_by_others(path):
                raise PermissionError(f"sandbox: reading private host files is not allowed: {path}")
        elif event in ("os.listdir", "os.scandir"):
            if not readable_by_others(args[0]):
                raise PermissionError(f"sandbox: listing private host directories is not allowed: {args[0]}")
        elif event == "import":
            if args[0] in _BLOCKED_IMPORTS:
                raise ImportError(f"sandbox: importing {args[0]} is not allowed")
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

    _forbid_native_spawn()
    sys.addaudithook(hook)
    _forbid_new_sessions()


def _forbid_native_spawn() -> None:
    """subprocess audits Popen, but its C helper does not: refuse direct calls to it."""
    import _posixsubprocess

    def refuse(*_args, **_kwargs):
        raise PermissionError("sandbox: starting processes is not allowed (_posixsubprocess)")

    _posixsubprocess.fork_exec = refuse


def _forbid_new_sessions() -> None:
    """Keep every descendant in the host's kill group: setsid/setpgid have no audit events."""
    import posix

    def refuse(*_args, **_kwargs):
        raise PermissionError("sandbox: leaving the process group is not allowed")

    for module in (os, posix):
        for name in ("setsid", "setpgid", "setpgrp"):
            if hasattr(module, name):
                setattr(module, name, refuse)
