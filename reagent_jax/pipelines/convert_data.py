"""Dataset conversion: downloaded files (JSONL, JSON, parquet in the layouts of the real
downloads) -> one JSONL file in a schema of `reagent_jax/data/schemas.py`. `launch/convert_data.py`
is its command line, whose docstring lists the kinds and the field names each one reads.

It lives at the pipelines layer, not in `data/`, because reading Agent-RRM rows needs the RRM's
own judgement parser and prompt (`rrm`, a higher layer than `data`).
"""
from __future__ import annotations

import glob
import json
import math
import os
from typing import Any, Iterator, Mapping, Optional

from reagent_jax import chat
from reagent_jax.data import RRM_SFT, RowError, get_schema
from reagent_jax.rrm import parse_judgement, render_judgement
from reagent_jax.rrm.training import sft_conversation

KINDS = ("agent_rl", "agent_sft", "rrm_sft", "rrm_sft_messages", "rrm_rl", "pairwise", "benchmark")
SCHEMA_OF = {"agent_rl": "agent_rl", "agent_sft": "agent_sft", "rrm_sft": "rrm_sft", "rrm_sft_messages": "agent_sft",
             "rrm_rl": "rrm_rl",
             "pairwise": "evalplanner_pair", "benchmark": "benchmark"}
FIELDS = {  # target field -> source names tried in order
    "question": ("question", "problem", "prompt", "query", "input", "Question"),
    "answer": ("answer", "answers", "ground_truth", "golden_answers", "target", "reward_model.ground_truth",
               "Final answer", "final_answer"),
    "data_source": ("data_source", "source", "meta_info.source", "ability", "category"),
    "messages": ("messages", "conversations", "conversation", "dialog"),
    "trajectory": ("trajectory", "messages", "conversations", "history"),
    "judgement": ("judgement", "judgment", "output", "response", "completion"),
    "target": ("target", "label", "score", "outcome", "reward", "correct"),
    "instruction": ("instruction", "prompt", "question", "input"),
    "chosen": ("chosen", "response_chosen", "chosen_response"),
    "rejected": ("rejected", "response_rejected", "rejected_response"),
    "category": ("category", "subset", "domain", "source"),
    "id": ("id", "pair_id", "task_id", "qid"),
}
ROLE_ALIASES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant", "model": "assistant",
                "bot": "assistant", "system": "system", "tool": "tool", "observation": "tool", "function": "tool",
                "ipython": "tool", "function_response": "tool", "function_call": "assistant"}


_BOM = b"\xef\xbb\xbf"


class ConvertError(ValueError):
    """A row cannot be converted; the message says which field and why."""


# ---- reading ------------------------------------------------------------------------------------
def input_files(spec: str) -> list[str]:
    files = []
    for item in [s.strip() for s in spec.split(",") if s.strip()]:
        if os.path.isdir(item):
            found = [f for ext in ("jsonl", "json", "parquet")
                     for f in glob.glob(os.path.join(item, "**", f"*.{ext}"), recursive=True)]
        else:
            found = glob.glob(item) if any(c in item for c in "*?[") else ([item] if os.path.exists(item) else [])
        if not found:
            raise FileNotFoundError(f"--input: nothing matches {item!r} (expected .jsonl, .json or .parquet files)")
        files += sorted(found)
    return files


