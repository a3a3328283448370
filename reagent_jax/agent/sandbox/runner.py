"""Host side of the Python sandbox: one isolated child process per call (see `child.py`).

The host never trusts the child: a wall-clock deadline, output caps enforced while reading (at most
`max_output_bytes` kept, the child killed past `kill_output_bytes`), and on any exit the child's
whole process group and PID namespace are killed and its private work directory deleted. Work dirs
are named after the host's pid, so those of a host that died mid-call are swept by the next host.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import logging
import os
import re
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from typing import Literal

_CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "child.py")
_UID_BASE, _UID_SPAN = 200_000, 800_000  # a fresh uid per call: no sharing of RLIMIT_NPROC or signals
_uid_counter = itertools.count(os.getpid() * 7919)
_uid_lock = threading.Lock()
_SETUP_FAILED = 70  # child.SETUP_FAILED (child.py is a script, never imported by the host)
_log = logging.getLogger(__name__)
_WORKDIR_PREFIX = "reagent-sandbox-"
_STALE_WORKDIR = re.compile(rf"^{_WORKDIR_PREFIX}(\d+)-")

Isolation = Literal["auto", "namespaces", "process"]


@dataclasses.dataclass(frozen=True)
class SandboxConfig:
    """Limits of one sandboxed call. Environment-free on purpose: tools build it from their config."""

    wall_time_s: float = 10.0
    cpu_time_s: int = 10
    memory_mb: int = 2048            # RLIMIT_AS of each cell process: a cell that forks may use up to
    #                                  max_processes * memory_mb (+ tmpfs); no cgroup bounds the sum
    max_processes: int = 32          # RLIMIT_NPROC (per fresh uid); also the guard's fork budget
    max_file_mb: int = 64            # RLIMIT_FSIZE
    max_open_files: int = 256
    tmpfs_mb: int = 128              # size of the private work dir and /tmp (namespaces mode; RAM-backed)
    max_output_bytes: int = 64_000   # per stream kept (head + tail); the rest is counted, not stored
    kill_output_bytes: int = 16_000_000  # a child writing more than this is killed
    isolation: Isolation = "auto"    # auto: namespaces when available (root + unshare), else process
    audit_hook: bool | None = None   # None: only in process mode, where the kernel layers are missing
    sandbox_uid: int | None = None   # None: a fresh unprivileged uid per call when running as root
    python: str = sys.executable
    extra_env: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None
    elapsed_s: float
    isolation: str
    timed_out: bool = False
    output_limited: bool = False
    stdout_bytes: int = 0            # bytes the cell wrote, including those not kept
    stderr_bytes: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_limited

    @property
    def error_kind(self) -> str | None:
        """None, "timeout", "output_limit", "resource_limit" (killed by a signal), "sandbox_error"
        (isolation could not be set up) or "runtime_error" (the cell raised)."""
        if self.timed_out:
            return "timeout"
        if self.output_limited:
            return "output_limit"
        if self.exit_code == 0:
            return None
        if self.exit_code is None:
            return "sandbox_error"
        if self.exit_code is not None and (self.exit_code < 0 or self.exit_code > 128):
            return "resource_limit"
        return "runtime_error"


class _CappedStream:
    """Keeps the first and last `limit // 2` bytes of a stream and counts the rest."""

    def __init__(self, limit: int):
        self.half = max(1, limit // 2)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def feed(self, data: bytes) -> None:
        self.total += len(data)
        room = self.half - len(self.head)
        if room > 0:
            self.head += data[:room]
            data = data[room:]
        if data:
            self.tail += data
            if len(self.tail) > 2 * self.half:
                del self.tail[: len(self.tail) - self.half]

    def text(self) -> str:
        tail = self.tail[-self.half:]
        dropped = self.total - len(self.head) - len(tail)
        middle = f"\n... [{dropped} bytes of output omitted; {self.total} in total] ...\n" if dropped > 0 else ""
        return (self.head.decode("utf-8", "replace") + middle + bytes(tail).decode("utf-8", "replace"))


def _scrubbed_env(workdir: str, extra: tuple[tuple[str, str], ...]) -> dict[str, str]:
    """A fresh environment: nothing of the host's (API keys, tokens) reaches the cell."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "TMPDIR": workdir, "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "MPLBACKEND": "Agg",
    }
    env.update(dict(extra))
    return env


