"""Per-benchmark summaries of a results file, and the run's reports: summary.json, results.md and
one PNG chart per benchmark (pass@k against k; first vs second attempt in Reagent-C mode).

Metrics (percent in the table, fractions in JSON):
  avg@k      mean over questions of the fraction of its k samples judged correct (= pass@1)
  pass@k     unbiased pass@k (eval.passk), the chance one of k samples is correct
  score      mean rule score (EM = 1, else F1 when >= 0.3; math equivalence 0/1): partial credit
  attempt-2 avg@k / delta (Reagent-C): accuracy after the Agent-RRM critique, and the change;
  fixed / broken: samples wrong -> right and right -> wrong after the critique.
  failed samples: episodes or scoring that raised (scored wrong, never dropped); skipped rows:
  benchmark lines that do not parse; incomplete: records with fewer than k samples (left out).
"""
from __future__ import annotations

import collections
import json
import math
import os
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from reagent_jax.eval import passk
from reagent_jax.eval.results import sample_failed
from reagent_jax.metrics import markdown_table


def _attempt_stats(samples_by_q: list[list[dict]], prefix: str) -> dict[str, Any]:
    correct = [[bool(s["correct"]) for s in q] for q in samples_by_q]
    k = min(len(q) for q in correct)
    flat = [s for q in samples_by_q for s in q]
    trajs = [s.get("trajectory") or {} for s in flat]
    out = {f"{prefix}avg@k": passk.avg_at_k(correct), f"{prefix}pass@k": passk.mean_pass_at_k(correct, k),
           f"{prefix}pass_curve": {str(kk): v for kk, v in passk.pass_curve(correct).items()},
           f"{prefix}score": float(np.mean([float(s.get("score", 0.0)) for s in flat])),
           f"{prefix}rule_avg@k": float(np.mean([bool(s.get("rule_correct", s["correct"])) for s in flat])),
           f"{prefix}turns": float(np.mean([t.get("num_turns", 0) for t in trajs])),
           f"{prefix}tool_calls": float(np.mean([t.get("tool_calls", 0) for t in trajs])),
           f"{prefix}tool_seconds": float(np.mean([t.get("tool_seconds", 0.0) for t in trajs])),
           f"{prefix}response_tokens": float(np.mean([t.get("response_length", 0) for t in trajs])),
           f"{prefix}finish": dict(collections.Counter(t.get("finish_reason", "?") for t in trajs)),
           f"{prefix}methods": dict(collections.Counter(s.get("method", "?") for s in flat)),
           # already counted wrong above, counted here too
           f"{prefix}failed": sum(sample_failed(s) for s in flat)}
    return out


def benchmark_summary(records: Sequence[Mapping[str, Any]], k: int, refine: bool = False) -> dict[str, Any]:
    """Metrics over the first k samples of each record; records with fewer are left out and
    counted in `incomplete` (samples that failed are in the records, scored wrong)."""
    usable = [r for r in records if len(r.get("samples", [])) >= k]
    out: dict[str, Any] = {"questions": len(usable), "k": k, "incomplete": len(records) - len(usable)}
    if not usable:
        return out
    first = [list(r["samples"][:k]) for r in usable]
    out.update(_attempt_stats(first, ""))
    if refine and all(s.get("refined") for q in first for s in q):
        second = [[s["refined"] for s in q] for q in first]
        out.update(_attempt_stats(second, "attempt2/"))
        out["attempt2/delta"] = out["attempt2/avg@k"] - out["avg@k"]
        pairs = [(bool(s["correct"]), bool(s["refined"]["correct"])) for q in first for s in q]
        out["attempt2/fixed"] = sum(a is False and b is True for a, b in pairs)
        out["attempt2/broken"] = sum(a is True and b is False for a, b in pairs)
    return out


def _pct(v: Optional[float]) -> Optional[float]:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else round(100.0 * v, 2)


def _uncovered(summary: Mapping[str, Any]) -> dict[str, int]:
    """Columns for questions the accuracy does not cover (broken rows, too few samples), if any."""
    return {label: summary[key] for key, label in (("skipped_rows", "skipped rows"), ("incomplete", "incomplete"))
            if summary.get(key)}


def table_rows(summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for name, s in summaries.items():
        if not s.get("questions"):
            rows.append({"benchmark": name, "questions": 0, **_uncovered(s)})
            continue
        row = {"benchmark": name, "questions": s["questions"], "k": s["k"], "avg@k %": _pct(s["avg@k"]),
               f"pass@{s['k']} %": _pct(s["pass@k"]), "score %": _pct(s["score"]), "turns": round(s["turns"], 2),
               "tool calls": round(s["tool_calls"], 2)}
        if "attempt2/avg@k" in s:
            row.update({"attempt-2 avg@k %": _pct(s["attempt2/avg@k"]), "delta %": _pct(s["attempt2/delta"]),
                        "fixed": s["attempt2/fixed"], "broken": s["attempt2/broken"]})
        judged = s["methods"].get("llm", 0) + s["methods"].get("rule_fallback", 0)
        if judged:
            row["judge fallbacks"] = s["methods"].get("rule_fallback", 0)
        if s.get("failed"):
            row["failed samples"] = s["failed"]
        rows.append({**row, **_uncovered(s)})
    return rows


def plot_benchmark(name: str, summary: Mapping[str, Any], path: str) -> str:
    """pass@k vs k (with avg@k marked); beside it first vs second attempt when refined."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    refine = "attempt2/avg@k" in summary
    fig = Figure(figsize=(10 if refine else 6, 3.8), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 2 if refine else 1, 1)
    for prefix, label in (("", "attempt 1"), ("attempt2/", "attempt 2 (after critique)")):
        curve = summary.get(f"{prefix}pass_curve")
        if curve:
            ks = sorted(int(k) for k in curve)
            ax.plot(ks, [100 * curve[str(k)] for k in ks], marker="o", label=f"pass@k, {label}")
    ax.axhline(100 * summary["avg@k"], color="C0", linestyle="--", alpha=0.6, label="avg@k (attempt 1)")
    ax.set(xlabel="k", ylabel="% of questions", title=f"{name}: pass@k ({summary['questions']} questions)",
           ylim=(0, 100))
    ax.set_xticks(sorted(int(k) for k in summary["pass_curve"]))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    if refine:
        ax2 = fig.add_subplot(1, 2, 2)
        vals = [100 * summary["avg@k"], 100 * summary["attempt2/avg@k"]]
        bars = ax2.bar(["first attempt", "after critique"], vals, color=["C0", "C2"])
        ax2.bar_label(bars, fmt="%.1f")
        ax2.set(ylabel="avg@k %", ylim=(0, 100), title="Reagent-C: first vs second attempt")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path)
    return path


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def write_reports(out_dir: str, summaries: Mapping[str, Mapping[str, Any]], extra: Optional[Mapping[str, Any]] = None
                  ) -> dict[str, str]:
    """summary.json, results.md and <benchmark>.png in out_dir; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {"summary": os.path.join(out_dir, "summary.json"), "table": os.path.join(out_dir, "results.md")}
    with open(paths["summary"], "w") as f:
        json.dump({"benchmarks": summaries, **(extra or {})}, f, indent=2, default=str)
    table = markdown_table(table_rows(summaries))
    with open(paths["table"], "w") as f:
        f.write(table + "\n")
    for name, s in summaries.items():
        if s.get("questions"):
            paths[f"chart/{name}"] = plot_benchmark(name, s, os.path.join(out_dir, f"{_safe_name(name)}.png"))
    return paths