def read_rows(path: str) -> Iterator[tuple[str, Any]]:
    """(where, row) for every row of a .jsonl, .json (a list, {"data": [...]}, one object, or JSON
    Lines under a .json name) or .parquet file. A UTF-8 BOM is ignored; a line that is not UTF-8
    or not JSON comes as a ConvertError (skipped and counted), as does an unreadable JSON array."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq
        n = 0
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                n += 1
                yield f"{path}:{n}", row
        return
    with open(path, "rb") as f:
        head = f.read(4096).removeprefix(_BOM).lstrip()[:1]
    if head == b"[" or (head == b"{" and path.endswith(".json")):  # one JSON document, or JSON Lines
        try:
            with open(path, encoding="utf-8-sig") as f:
                data = json.load(f)
        except UnicodeDecodeError as e:
            yield f"{path}", ConvertError(f"not valid UTF-8 ({e.reason} at byte {e.start})")
            return
        except json.JSONDecodeError as e:
            if head == b"[":
                yield f"{path}:{e.lineno}", ConvertError(f"not valid JSON ({e.msg} at column {e.colno}); "
                                                          "the whole array is unreadable")
                return
            data = None  # not one document: JSON Lines saved as .json (common on the hub)
        if data is not None:
            rows = data.get("data", data.get("rows")) if isinstance(data, dict) else data
            if not isinstance(rows, list):  # one object: a one-row file (or metadata: skipped, counted)
                rows = [data]
            for i, row in enumerate(rows, 1):
                yield f"{path}:{i}", row
            return
    with open(path, "rb") as f:
        for i, line in enumerate(f, 1):
            if i == 1:
                line = line.removeprefix(_BOM)
            if not line.strip():
                continue
            try:
                yield f"{path}:{i}", json.loads(line.decode("utf-8"))
            except UnicodeDecodeError as e:
                yield f"{path}:{i}", ConvertError(f"not valid UTF-8 ({e.reason} at byte {e.start})")
            except json.JSONDecodeError as e:
                yield f"{path}:{i}", ConvertError(f"not valid JSON ({e.msg})")


# ---- fields -------------------------------------------------------------------------------------
def lookup(row: Mapping[str, Any], name: str) -> Any:
    value: Any = row
    for part in name.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return None
        value = value[part]
    return value


def get(row: Mapping[str, Any], target: str, field_map: Mapping[str, str], required: bool = True) -> Any:
    names = (field_map[target],) if target in field_map else FIELDS[target]
    for name in names:
        value = lookup(row, name)
        if value is not None:
            return value
    if required:
        raise ConvertError(f"no {target!r} field (looked for {', '.join(names)}; set --field_map={target}=NAME)")
    return None


def maybe_json(value: Any) -> Any:
    """Nested fields stored as JSON strings (common in parquet exports) are decoded."""
    if isinstance(value, str) and value[:1] in "[{":
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def chat_messages(value: Any, field: str) -> list[dict]:
    """OpenAI messages from OpenAI or ShareGPT rows; Hermes tool-call text becomes tool_calls."""
    value = maybe_json(value)
    if not isinstance(value, list) or not value:
        raise ConvertError(f"{field!r} is not a non-empty list of messages")
    out = []
    for i, m in enumerate(value):
        if not isinstance(m, Mapping):
            raise ConvertError(f"{field}[{i}] is not an object")
        raw_role = m.get("role", m.get("from"))
        role = ROLE_ALIASES.get(str(raw_role).lower())
        if role is None:
            raise ConvertError(f"{field}[{i}]: unknown role {raw_role!r}")
        content = m.get("content", m.get("value"))
        content = "" if content is None else content
        if isinstance(content, list):  # multimodal parts: keep the text parts
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
        msg = {k: v for k, v in m.items() if k not in ("from", "value")}
        msg.update(role=role, content=str(content))
        if raw_role == "function_call":  # ShareGPT: the value is {"name": ..., "arguments": ...}
            call = maybe_json(content)
            if not isinstance(call, Mapping) or "name" not in call:
                raise ConvertError(f"{field}[{i}]: function_call value is not a JSON object with a name")
            msg.update(content="", tool_calls=[{"type": "function", "function": {
                "name": call["name"], "arguments": maybe_json(call.get("arguments", {}))}}])
        elif role == "assistant" and not m.get("tool_calls") and "<tool_call>" in msg["content"]:
            parsed, errors = chat.assistant_message_from_text(msg["content"])
            if errors:
                raise ConvertError(f"{field}[{i}]: a <tool_call> does not parse: {errors[0].message}")
            msg.update(parsed)
        out.append(msg)
    return out


def last_text(value: Any, role: str) -> Optional[str]:
    """A plain string, or the last `role` message of a chat list."""
    value = maybe_json(value)
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        turns = [m for m in value if isinstance(m, Mapping) and ROLE_ALIASES.get(str(m.get("role", m.get("from"))).lower()) == role]
        if turns:
            return str(turns[-1].get("content", turns[-1].get("value", "")))
    return None


def answers(value: Any) -> Any:
    value = maybe_json(value)
    if isinstance(value, Mapping) and "target" in value:  # verl / Search-R1: {"target": [...]}
        value = value["target"]
    if isinstance(value, list):
        return [number_text(v) for v in value]
    return number_text(value)


def number_text(value: Any) -> Any:
    """A numeric answer as text ("2.0" -> "2"); NaN / infinity are no answer (e.g. a pandas gap)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ConvertError(f"answer is {value!r}, not a usable value")
    return str(int(value)) if isinstance(value, int) or (value.is_integer() and abs(value) <= 2**53) else repr(value)


