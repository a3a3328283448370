"""Hardened Python sandbox: one fresh, isolated process per call.

    from reagent_jax.agent.sandbox import run_python, SandboxConfig
    res = run_python("print(1 + 1)", SandboxConfig(wall_time_s=5))
    res.stdout, res.stderr, res.ok, res.error_kind   # "timeout", "resource_limit", "output_limit", ...

Two isolation modes (`SandboxConfig.isolation`, "auto" picks the strongest available, probed once):

- namespaces (the host runs as root and may unshare, e.g. this project's machines and containers
  with CAP_SYS_ADMIN): new mount, network, PID, IPC and UTS namespaces; the whole filesystem
  read-only and nosuid; RAM-backed, size-capped tmpfs for the work dir, /tmp, /var/tmp, /dev/shm;
  inaccessible homes such as /root hidden (only the interpreter is bound back, read-only); the cell
  runs as a fresh unprivileged uid per call (so RLIMIT_NPROC binds and it can signal nothing of the
  host) with no capabilities and no_new_privs, under a PID-namespace init whose exit kills all it
  started; no network interface is up.
- process (fallback, e.g. non-root hosts; "auto" logs a warning when it falls back): a new session,
  the same rlimits, a scrubbed environment and a private cwd, plus an audit-hook guard that refuses
  sockets, subprocesses, ctypes, signals to other processes, leaving the process group, writes
  outside the work dir, and reads of what an unrelated user could not read (other processes'
  /proc entries such as the host's environ, 0600 keys, 0700 homes).
  The guard is best effort (native extensions can bypass it), RLIMIT_FSIZE bounds each file but not
  their number, and when the host is root without namespace rights RLIMIT_NPROC does not bind (the
  guard's fork budget does). Prefer running as root in a container, or extend with user namespaces.

Both modes: RLIMIT_AS (per process, see SandboxConfig.memory_mb) / CPU / FSIZE / NPROC / NOFILE /
CORE, a wall-clock deadline with the process group (and namespace) killed, output capped while it is
read, the work dir deleted after, and the sandbox killed with the host (PR_SET_PDEATHSIG) if the host
dies mid-call (in process mode, processes the cell forked itself may outlive it).
"""

from reagent_jax.agent.sandbox.runner import (
                                              SandboxConfig,
                                              SandboxResult,
                                              namespaces_available,
                                              resolve_isolation,
                                              run_python,
)

__all__ = ["SandboxConfig", "SandboxResult", "namespaces_available", "resolve_isolation", "run_python"]
