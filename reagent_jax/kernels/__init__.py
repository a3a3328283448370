"""The kernel-backend seam: how each device computation runs, chosen from the mesh's devices (or
an explicit config field), never from the host's backend at trace time. The model
(`models/qwen3.py`) and the rollout engine (`rollout/kernels.py`) call these modules and hold no
backend branches of their own.

  matmul.py         dense layers and attention einsums in fp32 accumulation (OpenBLAS on one CPU)
  logits.py         hidden states -> logits: the model's projection, the decode sampler's [V, B]
  attention.py      which attention kernel: causal (xla | splash) and one-token decode (xla | ragged)
  xla_attention.py  attention through XLA, every backend
  blocks.py         running an accelerator attention kernel on each device's block (shard_map)
  kv_layout.py      the KV cache's axis order per backend and how new K/V are written into it
  kv_pages.py       a paged KV cache: a pool of pages, block tables, windows gathered from it
  tpu/              Pallas: splash attention, ragged decode attention
  gpu/              cuDNN flash attention (training and scoring)
  cpu/              C++ custom calls: OpenBLAS GEMM, the decode projection, the fused decode layers

The package imports only `parallel` below it: kernels take a model config as a plain object.
"""
