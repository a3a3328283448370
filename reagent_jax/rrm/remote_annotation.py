"""Builds Agent-RRM SFT data by asking a strong annotator model (an OpenAI-compatible endpoint) to
judge agent trajectories, the way the paper built its RRM SFT set with a large teacher model.

Why resumable and streaming: annotating tens of thousands of long trajectories takes hours and
endpoints fail. Each accepted judgement is appended (and flushed) as soon as it arrives; a rerun
skips ids already in the output (and in the rejected file, if one is kept), and repairs a last
line cut off by a crash. Requests that failed at the endpoint are not written, so a rerun retries
them.

Input JSONL, one trajectory per line:
    {"id"?: str, "question": str, "trajectory" | "messages": [chat messages], "tools"?: [...]}
    (without "id", a hash of question + trajectory identifies the record across runs)
Output JSONL (RRM SFT schema), in completion order:
    {"id", "question", "trajectory", "think", "critique", "score", "annotator", "status"}
    + "sub_scores" (multi_dim) / "confidence" when the annotator wrote them.
Only replies whose parse status is in `accept_statuses` (default: "ok") are kept; the others go to
`rejected_path` (with the raw reply as "text") when it is given, else they are only counted.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
from typing import Any, Iterable, Sequence

from reagent_jax.endpoints import EndpointConfig
from reagent_jax.rrm.base import JudgeRequest
from reagent_jax.rrm.parser import JudgementStatus
from reagent_jax.rrm.prompt import build_rrm_messages
from reagent_jax.rrm.remote import RemoteJudge, RemoteReply

MAX_LISTED = 5  # examples of bad lines / errors kept in the summary


@dataclasses.dataclass
class AnnotationSummary:
    input_records: int = 0
    already_done: int = 0  # ids found in the output (or rejected file) of an earlier run
    duplicates: int = 0  # repeated ids in the input (the first one is used)
    bad_input: int = 0  # lines that are not a usable trajectory record
    sent: int = 0
    written: int = 0
    rejected: dict[str, int] = dataclasses.field(default_factory=dict)  # parse status -> count
    endpoint_errors: int = 0
    repaired_tail: bool = False  # a cut-off last output line was removed before appending
    examples: list[str] = dataclasses.field(default_factory=list)  # first bad lines / errors

    def note(self, message: str) -> None:
        if len(self.examples) < MAX_LISTED:
            self.examples.append(message)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def record_id(record: dict[str, Any]) -> str:
    """The record's "id", else a stable hash of its question and trajectory."""
    if record.get("id") is not None:
        return str(record["id"])
    trajectory = record.get("trajectory", record.get("messages"))
    payload = json.dumps([record.get("question"), trajectory], sort_keys=True, ensure_ascii=False)
    return "sha1:" + hashlib.sha1(payload.encode()).hexdigest()[:20]


def _repair_tail(path: str) -> bool:
    """Cuts a last line without its newline (a crash mid-write) so appends start on a fresh line."""
    if not os.path.exists(path) or os.path.getsize(path) == 0:
        return False
    with open(path, "rb+") as f:
        data = f.read()
        if data.endswith(b"\n"):
            return False
        f.truncate(data.rfind(b"\n") + 1)
    return True


def done_ids(path: str | None) -> set[str]:
    """Ids already written to a JSONL file (unreadable lines are ignored)."""
    ids: set[str] = set()
    if not path or not os.path.exists(path):
        return ids
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                ids.add(str(json.loads(line)["id"]))
            except (ValueError, KeyError, TypeError):
                continue
    return ids


