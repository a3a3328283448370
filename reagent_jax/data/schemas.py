"""Row schemas for the Reagent / EvalPlanner datasets and the benchmark files.

A schema checks one parsed JSON row and returns it normalised (answers always a list of strings,
tool-call arguments always dicts, scores always floats), or raises `RowError` saying which field is
wrong and why. Sources run it once per row at index time, so a training run never meets a broken
row mid-epoch. Fields not named by a schema are kept unchanged. One example line per schema:

`BENCHMARK` (the files in shared/data/benchmarks, see its README; also a user's own gaia.jsonl)::

    {"id": "bamboogle/0", "question": "Who was president ...?", "answer": ["james madison"],
     "source": "bamboogle", "meta": {}}

`AGENT_RL` (Reagent-RL-709K style; `source` is accepted for `data_source`, so benchmark rows fit)::

    {"question": "What is 2+3?", "answer": ["5"], "data_source": "gsm8k"}

`AGENT_SFT` (Reagent-SFT-55.6K style: OpenAI chat messages, optional tool schemas)::

    {"messages": [{"role": "user", "content": "Capital of France?"},
                  {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                   "function": {"name": "search", "arguments": {"query": "capital of France"}}}]},
                  {"role": "tool", "content": "Paris is the capital ..."},
                  {"role": "assistant", "content": "\\\\boxed{Paris}"}],
     "tools": [{"type": "function", "function": {"name": "search", "parameters": {}}}]}

`RRM_SFT` (Reagent-RRM-SFT-28K style: a judged trajectory with the Agent-RRM's three outputs)::

    {"question": "Capital of France?", "trajectory": [{"role": "user", "content": "..."},
     {"role": "assistant", "content": "\\\\boxed{Paris}"}], "think": "The agent searched ...",
     "critique": "No flaws.", "score": 0.9}

`RRM_RL` (Reagent-RRM-RL-90K style: `target` in [0, 1]; `label`, `score` or `outcome`, and
booleans, are accepted)::

    {"question": "Capital of France?", "trajectory": [{"role": "user", "content": "..."},
     {"role": "assistant", "content": "\\\\boxed{Lyon}"}], "target": 0.0}

`EVALPLANNER_PAIR` (pairwise preference rows: chosen and rejected responses to an instruction)::

    {"instruction": "Write a haiku about rain.", "chosen": "Soft rain on the roof ...",
     "rejected": "Rain is water falling from clouds.", "category": "chat", "id": "pair-17"}
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Callable, Mapping, Optional

ROLES = ("system", "user", "assistant", "tool")


class RowError(ValueError):
    """A row does not match its schema; the message says which field and why."""


def _type_name(value: Any) -> str:
    return type(value).__name__


def text(value: Any) -> str:
    """A non-empty string (questions, instructions, responses)."""
    if not isinstance(value, str):
        raise RowError(f"expected a string, got {_type_name(value)}")
    if not value.strip():
        raise RowError("is empty")
    return value


def any_text(value: Any) -> str:
    """A string that may be empty (e.g. a critique of a flawless trajectory)."""
    if not isinstance(value, str):
        raise RowError(f"expected a string, got {_type_name(value)}")
    return value


def identifier(value: Any) -> str:
    """A non-empty id; integer ids from source files are turned into strings."""
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return text(value)


def answers(value: Any) -> list[str]:
    """Acceptable answers: a string or a list of strings -> a non-empty list of non-empty strings."""
    items = value if isinstance(value, list) else [value]
    out = []
    for i, item in enumerate(items):
        if isinstance(item, int) and not isinstance(item, bool):  # e.g. AIME / GSM8K integers
            item = str(item)
        if not isinstance(item, str):
            where = f"[{i}] " if isinstance(value, list) else ""
            raise RowError(f"{where}expected a string or list of strings, got {_type_name(item)}")
        if item.strip():
            out.append(item)
    if not out:
        raise RowError("has no non-empty answer")
    return out


def mapping(value: Any) -> dict:
    """A JSON object (`meta`, `extra_info`)."""
    if not isinstance(value, dict):
        raise RowError(f"expected an object, got {_type_name(value)}")
    return value


def unit_score(value: Any) -> float:
    """A float in [0, 1]; booleans count as 1.0 / 0.0 (an outcome label)."""
    if isinstance(value, bool):
        return float(value)
    if not isinstance(value, (int, float)):
        raise RowError(f"expected a number in [0, 1], got {_type_name(value)}")
    if not math.isfinite(value) or not 0.0 <= value <= 1.0:
        raise RowError(f"expected a number in [0, 1], got {value!r}")
    return float(value)


def _tool_call(call: Any) -> dict:
    if not isinstance(call, dict):
        raise RowError(f"expected an object, got {_type_name(call)}")
    fn = call.get("function", call)  # OpenAI nests under "function"; Hermes-style rows do not
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not fn["name"]:
        raise RowError("has no function name")
    args = fn.get("arguments", {})
    if isinstance(args, str):  # OpenAI wire format: arguments as a JSON string
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError as e:
            raise RowError(f"arguments are not valid JSON ({e.msg})") from None
    if not isinstance(args, dict):
        raise RowError(f"arguments must be an object, got {_type_name(args)}")
    return {**call, "type": call.get("type", "function"), "function": {**fn, "arguments": args}}


def messages(value: Any) -> list[dict]:
    """OpenAI-style chat messages; tool-call arguments become dicts."""
    if not isinstance(value, list) or not value:
        raise RowError("expected a non-empty list of messages" if isinstance(value, list)
                       else f"expected a list of messages, got {_type_name(value)}")
    out = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise RowError(f"[{i}] expected an object, got {_type_name(msg)}")
        if msg.get("role") not in ROLES:
            raise RowError(f"[{i}] role must be one of {ROLES}, got {msg.get('role')!r}")
        msg = dict(msg)
        calls = msg.get("tool_calls") or []
        if not isinstance(calls, list):
            raise RowError(f"[{i}].tool_calls expected a list, got {_type_name(calls)}")
        content = msg.get("content")
        if content is None and calls:
            content = ""
        if not isinstance(content, str):
            raise RowError(f"[{i}].content expected a string, got {_type_name(content)}")
        msg["content"] = content
        if calls:
            try:
                msg["tool_calls"] = [_tool_call(c) for c in calls]
            except RowError as e:
                raise RowError(f"[{i}].tool_calls {e}") from None
        else:
            msg.pop("tool_calls", None)
        if not isinstance(msg.get("reasoning_content", ""), str):
            raise RowError(f"[{i}].reasoning_content expected a string")
        weight = msg.get("weight")  # OpenAI fine-tuning: 0 keeps an assistant turn out of the loss
        if weight is not None and (msg["role"] != "assistant" or isinstance(weight, bool) or weight not in (0, 1)):
            raise RowError(f"[{i}].weight must be 0 or 1 on an assistant message, got {weight!r} "
                           f"(role {msg['role']!r})")
        out.append(msg)
    return out


def tools(value: Any) -> list:
    """Tool schemas (OpenAI function dicts) or plain tool names."""
    if not isinstance(value, list):
        raise RowError(f"expected a list, got {_type_name(value)}")
    for i, item in enumerate(value):
        fn = item.get("function", item) if isinstance(item, dict) else None
        ok_dict = isinstance(fn, dict) and isinstance(fn.get("name"), str) and bool(fn["name"])
        if not (ok_dict or (isinstance(item, str) and item)):
            raise RowError(f"[{i}] expected a tool schema with a name or a tool name")
    return value


@dataclasses.dataclass(frozen=True)
class Field:
    """One field: `check` returns the normalised value or raises `RowError`."""
    name: str
    check: Callable[[Any], Any]
    required: bool = True
    default: Optional[Callable[[], Any]] = None  # used when an optional field is absent
    aliases: tuple[str, ...] = ()  # other names accepted in source files; stored under `name`


@dataclasses.dataclass(frozen=True)
class Schema:
    """A named set of fields plus an optional cross-field check."""
    name: str
    fields: tuple[Field, ...]
    row_check: Optional[Callable[[dict], None]] = None

    def validate(self, row: Any) -> dict:
        """Returns the normalised row or raises `RowError` naming the failing field."""
        if not isinstance(row, dict):
            raise RowError(f"expected a JSON object, got {_type_name(row)}")
        out = dict(row)
        for f in self.fields:
            key = next((k for k in (f.name, *f.aliases) if k in row and row[k] is not None), None)
            if key is None:
                if f.required:
                    raise RowError(f"missing field {f.name!r}")
                if f.default is not None:
                    out[f.name] = f.default()
                continue
            try:
                out[f.name] = f.check(row[key])
            except RowError as e:
                raise RowError(f"field {key!r} {e}") from None
            if key != f.name:
                out.pop(key)
        if self.row_check is not None:
            self.row_check(out)
        return out


def _has_assistant_turn(row: dict) -> None:
    if not any(m["role"] == "assistant" and m.get("weight") != 0 for m in row["messages"]):
        raise RowError("field 'messages' has no assistant message to train on (none without weight 0)")


def _distinct_pair(row: dict) -> None:
    if row["chosen"] == row["rejected"]:
        raise RowError("fields 'chosen' and 'rejected' are identical")


BENCHMARK = Schema("benchmark", (
    Field("id", identifier),
    Field("question", text),
    Field("answer", answers),
    Field("source", text),
    Field("meta", mapping, required=False, default=dict),
))

AGENT_RL = Schema("agent_rl", (
    Field("question", text),
    Field("answer", answers),
    Field("data_source", text, aliases=("source",)),
))

AGENT_SFT = Schema("agent_sft", (
    Field("messages", messages),
    Field("tools", tools, required=False),
), row_check=_has_assistant_turn)

RRM_SFT = Schema("rrm_sft", (
    Field("question", text),
    Field("trajectory", messages),
    Field("think", text),
    Field("critique", any_text),
    Field("score", unit_score),
))

RRM_RL = Schema("rrm_rl", (
    Field("question", text),
    Field("trajectory", messages),
    Field("target", unit_score, aliases=("label", "score", "outcome")),
))

EVALPLANNER_PAIR = Schema("evalplanner_pair", (
    Field("instruction", text),
    Field("chosen", text),
    Field("rejected", text),
    Field("category", text, required=False),
    Field("id", identifier, required=False),
), row_check=_distinct_pair)

SCHEMAS: Mapping[str, Schema] = {s.name: s for s in
                                 (BENCHMARK, AGENT_RL, AGENT_SFT, RRM_SFT, RRM_RL, EVALPLANNER_PAIR)}


def get_schema(name_or_schema: str | Schema) -> Schema:
    """Looks a schema up by name (`"agent_rl"`, ...) so configs can name one as a string."""
    if isinstance(name_or_schema, Schema):
        return name_or_schema
    try:
        return SCHEMAS[name_or_schema]
    except KeyError:
        raise ValueError(f"unknown schema {name_or_schema!r}; known: {sorted(SCHEMAS)}") from None
