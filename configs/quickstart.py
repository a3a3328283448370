r"""CPU quickstart: a tiny Qwen3 agent learns to search and compute on the synthetic world.

  python launch/train.py --config=configs/quickstart.py --workdir=/tmp/quickstart

Stages: random init -> SFT on expert trajectories -> GRPO with the rule reward, then a table of
held-out accuracy for each policy. Override anything: `--config.grpo.steps=10`,
`--config.strategy=reagent_u`, `--config.stages=sft`.
"""
import ml_collections


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 1  # init + sampling; tiny runs swing with it (BENCHMARKS.md, quickstart section)
    c.stages = "sft,grpo"           # comma-separated, run in order; each resumes if interrupted
    c.strategy = "grpo"             # grpo | reagent_c | reagent_r | reagent_u (Agent-RRM strategies)
    c.mesh = "single"               # a reagent_jax.parallel.MESH_PRESETS name

    # Task: the synthetic world (fictional entities; search + python questions).
    # Level-1/2 questions over 12 entities: 1800 distinct training questions, so SFT's 8000
    # demonstrations show each about 4 times (it must learn to copy names and values rather than
    # memorise each question's answer); 200 unseen questions held out and all evaluated, so a run's own
    # 95% interval of its SFT -> GRPO change is about +-0.06 (80 gave +-0.1; EXPERIMENTS.md, session 47).
    c.world = ml_collections.ConfigDict(dict(seed=0, n_entities=12, n_questions=2000, heldout_fraction=0.1,
                                             level_weights=(0.5, 0.5, 0.0), search_topk=1,
                                             operators=("plus", "minus", "times")))
    # A compact BPE trained on the world's texts (the real Qwen3 tokenizer is used for real checkpoints);
    # numbers of up to 4 digits become single tokens, the same token after a space, a bracket or a
    # brace, so copying a value into code or into \boxed{} is one identical token, not four.
    c.tokenizer = ml_collections.ConfigDict(dict(kind="compact", vocab_size=2048, path="", max_digits=4))

    # Model: a tiny Qwen3 (fp32 on CPU). `init_from` may be an HF dir or a reagent_jax params dir.
    c.model = ml_collections.ConfigDict(dict(
        init_from="", hidden_size=128, intermediate_size=384, num_layers=4, num_heads=4, num_kv_heads=2,
        head_dim=32, rope_theta=10000.0, param_dtype="float32", compute_dtype="float32", remat_policy="none",
        attention="auto"))

    c.agent = ml_collections.ConfigDict(dict(max_turns=6, max_tokens_per_turn=96, temperature=0.7, top_p=1.0,
                                             include_tool_schemas=False, tools="search,python"))
    c.rollout = ml_collections.ConfigDict(dict(num_slots=64, max_len=768, prefill_chunk=256, decode_steps=8, kv_page_size=0, kv_pages=0, kv_dtype=""))

    # context_loss_weight: also model tool responses and the question (weight 1.0), which teaches a
    # random-init model to copy names and numbers far sooner; 0 for pretrained checkpoints.
    # by_hand_fraction: half of the expert demonstrations do the arithmetic in their text (correctly)
    # instead of calling python. The tiny student cannot compute in its head, so after SFT it guesses
    # on the questions where it picks that habit; GRPO's reward teaches it to use the python tool, which
    # transfers to unseen questions (the SFT -> GRPO gain of the final table). Set 0 for an all-python SFT.
    # critique_fraction: this share of the questions also gets a Reagent-C demonstration (an attempt out
    # of the loss, the rule judge's critique, the expert's retry), so a policy can use a critique at all.
    c.sft = ml_collections.ConfigDict(dict(steps=1000, batch_size=8, micro_batches=1, learning_rate=6e-3,
                                           warmup_steps=20, max_len=768, context_loss_weight=1.0,
                                           by_hand_fraction=0.5, num_examples=0, critique_fraction=0.0))
    c.grpo = ml_collections.ConfigDict(dict(
        steps=10, questions_per_step=8, n=8, learning_rate=2e-4, warmup_steps=0, beta=0.0, kl_kind="k3",
        policy_loss="vanilla", fused_head=True, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0, advantage="grpo",
        loss_agg_mode="token-mean",
        micro_batches=2, mini_batches=1, old_logprobs="rollout", drop_equal_reward_groups=True, mask_overlong=False,
        max_grad_norm=1.0))
    # Agent-RRM (used when strategy != grpo). judge: rule (the synthetic world's annotator),
    # local (a tiny RRM trained by the rrm_sft / rrm_grpo stages), remote (OpenAI-compatible),
    # evalplanner (a pairwise EvalPlanner judge from the run in judge_dir, for Reagent-R: group win rates).
    c.rrm = ml_collections.ConfigDict(dict(judge="rule", lam=0.3, refine_below=1.0, max_len=1536,
                                           max_new_tokens=160, base_urls="", model="", judge_dir="",
                                           judge_format="plan_execute", restate_question=False))
    c.rrm_sft = ml_collections.ConfigDict(dict(steps=200, batch_size=8, micro_batches=1, learning_rate=3e-3,
                                               warmup_steps=20, max_len=1536))
    c.rrm_grpo = ml_collections.ConfigDict(dict(
        steps=10, questions_per_step=8, n=4, learning_rate=2e-4, warmup_steps=0, beta=0.0, kl_kind="k3",
        policy_loss="vanilla", fused_head=True, eps_low=0.2, eps_high=0.28, dual_clip_c=3.0, advantage="grpo",
        loss_agg_mode="token-mean",
        micro_batches=2, mini_batches=1, old_logprobs="rollout", drop_equal_reward_groups=True, mask_overlong=True,
        max_grad_norm=1.0))

    c.eval = ml_collections.ConfigDict(dict(num_questions=200, n=1, max_turns=6, greedy=True, refinement=False,
                                            selective_below=0.5, rrm_items=40))
    c.checkpoint = ml_collections.ConfigDict(dict(every=50, keep=2))
    return c
