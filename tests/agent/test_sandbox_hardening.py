"""Regressions for sandbox holes found in an audit: process-mode reads and native escapes, orphans,
work dirs leaked by a killed host."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid

import pytest

from reagent_jax.agent.sandbox import SandboxConfig, namespaces_available, run_python
from reagent_jax.agent.sandbox.runner import sweep_stale_workdirs

PROCESS = SandboxConfig(isolation="process", wall_time_s=5, cpu_time_s=4, memory_mb=1024)


def _refused(res) -> bool:
    return not res.ok and "sandbox:" in res.stderr


def test_process_mode_cannot_read_the_host_environment_or_private_files(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    secret = private / "token"
    secret.write_text("hunter2-do-not-leak")
    secret.chmod(0o600)
    for code in (f"print(open('/proc/{os.getpid()}/environ', 'rb').read())",
                 "import os\nprint(open(f'/proc/{os.getppid()}/environ', 'rb').read())",
                 f"print(open({str(secret)!r}).read())",
                 f"import os\nprint(os.listdir({str(private)!r}))"):
        res = run_python(code, PROCESS)
        assert not res.ok and "hunter2" not in res.stdout and "token" not in res.stdout, code
    res = run_python(f"print(open('/proc/{os.getpid()}/environ', 'rb').read())", PROCESS)
    assert _refused(res) and "reading private host files" in res.stderr
    # world-readable files, the cell's own /proc entry and the stdlib stay readable
    ok = run_python("import os, json\nprint(len(open(os.__file__).read()) > 0, "
                    "'Name' in open('/proc/self/status').read())", PROCESS)
    assert ok.ok and ok.stdout == "True True\n"


def test_process_mode_closes_native_paths_around_the_guard():
    attacks = {
        "fork_exec": "import _posixsubprocess\n_posixsubprocess.fork_exec()",
        "subinterpreter": "import _xxsubinterpreters",  # sub-interpreters run without the audit hooks
        "posix_reimport": "import sys\ndel sys.modules['posix']\nimport posix\nprint(posix.setsid)",
    }
    for name, code in attacks.items():
        res = run_python(code, PROCESS)
        assert _refused(res), (name, res.stdout, res.stderr)
    assert run_python("import subprocess, multiprocessing\nprint('imports fine')", PROCESS).stdout == "imports fine\n"


def _pids_with_marker(marker: bytes) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if marker in f.read():
                        pids.append(int(entry))
            except OSError:
                continue
    return pids


@pytest.mark.parametrize("isolation", ["namespaces", "process"])
def test_cells_die_with_a_killed_host(isolation):
    if isolation == "namespaces" and not namespaces_available():
        pytest.skip("namespaces mode needs root")
    marker = f"REAGENT_TEST_MARK={uuid.uuid4().hex}"
    key, value = marker.split("=")
    host_code = textwrap.dedent(f"""
        from reagent_jax.agent.sandbox import SandboxConfig, run_python
        run_python("import time\\ntime.sleep(600)",
                   SandboxConfig(isolation={isolation!r}, wall_time_s=600, extra_env=(({key!r}, {value!r}),)))
    """)
    host = subprocess.Popen([sys.executable, "-c", host_code])
    try:
        for _ in range(300):  # wait until the cell runs (interpreter start-up can be slow on a busy box)
            if _pids_with_marker(marker.encode()):
                break
            time.sleep(0.05)
        assert _pids_with_marker(marker.encode()), "the sandboxed cell never started"
        host.kill()
        host.wait()
        for _ in range(100):
            if not _pids_with_marker(marker.encode()):
                break
            time.sleep(0.05)
        left = _pids_with_marker(marker.encode())
        assert left == [], f"sandbox processes outlived the host: {left}"
        stale = glob.glob(os.path.join(tempfile.gettempdir(), f"reagent-sandbox-{host.pid}-*"))
        assert stale  # the killed host could not delete its work dir ...
        assert sweep_stale_workdirs(min_age_s=0) >= 1  # ... so a later host sweeps it
        assert not any(os.path.exists(d) for d in stale)
    finally:
        host.kill()
        for pid in _pids_with_marker(marker.encode()):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
