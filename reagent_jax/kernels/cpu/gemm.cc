// XLA FFI handlers for fp32 matmuls on the CPU, each split over XLA's own intra-op thread pool:
// - ReagentSgemm: a GEMM through a single-threaded ILP64 `cblas_sgemm` (OpenBLAS of the
//   scipy-openblas64 wheel);
// - ReagentVocabLogits: few rows against a big row-major weight (the decode step's output
//   projection with a tied embedding), streamed once from memory by an AVX-512 kernel.
// Built on first use by reagent_jax/kernels/cpu/gemm.py; the BLAS entry point is handed in at run
// time (reagent_set_sgemm), so this file links against nothing but the XLA FFI headers.
#include "kernels.h"

using Sgemm = void (*)(int layout, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
static Sgemm sgemm = nullptr;

extern "C" void reagent_set_sgemm(void* fn) { sgemm = reinterpret_cast<Sgemm>(fn); }

namespace {
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
}  // namespace

// Row-major C[m, n] = op(A) . op(B); op(A) is [m, k] (A stored [k, m] when trans_a), op(B) is
// [k, n] (B stored [n, k] when trans_b). Operands arrive dense and row-major (ffi_call's default).
static ffi::Error Gemm(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> a, ffi::Buffer<ffi::F32> b,
                       ffi::ResultBuffer<ffi::F32> c, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k) {
  if (sgemm == nullptr) return ffi::Error::InvalidArgument("reagent_sgemm: no BLAS sgemm was registered");
  if (a.element_count() != static_cast<size_t>(m * k) || b.element_count() != static_cast<size_t>(k * n) ||
      c->element_count() != static_cast<size_t>(m * n)) {
    return ffi::Error::InvalidArgument("reagent_sgemm: operand sizes do not match m=" + std::to_string(m) +
                                       " n=" + std::to_string(n) + " k=" + std::to_string(k));
  }
  if (m == 0 || n == 0) return ffi::Error::Success();
  const float* pa = a.typed_data();
  const float* pb = b.typed_data();
  float* pc = c->typed_data();
  const int64_t lda = trans_a ? m : k, ldb = trans_b ? k : n;
  const bool split_n = n >= m;
  const int64_t extent = split_n ? n : m;
  const int64_t threads = std::max<int64_t>(1, pool.num_threads());
  const int64_t parts = std::max<int64_t>(1, (int64_t)std::min<double>({double(threads), double(extent), 2.0 * m * n * k / kMinFlopsPerPart}));
  RunParts(pool, parts, [=](int64_t p) {  // split_n: C[:, lo:hi] = op(A) . op(B)[:, lo:hi]; else C[lo:hi, :] = op(A)[lo:hi, :] . op(B)
    const int64_t lo = extent * p / parts, hi = extent * (p + 1) / parts;
    const float* pa_p = split_n ? pa : (trans_a ? pa + lo : pa + lo * k);
    const float* pb_p = split_n ? (trans_b ? pb + lo * k : pb + lo) : pb;
    sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, split_n ? m : hi - lo,
          split_n ? hi - lo : n, k, 1.0f, pa_p, lda, pb_p, ldb, 0.0f, split_n ? pc + lo : pc + lo * n, n);
  });
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReagentSgemm, Gemm,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<bool>("trans_a")
                                  .Attr<bool>("trans_b")
                                  .Attr<int64_t>("m")
                                  .Attr<int64_t>("n")
                                  .Attr<int64_t>("k"));

