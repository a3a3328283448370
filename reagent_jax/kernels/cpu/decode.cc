// ReagentDecodeLayers: every decoder layer of one decode step (one new token per row) in a single
// XLA FFI call, for fp32 on an AVX-512 CPU. Built with gemm.cc by reagent_jax/kernels/cpu/gemm.py;
// used by reagent_jax/kernels/cpu/decode.py.
//
// Why: under XLA:CPU a decode step of a small model is mostly overhead, not arithmetic. Each of
// the ~35 ops per layer is a separate fork-join over the threads, the layer scan copies each
// layer's weights out of the stacked [L, ...] params (dynamic slices) and the attention copies
// its cache window, so a 4-layer, 256-wide step took ~2.5 ms for ~0.2 GFLOP. Here the weights and
// the cache are read where they lie, and each layer is seven phases split over the threads
// (PhasedJob), ~1.5 ms for that step.
//
// Math (the model's, Qwen3 in reagent_jax/models/qwen3.py; fp32 throughout, sums in another order):
//   h = rmsnorm(x) * input_norm; q, k, v = h Wq, h Wk, h Wv; per head q, k = rmsnorm * q_norm / k_norm,
//   then RoPE (rotate-half, cos / sin given per row); k, v written at the row's position; attention
//   of each query head over its kv head's positions <= the row's; x += attn Wo;
//   h = rmsnorm(x) * post_attn_norm; x += (silu(h Wg) * (h Wu)) Wd.
// A row whose position is >= the cache window is inactive: nothing is written, its output is
// meaningless (the caller discards it).
#include <cmath>

#include "kernels.h"

namespace {

struct Shape {
  int64_t rows, embed, heads, kv_heads, head_dim, mlp, window, layers;
  float eps, scale;
};

// C[0:R, n0:n1] (+)= A[0:R, k] . W[k, n0:n1] (row-major, W's rows n long, n0 and n1 multiples
// of 16). W goes in blocks of kKBlock rows, each block's columns in turn: kKBlock short contiguous
// streams, the next block prefetched into L2 meanwhile, instead of one stream per column that
// strides a whole row of W per FMA group (38 -> 87 GFLOP/s at [16, 256] x [256, 768] from DRAM,
// one core). C holds the partial sums between blocks (in L1 / L2).
constexpr int kKBlock = 16;

template <int R>
REAGENT_AVX512 inline __attribute__((always_inline)) void GemmRows(const float* a, int64_t k, const float* w, int64_t n,
                                                                   float* c, int64_t n0, int64_t n1, bool accumulate) {
  for (int64_t k0 = 0; k0 < k; k0 += kKBlock) {
    const int64_t kb = std::min<int64_t>(kKBlock, k - k0);
    const bool fresh = k0 == 0 && !accumulate;
    for (int64_t j = n0; j < n1; j += 16) {
      Vec16 acc[R];
      for (int r = 0; r < R; ++r) {
        if (fresh) acc[r] = Vec16{};
        else std::memcpy(&acc[r], c + r * n + j, 64);
      }
      const float* wj = w + k0 * n + j;
      for (int64_t kk = 0; kk < kb; ++kk) {
        Vec16 wv;
        std::memcpy(&wv, wj + kk * n, 64);
        __builtin_prefetch(wj + (kKBlock + kk) * n, 0, 2);  // the next block, into L2 (a hint: never faults)
        for (int r = 0; r < R; ++r) acc[r] += a[r * k + k0 + kk] * wv;
      }
      for (int r = 0; r < R; ++r) std::memcpy(c + r * n + j, &acc[r], 64);
    }
  }
}

// C[:, n0:n1] (+)= A[m, k] . W[k, n0:n1]: rows in tiles of 16, 8, 4, 2, 1 (one pass over W each).
REAGENT_AVX512 void Gemm(const float* a, int64_t m, int64_t k, const float* w, int64_t n, float* c, int64_t n0,
                         int64_t n1, bool accumulate) {
  int64_t r = 0;
  for (; r + 16 <= m; r += 16) GemmRows<16>(a + r * k, k, w, n, c + r * n, n0, n1, accumulate);
  if (r + 8 <= m) GemmRows<8>(a + r * k, k, w, n, c + r * n, n0, n1, accumulate), r += 8;
  if (r + 4 <= m) GemmRows<4>(a + r * k, k, w, n, c + r * n, n0, n1, accumulate), r += 4;
  if (r + 2 <= m) GemmRows<2>(a + r * k, k, w, n, c + r * n, n0, n1, accumulate), r += 2;
  if (r < m) GemmRows<1>(a + r * k, k, w, n, c + r * n, n0, n1, accumulate);
}

// Columns [0, n) cut into `parts` ranges of whole 16-column vectors.
inline int64_t ColumnSplit(int64_t n, int64_t parts, int64_t p) { return n / 16 * p / parts * 16; }

// out[r, :] = x[r, :] * rsqrt(mean(x[r, :]^2) + eps) * scale, for `rows` rows of width `dim`.
void RmsNorm(const float* x, const float* scale, float* out, int64_t rows, int64_t dim, float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    float ss = 0.0f;
    for (int64_t i = 0; i < dim; ++i) ss += xr[i] * xr[i];
    const float inv = 1.0f / std::sqrt(ss / dim + eps);
    for (int64_t i = 0; i < dim; ++i) out[r * dim + i] = xr[i] * inv * scale[i];
  }
}

