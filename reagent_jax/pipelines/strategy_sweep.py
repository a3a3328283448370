"""Agent-RRM strategies from one SFT policy per seed: is Reagent-R's or Reagent-U's gain over
rule-only GRPO bigger than the seed?

`launch/train.py --strategies=grpo,reagent_r,reagent_u --seeds=0,1,2` runs, for each seed, the
whole pipeline once for the first strategy (`<workdir>/<strategy>/seed_<s>`), then only the `grpo`
stage of every other strategy, from a copy of that seed's finished stages (SFT, and the RRM's when
the judge is trained: `rrm_sft`, `rrm_grpo`) and tokenizer: the same starting policy and judge,
the same training questions in the same order, the same held-out questions. Each strategy's seeds are summarised as `--seeds` does (`<workdir>/<strategy>/seeds_summary.json`); then
`<workdir>/strategies_summary.json` and `strategies.png` hold, per strategy, the held-out accuracy per
seed with its mean and Student-t interval, the share of groups with reward variance (the ones GRPO
can learn from), episodes and wall time per step; and for every strategy against the first, the
paired bootstrap over held-out questions per seed and the mean change over seeds.

Same number of rollouts: Reagent-U's group pools each first attempt with its critique-guided retry,
so with `match_rollouts` it gets n/2 first attempts per question and generates at most n episodes,
as the others do (said in the log and the summary).
"""
from __future__ import annotations

import copy
import json
import logging
import os
import shutil
from typing import Callable, Mapping, Sequence

import numpy as np

from reagent_jax import metrics as metrics_lib
from reagent_jax.eval.statistics import mean_ci, paired_bootstrap
from reagent_jax.parallel import hosts
from reagent_jax.pipelines import seeds as seeds_lib
from reagent_jax.rrm.strategies import STRATEGIES
from reagent_jax.typed_config import ConfigError

log = logging.getLogger(__name__)

SUMMARY_NAME = "strategies_summary.json"
PLOT_NAME = "strategies.png"