// ---- ReagentVocabLogits: C[V, B] = W[V, K] . H[B, K]^T for few rows B, with chunk statistics ----
// XLA:CPU's fused multiply-reduce for this reads W at ~14 GB/s (and at B = 1 takes ~0.5 s) and its
// GEMM packs W first; this kernel keeps H^T in registers (16 rows of B per vector), broadcasts
// each weight into its FMA and prefetches the weight rows two tiles ahead: 7.1-7.7 ms vs
// 11.4-11.8 ms for [151936, 256] x [16, 256] on 2 cores (BENCHMARKS.md). C comes out
// vocabulary-major, as the sampler reads it. Rows of H go in groups of 32, one pass over W each.
// As each tile leaves the registers it is also folded into the sampler's statistics per chunk of
// `chunk` vocabulary rows and per row of H: the maximum M and sum(exp((C - M) * inv_t)), so the
// sampler never reads the [V, B] logits whole (it took two passes over 9.7 MB, ~1.2 ms, per decode
// step at this shape; the statistics add ~0.3 ms here).
namespace {

constexpr int kPrefetchTiles = 2;
constexpr int64_t kGroupRows = 32;

// Running statistics of one chunk, per vector of rows of H: maximum m and sum(exp((x - m) * it)),
// rescaled when m grows (once per tile, not per row).
template <int NB>
struct ChunkStats {
  Vec16 m[NB], s[NB], it[NB];
  inline __attribute__((always_inline)) void Reset() {
    for (int nb = 0; nb < NB; ++nb) m[nb] = Vec16{} - __builtin_inff(), s[nb] = Vec16{};
  }
  template <int R>
  inline __attribute__((always_inline)) void Add(const Vec16 (&acc)[R][NB]) {
    for (int nb = 0; nb < NB; ++nb) {
      Vec16 tm = m[nb];
      for (int r = 0; r < R; ++r) tm = acc[r][nb] > tm ? acc[r][nb] : tm;
      Vec16 sum = s[nb] * ExpNonPositive((m[nb] - tm) * it[nb]);  // (-inf - finite) * it -> exp 0 at the start
      for (int r = 0; r < R; ++r) sum += ExpNonPositive((acc[r][nb] - tm) * it[nb]);
      m[nb] = tm, s[nb] = sum;
    }
  }
};

// Rows v0..v1 of C's columns [0, bg) (row stride ldc), each tile also added to `stats`. ht is the
// group's H^T zero-padded to [K, NB * 16]. Per tile: R rows of W x KB columns, KB * NB vectors of
// H^T and R * NB accumulators in registers (at most 32 vectors).
template <int NB, int R, int KB>
inline __attribute__((always_inline)) void VocabRows(const float* w, int64_t k, const float* ht, float* c,
                                                     int64_t ldc, int64_t bg, int64_t v0, int64_t v1,
                                                     ChunkStats<NB>& stats) {
  constexpr int64_t bp = NB * 16;
  int64_t v = v0;
  for (; v + R <= v1; v += R) {
    Vec16 acc[R][NB] = {};
    int64_t k0 = 0;
    for (; k0 + KB <= k; k0 += KB) {
      Vec16 hv[KB][NB];
      for (int kk = 0; kk < KB; ++kk)
        for (int nb = 0; nb < NB; ++nb) std::memcpy(&hv[kk][nb], ht + (k0 + kk) * bp + nb * 16, 64);
      for (int r = 0; r < R; ++r) {
        const float* wr = w + (v + r) * k + k0;
        __builtin_prefetch(wr + kPrefetchTiles * R * k, 0, 1);  // a hint: never faults
        for (int kk = 0; kk < KB; ++kk)
          for (int nb = 0; nb < NB; ++nb) acc[r][nb] += wr[kk] * hv[kk][nb];
      }
    }
    for (; k0 < k; ++k0)
      for (int r = 0; r < R; ++r)
        for (int nb = 0; nb < NB; ++nb) {
          Vec16 h;
          std::memcpy(&h, ht + k0 * bp + nb * 16, 64);
          acc[r][nb] += w[(v + r) * k + k0] * h;
        }
    for (int r = 0; r < R; ++r) std::memcpy(c + (v + r) * ldc, acc[r], bg * sizeof(float));
    stats.Add(acc);
  }
  if (R > 1 && v < v1) VocabRows<NB, 1, KB>(w, k, ht, c, ldc, bg, v, v1, stats);
}

// Rows v0..v1 (v0 a chunk boundary) of C's columns g0..g0+bg and their chunk statistics.
template <int NB, int R, int KB>
inline __attribute__((always_inline)) void VocabChunks(const float* w, int64_t k, const float* ht, const float* inv_t,
                                                       float* c, float* cmax, float* csum, int64_t ldc, int64_t bg,
                                                       int64_t chunk, int64_t v0, int64_t v1) {
  ChunkStats<NB> stats;
  for (int nb = 0; nb < NB; ++nb) {
    float lanes[16];
    for (int i = 0; i < 16; ++i) lanes[i] = nb * 16 + i < bg ? inv_t[nb * 16 + i] : 1.0f;
    std::memcpy(&stats.it[nb], lanes, 64);
  }
  for (int64_t c0 = v0; c0 < v1; c0 += chunk) {
    stats.Reset();
    VocabRows<NB, R, KB>(w, k, ht, c, ldc, bg, c0, std::min(v1, c0 + chunk), stats);
    const int64_t ci = c0 / chunk;
    std::memcpy(cmax + ci * ldc, stats.m, bg * sizeof(float));
    std::memcpy(csum + ci * ldc, stats.s, bg * sizeof(float));
  }
}

#if defined(__x86_64__)
REAGENT_AVX512 void VocabChunksAvx512(const float* w, int64_t k, const float* ht, const float* inv_t, float* c,
                                     float* cmax, float* csum, int64_t ldc, int64_t bg, int64_t chunk, int64_t v0,
                                     int64_t v1) {
  if (bg <= 16) return VocabChunks<1, 8, 16>(w, k, ht, inv_t, c, cmax, csum, ldc, bg, chunk, v0, v1);
  return VocabChunks<2, 6, 8>(w, k, ht, inv_t, c, cmax, csum, ldc, bg, chunk, v0, v1);
}
#else  // other CPUs keep XLA's loop (reagent_vocab_logits_supported() says no)
void VocabChunksAvx512(const float*, int64_t, const float*, const float*, float*, float*, float*, int64_t, int64_t,
                       int64_t, int64_t, int64_t) {}
#endif

}  // namespace