// One head vector [d]: rmsnorm * scale, then RoPE (rotate-half) with cos / sin [d / 2].
void NormRope(float* x, const float* scale, const float* cos, const float* sin, int64_t d, float eps) {
  RmsNorm(x, scale, x, 1, d, eps);
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = x[i], x2 = x[half + i];
    x[i] = x1 * cos[i] - x2 * sin[i];
    x[half + i] = x2 * cos[i] + x1 * sin[i];
  }
}

// Sum of the 16 lanes: halves added twice (a tree, not 15 dependent adds).
REAGENT_AVX512 inline __attribute__((always_inline)) float Sum16(Vec16 v) {
  typedef float Vec8 __attribute__((vector_size(32)));
  typedef float Vec4 __attribute__((vector_size(16)));
  Vec8 lo8, hi8;
  std::memcpy(&lo8, &v, 32);
  std::memcpy(&hi8, reinterpret_cast<const char*>(&v) + 32, 32);
  const Vec8 s8 = lo8 + hi8;
  Vec4 lo4, hi4;
  std::memcpy(&lo4, &s8, 16);
  std::memcpy(&hi4, reinterpret_cast<const char*>(&s8) + 16, 16);
  const Vec4 s4 = lo4 + hi4;
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// One query head qh [NV * 16] over cached keys / values [n, NV * 16]: out = softmax(q.K * scale) V.
// scores [n] is scratch.
template <int NV>
REAGENT_AVX512 void AttendHead(const float* qh, const float* keys, const float* vals, int64_t n, float scale,
                               float* scores, float* out) {
  Vec16 qv[NV];
  for (int i = 0; i < NV; ++i) std::memcpy(&qv[i], qh + 16 * i, 64);
  float m = -3.0e38f;
  for (int64_t j = 0; j < n; ++j) {
    Vec16 acc = {};
    for (int i = 0; i < NV; ++i) {
      Vec16 kv;
      std::memcpy(&kv, keys + j * NV * 16 + 16 * i, 64);
      acc += qv[i] * kv;
    }
    scores[j] = Sum16(acc) * scale;
    m = std::max(m, scores[j]);
  }
  float z = 0.0f;
  for (int64_t j = 0; j < n; j += 16) {  // exp(s - m), 16 at a time
    float buf[16];
    for (int i = 0; i < 16; ++i) buf[i] = j + i < n ? scores[j + i] - m : -1.0e30f;
    Vec16 e;
    std::memcpy(&e, buf, 64);
    e = ExpNonPositive(e);
    std::memcpy(buf, &e, 64);
    for (int i = 0; i < 16 && j + i < n; ++i) scores[j + i] = buf[i], z += buf[i];
  }
  const float inv_z = 1.0f / z;
  Vec16 acc[NV] = {};
  for (int64_t j = 0; j < n; ++j) {
    const float p = scores[j] * inv_z;
    for (int i = 0; i < NV; ++i) {
      Vec16 vv;
      std::memcpy(&vv, vals + j * NV * 16 + 16 * i, 64);
      acc[i] += p * vv;
    }
  }
  std::memcpy(out, acc, NV * 64);
}

using AttendFn = void (*)(const float*, const float*, const float*, int64_t, float, float*, float*);

// AttendHead for head_dim = 16 * nv (1 <= nv <= 16).
AttendFn AttendFor(int64_t nv) {
  static const AttendFn table[] = {AttendHead<1>,  AttendHead<2>,  AttendHead<3>,  AttendHead<4>,
                                   AttendHead<5>,  AttendHead<6>,  AttendHead<7>,  AttendHead<8>,
                                   AttendHead<9>,  AttendHead<10>, AttendHead<11>, AttendHead<12>,
                                   AttendHead<13>, AttendHead<14>, AttendHead<15>, AttendHead<16>};
  return table[nv - 1];
}

// Attention of row r's query heads over its cache positions [0, n) of one layer (cache [N, K, S, D]).
void AttendRow(const Shape& s, const float* q, const float* kc, const float* vc, int64_t r, int64_t n, float* scores,
               float* out) {
  const int64_t d = s.head_dim, groups = s.heads / s.kv_heads;
  const AttendFn attend = AttendFor(d / 16);
  for (int64_t h = 0; h < s.heads; ++h) {
    const int64_t at = (r * s.kv_heads + h / groups) * s.window * d;
    attend(q + (r * s.heads + h) * d, kc + at, vc + at, n, s.scale, scores, out + (r * s.heads + h) * d);
  }
}

// silu(g) * u over n values (n a multiple of 16): g * sigmoid(g), sigmoid from exp(-|g|).
REAGENT_AVX512 void SiluMul(const float* g, const float* u, float* out, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    Vec16 gv, uv;
    std::memcpy(&gv, g + i, 64);
    std::memcpy(&uv, u + i, 64);
    const Vec16 neg_abs = gv < 0 ? gv : -gv;
    const Vec16 e = ExpNonPositive(neg_abs);
    const Vec16 sig = gv >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
    const Vec16 y = gv * sig * uv;
    std::memcpy(out + i, &y, 64);
  }
}

