// XLA FFI handler: an fp32 GEMM on the CPU through a single-threaded ILP64 `cblas_sgemm`
// (OpenBLAS of the scipy-openblas64 wheel), split over XLA's own intra-op thread pool.
// Built on first use by reagent_jax/models/cpu_gemm.py; the BLAS entry point is handed in at run
// time (reagent_set_sgemm), so this file links against nothing but the XLA FFI headers.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

using Sgemm = void (*)(int layout, int trans_a, int trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
static Sgemm sgemm = nullptr;

extern "C" void reagent_set_sgemm(void* fn) { sgemm = reinterpret_cast<Sgemm>(fn); }

namespace {

// One GEMM cut into parts along its longer output dimension. Parts are claimed from an atomic
// counter by the calling thread and by helper tasks on XLA's own intra-op pool, so the caller
// finishes the job alone if no helper ever runs (no deadlock when the pool is busy), and no
// second thread pool (the BLAS's own) competes with XLA's for the cores.
struct Job {
  std::function<void(int64_t)> part;
  int64_t parts = 0;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;

  void Work() {
    for (int64_t p = next.fetch_add(1); p < parts; p = next.fetch_add(1)) {
      part(p);
      if (done.fetch_add(1) + 1 == parts) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
constexpr double kMinFlopsPerPart = 1 << 22;  // below, one thread does the whole GEMM

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
  auto job = std::make_shared<Job>();
  job->parts = parts;
  job->part = [=](int64_t p) {  // split_n: C[:, lo:hi] = op(A) . op(B)[:, lo:hi]; else C[lo:hi, :] = op(A)[lo:hi, :] . op(B)
    const int64_t lo = extent * p / parts, hi = extent * (p + 1) / parts;
    const float* pa_p = split_n ? pa : (trans_a ? pa + lo : pa + lo * k);
    const float* pb_p = split_n ? (trans_b ? pb + lo * k : pb + lo) : pb;
    sgemm(kRowMajor, trans_a ? kTrans : kNoTrans, trans_b ? kTrans : kNoTrans, split_n ? m : hi - lo,
          split_n ? hi - lo : n, k, 1.0f, pa_p, lda, pb_p, ldb, 0.0f, split_n ? pc + lo : pc + lo * n, n);
  };
  for (int64_t i = 1; i < parts; ++i) pool.Schedule([job] { job->Work(); });
  job->Work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done.load() == job->parts; });
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
