r"""CPU quickstart for EvalPlanner: a tiny plan-then-judge evaluator on the synthetic pairwise task.

  python launch/train.py --config=configs/evalplanner_quickstart.py --workdir=/tmp/judge

Task: held-out questions of the synthetic world with the facts they need; response A or B is the
right answer, the other has one flaw (misread or guessed value, wrong arithmetic, no \boxed{}).
Stages: seed judge (SFT on a scripted judge that is wrong 30% of the time) -> round-1 chains
(|P| plans x |E| executions x 2 orders per instruction) -> SFT on correct chains -> DPO round 1
-> fresh instructions, chains from the round-1 judge -> DPO round 2. Pairwise and
position-consistent accuracy after every stage. Ablations:
  --config.judge.format=verdict_only             no planning (bare verdicts)
  --config.chains.num_plans=1 --config.chains.num_executions=2   fewer chains per instruction
  --config.stages=judge_data,judge_sft,judge_dpo --config.model.init_from=DIR/judge_seed/final
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.pipeline = "evalplanner"
    c.seed = 0
    c.stages = "judge_seed,judge_data,judge_sft,judge_dpo"  # in this order; each resumes / is skipped when done
    c.mesh = "single"

    # Task: the synthetic world (see reagent_jax/worlds/pairwise.py).
    c.world = ml_collections.ConfigDict(dict(seed=0, n_entities=40, n_questions=400, heldout_fraction=0.2,
                                             level_weights=(0.5, 0.5, 0.0)))
    c.data = ml_collections.ConfigDict(dict(
        source="synthetic",       # synthetic | jsonl (train_paths, eval_paths) | math (math_path, eval_paths)
        response_kind="answer",   # answer | trajectory (synthetic only)
        flaws="",                 # comma-separated subset of the flaws ("" = all)
        train_paths="", eval_paths="", math_path="", math_samples=8,
        data_dir="",              # where tfds: datasets in train_paths / eval_paths are built
        num_seed=96, num_per_round=16, num_eval=24))
    c.tokenizer = ml_collections.ConfigDict(dict(kind="compact", vocab_size=1024, path=""))
    c.model = ml_collections.ConfigDict(dict(
        init_from="", hidden_size=64, intermediate_size=192, num_layers=2, num_heads=4, num_kv_heads=2,
        head_dim=16, rope_theta=10000.0, param_dtype="float32", compute_dtype="float32", remat_policy="none",
        attention="auto"))

    c.judge = ml_collections.ConfigDict(dict(format="plan_execute", temperature=0.8, top_p=0.95,
                                             max_plan_tokens=64, max_execution_tokens=80, enable_thinking=False))
    # Chains per instruction: num_plans x num_executions x 2 orders (paper: 5 x 8); source "model"
    # samples them with the judge being trained, "teacher" with the scripted judge.
    c.chains = ml_collections.ConfigDict(dict(source="model", num_plans=2, num_executions=4, pairing="one_to_one"))

    # formats: the seed judge learns each listed format (one seed for the plan / no-plan ablation).
    c.seed_judge = ml_collections.ConfigDict(dict(teacher_error_rate=0.3, formats="plan_execute,verdict_only",
                                                  steps=100, batch_size=8, micro_batches=1, learning_rate=3e-3,
                                                  warmup_steps=10, max_len=576))
    c.sft = ml_collections.ConfigDict(dict(steps=16, batch_size=8, micro_batches=1, learning_rate=1e-3,
                                           warmup_steps=2, max_len=576))
    c.dpo = ml_collections.ConfigDict(dict(rounds=2, steps=16, batch_size=4, micro_batches=1, learning_rate=5e-4,
                                           warmup_steps=2, beta=0.1, loss_type="sigmoid", label_smoothing=0.0,
                                           nll_coef=0.0, max_len=576))
    c.rollout = ml_collections.ConfigDict(dict(num_slots=64, max_len=640, prefill_chunk=512, decode_steps=16, kv_page_size=0, kv_pages=0, kv_dtype=""))
    c.eval = ml_collections.ConfigDict(dict(both_orders=True))
    c.checkpoint = ml_collections.ConfigDict(dict(every=50, keep=2))
    return c