# ---- one row per kind -----------------------------------------------------------------------------
def convert_row(kind: str, row: Any, field_map: Mapping[str, str], data_source: str = "",
                index: int = 0) -> list[dict]:
    """The local-schema row(s) of one source row (pairwise RM-Bench rows give several)."""
    if not isinstance(row, Mapping):
        raise ConvertError(f"expected a JSON object, got {type(row).__name__}")
    g = lambda target, required=True: get(row, target, field_map, required)  # noqa: E731
    if kind == "agent_rl":
        question = last_text(g("question"), "user")
        source = g("data_source", required=False) or data_source
        if not source:
            raise ConvertError("no data_source field; pass --data_source=NAME (it picks the reward, e.g. gsm8k, hotpotqa)")
        return [{"question": question, "answer": answers(g("answer")), "data_source": str(source)}]
    if kind == "agent_sft":
        out = {"messages": chat_messages(g("messages"), "messages")}
        tools = maybe_json(row.get("tools"))
        if tools:
            out["tools"] = tools
        return [out]
    if kind in ("rrm_sft", "rrm_sft_messages", "rrm_rl"):
        trajectory = chat_messages(g("trajectory"), "trajectory")
        question = g("question", required=False)
        question = last_text(question, "user") if question is not None else None
        if question is None:
            question = next((m["content"] for m in trajectory if m["role"] == "user"), None)
        if not question:
            raise ConvertError("no question field and no user turn in the trajectory")
        out = {"question": question, "trajectory": trajectory}
        if kind == "rrm_rl":
            target = g("target")
            out["target"] = float(target) if isinstance(target, (bool, int, float)) else target
            return [out]
        if all(row.get(k) is not None for k in ("think", "critique", "score")):
            out.update(think=row["think"], critique=row["critique"], score=row["score"])
        else:
            j = parse_judgement(last_text(g("judgement"), "assistant") or "")
            if not j.ok:
                raise ConvertError(f"the judgement text does not parse as <think>/<critique>/<score> ({j.status.value})")
            out.update(think=j.think, critique=j.critique, score=j.score)
        if kind == "rrm_sft_messages":  # the RRM prompt + the judgement as the assistant turn
            rec = RRM_SFT.validate(out)
            text = render_judgement(rec["think"], rec["critique"], rec["score"])
            return [{"messages": sft_conversation(rec["question"], rec["trajectory"], text)}]
        return [out]
    if kind == "pairwise":
        return pairwise_rows(row, field_map, index)
    if kind == "benchmark":
        if not data_source:
            raise ConvertError("pass --data_source=NAME for benchmark rows (e.g. gaia)")
        rid = g("id", required=False)
        used = {*FIELDS["question"], *FIELDS["answer"], *FIELDS["id"], *(v.split(".")[0] for v in field_map.values())}
        meta = {k: v for k, v in row.items() if k not in used}
        return [{"id": f"{data_source}/{rid if rid is not None else index}", "question": last_text(g("question"), "user"),
                 "answer": answers(g("answer")), "source": data_source, "meta": meta}]
    raise ConvertError(f"unknown kind {kind!r}; use one of {', '.join(KINDS)}")


