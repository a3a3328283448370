"""The ahead-of-time compile check: every program of a tiny run compiled for real TPU topologies by
XLA's TPU compiler on this CPU host (libtpu from `jax[tpu]`), and what the compiled HLO shows:
FSDP weight all-gathers inside the layer scan, gradient reductions into the shards, no
all-reduce of full-vocabulary logits, and the HLO statistics themselves on hand-written HLO."""
import json
import os
import subprocess
import sys

import pytest

from reagent_jax.aot import hlo_stats

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# A tiny agent run: SFT + GRPO (beta > 0: a reference pass) + the engine, vocabulary 1024 so
# that a full-vocabulary logits chunk ([rows, 64, 1024] fp32) is easy to tell from everything else;
# fp32 like the quickstart, where this AVX-512 CPU host would pick its own CPU kernels.
TINY = ["--config.model.hidden_size=64", "--config.model.intermediate_size=128", "--config.model.num_layers=3",
        "--config.model.num_heads=4", "--config.model.num_kv_heads=2", "--config.model.head_dim=16",
        "--config.tokenizer.vocab_size=1024",
        "--config.sft.batch_size=8", "--config.sft.max_len=128", "--config.grpo.questions_per_step=2",
        "--config.grpo.n=4", "--config.grpo.micro_batches=1", "--config.grpo.beta=0.04",
        "--config.rollout.max_len=128", "--config.rollout.num_slots=8", "--config.rollout.prefill_chunk=64"]


def _libtpu_or_skip():
    try:
        import libtpu  # noqa: F401
    except ImportError:
        pytest.skip("libtpu is not installed (pip install \"jax[tpu]==<the pinned jax>\"), so no TPU compiler")


def _run(topology, tmp_path, *extra):
    out = tmp_path / f"{topology.replace(':', '_')}.json"
    hlo = tmp_path / f"hlo_{topology.replace(':', '_')}"
    cmd = [sys.executable, "launch/compile_check.py", "--config=configs/quickstart.py", f"--topology={topology}",
           f"--json_out={out}", f"--hlo_dir={hlo}", *TINY, *extra]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    if "cannot get TPU topology" in proc.stderr:
        pytest.skip(f"libtpu cannot load here: {proc.stderr[-300:]}")
    return proc, (json.loads(out.read_text()) if out.exists() else None), hlo


@pytest.fixture(scope="module", params=["v5e:2x2", "v5p:2x2x2"])
def compiled(request, tmp_path_factory):
    _libtpu_or_skip()
    proc, report, hlo = _run(request.param, tmp_path_factory.mktemp("aot"))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return request.param, proc.stdout, report, hlo


def test_every_program_of_the_run_compiles_and_fits(compiled):
    topology, stdout, report, _ = compiled
    names = [p["name"] for p in report["programs"]]
    assert names == ["sft/train_step", "grpo/train_step", "grpo/ref_logprobs", "rollout/prefill", "rollout/decode"]
    assert report["all_fit"] and all(p["fits"] and p["compiled"] for p in report["programs"])
    assert report["num_devices"] == {"v5e:2x2": 4, "v5p:2x2x2": 8}[topology]
    assert report["mesh"]["fsdp"] == report["num_devices"]  # the quickstart's "single" becomes FSDP over the slice
    for p in report["programs"]:
        assert 0 < p["program_bytes"] < p["budget_bytes"] and p["model_flops"] > 0 and p["roofline_s"] > 0
        assert p["total_bytes"] == pytest.approx(p["program_bytes"] + sum(p["resident"].values()))
    assert "| grpo/train_step | yes |" in stdout
    grpo = next(p for p in report["programs"] if p["name"] == "grpo/train_step")
    assert grpo["resident"]["engine KV cache"] > 0 and grpo["resident"]["reference params"] > 0


def test_the_engine_cache_is_the_runs_num_slots_over_every_chip(compiled):
    """rollout.num_slots is the run's total: on v5p:2x2x2 (2 hosts of 4 chips) each host's engine
    holds half the slots on its own chips, so the KV cache per chip is the run's whole cache over
    all chips, as on one host."""
    topology, _, report, _ = compiled
    tiny = {k.removeprefix("--config."): float(v) for k, v in (a.split("=") for a in TINY)}
    slots, fp32 = int(tiny["rollout.num_slots"]), 4
    whole = 2 * tiny["model.num_layers"] * slots * tiny["model.num_kv_heads"] * tiny["rollout.max_len"] * \
        tiny["model.head_dim"] * fp32  # k and v
    grpo = next(p for p in report["programs"] if p["name"] == "grpo/train_step")
    assert grpo["resident"]["engine KV cache"] == pytest.approx(whole / report["num_devices"])
    decode = next(p for p in report["programs"] if p["name"] == "rollout/decode")
    assert f"x {slots // (2 if topology == 'v5p:2x2x2' else 1)} slots" in decode["notes"]
    assert (f"this host's share of {slots}" in decode["notes"]) == (topology == "v5p:2x2x2")