def parse_strategies(text: str, known: Sequence[str]) -> list[str]:
    """`"grpo,reagent_r"` -> ["grpo", "reagent_r"]: at least two distinct registered names."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    unknown = [s for s in names if s not in known]
    if unknown or len(names) < 2 or len(set(names)) != len(names):
        why = f"unknown {unknown}" if unknown else "expected at least two distinct names"
        raise ConfigError(f"--strategies={text!r}: {why}; choose from {', '.join(known)}, "
                          "e.g. --strategies=grpo,reagent_r,reagent_u")
    return names


def check_sweep_config(config) -> None:
    """A comparison of strategies needs the agent pipeline with a `grpo` stage."""
    stages = [s.strip() for s in config.stages.split(",") if s.strip()]
    if config.get("pipeline", "agent") != "agent" or "grpo" not in stages:
        raise ConfigError("--strategies compares GRPO strategies: it needs the agent pipeline with a grpo stage "
                          f"(pipeline={config.get('pipeline', 'agent')!r}, stages={config.stages!r})")


def strategy_config(config, name: str, match_rollouts: bool = True):
    """The run config of one strategy: `config.strategy = name`; a pooled strategy (Reagent-U) gets
    n/2 first attempts when `match_rollouts`, so it generates no more episodes than the others."""
    c = copy.deepcopy(config)
    c.strategy = name
    if match_rollouts and _pooled(name):
        if c.grpo.n < 2:
            raise ConfigError(f"{name} with match_rollouts needs grpo.n >= 2 (n/2 first attempts), got {c.grpo.n}")
        c.grpo.n = c.grpo.n // 2
        log.info("%s: %d first attempts per question + their retries (grpo.n=%d for the others)",
                 name, c.grpo.n, config.grpo.n)
    return c


def shared_stages(config) -> list[str]:
    """The stages every strategy shares: all but `grpo` (SFT, and the RRM's when the judge is trained)."""
    return [s.strip() for s in config.stages.split(",") if s.strip() and s.strip() != "grpo"]


def share_stages(source: str, target: str, stages: Sequence[str]) -> None:
    """Copies the first strategy's tokenizer and the final params of `stages` into `target` (once)."""
    for rel in ("tokenizer", *(f"{stage}/final" for stage in stages)):
        src, dst = os.path.join(source, rel), os.path.join(target, rel)
        if not os.path.exists(src):
            raise FileNotFoundError(f"{src} is missing: the first strategy's run did not finish its stages")
        if not os.path.exists(dst):
            shutil.copytree(src, dst)


def run_strategies(run: Callable[[object, str], dict], config, workdir: str, strategies: Sequence[str],
                   seeds: Sequence[int], match_rollouts: bool = True) -> dict:
    """`run(config, workdir)` (the agent pipeline) per strategy and seed, the later strategies from
    the first one's SFT policy; returns (and writes) the summary across strategies."""
    check_sweep_config(config)
    first = strategies[0]
    shared = shared_stages(config)
    results: dict[str, dict[int, dict]] = {}
    for name in strategies:
        base = os.path.join(workdir, name)

        def run_one(c, wd, name=name):
            if name != first and shared:
                if hosts.is_leader():
                    share_stages(os.path.join(workdir, first, os.path.basename(wd)), wd, shared)
                hosts.barrier(f"strategies/{name}/{os.path.basename(wd)}")
                c.stages = "grpo"
            summary = run(c, wd)
            results.setdefault(name, {})[int(c.seed)] = {**summary, "metrics_dir": os.path.join(wd, "grpo")}
            return summary

        seeds_lib.run_seeds(run_one, strategy_config(config, name, match_rollouts), base, seeds)
    out = summarize_strategies(results, strategies, episodes_note(config, strategies, match_rollouts))
    if hosts.is_leader():
        with open(os.path.join(workdir, SUMMARY_NAME), "w") as f:
            json.dump(out, f, indent=2)
        try:
            plot_strategies(out, os.path.join(workdir, PLOT_NAME))
        except Exception as e:  # a plot must never fail a finished comparison
            log.warning("could not plot the strategies: %s", e)
        print("\n" + describe_strategies(out))
    return out


def episodes_note(config, strategies: Sequence[str], match_rollouts: bool) -> dict[str, str]:
    n = config.grpo.n
    return {s: (f"{n // 2} first attempts + their retries" if _pooled(s) and match_rollouts else
                f"{n} first attempts + their retries" if _pooled(s) else f"{n}") for s in strategies}


def _pooled(name: str) -> bool:
    """A strategy whose GRPO group holds each first attempt and its retry (Reagent-U)."""
    return bool(STRATEGIES.traits(name).get("retries_in_group"))


def _final_scores(summary: Mapping, name: str) -> tuple[list, list, list] | None:
    """(question ids, scores of the policy before the stage, scores after) from one run's summary."""
    scores = summary.get("question_scores") or {}
    names = list(scores)
    if name not in names or names.index(name) == 0:
        return None
    return summary.get("question_ids") or [], scores[names[names.index(name) - 1]], scores[name]


def _step_means(metrics_dir: str) -> dict[str, float]:
    """Means over the stage's logged steps of the quantities the comparison reports."""
    try:
        steps = metrics_lib.read_metrics(metrics_dir)
    except FileNotFoundError:
        return {}
    out = {}
    for key, label in (("batch/kept_frac", "kept_episode_frac"), ("batch/episodes", "episodes_per_step"),
                       ("timing_s/step", "step_s"), ("timing_s/gen", "gen_s"),
                       ("perf/gen_tokens_per_s", "gen_tokens_per_s")):
        values = [float(m[key]) for m in steps if key in m]
        if values:
            out[label] = float(np.mean(values))
    shares = [1 - m["batch/zero_std_groups"] / m["batch/groups"] for m in steps
              if m.get("batch/groups") and "batch/zero_std_groups" in m]
    if shares:
        out["groups_with_variance_frac"] = float(np.mean(shares))
    return out


def summarize_strategies(results: Mapping[str, Mapping[int, Mapping]], strategies: Sequence[str],
                         episodes: Mapping[str, str] | None = None) -> dict:
    """Per strategy: final accuracy and step figures per seed with means over seeds; per strategy
    against the first: the per-seed paired bootstrap over held-out questions and the mean change."""
    first = strategies[0]
    per_strategy, finals = {}, {}
    for name in strategies:
        seeds = {}
        for seed, summary in sorted(results[name].items()):
            scores = _final_scores(summary, name)
            row = {"start_accuracy": float(np.mean(scores[1])) if scores else None,
                   "accuracy": float(np.mean(scores[2])) if scores else None,
                   **_step_means(summary.get("metrics_dir", ""))}
            seeds[seed] = row
            if scores:
                finals[(name, seed)] = scores
        keys = sorted({k for row in seeds.values() for k, v in row.items() if v is not None})
        per_strategy[name] = {"per_seed": seeds, "episodes_per_question": (episodes or {}).get(name),
                              **{k: mean_ci([row[k] for row in seeds.values() if row.get(k) is not None]).to_dict()
                                 for k in keys}}
    comparisons = []
    for name in strategies[1:]:
        per_seed = {}
        for seed in sorted(results[name]):
            a, b = finals.get((first, seed)), finals.get((name, seed))
            if a is None or b is None:
                continue
            if a[0] != b[0]:
                raise ValueError(f"seed {seed}: {first} and {name} were evaluated on different held-out questions")
            per_seed[seed] = paired_bootstrap(a[2], b[2], seed=seed).to_dict()
        if per_seed:
            comparisons.append({"before": first, "after": name, **seeds_lib.change_over_seeds(per_seed),
                                "per_seed": per_seed})
    return {"strategies": list(strategies), "baseline": first,
            "seeds": sorted({s for r in results.values() for s in r}),
            "per_strategy": per_strategy, "comparisons": comparisons}


def describe_strategies(out: Mapping) -> str:
    """The summary as a markdown table and one line per comparison."""
    rows = []
    for name, s in out["per_strategy"].items():
        def fmt(key, spec="{:.3f}"):
            if key not in s:
                return "-"
            ci = s[key]
            return (spec.format(ci["estimate"]) if ci["n"] < 2 else
                    f"{spec.format(ci['estimate'])} [{spec.format(ci['lo'])}, {spec.format(ci['hi'])}]")
        rows.append({"strategy": name, "episodes / question": s.get("episodes_per_question") or "-",
                     "start acc": fmt("start_accuracy"), "final acc (mean [95% t])": fmt("accuracy"),
                     "groups with variance": fmt("groups_with_variance_frac", "{:.2f}"),
                     "episodes / step": fmt("episodes_per_step", "{:.0f}"), "step s": fmt("step_s", "{:.1f}"),
                     "gen tok/s": fmt("gen_tokens_per_s", "{:.0f}")})
    lines = [metrics_lib.markdown_table(rows), ""]
    for c in out["comparisons"]:
        per_seed = ", ".join(f"{s}: {r['estimate']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]"
                             for s, r in c["per_seed"].items())
        lines.append(f"{c['before']} -> {c['after']}: mean {c['estimate']:+.3f} [{c['lo']:+.3f}, {c['hi']:+.3f}] "
                     f"over {c['n']} seed(s) (per seed, paired over held-out questions: {per_seed}; "
                     f"a significant gain in seeds {c['seeds_gaining']}, a loss in {c['seeds_losing']})")
    return "\n".join(lines)


def plot_strategies(out: Mapping, path: str) -> str:
    """Final held-out accuracy per strategy: each seed a dot, the mean with its t interval a bar."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(1.8 + 1.4 * len(out["strategies"]), 3.6))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for i, name in enumerate(out["strategies"]):
        s = out["per_strategy"][name]
        if "accuracy" not in s:
            continue
        ci = s["accuracy"]
        ax.bar(i, ci["estimate"], color="#9ecae1", yerr=[[ci["estimate"] - ci["lo"]], [ci["hi"] - ci["estimate"]]],
               capsize=6)
        accs = [row["accuracy"] for row in s["per_seed"].values() if row.get("accuracy") is not None]
        ax.scatter(np.full(len(accs), i), accs, color="#08519c", zorder=3, s=18)
        if "start_accuracy" in s:
            ax.hlines(s["start_accuracy"]["estimate"], i - 0.4, i + 0.4, colors="grey", linestyles="dashed")
    ax.set_xticks(range(len(out["strategies"])), out["strategies"])
    ax.set_ylabel("held-out accuracy")
    ax.set_title(f"seeds {out['seeds']} (dashed: the starting policy)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path
