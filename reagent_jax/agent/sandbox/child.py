"""The sandbox child: isolates itself, then runs one code cell like a notebook.

Started by `runner.py` as `python -I -B child.py CONFIG_JSON`, never imported by the host.
Layers, outermost first:
  namespaces mode (root): new mount/net/pid/ipc/uts namespaces; every mount read-only and nosuid;
    private size-capped tmpfs on /tmp, /var/tmp, /dev/shm, /run/lock and the work dir (the only
    writable places, all in memory, all gone when the namespace dies);
    the cell runs under a fresh unprivileged uid (no capabilities, no_new_privs) as the only child of
    the new PID namespace's init, whose exit kills every process the cell started; the network
    namespace has no interface up, so nothing (loopback included) is reachable.
  process mode (fallback): the same rlimits, a scrubbed environment and a private cwd, plus the
    audit-hook guard (`_guard.py`) against sockets, subprocesses, signals and writes outside the cwd.
Both: RLIMIT_AS/CPU/FSIZE/NPROC/NOFILE/CORE. Exit status: 0 ok, 1 the cell raised, 70 setup failed.
"""

from __future__ import annotations

import ast
import builtins
import json
import linecache
import os
import resource
import signal
import stat
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _guard  # noqa: E402
import _linux  # noqa: E402

SETUP_FAILED = 70
_SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock")
_CELL = "<cell>"


def _blocked_ancestor(path: str) -> str | None:
    """The highest directory on the way to `path` that others cannot traverse (e.g. /root, 0700)."""
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = os.path.join(current, part)
        try:
            mode = os.stat(current).st_mode
        except OSError:
            return None
        if not mode & stat.S_IXOTH and current != path:
            return current
    return None


def _expose(paths: list[str]) -> None:
    """Make `paths` (the Python installation) reachable for the unprivileged uid.

    An inaccessible ancestor such as /root is covered by an empty read-only tmpfs (hiding the rest
    of it) into which only the needed directories are bound back, read-only.
    """
    groups: dict[str, list[tuple[str, int]]] = {}
    for path in paths:
        ancestor = _blocked_ancestor(path)
        if ancestor is not None:
            groups.setdefault(ancestor, []).append((path, os.open(path, os.O_PATH | os.O_DIRECTORY)))
    for ancestor, entries in groups.items():
        _linux.mount("tmpfs", ancestor, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, "size=1m,mode=0755")
        for path, fd in entries:
            os.makedirs(path, mode=0o755, exist_ok=True)
            _linux.mount(f"/proc/self/fd/{fd}", path, None, _linux.MS_BIND | _linux.MS_REC)
            _linux.mount(None, path, None,
                         _linux.MS_REMOUNT | _linux.MS_BIND | _linux.MS_RDONLY | _linux.MS_NOSUID)
            os.close(fd)
        _linux.mount(None, ancestor, None,
                     _linux.MS_REMOUNT | _linux.MS_RDONLY | _linux.MS_NOSUID | _linux.MS_NODEV, "size=1m,mode=0755")


def _isolate_filesystem(cfg: dict) -> None:
    """Read-only view of the host, private scratch space, and the work dir as the only host dir writable."""
    _linux.mount(None, "/", None, _linux.MS_REC | _linux.MS_PRIVATE)  # nothing propagates to the host
    workdir = cfg["workdir"]
    expose = [p for p in cfg["expose"] if os.path.isdir(p)]
    try:
        _linux.make_tree_readonly("/")
    except OSError:
        pass  # kernels < 5.12: the unprivileged uid and the private scratch dirs still apply
    _expose(expose)
    for scratch in _SCRATCH_DIRS:
        if os.path.isdir(scratch) and not os.path.islink(scratch):
            size = cfg["tmpfs_mb"] if scratch == "/tmp" else min(16, cfg["tmpfs_mb"])
            _linux.mount("tmpfs", scratch, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV, f"size={size}m,mode=1777")
    # The work dir is a size-capped tmpfs too, so the cell cannot fill the host's disk; it vanishes with
    # the namespace. (Under /tmp, the directory is created inside the fresh /tmp tmpfs.)
    os.makedirs(workdir, mode=0o755, exist_ok=True)
    owner = f",uid={cfg['uid']},gid={cfg['uid']}" if cfg["uid"] is not None else ""
    _linux.mount("tmpfs", workdir, "tmpfs", _linux.MS_NOSUID | _linux.MS_NODEV,
                 f"size={cfg['tmpfs_mb']}m,mode=0700{owner}")


