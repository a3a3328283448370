"""One recipe over several seeds, summarised with intervals: is the gain bigger than the seed?

`launch/train.py --seeds=0,1,2` runs the configured pipeline once per seed, each in
`<workdir>/seed_<s>` (each resumes on its own), then writes `<workdir>/seeds_summary.json`: for each
policy every numeric column of its table row as a mean with a Student-t 95% interval over the
seeds, and for each paired comparison the pipeline reported (`sft -> grpo`) the mean change, its
interval, and how many seeds' own paired intervals showed a gain or a loss.
"""
from __future__ import annotations

import copy
import json
import logging
import math
import os
from typing import Callable, Mapping, Sequence

from reagent_jax.eval.statistics import mean_ci
from reagent_jax.parallel import hosts
from reagent_jax.typed_config import ConfigError

log = logging.getLogger(__name__)

SUMMARY_NAME = "seeds_summary.json"
_NAME_KEYS = ("policy", "judge")  # the column that names a table row, per pipeline


def parse_seeds(text: str) -> list[int]:
    """`"0,1,2"` -> [0, 1, 2]; a ConfigError for anything else (or a repeated seed)."""
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds={text!r}: expected comma-separated integers, e.g. --seeds=0,1,2") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"--seeds={text!r}: expected distinct comma-separated integers, e.g. --seeds=0,1,2")
    return seeds


def run_seeds(run: Callable[[object, str], dict], config, workdir: str, seeds: Sequence[int]) -> dict:
    """`run(config, workdir)` (a pipeline's run) once per seed with `config.seed` set, then the
    summary over seeds (written to `<workdir>/seeds_summary.json` and printed)."""
    summaries = {}
    for seed in seeds:
        c = copy.deepcopy(config)
        c.seed = int(seed)
        log.info("seed %d of %s", seed, list(seeds))
        summaries[int(seed)] = run(c, os.path.join(workdir, f"seed_{seed}"))
    out = summarize_seeds(summaries)
    if hosts.is_leader():
        with open(os.path.join(workdir, SUMMARY_NAME), "w") as f:
            json.dump(out, f, indent=2)
        print("\n" + describe_seeds(out))
    return out


def _row_name(row: Mapping) -> str | None:
    return next((str(row[k]) for k in _NAME_KEYS if k in row), None)


def summarize_seeds(summaries: Mapping[int, dict]) -> dict:
    """Per policy and numeric column: mean and interval over the seeds that report it; per paired
    comparison: the same for its change, plus the seeds whose own interval excludes zero."""
    policies: dict[str, dict[str, list[float]]] = {}
    for summary in summaries.values():
        for row in summary.get("table", []):
            name = _row_name(row)
            if name is None:
                continue
            for key, value in row.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                    policies.setdefault(name, {}).setdefault(key, []).append(float(value))
    changes: dict[tuple[str, str], list[dict]] = {}
    for seed, summary in summaries.items():
        for c in summary.get("comparisons", []):
            changes.setdefault((c["before"], c["after"]), []).append({**c, "seed": seed})
    return {
        "seeds": sorted(summaries),
        "policies": {name: {key: mean_ci(values).to_dict() for key, values in cols.items()}
                     for name, cols in policies.items()},
        "comparisons": [{"before": before, "after": after,
                         **change_over_seeds({r["seed"]: r for r in rows}),
                         "per_seed": {r["seed"]: r["estimate"] for r in rows}}
                        for (before, after), rows in changes.items()],
    }


def change_over_seeds(per_seed: Mapping[int, Mapping]) -> dict:
    """Per-seed paired changes (`estimate`, `lo`, `hi`) -> their mean with a t interval over the
    seeds, and the seeds whose own interval shows a gain or a loss."""
    return {**mean_ci([r["estimate"] for r in per_seed.values()]).to_dict(),
            "seeds_gaining": sorted(s for s, r in per_seed.items() if r["lo"] > 0),
            "seeds_losing": sorted(s for s, r in per_seed.items() if r["hi"] < 0)}


def describe_seeds(out: dict) -> str:
    """The summary as a few lines: each comparison's mean change over the seeds with its interval."""
    lines = [f"over seeds {out['seeds']}:"]
    for c in out["comparisons"]:
        per_seed = ", ".join(f"{s}: {v:+.3f}" for s, v in c["per_seed"].items())
        lines.append(f"  {c['before']} -> {c['after']}: mean {c['estimate']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}] "
                     f"({c['confidence']:.0%} t interval over {c['n']} seeds; per seed {per_seed}; "
                     f"a significant gain in seeds {c['seeds_gaining']}, a loss in {c['seeds_losing']})")
    if not out["comparisons"]:
        lines.append("  (the pipeline reported no paired comparisons)")
    return "\n".join(lines)
