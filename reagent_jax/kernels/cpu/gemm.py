"""fp32 matmuls on the CPU through OpenBLAS, as XLA FFI custom calls; and a streaming kernel for
the decode step's output projection (`vocab_logits`).

Why: XLA:CPU's own fp32 GEMM (YNNPACK) runs ~15% below a tuned BLAS on this project's benchmark
shapes (`[2048, 512] x [512, 151936]`: ~1.0 s vs ~0.86 s on 2 cores), which made the model's
forward slower than transformers' (torch calls oneMKL). Routing the model's dense contractions
(q/k/v/o, the MLP, the output projection) through `cblas_sgemm` closes that gap; BENCHMARKS.md.

The BLAS is the `scipy-openblas64` wheel's (the OpenBLAS numpy is built with; its symbols are
prefixed, so it never clashes with numpy's or torch's BLAS). It runs single-threaded and the
handler (`gemm.cc`) splits each GEMM over XLA's own thread pool, so no second thread pool
competes with XLA's for the cores. Used only where it is a like-for-like swap: CPU backend, fp32
operands, no device mesh, at least `MIN_ROWS` rows. Everywhere else (GPU/TPU, bf16, sharded runs,
decode steps) the callers keep the einsum. Gradients are the same GEMMs transposed (custom VJP).

`REAGENT_CPU_GEMM` picks: `auto` (default: OpenBLAS when the wheel and a C++ compiler are there,
else XLA with one warning), `blas` (an error if it cannot be used), `xla` (never, nor the other
CPU kernels). The handlers (`gemm.cc`, `decode.cc`, sharing `kernels.h`) are compiled
on first use into one library in `$REAGENT_CACHE_DIR` (default `~/.cache/reagent_jax`), keyed by
the sources, the compiler command and the jax version.

`vocab_logits` (tied embedding [V, E] x a few hidden rows -> [V, B]) is memory-bound at decode;
XLA:CPU's multiply-reduce reads the weight at about half the machine's bandwidth and its GEMM
packs the weight first, so an AVX-512 kernel in the same file streams it once and hands the
sampler its per-chunk statistics (the engine's decode step, BENCHMARKS.md). CPUs without AVX-512
keep XLA's loop. The decode step's layers have their own kernel (`kernels.cpu.decode`).
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import math
import os
import pathlib
import subprocess
import tempfile

import jax
import jax.numpy as jnp

from reagent_jax.parallel.mesh import mesh_platform

log = logging.getLogger(__name__)

_TARGET = "reagent_sgemm"
_VOCAB_TARGET = "reagent_vocab_logits"
_HERE = pathlib.Path(__file__).parent
_SOURCES = (_HERE / "gemm.cc", _HERE / "decode.cc")  # one library; both include kernels.h
_HEADER = _HERE / "kernels.h"
_DECODE_TARGET = "reagent_decode_layers"
_MODES = ("auto", "blas", "xla")
# Fewer rows than this stay with XLA: at decode (one row per sequence, 16 here) XLA's small GEMMs
# fused with their neighbours won (engine decode step 15-16 ms vs 17-19 ms through a BLAS).
MIN_ROWS = 128
# `vocab_logits` takes at most this many rows: beyond, no faster than XLA's loop (64 rows: 40 vs
# 42 ms with the full Qwen3 vocabulary, 2.25 vs 1.95 ms with an [8192, 256] weight in the cache;
# 48 rows: 20-24 vs 24-28 ms).
VOCAB_LOGITS_MAX_ROWS = 48


def mode() -> str:
    m = os.environ.get("REAGENT_CPU_GEMM", "auto").strip().lower() or "auto"
    if m not in _MODES:
        raise ValueError(f"REAGENT_CPU_GEMM={m!r}: expected one of {', '.join(_MODES)}")
    return m


def _open_blas() -> ctypes.CDLL:
    """The scipy-openblas64 library, set to one thread: the handler does the threading. (numpy's
    wheels carry their own copy in numpy.libs, so numpy's thread count is not touched.)"""
    try:
        import scipy_openblas64
    except ImportError:
        raise RuntimeError("the scipy-openblas64 wheel is not installed (see requirements.txt)") from None
    lib = ctypes.CDLL(str(pathlib.Path(scipy_openblas64.get_lib_dir(), scipy_openblas64.get_library(fullname=True))))
    lib.scipy_openblas_set_num_threads64_(1)
    return lib


def _cache_dir() -> pathlib.Path:
    return pathlib.Path(os.environ.get("REAGENT_CACHE_DIR") or pathlib.Path.home() / ".cache" / "reagent_jax")


def _compile() -> pathlib.Path:
    """Builds the handlers once per (source, compiler command, jax version); the rename makes
    concurrent builds safe. -O3: the vocab kernel needs its register tiles fully unrolled."""
    cxx = os.environ.get("CXX", "c++")
    flags = ["-O3", "-shared", "-fPIC", "-std=c++17", "-w", f"-I{jax.ffi.include_dir()}"]
    code = b"".join(f.read_bytes() for f in (*_SOURCES, _HEADER))
    key = hashlib.sha256(code + " ".join([cxx, *flags, jax.__version__]).encode()).hexdigest()[:16]
    out = _cache_dir() / f"cpu_gemm-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        tmp_so = pathlib.Path(tmp, out.name)
        cmd = [cxx, *flags, *map(str, _SOURCES), "-o", str(tmp_so)]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise RuntimeError(f"cannot run the C++ compiler {cxx!r} ({e})") from None
        if res.returncode != 0:
            raise RuntimeError(f"compiling the CPU kernels failed ({' '.join(cmd)}):\n{res.stderr[-2000:]}")
        os.replace(tmp_so, out)
    return out


@functools.lru_cache(maxsize=None)
def _library() -> ctypes.CDLL | None:
    """Builds, loads and registers the FFI targets; None when they can't be used (the reason is
    logged once)."""
    try:
        blas = _open_blas()
        so = ctypes.CDLL(str(_compile()))
        so.reagent_set_sgemm(ctypes.cast(blas.scipy_cblas_sgemm64_, ctypes.c_void_p))
        jax.ffi.register_ffi_target(_TARGET, jax.ffi.pycapsule(so.ReagentSgemm), platform="cpu")
        jax.ffi.register_ffi_target(_VOCAB_TARGET, jax.ffi.pycapsule(so.ReagentVocabLogits), platform="cpu")
        jax.ffi.register_ffi_target(_DECODE_TARGET, jax.ffi.pycapsule(so.ReagentDecodeLayers), platform="cpu")
        return so
    except (OSError, RuntimeError, AttributeError) as e:
        if mode() == "blas":
            raise RuntimeError(f"REAGENT_CPU_GEMM=blas but the OpenBLAS GEMM is unavailable: {e}") from e
        log.warning("fp32 CPU matmuls use XLA's (slower) GEMM: %s. Set REAGENT_CPU_GEMM=xla to silence this.", e)
        return None


def _load() -> bool:
    return _library() is not None


def usable(x: jax.Array, w: jax.Array, mesh=None, n_contract: int = 1) -> bool:
    """True when x [..., K1..Kc] . w (c = n_contract) may go through OpenBLAS; decided at trace
    time from static facts."""
    if mode() == "xla" or mesh_platform(mesh) != "cpu":
        return False
    if math.prod(x.shape[:x.ndim - n_contract]) < MIN_ROWS:
        return False
    if mesh is not None and mesh.size > 1:
        return False
    if x.dtype != jnp.float32 or w.dtype != jnp.float32 or x.size == 0 or w.size == 0:
        return False
    return _load()


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def matmul(a: jax.Array, b: jax.Array, trans_a: bool = False, trans_b: bool = False) -> jax.Array:
    """Row-major op(a) @ op(b) of two fp32 matrices (op = transpose when trans_*) through OpenBLAS.
    Differentiable to any order in reverse mode (the gradients are this function again); forward
    mode (jvp) is not defined. Call only where `usable` said yes."""
    if not _load():
        raise RuntimeError("the OpenBLAS GEMM is unavailable here; check kernels.cpu.gemm.usable() before calling it")
    m, k = (a.shape[1], a.shape[0]) if trans_a else a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    call = jax.ffi.ffi_call(_TARGET, jax.ShapeDtypeStruct((m, n), jnp.float32), vmap_method="sequential")
    return call(a, b, trans_a=trans_a, trans_b=trans_b, m=m, n=n, k=k)


def _matmul_fwd(a, b, trans_a, trans_b):
    return matmul(a, b, trans_a, trans_b), (a, b)


def _matmul_bwd(trans_a, trans_b, res, g):
    """C = op(A) op(B): d op(A) = G op(B)^T and d op(B) = op(A)^T G, transposed back to A's and
    B's storage when they were stored transposed."""
    a, b = res
    da = matmul(b, g, trans_b, True) if trans_a else matmul(g, b, False, not trans_b)
    db = matmul(g, a, True, trans_a) if trans_b else matmul(a, g, not trans_a, False)
    return da, db


matmul.defvjp(_matmul_fwd, _matmul_bwd)


def contract(x: jax.Array, w: jax.Array, n_contract: int) -> jax.Array:
    """x [..., K1..Kc] . w [K1..Kc, N...] -> [..., N...] (c = n_contract), e.g. "bte,ehd->bthd"."""
    lead, k_dims, n_dims = x.shape[:x.ndim - n_contract], w.shape[:n_contract], w.shape[n_contract:]
    k = math.prod(k_dims)
    return matmul(x.reshape(-1, k), w.reshape(k, -1)).reshape(lead + n_dims)


def contract_rows(x: jax.Array, w: jax.Array) -> jax.Array:
    """x [..., E] . w[V, E]^T -> [..., V]: a tied embedding used as the output projection."""
    return matmul(x.reshape(-1, x.shape[-1]), w, False, True).reshape(x.shape[:-1] + (w.shape[0],))


def leading_contraction(eq: str) -> int | None:
    """For an einsum "x,w->y" where w's leading dims contract with x's trailing dims and y is x's
    rest followed by w's rest, the number of contracted dims; None for any other equation."""
    try:
        lhs, out = eq.replace(" ", "").split("->")
        xs, ws = lhs.split(",")
    except ValueError:
        return None
    if "." in eq:
        return None
    for c in range(1, min(len(xs), len(ws)) + 1):
        if xs[len(xs) - c:] == ws[:c] and out == xs[:len(xs) - c] + ws[c:]:
            return c if len(set(xs + ws)) == len(xs) + len(ws) - c else None
    return None


def vocab_logits_usable(w: jax.Array, h: jax.Array, mesh=None) -> bool:
    """True when w [V, E] . h [B, E]^T may go through `vocab_logits`: CPU with AVX-512, fp32,
    no device mesh, 1 <= B <= VOCAB_LOGITS_MAX_ROWS. Decided at trace time."""
    if mode() == "xla" or mesh_platform(mesh) != "cpu" or (mesh is not None and mesh.size > 1):
        return False
    if w.ndim != 2 or h.ndim != 2 or w.shape[1] != h.shape[1] or not 1 <= h.shape[0] <= VOCAB_LOGITS_MAX_ROWS:
        return False
    if w.dtype != jnp.float32 or h.dtype != jnp.float32 or w.size == 0:
        return False
    so = _library()
    return so is not None and bool(so.reagent_vocab_logits_supported())


def vocab_logits(w: jax.Array, h: jax.Array, inv_temperature: jax.Array, chunk: int
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """w [V, E] . h [B, E]^T -> (logits [V, B] fp32, vocabulary-major as the sampler reads them;
    chunk maxima [C, B]; chunk exp-sums [C, B]) with C = ceil(V / chunk):
    maxima[c, b] = max of logits[c * chunk : (c + 1) * chunk, b] and exp-sums[c, b] = sum over
    the same rows of exp((logits - maxima[c, b]) * inv_temperature[b]) (`sampling.chunk_stats`,
    folded in as each tile of logits is computed). One pass over w per 32 rows of h. Not
    differentiable (sampling only). Call only where `vocab_logits_usable` said yes."""
    if not _load():
        raise RuntimeError("the CPU kernels are unavailable here; check kernels.cpu.gemm.vocab_logits_usable() first")
    v, b = w.shape[0], h.shape[0]
    c = -(-v // chunk)
    out = (jax.ShapeDtypeStruct((v, b), jnp.float32),) + (jax.ShapeDtypeStruct((c, b), jnp.float32),) * 2
    call = jax.ffi.ffi_call(_VOCAB_TARGET, out, vmap_method="sequential")
    return tuple(call(w, h, inv_temperature.astype(jnp.float32), chunk=chunk))