def test_no_cpu_kernel_enters_a_tpu_program(compiled):
    """Kernel choices follow the mesh's devices: the host is a CPU, the programs are TPU programs,
    and the training / scoring passes run TPU splash attention (model.attention=auto)."""
    _, _, report, hlo = compiled
    assert report["model"]["attention"] == "auto"
    for p in report["programs"]:
        text = (hlo / (p["name"].replace("/", "__") + ".hlo.txt")).read_text()
        assert "reagent_sgemm" not in text and "reagent_decode_layers" not in text
        assert "reagent_vocab_logits" not in text
        if not p["name"].startswith("rollout/"):
            assert "attention splash" in p["notes"] and "splash_mqa_fwd" in text, p["name"]
            if p["name"].endswith("train_step"):
                assert "splash_mqa_dkv" in text and "splash_mqa_dq" in text  # the kernel's own backward


def test_parameters_are_split_over_every_chip(compiled):
    """fp32 params: each chip holds total / fsdp of them. The compiler's own figure for the
    logprob pass (params + two token arrays, padded to TPU tiles) stays below one whole copy of
    the params, which a replicated layout would need on every chip."""
    _, _, report, _ = compiled
    n = report["num_devices"]
    params = report["model"]["num_params"] * 4
    assert report["model"]["param_bytes_per_device"] == pytest.approx(params / n)
    ref = next(p for p in report["programs"] if p["name"] == "grpo/ref_logprobs")
    assert params / n < ref["argument_bytes"] < params


def _layer_scan_ops(text, kind):
    comps, entry = hlo_stats._computations(text)
    return [(ins, mult) for ins, mult, _ in hlo_stats._walk(comps, entry) if hlo_stats._kind(ins.op) == kind]


def test_hlo_shows_fsdp(compiled):
    """Per-layer weight all-gathers run inside the layer scan (executed layers x micro-batches
    times), gradients are reduced into the shards (a reduce-scatter; on v5p XLA writes it as an
    all-reduce + dynamic-slice of the same bytes), and no full-vocabulary logits block
    ([rows, chunk, 1024] fp32) is ever all-reduced or gathered."""
    topology, _, report, hlo = compiled
    text = (hlo / "grpo__train_step.hlo.txt").read_text()
    gathers = _layer_scan_ops(text, "all-gather")
    in_layer_scan = [m for ins, m in gathers if "layers/mlp" in ins.args or "layers/attn" in ins.args]
    assert in_layer_scan and min(in_layer_scan) >= 3, gathers[:5]  # 3 layers, once per executed layer
    grpo = next(p for p in report["programs"] if p["name"] == "grpo/train_step")
    reduced = grpo["collective_bytes"]["reduce-scatter"] + grpo["collective_bytes"]["all-reduce"]
    assert reduced > 0
    if topology == "v5e:2x2":
        assert grpo["collective_bytes"]["reduce-scatter"] > 0
    for kind in ("all-reduce", "all-gather", "all-to-all"):
        for ins, _ in _layer_scan_ops(text, kind):
            assert ",1024]" not in ins.type and ",1024}" not in ins.type, (kind, ins.type)
    assert grpo["link_vs_min"] <= 1.5, grpo


# The engine's programs at TPU-shaped minor dims (bf16, head_dim 128: a tiny cache would be staged
# in on-chip memory whatever its layout), 2 KV heads -> tensor 2 x data 2 on v5e:2x2.
ENGINE = ["--config.model.hidden_size=256", "--config.model.intermediate_size=512", "--config.model.num_layers=2",
          "--config.model.num_heads=4", "--config.model.num_kv_heads=2", "--config.model.head_dim=128",
          "--config.model.compute_dtype=bfloat16", "--config.tokenizer.vocab_size=1024",
          "--config.rollout.max_len=2048", "--config.rollout.num_slots=16", "--config.rollout.prefill_chunk=128",
          "--config.sft.max_len=128", "--config.grpo.micro_batches=1", "--only=rollout"]


