"""The six agent tools and their registry.

    from reagent_jax.agent import tools
    out = tools.get("python").call({"code": "print(1 + 1)"})       # out.text, out.ok, out.error_kind
    reg = tools.build_registry({"search": {"backend": "http", "url": "http://127.0.0.1:8000/retrieve"}})
    outs = reg.call_many([("search", {"query": "..."}), ("python", {"code": "..."})], max_workers=8)
    reg.schemas()                                                     # OpenAI-style function schemas

Each tool reads its defaults from environment variables (see each module) and accepts keyword
overrides of its config dataclass, plus `timeout_s` and `max_output_chars`.
"""

from __future__ import annotations

import concurrent.futures
import importlib
from typing import Any, Iterable, Mapping

from reagent_jax.agent.tools.base import (
    BAD_ARGUMENTS,
    NOT_CONFIGURED,
    NOT_FOUND,
    PERMISSION_DENIED,
    RUNTIME_ERROR,
    TIMEOUT,
    UNKNOWN_TOOL,
    UNSUPPORTED,
    Tool,
    ToolError,
    ToolOutput,
    truncate_middle,
    validate_arguments,
)

TOOL_NAMES = ("search", "browse", "python", "file_reader", "image2text", "audio2text")
_CLASSES = {
    "search": "reagent_jax.agent.tools.search:SearchTool",
    "browse": "reagent_jax.agent.tools.browse:BrowseTool",
    "python": "reagent_jax.agent.tools.python_exec:PythonTool",
    "file_reader": "reagent_jax.agent.tools.file_reader:FileReaderTool",
    "image2text": "reagent_jax.agent.tools.image2text:Image2TextTool",
    "audio2text": "reagent_jax.agent.tools.audio2text:Audio2TextTool",
}


def tool_class(name: str) -> type[Tool]:
    if name not in _CLASSES:
        raise KeyError(f"unknown tool {name!r}; available tools: {', '.join(TOOL_NAMES)}")
    module, cls = _CLASSES[name].split(":")
    return getattr(importlib.import_module(module), cls)


def get(name: str, **kwargs: Any) -> Tool:
    """A new `name` tool configured from the current environment plus `kwargs` (construction is cheap:
    heavy state such as BM25 indexes and the sandbox probe is cached at module level)."""
    return tool_class(name)(**kwargs)


def _normalise_call(call: Any) -> tuple[Any, Any]:
    """(name, arguments) from a tuple, {"name", "arguments"} or {"function": {"name", "arguments"}}."""
    if isinstance(call, Mapping):
        call = call.get("function", call)
        return call.get("name"), call.get("arguments", {})
    if isinstance(call, (tuple, list)) and len(call) == 2:
        return call[0], call[1]
    return None, call


def unknown_tool_output(name: Any, available: Iterable[str]) -> ToolOutput:
    return ToolOutput.error(UNKNOWN_TOOL, f"Unknown tool {str(name)[:100]!r}. Available tools: {', '.join(available)}.")


class ToolRegistry:
    """A fixed set of tool instances; calls by name never raise."""

    def __init__(self, tools: Mapping[str, Tool]):
        self.tools = dict(tools)

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def schemas(self) -> list[dict]:
        return [tool.schema for tool in self.tools.values()]

    def __contains__(self, name: str) -> bool:
        return name in self.tools

    def __getitem__(self, name: str) -> Tool:
        return self.tools[name]

    def call(self, name: Any, arguments: Any = None) -> ToolOutput:
        if not isinstance(name, str) or name not in self.tools:
            return unknown_tool_output(name, self.tools)
        return self.tools[name].call({} if arguments is None else arguments)

    def call_many(self, calls: Iterable[Any], max_workers: int = 8) -> list[ToolOutput]:
        """Run the calls of one turn in parallel threads; outputs come back in the calls' order."""
        pairs = [_normalise_call(c) for c in calls]
        if len(pairs) <= 1:
            return [self.call(n, a) for n, a in pairs]
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(pairs)))) as pool:
            return list(pool.map(lambda pair: self.call(*pair), pairs))


def build_registry(config: Mapping[str, Mapping[str, Any]] | None = None,
                   names: Iterable[str] | None = None) -> ToolRegistry:
    """A registry of `names` (default: all six, in TOOL_NAMES order), each built with config[name] as kwargs."""
    config = dict(config or {})
    unknown = [n for n in config if n not in _CLASSES]
    if unknown:
        raise KeyError(f"unknown tool(s) {unknown} in the tools config; available tools: {', '.join(TOOL_NAMES)}")
    selected = list(names) if names is not None else list(TOOL_NAMES)
    return ToolRegistry({n: tool_class(n)(**dict(config.get(n, {}))) for n in selected})


def default_registry() -> ToolRegistry:
    """All six tools configured from the current environment."""
    return ToolRegistry({name: get(name) for name in TOOL_NAMES})


def call(name: Any, arguments: Any = None) -> ToolOutput:
    """Call a default-configured tool by name (unknown names give an error output)."""
    if not isinstance(name, str) or name not in _CLASSES:
        return unknown_tool_output(name, TOOL_NAMES)
    return get(name).call({} if arguments is None else arguments)


def call_many(calls: Iterable[Any], max_workers: int = 8) -> list[ToolOutput]:
    """`ToolRegistry.call_many` over the default-configured tools."""
    return default_registry().call_many(calls, max_workers=max_workers)


def schemas(names: Iterable[str] = TOOL_NAMES) -> list[dict]:
    """OpenAI-style schemas of the named tools (no tool is instantiated)."""
    out = []
    for name in names:
        cls = tool_class(name)
        out.append({"type": "function",
                    "function": {"name": cls.name, "description": cls.description, "parameters": cls.parameters}})
    return out


__all__ = ["TOOL_NAMES", "Tool", "ToolError", "ToolOutput", "ToolRegistry", "build_registry", "call", "call_many",
           "default_registry", "get", "schemas", "tool_class", "truncate_middle", "unknown_tool_output",
           "validate_arguments",
           "BAD_ARGUMENTS", "NOT_CONFIGURED", "NOT_FOUND", "PERMISSION_DENIED", "RUNTIME_ERROR", "TIMEOUT", "UNKNOWN_TOOL", "UNSUPPORTED"]