struct LayerWeights {
  const float *input_norm, *wq, *wk, *wv, *q_norm, *k_norm, *wo, *post_norm, *wg, *wu, *wd;
};

inline void Pause() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Runs run(phase, part) for phases 0..P-1 in order, each cut into `parts` parts, on the caller and
// on parts - 1 helpers from XLA's pool. Whoever is there claims the next part of the current phase
// (an atomic counter) and then spins until the phase is complete: no thread waits for another to
// start (a pool thread took ~40 us to start, as long as a whole phase here), a helper that starts
// late joins at the current phase, and a helper that never starts leaves the caller to do every
// part (no deadlock when the pool is busy). Phases are short, so spinning costs less than sleeping.
class PhasedJob {
 public:
  static void Run(ffi::ThreadPool& pool, int64_t phases, int64_t parts, std::function<void(int64_t, int64_t)> run) {
    auto job = std::make_shared<PhasedJob>(phases, parts, std::move(run));
    for (int64_t i = 1; i < parts; ++i) pool.Schedule([job] { job->Follow(); });
    job->Follow();  // returns once the last phase is complete, so `run` is never called after Run returns
  }

  PhasedJob(int64_t phases, int64_t parts, std::function<void(int64_t, int64_t)> run)
      : next_(phases), done_(phases), parts_(parts), run_(std::move(run)) {}

 private:
  void Follow() {
    for (size_t p = 0; p < next_.size(); ++p) {
      for (int64_t i = next_[p].fetch_add(1); i < parts_; i = next_[p].fetch_add(1)) {
        run_(p, i);
        done_[p].fetch_add(1, std::memory_order_release);
      }
      while (done_[p].load(std::memory_order_acquire) < parts_) Pause();
    }
  }

  std::vector<std::atomic<int64_t>> next_, done_;
  const int64_t parts_;
  const std::function<void(int64_t, int64_t)> run_;
};

