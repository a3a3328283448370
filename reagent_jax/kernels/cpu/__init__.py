"""CPU kernels as XLA FFI custom calls (C++, compiled on first use): fp32 GEMMs through OpenBLAS
(`gemm`), the decode step's output projection with the sampler's statistics (`gemm.vocab_logits`)
and every decoder layer of a decode step in one call (`decode`). Only ever chosen for a mesh of
CPU devices; `REAGENT_CPU_GEMM=xla` turns them all off."""
