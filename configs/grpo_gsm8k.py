r"""Plain single-turn GRPO (no agent loop, no tools): SmolLM2-135M-Instruct on GSM8K with the rule
reward, on a 2-core CPU. The entry point TRL's `GRPOTrainer(reward_funcs=...)` gives, over this
project's engine, train step, checkpoints and metrics (`reagent_jax/pipelines/grpo.py`).

  python launch/train.py --config=configs/grpo_gsm8k.py --workdir=/tmp/grpo_gsm8k

Rewards by name (`rewards.REWARD_FNS`): `answer` (the final \boxed{} answer against the record's
answer; math equivalence for GSM8K) weighted 1, `boxed` (the format) weighted 0.1. Held-out: the
first `eval.num_questions` GSM8K test questions, greedy, before and after GRPO. Your own reward
functions: `pipelines.grpo.run(config, workdir, reward_fns={"name": fn})` with
fn(completion_text, record) -> float. On a GPU: raise grpo.steps / questions_per_step /
eval.num_questions and use `model.compute_dtype=bfloat16`.
"""
import os

import ml_collections

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.pipeline = "grpo"
    c.seed = 0
    c.mesh = "single"
    c.data = ml_collections.ConfigDict(dict(
        train_path=os.path.normpath(os.path.join(_DATA, "train", "gsm8k_train.jsonl")),
        eval_path=os.path.normpath(os.path.join(_DATA, "benchmarks", "gsm8k_full.jsonl")),
        data_dir=""))  # data_dir: where tfds: datasets are built
    c.tokenizer = ml_collections.ConfigDict(dict(kind="checkpoint", vocab_size=0, path=""))
    c.model = ml_collections.ConfigDict(dict(
        init_from="smollm2", preset="", hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100000.0, param_dtype="float32", compute_dtype="float32",
        remat_policy="none", attention="auto"))
    c.rewards = "answer,boxed"
    c.reward_weights = "1.0,0.1"
    c.prompt = ml_collections.ConfigDict(dict(
        system="Solve the math problem step by step. Put the final answer in \\boxed{}.",
        temperature=0.8, top_p=1.0, max_new_tokens=192))
    c.rollout = ml_collections.ConfigDict(dict(num_slots=16, max_len=512, prefill_chunk=256, decode_steps=8, kv_page_size=0, kv_pages=0, kv_dtype=""))
    c.grpo = ml_collections.ConfigDict(dict(
        steps=8, questions_per_step=4, n=4, learning_rate=5e-6, warmup_steps=0, beta=0.0, kl_kind="k3",
        policy_loss="vanilla", fused_head=True, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0, advantage="grpo",
        loss_agg_mode="token-mean",
        micro_batches=4, mini_batches=1, old_logprobs="rollout", drop_equal_reward_groups=True, mask_overlong=False,
        max_grad_norm=1.0))
    c.eval = ml_collections.ConfigDict(dict(num_questions=40))
    c.checkpoint = ml_collections.ConfigDict(dict(every=20, keep=1))
    return c