def pairwise_rows(row: Mapping[str, Any], field_map: Mapping[str, str], index: int) -> list[dict]:
    chosen, rejected = get(row, "chosen", field_map, False), get(row, "rejected", field_map, False)
    if chosen is None and "response_A" in row and "response_B" in row:  # JudgeBench
        label = str(row.get("label", "")).replace(" ", "")
        if label not in ("A>B", "B>A"):
            raise ConvertError(f"JudgeBench label must be 'A>B' or 'B>A', got {row.get('label')!r}")
        chosen, rejected = (row["response_A"], row["response_B"]) if label == "A>B" else (row["response_B"], row["response_A"])
    if chosen is None or rejected is None:
        raise ConvertError("no chosen / rejected responses (or JudgeBench response_A, response_B, label)")
    instruction = get(row, "instruction", field_map, False)
    instruction = last_text(instruction, "user") if instruction is not None else last_text(chosen, "user")
    if not instruction:
        raise ConvertError("no instruction field (and the chosen response is not a chat with a user turn)")
    rid = get(row, "id", field_map, False)
    rid = str(rid) if rid is not None else f"pair-{index}"
    category = get(row, "category", field_map, False)

    def responses(value: Any) -> list[str]:
        value = maybe_json(value)
        if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
            return value  # RM-Bench: several responses
        text = last_text(value, "assistant")
        if text is None:
            raise ConvertError("a chosen / rejected response is neither a text nor a chat with an assistant turn")
        return [text]

    cs, rs = responses(chosen), responses(rejected)
    out = []
    for i, c in enumerate(cs):
        for j, r in enumerate(rs):
            pid = rid if len(cs) == len(rs) == 1 else f"{rid}/c{i}-r{j}"
            out.append({"id": pid, "instruction": instruction, "chosen": c, "rejected": r,
                        **({"category": str(category)} if category is not None else {})})
    return out


def inspect(inputs: str, max_chars: int = 1500) -> str:
    """Each input file's first row: its field names and the row itself (shortened)."""
    lines = []
    for path in input_files(inputs):
        first = next(read_rows(path), None)
        if first is None:
            lines.append(f"{path}: no rows")
            continue
        where, row = first
        keys = sorted(row) if isinstance(row, Mapping) else type(row).__name__
        text = json.dumps(row, ensure_ascii=False, default=str) if not isinstance(row, Exception) else str(row)
        lines.append(f"{path}\n  fields: {keys}\n  first row: {text[:max_chars]}{' ...' if len(text) > max_chars else ''}")
    return "\n".join(lines)


# ---- the command --------------------------------------------------------------------------------
def parse_field_map(text: str) -> dict[str, str]:
    out = {}
    for item in [s.strip() for s in text.split(",") if s.strip()]:
        target, sep, source = item.partition("=")
        if not sep or target not in FIELDS or not source:
            raise ValueError(f"--field_map item {item!r}: expected TARGET=SOURCE with TARGET one of {sorted(FIELDS)}")
        out[target] = source
    return out


def convert(kind: str, inputs: str, output: str, *, field_map: Optional[Mapping[str, str]] = None,
            data_source: str = "", limit: int = 0, on_error: str = "skip", max_reasons: int = 5) -> dict:
    """Converts every row; returns {"written", "skipped", "reasons"}. Raises when nothing converts."""
    if kind not in KINDS:
        raise ValueError(f"--kind={kind!r}; use one of {', '.join(KINDS)}")
    schema = get_schema(SCHEMA_OF[kind])
    field_map = dict(field_map or {})
    written, skipped, reasons, seen_ids = 0, 0, [], set()
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    tmp = output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for path in input_files(inputs):
            for where, row in read_rows(path):
                if limit and written >= limit:
                    break
                try:
                    if isinstance(row, Exception):
                        raise row
                    for new in convert_row(kind, row, field_map, data_source, index=written + skipped):
                        new = schema.validate(new)
                        if "id" in new and kind in ("pairwise", "benchmark"):
                            if new["id"] in seen_ids:
                                raise ConvertError(f"duplicate id {new['id']!r}")
                            seen_ids.add(new["id"])
                        out.write(json.dumps(new, ensure_ascii=False) + "\n")
                        written += 1
                except (ConvertError, RowError, ValueError, TypeError) as e:
                    if on_error == "raise":
                        os.remove(tmp)
                        raise ConvertError(f"{where}: {e}") from None
                    skipped += 1
                    if len(reasons) < max_reasons:
                        reasons.append(f"{where}: {e}")
    if written == 0:
        os.remove(tmp)
        raise ConvertError(f"no row of {inputs} converted to {kind}; "
                           + ("first reasons:\n  " + "\n  ".join(reasons) if reasons else "the inputs have no rows"))
    os.replace(tmp, output)
    return {"written": written, "skipped": skipped, "reasons": reasons}
