#!/usr/bin/env bash
# The GPU figures of BENCHMARKS.md on one NVIDIA GPU (written for an H200; any 80+ GB card):
#   part 1: the cuDNN attention oracle tests, then the Qwen3-1.7B-shaped GRPO train step
#           (bf16 compute, fp32 weights + AdamW) with cuDNN vs XLA attention;
#   part 2: the Qwen3-8B-shaped train step (bf16 weights + AdamW, full remat); its decode call
#           alone (64 live slots of 256..4096 cached tokens) in both KV cache axis orders; the
#           engine decoding 64 prompts of mixed lengths (256..4096 tokens); both against the HBM
#           roofline.
# Random weights: throughput does not depend on them. Each figure is a JSON file in OUTDIR.
#   decode_kernel: probes of the decode call alone (BENCHMARKS.md found each layer's cache window
#           and weights copied out of the stacked arrays in every step): the batched-dot vs the
#           multiply-reduce attention form, then XLA's dynamic-slice fusion; the cuDNN tests.
#   launch/bench_gpu.sh OUTDIR [1|2|all|decode_kernel]
set -u
out=${1:?usage: launch/bench_gpu.sh OUTDIR [1|2|all|decode_kernel]}
part=${2:-all}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export JAX_PLATFORMS=cuda XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

section() {  # name, time limit (s), command...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  echo "== $name (limit ${limit}s)"
  timeout "$limit" "$@" 2>&1 | grep -v "^I0000\|^W0000" | tail -n 40
  echo "== $name: rc=${PIPESTATUS[0]} in $((SECONDS - t0))s"
}
bench() { local name=$1 limit=$2; shift 2; section "$name" "$limit" python3 launch/bench.py --json_out="$out/$name.json" "$@"; }

cudnn_tests() { section cudnn_tests 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/test_cudnn_attention.py; }
decode_kernel_8b() {  # name suffix, extra flags...
  local suffix=$1; shift
  bench "decode_kernel_8b$suffix" 200 --mode=decode_kernel --preset=qwen3-8b --dtype=bfloat16 --param_dtype=bfloat16 \
    --batch=64 --min_prompt=256 --prompt_len=4096 --decode_steps=16 --iters=3 "$@"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import jax, flax, optax; print('jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, jax.devices())"

if [[ $part == 1 || $part == all ]]; then
  cudnn_tests
  bench train_1p7b 240 --mode=train_step --preset=qwen3-1.7b --dtype=bfloat16 --batch=4 --seq_len=4096 --iters=3 \
    --attention=auto,xla
fi
if [[ $part == decode_kernel ]]; then
  decode_kernel_8b _forms --decode_forms=einsum,reduce
  XLA_FLAGS="${XLA_FLAGS:-} --xla_gpu_enable_dynamic_slice_fusion=true" decode_kernel_8b _dsfusion --decode_forms=einsum,reduce
  cudnn_tests
fi
if [[ $part == 2 || $part == all ]]; then
  bench train_8b 260 --mode=train_step --preset=qwen3-8b --dtype=bfloat16 --param_dtype=bfloat16 --remat=full \
    --batch=4 --seq_len=2048 --iters=3
  decode_kernel_8b "" --kv_orders=lnskd,lnksd
  bench decode_8b 260 --mode=decode --preset=qwen3-8b --dtype=bfloat16 --param_dtype=bfloat16 --batch=64 \
    --min_prompt=256 --prompt_len=4096 --new_tokens=128 --decode_steps=16 --iters=2
fi
ls -la "$out"