def test_engine_programs_read_their_tensor_parallel_shard_and_copy_no_cache(tmp_path):
    """The engine runs on its own layout: bf16 weights split over the tensor axis and read where
    they lie (the weights each chip takes = total / tensor; no weight all-gather in decode, where
    the trainer's FSDP layout gathered every layer per step), and no cache-sized copy in decode
    (a single all-layers scatter of the new K/V made XLA:TPU copy the cache twice per step).
    Decode attention is the ragged kernel, which reads each slot up to its own length."""
    _libtpu_or_skip()
    proc, report, hlo = _run("v5e:2x2", tmp_path, *ENGINE)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    progs = {p["name"]: p for p in report["programs"]}
    assert set(progs) == {"rollout/prefill", "rollout/decode"}
    n = report["model"]["num_params"]
    norms = 2 * (2 * 256 + 2 * 128) + 256  # replicated RMSNorm scales
    for p in progs.values():
        assert "engine mesh data 2 x tensor 2" in p["notes"]
        assert p["weight_bytes"] == pytest.approx((n - norms) * 2 / 2 + norms * 2)  # bf16, split over tensor 2
        assert p["fits"] and p["resident"]["trainer params"] > 0
    decode = progs["rollout/decode"]
    assert decode["large_copies"] == [], decode["large_copies"]
    assert decode["collective_bytes"]["all-gather"] < 0.01 * decode["weight_bytes"]
    # the ragged Pallas kernel lowered for TPU (Mosaic) inside the layer scan, and slots of mixed
    # lengths read their own blocks: within 1.3x of the weights + live KV
    assert "decode attention ragged" in decode["notes"]
    assert 'custom_call_target="tpu_custom_call"' in (hlo / "rollout__decode.hlo.txt").read_text()
    assert decode["mixed_lengths"]["vs_min"] <= 1.3, decode["mixed_lengths"]


def test_paged_engine_reads_its_pages_in_place(tmp_path):
    """A paged KV cache (`rollout.kv_page_size`): the pool (64 pages x 128 = half of 16 slots x
    2048) is what the programs hold, decode's ragged kernel reads each slot's pages where they
    lie (no window gathered, no cache-sized copy) and each shard writes its slots' new K/V into
    its own pages, and mixed lengths still read within 1.3x of the weights + live KV."""
    _libtpu_or_skip()
    proc, report, hlo = _run("v5e:2x2", tmp_path, *ENGINE, "--config.rollout.kv_page_size=128",
                             "--config.rollout.kv_pages=64")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    decode = {p["name"]: p for p in report["programs"]}["rollout/decode"]
    assert "paged KV: 64 pages x 128" in decode["notes"] and "decode attention ragged" in decode["notes"]
    assert decode["large_copies"] == [], decode["large_copies"]
    assert 'custom_call_target="tpu_custom_call"' in (hlo / "rollout__decode.hlo.txt").read_text()
    assert decode["mixed_lengths"]["vs_min"] <= 1.3, decode["mixed_lengths"]
    assert decode["mixed_lengths"]["fits"] is False  # 16 slots of 128-2047 tokens need ~70 pages
    # each data shard writes its own slots' new K/V into its own pages: nothing of them crosses a
    # link (writing through global page ids all-gathered 135 KB of them per call); what is left
    # is the sampler's few bytes, less than one layer's new K of the 16 slots (2 heads x 128 bf16)
    assert decode["collective_bytes"]["all-gather"] < 16 * 2 * 128 * 2, decode["collective_bytes"]
    # the cache arguments: K and V pools of 2 layers x 64 x 128 positions x 2 heads x 128 bf16, over 4 chips
    pool = 2 * 2 * 64 * 128 * 2 * 128 * 2 / 4
    assert decode["argument_bytes"] == pytest.approx(decode["weight_bytes"] + pool, rel=0.02)


def test_an_fp8_cache_is_written_and_read_where_it_lies(tmp_path):
    """An fp8 KV cache with 2 heads per chip, which XLA:TPU lays out positions second-minor:
    the decode writes head by head and its kernel reads the [L, N, K, S, D] view, so no program
    relays the cache out (addressed as [.., S, K, D] it was copied out and back in every decode
    call); the programs hold half the bf16 cache. Contiguous and paged (whose prefill copies
    are its rows' gathered windows, as in bf16: the XLA paged path)."""
    _libtpu_or_skip()
    heads = ["--config.model.num_kv_heads=4", "--config.rollout.kv_dtype=float8_e4m3fn"]
    for paged in ([], ["--config.rollout.kv_page_size=128", "--config.rollout.kv_pages=64"]):
        proc, report, _ = _run("v5e:2x2", tmp_path, *ENGINE, *heads, *paged)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        progs = {p["name"]: p for p in report["programs"]}
        for p in progs.values() if not paged else [progs["rollout/decode"]]:
            assert p["large_copies"] == [], (p["name"], p["large_copies"])
        # K and V: 2 layers x (16 slots x 2048 | 64 pages x 128) x 4 heads x 128 x 1 byte, over 4 chips
        cache = 2 * 2 * (64 * 128 if paged else 16 * 2048) * 4 * 128 / 4
        decode = progs["rollout/decode"]
        assert decode["argument_bytes"] == pytest.approx(decode["weight_bytes"] + cache, rel=0.02)