@functools.lru_cache(maxsize=None)
def _python_paths(python: str = sys.executable) -> tuple[str, ...]:
    """Directories of the interpreter `python` (prefixes, site-packages) that the cell's uid must read."""
    probe = "import json, site, sys; print(json.dumps([sys.prefix, sys.base_prefix, sys.exec_prefix, " \
            "sys.base_exec_prefix, *site.getsitepackages()]))"
    if os.path.realpath(python) == os.path.realpath(sys.executable):
        import site

        candidates = [sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, *site.getsitepackages()]
    else:
        out = subprocess.run([python, "-I", "-c", probe], capture_output=True, text=True, timeout=30)
        candidates = json.loads(out.stdout) if out.returncode == 0 else []
    paths = sorted({os.path.realpath(p) for p in candidates if p and os.path.isdir(p)})
    return tuple(p for p in paths if not any(p != q and p.startswith(q + os.sep) for q in paths))


def _reachable_by_others(path: str) -> bool:
    """Whether an unrelated uid can traverse every directory down to `path` (root always can)."""
    current = "/"
    for part in [p for p in path.split("/") if p]:
        current = os.path.join(current, part)
        try:
            if not os.stat(current).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of the per-call uid (catches setsid escapees in process mode)."""
    for _ in range(5):  # a process may fork while we scan: repeat until none is found
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    found = True
                    os.kill(int(entry), signal.SIGKILL)
            except (FileNotFoundError, ProcessLookupError, PermissionError):
                continue
        if not found:
            return
        time.sleep(0.01)


def sweep_stale_workdirs(min_age_s: float = 3600.0) -> int:
    """Delete work dirs left by hosts that died mid-call (the host's pid is in the name); returns how many.

    Only dirs untouched for `min_age_s`: a host in another PID namespace sharing /tmp may look dead."""
    removed = 0
    tmp = tempfile.gettempdir()
    for name in os.listdir(tmp):
        match = _STALE_WORKDIR.match(name)
        if not match:
            continue
        try:
            if time.time() - os.stat(os.path.join(tmp, name)).st_mtime < min_age_s:
                continue
        except OSError:
            continue
        try:
            os.kill(int(match.group(1)), 0)
            continue  # that host (or a process reusing its pid) is alive: leave it
        except ProcessLookupError:
            pass
        except (PermissionError, OverflowError):
            continue
        shutil.rmtree(os.path.join(tmp, name), ignore_errors=True)
        removed += 1
    return removed


@functools.lru_cache(maxsize=None)
def _sweep_stale_workdirs_once() -> None:
    try:
        sweep_stale_workdirs()
    except OSError:
        pass


def _next_uid() -> int:
    with _uid_lock:
        return _UID_BASE + next(_uid_counter) % _UID_SPAN


@functools.lru_cache(maxsize=None)
def namespaces_available(python: str = sys.executable) -> bool:
    """Whether this host can run the namespaces mode (root, unshare and mounts permitted): probed once."""
    if sys.platform != "linux" or os.geteuid() != 0:
        _log.warning("sandbox: not root on Linux, so isolation='auto' uses the weaker process mode "
                     "(rlimits + audit-hook guard; see reagent_jax.agent.sandbox)")
        return False
    probe = _run(SandboxConfig(isolation="namespaces", python=python, wall_time_s=20.0), "print(6 * 7)",
                 "namespaces")
    ok = probe.exit_code == 0 and probe.stdout.strip() == "42"
    if not ok:
        _log.warning("sandbox: namespaces unavailable (%s), so isolation='auto' uses the weaker process mode",
                     probe.stderr.strip()[-300:] or f"exit code {probe.exit_code}")
    return ok


def resolve_isolation(config: SandboxConfig) -> str:
    if config.isolation != "auto":
        return config.isolation
    return "namespaces" if namespaces_available(config.python) else "process"


def run_python(code: str, config: SandboxConfig | None = None) -> SandboxResult:
    """Run `code` in a fresh sandboxed Python process and return its captured outputs."""
    config = config or SandboxConfig()
    return _run(config, code, resolve_isolation(config))


def _kill(proc: subprocess.Popen, inner_pid: int | None) -> None:
    if inner_pid is not None and proc.poll() is None:
        try:  # the PID-namespace init: the kernel then kills every process in the namespace
            os.kill(inner_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _run(config: SandboxConfig, code: str, isolation: str) -> SandboxResult:
    start = time.monotonic()
    as_root = os.geteuid() == 0
    uid = config.sandbox_uid if config.sandbox_uid is not None else (_next_uid() if as_root else None)
    if not as_root:
        uid = None  # cannot change identity; the kernel already enforces RLIMIT_NPROC for this user
    elif isolation == "process" and not all(_reachable_by_others(p) for p in _python_paths(config.python)):
        uid = None  # without a mount namespace the interpreter may be unreachable for another uid
    _sweep_stale_workdirs_once()
    workdir = tempfile.mkdtemp(prefix=f"{_WORKDIR_PREFIX}{os.getpid()}-")
    report_r, report_w = os.pipe()
    try:
        code_path = os.path.join(workdir, ".cell.py")
        with open(code_path, "w", encoding="utf-8") as f:
            f.write(code)
        if uid is not None:
            os.chown(workdir, uid, uid)
        child_cfg = {
            "workdir": workdir, "code_path": code_path, "report_fd": report_w, "isolation": isolation,
            "host_pid": os.getpid(),
            "uid": uid, "tmpfs_mb": config.tmpfs_mb, "expose": list(_python_paths(config.python)),
            "audit_hook": config.audit_hook if config.audit_hook is not None else isolation == "process",
            "limits": {"cpu_s": config.cpu_time_s, "memory_bytes": config.memory_mb << 20,
                       "fsize_bytes": config.max_file_mb << 20, "nproc": config.max_processes,
                       "nofile": config.max_open_files},
        }
        proc = subprocess.Popen(
            [config.python, "-I", "-B", _CHILD, json.dumps(child_cfg)], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_scrubbed_env(workdir, config.extra_env),
            cwd=workdir, start_new_session=True, pass_fds=(report_w,), close_fds=True)
        os.close(report_w)
        report_w = -1
        result = _collect(proc, report_r, config, start, isolation)
        result.isolation = isolation
        if uid is not None and isolation == "process" and os.path.isdir("/proc"):
            _kill_uid(uid)
        return result
    finally:
        for fd in (report_r, report_w):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        shutil.rmtree(workdir, ignore_errors=True)


def _collect(proc: subprocess.Popen, report_r: int, config: SandboxConfig, start: float,
             isolation: str) -> SandboxResult:
    """Read both pipes under the deadline and output caps; kill everything the child left behind."""
    streams = {proc.stdout.fileno(): _CappedStream(config.max_output_bytes),
               proc.stderr.fileno(): _CappedStream(config.max_output_bytes)}
    deadline = start + config.wall_time_s
    inner_pid, report = None, b""
    timed_out = output_limited = False
    sel = selectors.DefaultSelector()
    for fd in list(streams) + [report_r]:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    open_fds = set(streams) | {report_r}
    grace_until = None
    try:
        while open_fds & set(streams):
            now = time.monotonic()
            if grace_until is None and now >= deadline:
                timed_out = True
            if grace_until is None and (timed_out or output_limited):
                _kill(proc, inner_pid)
                grace_until = now + 1.0  # drain what is left; escaped holders of the pipes are abandoned
            if grace_until is None and proc.poll() is not None:
                grace_until = now + 0.5  # the child is gone: whatever still holds the pipes is abandoned
            if grace_until is not None and now >= grace_until:
                break
            limit = (grace_until if grace_until is not None else deadline) - now
            for key, _ in sel.select(timeout=max(0.0, min(limit, 0.5))):
                fd = key.fd
                try:
                    data = os.read(fd, 65536)
                except BlockingIOError:
                    continue
                if not data:
                    sel.unregister(fd)
                    open_fds.discard(fd)
                    continue
                if fd == report_r:
                    report += data
                    if report.endswith(b"\n"):
                        inner_pid = int(report)
                    continue
                streams[fd].feed(data)
                if sum(s.total for s in streams.values()) > config.kill_output_bytes:
                    output_limited = True
    finally:
        sel.close()
        if proc.poll() is None and not (timed_out or output_limited):
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
        if isolation == "process" or proc.poll() is None or timed_out or output_limited:
            _kill(proc, inner_pid)  # in process mode this also kills children the cell left running
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    out_stream, err_stream = list(streams.values())
    stderr = err_stream.text()
    exit_code = proc.returncode
    if exit_code == _SETUP_FAILED and "sandbox setup failed" in stderr:
        exit_code = None
    return SandboxResult(stdout=out_stream.text(), stderr=stderr, exit_code=exit_code,
                         elapsed_s=time.monotonic() - start, isolation="", timed_out=timed_out,
                         output_limited=output_limited, stdout_bytes=out_stream.total,
                         stderr_bytes=err_stream.total)
