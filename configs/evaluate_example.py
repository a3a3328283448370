r"""Benchmark evaluation of an agent policy (launch/evaluate.py), paper settings by default.

  python launch/evaluate.py --config=configs/evaluate_example.py --outdir=/tmp/eval \
      --config.policy.path=/ckpt/Qwen3-8B --config.benchmarks=bamboogle,hotpotqa,gsm8k_full,aime24 \
      --config.tools.search.url=http://127.0.0.1:8001/retrieve

  # the quickstart's policy (tokenizer found in workdir/tokenizer), 20 questions, 2 samples:
  python launch/evaluate.py --config=configs/evaluate_example.py --outdir=/tmp/eval_qs \
      --config.policy.path=/tmp/quickstart/grpo/final --config.benchmarks=bamboogle --config.limit=20 \
      --config.k=2 --config.rollout.max_len=2048 --config.agent.max_tokens_per_turn=256

  # GAIA (bring your own gaia.jsonl in the benchmark schema), Reagent-C with a served Agent-RRM:
  ... --config.benchmarks=gaia=/data/gaia.jsonl --config.reagent_c.enabled=True \
      --config.reagent_c.judge.base_url=http://127.0.0.1:8002/v1 --config.reagent_c.judge.model=agent-rrm

Outputs in --outdir: results.jsonl (one line per question: k trajectories with tool calls and
scores; rerunning skips the questions already there), summary.json, results.md, <benchmark>.png.
"""
import ml_collections


def _judge(max_tokens: int) -> ml_collections.ConfigDict:
    # kind: endpoint (any OpenAI-compatible server: base_url + model), policy (the evaluated model
    # itself, through its engine), or checkpoint (another model at `path`, loaded with its own engine).
    return ml_collections.ConfigDict(dict(kind="endpoint", base_url="", model="", api_key_env="OPENAI_API_KEY",
                                          path="", tokenizer="", max_tokens=max_tokens, max_concurrency=32))


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()
    c.seed = 0
    c.mesh = "single"  # or a reagent_jax.parallel.MESH_PRESETS name
    # HF checkpoint dir or reagent_jax params dir (e.g. workdir/grpo/final); tokenizer "" = found next
    # to it (workdir/tokenizer) or the real Qwen3 one. dtype applies to HF checkpoints.
    c.policy = ml_collections.ConfigDict(dict(path="", tokenizer="", dtype="bfloat16", name="policy"))

    # Comma-separated: names in the benchmark directory ($REAGENT_BENCHMARK_DIR or shared/data/benchmarks),
    # paths, tfds:reagent_benchmark/NAME specs (built under data_dir, else $TFDS_DATA_DIR; see
    # docs/data.md), or name=path pairs. limit: first N questions of each (0 = all).
    c.benchmarks = "bamboogle,hotpotqa,2wiki,musique,gsm8k_full,math500,aime24,aime25"
    c.data_dir = ""
    c.limit = 0
    c.k = 4                 # episodes per question: avg@k and pass@k
    c.greedy = False        # True: temperature 0 (then use k=1)
    c.max_parallel = 128    # episodes in flight
    # The run exits 1 (after writing every report) when more samples than this failed (an engine
    # error, a request the engine refused, a scoring error; they are scored wrong and counted in the
    # table's `failed`); -1 never fails the run.
    c.max_failed_samples = 0

    # Tool set per benchmark name, source or kind (math / qa), then "default".
    c.tool_sets = ml_collections.ConfigDict(dict(
        gaia="search,browse,python,file_reader,image2text,audio2text", math="python", qa="search,browse",
        default="search,browse,python"))
    # Per-tool settings (empty values = the tool's environment defaults, see agent/tools/*).
    c.tools = ml_collections.ConfigDict(dict(
        search=dict(backend="", corpus="", url="", topk=3),
        browse=dict(page_store=""),
        python=dict(timeout_s=30.0)))

    c.agent = ml_collections.ConfigDict(dict(max_turns=30, max_tokens_per_turn=2048, temperature=0.7, top_p=0.95,
                                             include_tool_schemas=True, system_prompt="", final_step_message=""))
    # Bucket lists (comma-separated ints, "" = engine defaults) fix the kernel shapes: fewer compilations.
    c.rollout = ml_collections.ConfigDict(dict(num_slots=64, max_len=32768, prefill_chunk=1024, decode_steps=8,
                                               length_buckets="", row_buckets="", window_buckets="", kv_page_size=0, kv_pages=0, kv_dtype=""))

    # method: rule (EM / F1 / math equivalence) or llm (a judge with the rule as fallback).
    c.scoring = ml_collections.ConfigDict(dict(method="rule", correct_threshold=1.0, judge=_judge(1024)))
    # Reagent-C: an Agent-RRM critiques each first attempt, the agent tries again; both are reported.
    c.reagent_c = ml_collections.ConfigDict(dict(enabled=False, judge=_judge(2048)))
    return c