extern "C" int reagent_vocab_logits_supported() { return Avx512Supported() ? 1 : 0; }

// w [V, K], h [B, K], inv_t [B] -> logits [V, B], chunk maxima and exp-sums [ceil(V / chunk), B].
static ffi::Error VocabLogits(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> w, ffi::Buffer<ffi::F32> h,
                              ffi::Buffer<ffi::F32> inv_t, ffi::ResultBuffer<ffi::F32> c,
                              ffi::ResultBuffer<ffi::F32> cmax, ffi::ResultBuffer<ffi::F32> csum, int64_t chunk) {
  if (w.dimensions().size() != 2 || h.dimensions().size() != 2 || w.dimensions()[1] != h.dimensions()[1] ||
      inv_t.element_count() != static_cast<size_t>(h.dimensions()[0])) {
    return ffi::Error::InvalidArgument("reagent_vocab_logits: expects w [V, K], h [B, K] and inv_t [B]");
  }
  const int64_t v = w.dimensions()[0], k = w.dimensions()[1], b = h.dimensions()[0];
  if (chunk < 1 || cmax->element_count() != static_cast<size_t>((v + chunk - 1) / chunk * b)) {
    return ffi::Error::InvalidArgument("reagent_vocab_logits: chunk must be >= 1 and the statistics "
                                       "[ceil(V / chunk), B]");
  }
  if (!reagent_vocab_logits_supported()) return ffi::Error::Internal("reagent_vocab_logits: needs an AVX-512 CPU");
  const float *pw = w.typed_data(), *ph = h.typed_data(), *pt = inv_t.typed_data();
  float *pc = c->typed_data(), *pm = cmax->typed_data(), *ps = csum->typed_data();
  const int64_t threads = std::max<int64_t>(1, pool.num_threads()), chunks = (v + chunk - 1) / chunk;
  for (int64_t g0 = 0; g0 < b; g0 += kGroupRows) {
    const int64_t bg = std::min(kGroupRows, b - g0), bp = (bg + 15) / 16 * 16;  // NB = bp / 16 vectors per row
    std::vector<float> ht(k * bp, 0.0f);  // the group's H^T, [K, bp]
    for (int64_t i = 0; i < bg; ++i)
      for (int64_t j = 0; j < k; ++j) ht[j * bp + i] = ph[(g0 + i) * k + j];
    const float* pht = ht.data();
    const int64_t parts = std::max<int64_t>(1, std::min<double>({double(threads), double(chunks),
                                                                 2.0 * v * k * bg / kMinFlopsPerPart}));
    RunParts(pool, parts, [=](int64_t p) {  // whole chunks per part
      const int64_t lo = chunks * p / parts * chunk, hi = std::min(v, chunks * (p + 1) / parts * chunk);
      VocabChunksAvx512(pw, k, pht, pt + g0, pc + g0, pm + g0, ps + g0, b, bg, chunk, lo, hi);
    });
  }
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReagentVocabLogits, VocabLogits,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>()
                                  .Attr<int64_t>("chunk"));