def _set_limits(cfg: dict) -> None:
    limits = cfg["limits"]
    pairs = [
        (resource.RLIMIT_CPU, (limits["cpu_s"], limits["cpu_s"] + 1)),
        (resource.RLIMIT_AS, (limits["memory_bytes"],) * 2),
        (resource.RLIMIT_FSIZE, (limits["fsize_bytes"],) * 2),
        (resource.RLIMIT_NPROC, (limits["nproc"],) * 2),
        (resource.RLIMIT_NOFILE, (limits["nofile"],) * 2),
        (resource.RLIMIT_CORE, (0, 0)),
    ]
    for which, value in pairs:
        resource.setrlimit(which, value)


def _drop_privileges(uid: int) -> None:
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)  # a non-zero uid loses every capability
    _linux.prctl(_linux.PR_SET_NO_NEW_PRIVS, 1)


def _run_cell(code: str) -> int:
    """Execute `code` like a notebook cell; print the final expression's value; traceback on error."""
    linecache.cache[_CELL] = (len(code), None, code.splitlines(True), _CELL)
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    try:
        tree = ast.parse(code, _CELL, "exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, _CELL, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, _CELL, "eval"), namespace)
            if value is not None:
                print(repr(value))
        return 0
    except SystemExit as exc:
        if exc.code in (None, 0):
            return 0
        print(f"SystemExit: {exc.code}", file=sys.stderr)
        return 1
    except BaseException as exc:  # noqa: BLE001 - report every failure of the cell, like a notebook
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != _CELL:
            tb = tb.tb_next  # hide the sandbox's own frames
        sys.stderr.write("".join(traceback.format_exception(type(exc), exc, tb)))
        return 1


def _finish(status: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed or full pipe must not change the status
            pass
    os._exit(status)


def _cell_process(cfg: dict, code: str) -> None:
    """Become the cell: final isolation steps in this process, then run the code; never returns."""
    try:
        os.chdir(cfg["workdir"])
        _set_limits(cfg)
        if cfg["uid"] is not None:
            _drop_privileges(cfg["uid"])
            _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
        if cfg["audit_hook"]:
            _guard.install(cfg["workdir"], cfg["limits"]["nproc"], tuple(cfg["expose"]))
    except Exception as exc:  # noqa: BLE001
        print(f"sandbox setup failed: {exc!r}", file=sys.stderr)
        _finish(SETUP_FAILED)
    _finish(_run_cell(code))


def _wait_for(pid: int) -> int:
    """Reap children until `pid` exits; its status as an exit code (128 + signal when killed)."""
    while True:
        done, status = os.wait()
        if done == pid:
            return os.WEXITSTATUS(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _namespace_init(cfg: dict, code: str) -> None:
    """PID 1 of the new namespace: mounts /proc, runs the cell in a child, exits with its status.

    The cell is not PID 1 itself because the kernel shields a namespace init from signals it has no
    handler for (SIGXCPU of the CPU limit included). When this init exits, the kernel kills every
    process left in the namespace (daemons, fork bombs), so nothing outlives the call.
    """
    try:
        _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)  # the outer child died: the namespace goes
    except OSError:
        pass
    try:
        _linux.mount("proc", "/proc", "proc", _linux.MS_NOSUID | _linux.MS_NODEV | _linux.MS_NOEXEC)
    except OSError:
        pass  # the host /proc stays visible; other uids' secrets there are unreadable anyway
    cell = os.fork()
    if cell == 0:
        _cell_process(cfg, code)
    _finish(_wait_for(cell))


def _die_with_host(host_pid: int) -> None:
    """SIGKILL this process when the host dies (a killed trainer must not leave cells running)."""
    try:
        _linux.prctl(_linux.PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        return
    if os.getppid() != host_pid:  # the host died before the prctl took effect
        os._exit(SETUP_FAILED)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    _die_with_host(cfg["host_pid"])
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(encoding="utf-8", errors="backslashreplace")
    with open(cfg["code_path"], encoding="utf-8") as f:
        code = f.read()
    os.unlink(cfg["code_path"])
    report_fd = cfg["report_fd"]
    namespaces = cfg["isolation"] == "namespaces"
    if not namespaces:
        os.close(report_fd)
        _cell_process(cfg, code)
    try:
        _linux.unshare(_linux.CLONE_NEWNS | _linux.CLONE_NEWNET | _linux.CLONE_NEWPID
                       | _linux.CLONE_NEWIPC | _linux.CLONE_NEWUTS)
        _isolate_filesystem(cfg)
    except Exception as exc:  # noqa: BLE001
        print(f"sandbox setup failed: {exc!r}", file=sys.stderr)
        _finish(SETUP_FAILED)
    pid = os.fork()
    if pid == 0:
        os.close(report_fd)
        _namespace_init(cfg, code)
    os.write(report_fd, f"{pid}\n".encode())  # the host kills this PID-namespace init on timeout
    os.close(report_fd)
    _finish(_wait_for(pid))


if __name__ == "__main__":
    main()
