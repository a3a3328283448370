"""The `python` tool: runs a code cell in the hardened sandbox and reports it like a notebook."""

from __future__ import annotations

import dataclasses
import os
import signal

from reagent_jax.agent.sandbox import SandboxConfig, SandboxResult, run_python
from reagent_jax.agent.tools.base import Tool, ToolOutput

MAX_CODE_CHARS = 100_000


def sandbox_config_from_env(**overrides) -> SandboxConfig:
    """SandboxConfig with REAGENT_PYTHON_{TIMEOUT_S,CPU_S,MEMORY_MB,MAX_PROCESSES,ISOLATION} applied."""
    env = {"wall_time_s": ("REAGENT_PYTHON_TIMEOUT_S", float), "cpu_time_s": ("REAGENT_PYTHON_CPU_S", int),
           "memory_mb": ("REAGENT_PYTHON_MEMORY_MB", int), "max_processes": ("REAGENT_PYTHON_MAX_PROCESSES", int),
           "isolation": ("REAGENT_PYTHON_ISOLATION", str)}
    values = {field: cast(os.environ[var]) for field, (var, cast) in env.items() if os.environ.get(var)}
    values.update(overrides)
    return SandboxConfig(**values)


def describe_failure(result: SandboxResult, config: SandboxConfig) -> str | None:
    """A one-line reason for a failed run that the agent can act on (None when the cell just raised)."""
    if result.timed_out:
        return (f"Error: execution timed out after {config.wall_time_s:g} s of wall time; the process and "
                f"all its children were killed.")
    if result.output_limited:
        return (f"Error: the cell wrote more than {config.kill_output_bytes} bytes of output and was killed.")
    if result.error_kind == "sandbox_error":
        return "Error: the sandbox could not be set up (see stderr)."
    code = result.exit_code
    if result.error_kind == "resource_limit" and code is not None:
        sig = -code if code < 0 else code - 128
        if sig == signal.SIGXCPU:
            return f"Error: CPU time limit of {config.cpu_time_s} s exceeded; the process was killed."
        if sig == signal.SIGKILL:
            return (f"Error: the process was killed (SIGKILL): memory limit of {config.memory_mb} MB or the "
                    f"CPU hard limit reached.")
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = str(sig)
        return f"Error: the process was killed by signal {name}."
    if not result.ok and not result.stderr and code:  # os._exit(n), or a crash that printed nothing
        return (f"Error: the process exited with code {code} without an error message (e.g. os._exit); "
                "output still in its buffers was lost, so print and let the cell end normally.")
    return None


class PythonTool(Tool):
    name = "python"
    description = ("Run Python 3 code in a fresh, isolated sandbox (no network, no files kept between calls) and "
                   "return its stdout, stderr and any traceback. The value of a final expression is printed, "
                   "as in a notebook. Print what you need to see.")
    parameters = {
        "type": "object",
        "properties": {"code": {"type": "string", "description": "Python source code to execute.",
                                "maxLength": MAX_CODE_CHARS, "minLength": 1}},
        "required": ["code"],
        "additionalProperties": False,
    }

    def __init__(self, sandbox: SandboxConfig | None = None, timeout_s: float | None = None,
                 max_output_chars: int = 8000, **sandbox_overrides):
        self.sandbox = sandbox_config_from_env(**sandbox_overrides) if sandbox is None else (
            dataclasses.replace(sandbox, **sandbox_overrides))
        # The sandbox enforces its own deadline; the outer one is only a backstop.
        super().__init__(timeout_s=timeout_s or self.sandbox.wall_time_s + 15.0, max_output_chars=max_output_chars)

    def run(self, code: str) -> ToolOutput:
        result = run_python(code, self.sandbox)
        parts = []
        if result.stdout:
            parts.append(result.stdout.rstrip("\n"))
        if result.stderr:
            parts.append("[stderr]\n" + result.stderr.rstrip("\n"))
        reason = describe_failure(result, self.sandbox)
        if reason:
            parts.append(reason)
        if not parts:
            parts.append("(no output)")
        return ToolOutput(text="\n".join(parts), ok=result.ok, error_kind=result.error_kind)
