"""The tool protocol: a name, an OpenAI-style JSON schema, and `call(arguments) -> ToolOutput`.

`Tool.call` never raises: bad arguments, timeouts, missing backends and crashes of the tool all come
back as `ToolOutput(ok=False, error_kind=..., text=<a message the agent can read and act on>)`.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

# error_kind values shared by every tool
BAD_ARGUMENTS = "bad_arguments"
TIMEOUT = "timeout"
NOT_CONFIGURED = "not_configured"
NOT_FOUND = "not_found"
UNSUPPORTED = "unsupported"
RUNTIME_ERROR = "runtime_error"
UNKNOWN_TOOL = "unknown_tool"
PERMISSION_DENIED = "permission_denied"  # a path outside the folders the file tools may read


@dataclasses.dataclass
class ToolOutput:
    text: str
    ok: bool = True
    error_kind: str | None = None
    elapsed_s: float = 0.0

    @classmethod
    def error(cls, kind: str, message: str) -> "ToolOutput":
        return cls(text=message, ok=False, error_kind=kind)


class ToolError(Exception):
    """Raised inside a tool's `run` to return a clean error output of the given kind."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def truncate_middle(text: str, limit: int) -> str:
    """Keep the head and tail of `text` within `limit` characters, noting the original length."""
    if limit <= 0 or len(text) <= limit:
        return text
    note = f"\n\n[... truncated: the output had {len(text)} characters; the middle is omitted ...]\n\n"
    if limit <= len(note):  # no room for the note: a plain cut keeps the limit
        return text[:limit]
    keep = limit - len(note)
    head = keep // 2
    return text[:head] + note + text[len(text) - (keep - head):]


_JSON_TYPES = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "array": (list, tuple), "object": (dict,),
}


def _is_type(value: Any, json_type: str) -> bool:
    """Whether `value` is of a JSON-schema type (booleans are not numbers; unknown types match all)."""
    if json_type == "null":
        return value is None
    if json_type not in _JSON_TYPES:
        return True
    return isinstance(value, _JSON_TYPES[json_type]) and not (json_type in ("integer", "number")
                                                               and isinstance(value, bool))


def _type_name(value: Any) -> str:
    return {str: "string", bool: "boolean", int: "integer", float: "number", list: "array",
            tuple: "array", dict: "object", type(None): "null"}.get(type(value), type(value).__name__)


def validate_arguments(parameters: dict, arguments: Any) -> dict:
    """Check `arguments` against a JSON-schema subset (types, required, enum, bounds, maxLength,
    additionalProperties). Returns the arguments with defaults filled in; raises ToolError."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolError(BAD_ARGUMENTS, f"arguments are not valid JSON: {exc}") from None
    if not isinstance(arguments, dict):
        raise ToolError(BAD_ARGUMENTS, f"arguments must be a JSON object, got {_type_name(arguments)}")
    props: dict = parameters.get("properties", {})
    unknown = sorted(k for k in arguments if k not in props)
    if unknown and not parameters.get("additionalProperties", False):
        raise ToolError(BAD_ARGUMENTS, f"unknown argument(s) {', '.join(map(repr, unknown))}; "
                                       f"expected: {', '.join(props) or 'none'}")
    missing = [k for k in parameters.get("required", []) if k not in arguments]
    if missing:
        raise ToolError(BAD_ARGUMENTS, f"missing required argument(s) {', '.join(map(repr, missing))}")
    out = {}
    for name, spec in props.items():
        if name not in arguments:
            if "default" in spec:
                out[name] = spec["default"]
            continue
        value = arguments[name]
        expected = spec.get("type")
        allowed = [expected] if isinstance(expected, str) else list(expected or [])  # "t" or ["t", "null"]
        ok_type = not allowed or any(_is_type(value, t) for t in allowed)
        if not ok_type and "integer" in allowed and isinstance(value, float) and value.is_integer():
            value, ok_type = int(value), True
        if not ok_type:
            raise ToolError(BAD_ARGUMENTS, f"argument {name!r} must be of type {' or '.join(allowed)}, "
                                           f"got {_type_name(value)}")
        if "enum" in spec and value not in spec["enum"]:
            raise ToolError(BAD_ARGUMENTS, f"argument {name!r} must be one of {spec['enum']}, got {value!r}")
        if isinstance(value, str):
            if "maxLength" in spec and len(value) > spec["maxLength"]:
                raise ToolError(BAD_ARGUMENTS, f"argument {name!r} is too long ({len(value)} characters; "
                                               f"at most {spec['maxLength']})")
            if spec.get("minLength", 0) > len(value.strip()):
                raise ToolError(BAD_ARGUMENTS, f"argument {name!r} must not be empty")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if "minimum" in spec and value < spec["minimum"]:
                raise ToolError(BAD_ARGUMENTS, f"argument {name!r} must be >= {spec['minimum']}, got {value}")
            if "maximum" in spec and value > spec["maximum"]:
                raise ToolError(BAD_ARGUMENTS, f"argument {name!r} must be <= {spec['maximum']}, got {value}")
        out[name] = value
    return out


def resolve_config(config_cls: type, config: Any, overrides: dict) -> Any:
    """`config` with `overrides` applied, or `config_cls.from_env(**overrides)` when no config is given."""
    return config_cls.from_env(**overrides) if config is None else dataclasses.replace(config, **overrides)


class Tool:
    """Base class. Subclasses set name/description/parameters and implement `run(**arguments) -> str`.

    `run` raises ToolError for expected failures; any other exception becomes a runtime_error output.
    `timeout_s` bounds the call from outside (a worker thread); tools that can stop their own work
    (the sandbox, HTTP clients) also bound it from inside, which frees the resources.
    """

    name: str = ""
    description: str = ""
    parameters: dict = {"type": "object", "properties": {}, "required": []}

    def __init__(self, timeout_s: float = 60.0, max_output_chars: int = 8000):
        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars

    @property
    def schema(self) -> dict:
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    def run(self, **arguments: Any) -> str:  # pragma: no cover - abstract
        raise NotImplementedError

    def call(self, arguments: Any) -> ToolOutput:
        start = time.perf_counter()
        try:
            args = validate_arguments(self.parameters, arguments)
            out = self._run_with_timeout(args)
        except ToolError as exc:
            out = ToolOutput.error(exc.kind, f"{self.name}: {exc}")
        out.text = truncate_middle(out.text, self.max_output_chars)
        out.elapsed_s = time.perf_counter() - start
        return out

    def _run_with_timeout(self, args: dict) -> ToolOutput:
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["value"] = self.run(**args)
            except ToolError as exc:
                box["value"] = ToolOutput.error(exc.kind, f"{self.name}: {exc}")
            except BaseException as exc:  # noqa: BLE001 - a tool bug must not crash the agent loop
                box["value"] = ToolOutput.error(RUNTIME_ERROR, f"{self.name} failed: {type(exc).__name__}: {exc}")

        worker = threading.Thread(target=target, name=f"tool-{self.name}", daemon=True)
        worker.start()
        worker.join(self.timeout_s)
        if worker.is_alive():
            return ToolOutput.error(TIMEOUT, f"{self.name}: timed out after {self.timeout_s:g} s")
        value = box["value"]
        return value if isinstance(value, ToolOutput) else ToolOutput(text=str(value))