def read_trajectories(path: str, summary: AnnotationSummary) -> Iterable[tuple[str, dict[str, Any], JudgeRequest]]:
    """(id, record, request) per usable line; bad lines (including ones the judge prompt cannot be
    built from) are counted in `summary`, not raised, so one bad row never stops the run."""
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            summary.input_records += 1
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError(f"a JSON {type(record).__name__}, not an object")
                trajectory = record.get("trajectory", record.get("messages"))
                question = record.get("question")
                if not isinstance(question, str) or not question.strip():
                    raise ValueError("no non-empty 'question'")
                if not isinstance(trajectory, list) or not all(isinstance(m, dict) and "role" in m
                                                               for m in trajectory):
                    raise ValueError("'trajectory' (or 'messages') is not a list of chat messages")
                build_rrm_messages(question, trajectory, tools=record.get("tools"))  # e.g. bad 'tools'
            except ValueError as exc:
                summary.bad_input += 1
                summary.note(f"{path}:{line_no}: {exc}")
                continue
            yield record_id(record), record, JudgeRequest(question, trajectory, record.get("tools"))


def sft_record(rid: str, request: JudgeRequest, reply: RemoteReply, annotator: str) -> dict[str, Any]:
    j = reply.judgement
    out: dict[str, Any] = {"id": rid, "question": request.question, "trajectory": list(request.trajectory),
                           "think": j.think, "critique": j.critique, "score": j.score, "annotator": annotator,
                           "status": j.status.value}
    if j.sub_scores:
        out["sub_scores"] = j.sub_scores
    if j.confidence is not None:
        out["confidence"] = j.confidence
    return out


def annotate_file(
    input_path: str,
    output_path: str,
    config: EndpointConfig,
    *,
    annotator: str | None = None,
    accept_statuses: Sequence[str] = ("ok",),
    rejected_path: str | None = None,
    multi_dim: bool = False,
    limit: int | None = None,
    progress: bool = True,
    judge: RemoteJudge | None = None,
) -> AnnotationSummary:
    """Annotates every trajectory of `input_path` not yet in `output_path`; returns the counts."""
    known = {s.value for s in JudgementStatus}
    unknown = [s for s in accept_statuses if s not in known]
    if unknown:
        raise ValueError(f"accept_statuses has unknown statuses {unknown}; known: {sorted(known)}")
    if not os.path.exists(input_path):
        raise FileNotFoundError(f"input trajectories not found: {input_path}")
    summary = AnnotationSummary()
    summary.repaired_tail = _repair_tail(output_path)
    if rejected_path:
        _repair_tail(rejected_path)
    skip = done_ids(output_path) | done_ids(rejected_path)

    todo: list[tuple[str, JudgeRequest]] = []
    seen: set[str] = set()
    for rid, _record, request in read_trajectories(input_path, summary):
        if rid in seen:
            summary.duplicates += 1
            continue
        seen.add(rid)
        if rid in skip:
            summary.already_done += 1
            continue
        if limit is None or len(todo) < limit:
            todo.append((rid, request))

    own_judge = judge is None
    judge = judge if judge is not None else RemoteJudge(config, multi_dim=multi_dim)
    name = annotator or config.model or "unknown"
    accept = set(accept_statuses)
    rejected = collections.Counter()
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(todo), desc="annotate", unit="traj")
    os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
    try:
        with open(output_path, "a", encoding="utf-8") as out, \
                open(rejected_path or os.devnull, "a", encoding="utf-8") as rej:
            summary.sent = len(todo)
            for i, reply in judge.iter_judge([request for _, request in todo]):
                rid, request = todo[i]
                if reply.error is not None:
                    summary.endpoint_errors += 1
                    summary.note(f"id {rid}: {reply.error}")
                elif reply.judgement.status.value in accept:
                    out.write(json.dumps(sft_record(rid, request, reply, name), ensure_ascii=False) + "\n")
                    out.flush()
                    summary.written += 1
                else:
                    rejected[reply.judgement.status.value] += 1
                    if rejected_path:
                        rec = sft_record(rid, request, reply, name) | {"text": reply.text}
                        rej.write(json.dumps(rec, ensure_ascii=False) + "\n")
                        rej.flush()
                if bar is not None:
                    bar.update(1)
                    bar.set_postfix(written=summary.written, rejected=sum(rejected.values()),
                                    errors=summary.endpoint_errors, refresh=False)
    finally:
        if bar is not None:
            bar.close()
        if own_judge:
            judge.close()
    summary.rejected = dict(rejected)
    return summary