REAGENT_AVX512 void DecodeLayers(ffi::ThreadPool& pool, const Shape& s, const LayerWeights& w, const int32_t* pos,
                                 const float* cos, const float* sin, float* x, float* kcache, float* vcache) {
  const int64_t b = s.rows, e = s.embed, d = s.head_dim, hd = s.heads * d, kd = s.kv_heads * d, f = s.mlp;
  std::vector<float> h(b * e), q(b * hd), k(b * kd), v(b * kd), att(b * hd), g(b * f), u(b * f);
  std::vector<float> scores(b * s.window);
  const int64_t cache_layer = b * s.kv_heads * s.window * d;
  // ~2 * b * (params of one layer) FLOPs per layer; below ~4 MFLOP a second thread does not pay.
  const double flops = 2.0 * b * s.layers * (e * (hd + 2 * kd) + hd * e + 3 * e * f);
  const int64_t parts = std::max<int64_t>(1, std::min<double>(pool.num_threads(), flops / kMinFlopsPerPart));
  constexpr int64_t kPhases = 7;  // per layer
  PhasedJob::Run(pool, kPhases * s.layers, parts, [&](int64_t phase, int64_t t) {
    const int64_t l = phase / kPhases;
    const int64_t r0 = b * t / parts, r1 = b * (t + 1) / parts;  // part t's rows (norms, attention)
    auto cols = [&](int64_t width, int64_t i) { return ColumnSplit(width, parts, t + i); };  // its columns
    float* kc = kcache + l * cache_layer;
    float* vc = vcache + l * cache_layer;
    switch (phase % kPhases) {
      case 0:
        RmsNorm(x + r0 * e, w.input_norm + l * e, h.data() + r0 * e, r1 - r0, e, s.eps);
        break;
      case 1:
        Gemm(h.data(), b, e, w.wq + l * e * hd, hd, q.data(), cols(hd, 0), cols(hd, 1), false);
        Gemm(h.data(), b, e, w.wk + l * e * kd, kd, k.data(), cols(kd, 0), cols(kd, 1), false);
        Gemm(h.data(), b, e, w.wv + l * e * kd, kd, v.data(), cols(kd, 0), cols(kd, 1), false);
        break;
      case 2:
        for (int64_t r = r0; r < r1; ++r) {
          const float *cr = cos + r * (d / 2), *sr = sin + r * (d / 2);
          for (int64_t i = 0; i < s.heads; ++i) NormRope(&q[(r * s.heads + i) * d], w.q_norm + l * d, cr, sr, d, s.eps);
          for (int64_t i = 0; i < s.kv_heads; ++i) NormRope(&k[(r * s.kv_heads + i) * d], w.k_norm + l * d, cr, sr, d, s.eps);
          const bool active = pos[r] >= 0 && pos[r] < s.window;
          for (int64_t i = 0; active && i < s.kv_heads; ++i) {
            const int64_t at = ((r * s.kv_heads + i) * s.window + pos[r]) * d;
            std::memcpy(kc + at, &k[(r * s.kv_heads + i) * d], d * sizeof(float));
            std::memcpy(vc + at, &v[(r * s.kv_heads + i) * d], d * sizeof(float));
          }
          AttendRow(s, q.data(), kc, vc, r, active ? pos[r] + 1 : s.window, &scores[r * s.window], att.data());
        }
        break;
      case 3:
        Gemm(att.data(), b, hd, w.wo + l * hd * e, e, x, cols(e, 0), cols(e, 1), true);
        break;
      case 4:
        RmsNorm(x + r0 * e, w.post_norm + l * e, h.data() + r0 * e, r1 - r0, e, s.eps);
        break;
      case 5: {
        const int64_t lo = cols(f, 0), hi = cols(f, 1);
        Gemm(h.data(), b, e, w.wg + l * e * f, f, g.data(), lo, hi, false);
        Gemm(h.data(), b, e, w.wu + l * e * f, f, u.data(), lo, hi, false);
        for (int64_t r = 0; r < b; ++r) SiluMul(&g[r * f + lo], &u[r * f + lo], &g[r * f + lo], hi - lo);
        break;
      }
      case 6:
        Gemm(g.data(), b, f, w.wd + l * f * e, e, x, cols(e, 0), cols(e, 1), true);
        break;
    }
  });
}

}  // namespace

extern "C" int reagent_decode_layers_supported() { return Avx512Supported() ? 1 : 0; }

