"""End-to-end EvalPlanner pipeline with a tiny judge: every stage runs, leaves its data,
checkpoint, metrics and evaluation, and a second run over the finished workdir redoes nothing."""
import importlib.util
import json
import os

import pytest

from reagent_jax.pipelines import evalplanner as pipeline

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def tiny_config():
    spec = importlib.util.spec_from_file_location("ep_qs", os.path.join(ROOT, "configs", "evalplanner_quickstart.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = mod.get_config()
    c.world.update(dict(n_entities=12, n_questions=40))
    c.data.update(dict(num_seed=4, num_per_round=3, num_eval=3))
    c.model.update(dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16))
    c.judge.update(dict(max_plan_tokens=8, max_execution_tokens=8))
    # Scripted chains (a judge this small writes no verdicts yet); the engine still runs every evaluation.
    c.chains.update(dict(source="teacher", num_plans=1, num_executions=2))
    c.seed_judge.update(dict(steps=2, batch_size=4, teacher_error_rate=0.5, formats="plan_execute"))
    c.sft.update(dict(steps=2, batch_size=4))
    c.dpo.update(dict(steps=3, batch_size=2))
    c.rollout.update(dict(num_slots=8, max_len=640, prefill_chunk=512, decode_steps=8))
    c.rollout.length_buckets = (512,)
    c.rollout.row_buckets = (8,)
    c.rollout.window_buckets = (640,)
    return c


def snapshot(workdir):
    """Every file's size and mtime (checkpoints included): a redone stage would change them."""
    out = {}
    for d, _, files in os.walk(workdir):
        for f in files:
            if f != "summary.json" and not f.endswith(".png"):
                st = os.stat(os.path.join(d, f))
                out[os.path.relpath(os.path.join(d, f), workdir)] = (st.st_size, st.st_mtime_ns)
    return out


def test_pipeline_runs_every_stage_and_resumes_without_redoing(tmp_path, capsys):
    workdir = str(tmp_path / "judge")
    summary = pipeline.run(tiny_config(), workdir)
    names = [row["judge"] for row in summary["table"]]
    assert names == ["seed", "sft", "dpo_r1", "dpo_r2"]
    for row in summary["table"]:
        assert 0.0 <= row["pairwise acc"] <= 1.0 and row["n"] == 3
    assert [d["round"] for d in summary["data"]] == [1, 2]
    assert summary["kernels"]["platform"] == "cpu" and summary["kernels"]["causal"] == "xla"
    for name in ("seed", "round1", "round2", "eval"):
        assert os.path.exists(os.path.join(workdir, "data", f"{name}.jsonl"))
    for d in ("judge_data", "judge_data_r2"):
        chains = [json.loads(x) for x in open(os.path.join(workdir, d, "chains.jsonl"))]
        assert len(chains) == 3 * 1 * 2 * 2  # triples x plans x orders x executions
        stats = json.load(open(os.path.join(workdir, d, "stats.json")))
        pairs = [json.loads(x) for x in open(os.path.join(workdir, d, "pairs.jsonl"))]
        assert stats["pairs"] == len(pairs) > 0 and stats["kept"] + stats["dropped"] == 3
    for stage, steps in (("judge_seed", 2), ("judge_sft", 2), ("judge_dpo_r1", 3), ("judge_dpo_r2", 3)):
        assert os.path.exists(os.path.join(workdir, stage, "final", "reagent_config.json"))
        rows = [json.loads(x) for x in open(os.path.join(workdir, stage, "metrics.jsonl"))]
        logged = [r for r in rows if "step" in r]
        assert [r["step"] for r in logged] == list(range(1, steps + 1))
        if stage.startswith("judge_dpo"):
            for key in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies",
                        "logps/chosen", "logps/rejected", "dpo/loss"):
                assert key in logged[-1]
            assert os.path.exists(os.path.join(workdir, stage, "ref_logps.npy"))
    for name in names:
        report = json.load(open(os.path.join(workdir, "eval", f"{name}.json")))
        assert report["all"]["n"] == 3
        assert len(open(os.path.join(workdir, "eval", f"{name}.jsonl")).readlines()) == 6  # both orders
    out = capsys.readouterr().out
    assert "pos-consistent acc" in out and "dpo_r2" in out

    before = snapshot(workdir)
    again = pipeline.run(tiny_config(), workdir)
    assert snapshot(workdir) == before  # no stage, data round or evaluation was redone
    assert again["table"] == summary["table"] and again["data"] == summary["data"]


def test_stage_names_and_order_are_checked():
    assert pipeline.parse_stages("judge_data, judge_dpo") == ["judge_data", "judge_dpo"]
    with pytest.raises(ValueError, match="unknown stages"):
        pipeline.parse_stages("judge_data,grpo")
    with pytest.raises(ValueError, match="out of order"):
        pipeline.parse_stages("judge_dpo,judge_sft")


def test_reference_logprob_cache_is_tied_to_its_pairs_and_survives_a_torn_write(tmp_path):
    """run_dpo's <stage>/ref_logps.npy is reused only for the same pairs; a file cut by a kill or
    written for other pairs of the same count is recomputed (None), never trusted."""
    import numpy as np
    from reagent_jax.evalplanner.training import _cached_reference, _pairs_key, _save_reference

    def row(*ids):
        return {"tokens": list(ids), "loss_mask": [0] + [1] * (len(ids) - 1)}

    pairs = [{"chosen": row(1, 2, 3), "rejected": row(1, 4)}, {"chosen": row(5, 6), "rejected": row(5, 7, 8)}]
    other = [pairs[0], {"chosen": row(5, 6), "rejected": row(5, 7, 9)}]  # one token differs
    key = _pairs_key(pairs, 64)
    assert key != _pairs_key(other, 64) and key != _pairs_key(pairs, 32) and key == _pairs_key(list(pairs), 64)
    path = str(tmp_path / "ref_logps.npy")
    assert _cached_reference(path, key, 2) is None  # nothing cached yet
    ref = np.array([[-1.5, -2.5], [-3.0, -0.5]], np.float32)
    _save_reference(path, key, ref)
    np.testing.assert_array_equal(_cached_reference(path, key, 2), ref)
    assert _cached_reference(path, _pairs_key(other, 64), 2) is None
    assert _cached_reference(path, key, 3) is None
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) - 5])  # torn by a kill mid-write
    assert _cached_reference(path, key, 2) is None
    _save_reference(path, key, ref)
    (tmp_path / "ref_logps.npy.key").unlink()  # killed between the array and its key
    assert _cached_reference(path, key, 2) is None


@pytest.mark.parametrize("batch,micro,rows,want", [
    (8, 2, 100, (8, 2)),   # fits: unchanged
    (8, 4, 6, (4, 4)),     # shrunk to the data, rounded down to a multiple of micro_batches
    (8, 4, 3, (3, 3)),     # fewer rows than micro-batches: one row each
    (8, 1, 5, (5, 1)),
])
def test_fit_batch_keeps_micro_batches_bounded(batch, micro, rows, want):
    """Micro-batches bound memory: a shrunk batch never merges them into one bigger micro-batch."""
    from reagent_jax.evalplanner.training import fit_batch
    from reagent_jax.rl.stage_config import DPOConfig
    out = fit_batch(DPOConfig(batch_size=batch, micro_batches=micro, steps=3, learning_rate=1e-3, beta=0.2), rows)
    assert (out.batch_size, out.micro_batches) == want and out.steps == 3 and out.beta == 0.2  # the rest is kept
    assert out.batch_size % out.micro_batches == 0
    assert out.batch_size // out.micro_batches <= max(1, batch // micro)