def test_a_program_over_budget_fails_with_the_compilers_numbers(tmp_path):
    _libtpu_or_skip()
    proc, report, _ = _run("v5e:2x2", tmp_path, "--hbm_gib=0.001", "--only=grpo/train_step")
    assert proc.returncode == 1 and report is not None and not report["all_fit"]
    (p,) = report["programs"]
    assert p["compiled"] and not p["fits"] and p["total_bytes"] > 0.001 * 1024 ** 3
    assert "| grpo/train_step | no |" in proc.stdout


def test_unknown_topology_is_named():
    proc = subprocess.run([sys.executable, "launch/compile_check.py", "--config=configs/quickstart.py",
                           "--topology=v9x:1x1"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "cannot get TPU topology 'v9x:1x1'" in proc.stderr
    assert "v5e:2x2" in proc.stderr and "--topology=local" in proc.stderr  # what to use instead


HLO = """
HloModule m

%body (p: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %p = (s32[], f32[8,16]) parameter(0)
  %x = f32[8,16]{1,0} get-tuple-element(%p), index=1
  %ag = f32[32,16]{1,0} all-gather(%x), dimensions={0}
  %rs = f32[8,16]{1,0} reduce-scatter(%ag), dimensions={0}, to_apply=%add
  ROOT %t = (s32[], f32[8,16]) tuple(%i, %rs)
}

%cond (p: (s32[], f32[8,16])) -> pred[] {
  %p = (s32[], f32[8,16]) parameter(0)
  %c = s32[] constant(5)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: f32[8,16]) -> f32[8,16] {
  %a = f32[8,16]{1,0} parameter(0)
  %ar = bf16[4,4]{1,0} all-reduce(%a), to_apply=%add
  %w = (s32[], f32[8,16]) while(%t0), condition=%cond, body=%body
  %cp = (f32[8,16]{1,0}, f32[8,16]{1,0}, u32[], u32[]) collective-permute-start(%a), source_target_pairs={{0,1}}
  %in = (f32[64,64]{1,0:T(8,128)S(1)}, f32[64,64]{1,0:T(8,128)}, u32[]{:S(2)}) copy-start(%big)
  %vmem = f32[64,64]{1,0:T(8,128)S(1)} copy-done(%in)
  %back = (f32[64,64]{1,0:T(8,128)}, f32[64,64]{1,0:T(8,128)S(1)}, u32[]{:S(2)}) copy-start(%vmem)
  %out = f32[64,64]{1,0:T(8,128)} copy(%vmem)
  ROOT %big = f32[64,64]{1,0} copy(%a)
}
"""


def test_hlo_statistics_count_loop_bodies_by_their_trip_counts():
    by_kind = hlo_stats.collective_bytes(HLO)
    assert by_kind["all-gather"] == 5 * 32 * 16 * 4  # gathered result, 5 trips
    assert by_kind["reduce-scatter"] == 5 * 32 * 16 * 4  # the full operand
    assert by_kind["all-reduce"] == 8 * 16 * 4  # the larger of operand / result
    assert by_kind["collective-permute"] == 8 * 16 * 4 + 8  # the output (+ the two u32 contexts)
    assert hlo_stats.link_bytes(by_kind) == sum(by_kind.values()) + by_kind["all-reduce"]
    # staging into VMEM (S(1)) and back is not a second copy in HBM: only `big` counts
    assert hlo_stats.large_copies(HLO, 10_000) == [("big", 64 * 64 * 4, 1)]
    # ... unless it changes the layout on the way (a relayout: in HBM for a real model's array)
    relaid = HLO.replace("%out = f32[64,64]{1,0:T(8,128)} copy(%vmem)", "%out = f32[64,64]{0,1:T(8,128)} copy(%vmem)")
    assert {c[0] for c in hlo_stats.large_copies(relaid, 10_000)} == {"out", "big"}
    assert hlo_stats.shape_bytes("(bf16[2,3]{1,0}, s32[])") == 2 * 3 * 2 + 4


ASYNC_HLO = """
HloModule m

%start (a: bf16[1,256,64]) -> bf16[1,4096,64] {
  %a = bf16[1,256,64]{2,1,0} parameter(0)
  %ag.0 = bf16[1,4096,64]{2,1,0} all-gather(%a), channel_id=7, dimensions={1}
  ROOT %s = bf16[1,4096,64]{2,1,0} custom-call(%a, %ag.0), custom_call_target="AsyncCollectiveStart"
}

%async_collective_fusion.1 (a: bf16[1,256,64]) -> bf16[1,4096,64] {
  %a = bf16[1,256,64]{2,1,0} parameter(0)
  ROOT %ag.1 = bf16[1,4096,64]{2,1,0} all-gather(%a), channel_id=7, dimensions={1}
}

%done (a: bf16[1,256,64]) -> bf16[1,4096,64] {
  %a = bf16[1,256,64]{2,1,0} parameter(0)
  %ag.2 = bf16[1,4096,64]{2,1,0} all-gather(%a), channel_id=7, dimensions={1}
  %other = bf16[1,4096,64]{2,1,0} all-gather(%a), channel_id=8, dimensions={1}
  ROOT %d = bf16[1,4096,64]{2,1,0} custom-call(%a, %ag.2), custom_call_target="AsyncCollectiveDone"
}

%inner (p: (s32[], bf16[1,256,64])) -> (s32[], bf16[1,256,64]) {
  %p = (s32[], bf16[1,256,64]) parameter(0)
  %x = bf16[1,256,64]{2,1,0} get-tuple-element(%p), index=1
  %f1 = bf16[1,4096,64]{2,1,0} fusion(%x), kind=kCustom, calls=%async_collective_fusion.1
  ROOT %t = (s32[], bf16[1,256,64]) tuple(%i, %x)
}

%inner_cond (p: (s32[], bf16[1,256,64])) -> pred[] {
  %p = (s32[], bf16[1,256,64]) parameter(0)
  %c = s32[] constant(8)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

%body (p: (s32[], bf16[1,256,64])) -> (s32[], bf16[1,256,64]) {
  %p = (s32[], bf16[1,256,64]) parameter(0)
  %x = bf16[1,256,64]{2,1,0} get-tuple-element(%p), index=1
  %f0 = bf16[1,4096,64]{2,1,0} fusion(%x), kind=kCustom, calls=%start
  %w = (s32[], bf16[1,256,64]) while(%p), condition=%inner_cond, body=%inner
  %f2 = bf16[1,4096,64]{2,1,0} fusion(%x), kind=kCustom, calls=%done
  ROOT %t = (s32[], bf16[1,256,64]) tuple(%i, %x)
}

%cond (p: (s32[], bf16[1,256,64])) -> pred[] {
  %p = (s32[], bf16[1,256,64]) parameter(0)
  %c = s32[] constant(36)
  ROOT %lt = pred[] compare(%i, %c), direction=LT
}

ENTRY %main (a: bf16[1,256,64]) -> bf16[1,4096,64] {
  %a = bf16[1,256,64]{2,1,0} parameter(0)
  %w = (s32[], bf16[1,256,64]) while(%t0), condition=%cond, body=%body
  %r = bf16[1,4096,64]{2,1,0} all-gather(%a), channel_id=9, dimensions={1}
  ROOT %r2 = bf16[1,4096,64]{2,1,0} all-gather(%a), dimensions={1}
}
"""


def test_an_async_collective_split_over_fusions_counts_once():
    """The TPU compiler writes one async all-gather as a start fusion, continuation fusions (here
    inside an inner loop, overlapped with its compute) and a done fusion, each holding the op with
    the same channel_id. A real Qwen3-8B train step counted its weight gathers 3-32 times over
    before. Channels 7 and 8 run once per layer (36), 9 and the op without a channel once."""
    gathered = 4096 * 64 * 2
    assert hlo_stats.collective_bytes(ASYNC_HLO)["all-gather"] == 36 * 2 * gathered + 2 * gathered


def test_matmul_flops_count_every_executed_dot():
    """A dot in a 3-trip scan counts 3 times, batch dimensions included."""
    import jax
    import jax.numpy as jnp

    def f(a, b, q, k):
        c = jax.lax.scan(lambda c, _: (c @ b, None), a, None, length=3)[0]
        return c, jnp.einsum("hqd,hkd->hqk", q, k)

    args = (jnp.ones((16, 32)), jnp.ones((32, 32)), jnp.ones((4, 8, 16)), jnp.ones((4, 8, 16)))
    text = jax.jit(f).lower(*args).compile().as_text()
    assert hlo_stats.matmul_flops(text) == 3 * 2 * 16 * 32 * 32 + 2 * 4 * 8 * 8 * 16