// x [B, E] (embedded tokens), positions [B] int32, cos / sin [B, D / 2], the stacked layer params,
// k / v caches [L, B, K, S, D] (aliased to the outputs: updated in place) -> (hidden [B, E], k, v).
static ffi::Error DecodeLayersFfi(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x, ffi::Buffer<ffi::S32> positions,
                                  ffi::Buffer<ffi::F32> cos, ffi::Buffer<ffi::F32> sin,
                                  ffi::Buffer<ffi::F32> input_norm, ffi::Buffer<ffi::F32> wq, ffi::Buffer<ffi::F32> wk,
                                  ffi::Buffer<ffi::F32> wv, ffi::Buffer<ffi::F32> q_norm, ffi::Buffer<ffi::F32> k_norm,
                                  ffi::Buffer<ffi::F32> wo, ffi::Buffer<ffi::F32> post_norm, ffi::Buffer<ffi::F32> wg,
                                  ffi::Buffer<ffi::F32> wu, ffi::Buffer<ffi::F32> wd, ffi::Buffer<ffi::F32> kcache,
                                  ffi::Buffer<ffi::F32> vcache, ffi::ResultBuffer<ffi::F32> out,
                                  ffi::ResultBuffer<ffi::F32> kout, ffi::ResultBuffer<ffi::F32> vout, int64_t heads,
                                  float eps, float scale) {
  if (!reagent_decode_layers_supported()) return ffi::Error::Internal("reagent_decode_layers: needs an AVX-512 CPU");
  const auto kd = kcache.dimensions();
  if (kd.size() != 5 || x.dimensions().size() != 2 || wg.dimensions().size() != 3) {
    return ffi::Error::InvalidArgument("reagent_decode_layers: expects x [B, E], caches [L, B, K, S, D], gate [L, E, F]");
  }
  Shape s{x.dimensions()[0], x.dimensions()[1], heads, kd[2], kd[4], wg.dimensions()[2], kd[3], kd[0], eps, scale};
  if (kd[1] != s.rows || s.heads % s.kv_heads != 0 || s.head_dim % 16 != 0 || s.head_dim > 256 || s.embed % 16 != 0 || s.mlp % 16 != 0 ||
      wq.element_count() != static_cast<size_t>(s.layers * s.embed * s.heads * s.head_dim) ||
      kout->untyped_data() != kcache.untyped_data() || vout->untyped_data() != vcache.untyped_data()) {
    return ffi::Error::InvalidArgument("reagent_decode_layers: shapes do not fit (rows, heads, multiples of 16, head_dim <= 256) "
                                       "or the caches are not aliased to the outputs");
  }
  float* px = out->typed_data();
  std::memcpy(px, x.typed_data(), s.rows * s.embed * sizeof(float));
  LayerWeights w{input_norm.typed_data(), wq.typed_data(), wk.typed_data(), wv.typed_data(), q_norm.typed_data(),
                 k_norm.typed_data(), wo.typed_data(), post_norm.typed_data(), wg.typed_data(), wu.typed_data(),
                 wd.typed_data()};
#if defined(__x86_64__)
  DecodeLayers(pool, s, w, positions.typed_data(), cos.typed_data(), sin.typed_data(), px, kout->typed_data(),
               vout->typed_data());
#endif
  return ffi::Error::Success();
}

XLA_FFI_DEFINE_HANDLER_SYMBOL(ReagentDecodeLayers, DecodeLayersFfi,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()  // x
                                  .Arg<ffi::Buffer<ffi::S32>>()  // positions
                                  .Arg<ffi::Buffer<ffi::F32>>()  // cos
                                  .Arg<ffi::Buffer<ffi::F32>>()  // sin
                                  .Arg<ffi::Buffer<ffi::F32>>()  // input_norm [L, E]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q [L, E, H, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k [L, E, K, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v [L, E, K, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // q_norm [L, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k_norm [L, D]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // o [L, H, D, E]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // post_attn_norm [L, E]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // gate [L, E, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // up [L, E, F]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // down [L, F, E]
                                  .Arg<ffi::Buffer<ffi::F32>>()  // k cache
                                  .Arg<ffi::Buffer<ffi::F32>>()  // v cache
                                  .Ret<ffi::Buffer<ffi::F32>>()  // hidden [B, E]
                                  .Ret<ffi::Buffer<ffi::F32>>()  // k cache (aliased)
                                  .Ret<ffi::Buffer<ffi::F32>>()  // v cache (aliased)
                                  .Attr<int64_t>("heads")
                                  .Attr<float>("eps")
                                  .Attr<float>("scale"));
