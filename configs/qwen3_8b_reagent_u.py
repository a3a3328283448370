r"""Paper scale: Reagent-U on Qwen3-8B, one 8-GPU node (8xA800/H100/H200), the paper's settings.

  python launch/train.py --config=configs/qwen3_8b_reagent_u.py --workdir=/ckpt/reagent_u \
      --config.model.init_from=/ckpt/qwen3-8b-reagent-sft \
      --config.data.train_path=/data/reagent_rl_709k.jsonl --config.data.eval_path=/data/bamboogle.jsonl \
      --config.rrm.base_urls=http://rrm-host:8000/v1 --config.rrm.model=agent-rrm

Batch 32 questions x n=8, temperature 0.7, top-p 0.95, 13 agent turns (30 at evaluation), lr 5e-7,
300 steps; 64 cache slots x 16k tokens (~19 GB of bf16 KV cache per GPU next to the sharded
model); the Agent-RRM judge is served separately (launch/serve.py) and reached as a remote
judge. Not run in CI; `tests/test_configs.py` builds it and resolves its shardings with
`jax.eval_shape` on 8 simulated devices.
"""
import importlib.util
import os

import ml_collections


def _quickstart():
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quickstart.py")
    spec = importlib.util.spec_from_file_location("reagent_quickstart_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


# Variants for other slices (`--config=configs/qwen3_8b_reagent_u.py:v6e_8`): the same recipe with
# the sequence length (and so the rollout) cut to what fits the chips' HBM next to fp32 params +
# AdamW; the figures (launch/compile_check.py) are in docs/launching.md. Longer contexts on these
# chips need activation memory this project does not save yet (flash attention: issue 21).
VARIANTS = {
    # 8 x 80 GB (v5p:2x2x2 stands in for the compile check)
    "a800": dict(mesh="gpu8", num_slots=64, max_len=16384, prefill_chunk=2048, micro_batches=64),
    "v6e_8": dict(mesh="tpu_fsdp", num_slots=32, max_len=4096, prefill_chunk=2048, micro_batches=64),  # v6e:2x4
    "v5e_16": dict(mesh="tpu_fsdp", num_slots=16, max_len=2048, prefill_chunk=512, micro_batches=32),  # v5e:4x4
}


def get_config(variant: str = "a800") -> ml_collections.ConfigDict:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r} of the Qwen3-8B recipe; use one of {sorted(VARIANTS)}")
    v = VARIANTS[variant]
    c = _quickstart()
    c.stages = "grpo"
    c.strategy = "reagent_u"
    c.mesh = v["mesh"]
    del c["world"]
    c.data = ml_collections.ConfigDict(dict(train_path="", eval_path="", sft_path="", data_dir=""))
    c.tokenizer = ml_collections.ConfigDict(dict(kind="qwen3", vocab_size=0, path=""))
    c.model = ml_collections.ConfigDict(dict(
        init_from="", preset="qwen3-8b", hidden_size=4096, intermediate_size=12288, num_layers=36, num_heads=32,
        num_kv_heads=8, head_dim=128, rope_theta=1_000_000.0, param_dtype="float32", compute_dtype="bfloat16",
        remat_policy="full", attention="auto"))
    c.agent = ml_collections.ConfigDict(dict(max_turns=13, max_tokens_per_turn=2048, temperature=0.7, top_p=0.95,
                                             include_tool_schemas=True, tools="search,browse,python"))
    c.rollout = ml_collections.ConfigDict(dict(num_slots=v["num_slots"], max_len=v["max_len"],
                                               prefill_chunk=v["prefill_chunk"], decode_steps=16, kv_page_size=0, kv_pages=0, kv_dtype=""))
    c.grpo = ml_collections.ConfigDict(dict(
        steps=300, questions_per_step=32, n=8, learning_rate=5e-7, warmup_steps=0, beta=0.0, kl_kind="k3",
        policy_loss="vanilla", fused_head=True, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0, advantage="grpo",
        loss_agg_mode="token-mean",
        micro_batches=v["micro_batches"], mini_batches=1, old_logprobs="rollout", drop_equal_reward_groups=True, mask_overlong=True,
        max_grad_norm=1.0))
    c.rrm.judge = "remote"
    c.rrm.lam = 0.3
    c.eval = ml_collections.ConfigDict(dict(num_questions=125, max_turns=30, greedy=True, refinement=True))
    c.checkpoint = ml_collections.ConfigDict(dict(every=20, keep=3))
    return c
