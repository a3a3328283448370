// Pieces shared by the CPU kernels (gemm.cc, decode.cc): splitting work over XLA's own
// intra-op thread pool, 16-float vectors (GCC/clang vector extensions) and a vector exp.
#ifndef REAGENT_JAX_MODELS_CPU_KERNELS_H_
#define REAGENT_JAX_MODELS_CPU_KERNELS_H_

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

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

constexpr double kMinFlopsPerPart = 1 << 22;  // below, one thread does the whole GEMM

// Runs part(0..parts-1) on the caller and on parts-1 helper tasks of the pool; returns when all
// parts are done.
void RunParts(ffi::ThreadPool& pool, int64_t parts, std::function<void(int64_t)> part) {
  auto job = std::make_shared<Job>();
  job->parts = parts;
  job->part = std::move(part);
  for (int64_t i = 1; i < parts; ++i) pool.Schedule([job] { job->Work(); });
  job->Work();
  std::unique_lock<std::mutex> lock(job->mu);
  job->cv.wait(lock, [&] { return job->done.load() == job->parts; });
}

// True on an x86-64 CPU with AVX-512 (the kernels that need it are compiled for it with REAGENT_AVX512
// and called only then); other CPUs keep XLA's code.
inline bool Avx512Supported() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("avx512f");
#else
  return false;
#endif
}

#if defined(__x86_64__)
#define REAGENT_AVX512 __attribute__((target("avx512f,fma")))
#else
#define REAGENT_AVX512
#endif

typedef float Vec16 __attribute__((vector_size(64)));
typedef int32_t Vec16i __attribute__((vector_size(64)));

// exp(x) for x <= 0 to ~1e-7 relative (Cody-Waite reduction, degree-6 polynomial, exponent by
// bits); exact 1 at 0. Below -87.3 it returns exp(-87.3) ~ 1e-38 instead of 0: harmless in
// the sums it feeds, which hold a 1 (each chunk's maximum).
inline __attribute__((always_inline)) Vec16 ExpNonPositive(Vec16 x) {
  const Vec16 lo = Vec16{} - 87.3f;
  x = x < lo ? lo : x;
  const Vec16 n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round(x / ln 2)
  const Vec16 r = (x - n * 0.693145751953125f) - n * 1.428606765330187e-6f;
  Vec16 p = r * (1.0f / 720) + (1.0f / 120);
  p = p * r + (1.0f / 24);
  p = p * r + (1.0f / 6);
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const Vec16i bits = (__builtin_convertvector(n, Vec16i) + 127) << 23;
  Vec16 scale;
  std::memcpy(&scale, &bits, 64);
  return p * scale;
}

}  // namespace

#endif  // REAGENT_JAX_MODELS_CPU_KERNELS_H_
