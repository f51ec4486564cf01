#include "bench/kernels/openblas_baseline.h"

#include <chrono>
#include <thread>

#include "absl/status/status.h"

#ifndef NIBBLE_HAVE_OPENBLAS
#define NIBBLE_HAVE_OPENBLAS 0
#endif
#if NIBBLE_HAVE_OPENBLAS
#include <cblas.h>
#endif

namespace nibble::bench {

bool HaveOpenBlas() { return NIBBLE_HAVE_OPENBLAS; }

std::string OpenBlasDescription() {
#if NIBBLE_HAVE_OPENBLAS
  return openblas_get_config();
#else
  return "not built in: OpenBLAS was not found when nibble was configured "
         "(install libopenblas-dev and reconfigure)";
#endif
}

absl::StatusOr<std::vector<Timing>> TimeSgemm(
    [[maybe_unused]] const Shape& shape,
    [[maybe_unused]] const std::vector<int64_t>& ms,
    [[maybe_unused]] int threads, [[maybe_unused]] int repeats,
    [[maybe_unused]] int64_t llc_bytes,
    [[maybe_unused]] absl::FunctionRef<void(int64_t m)> before_each) {
#if NIBBLE_HAVE_OPENBLAS
  openblas_set_num_threads(threads);
  const int64_t b_floats = shape.k * shape.n;
  const int copies = CopiesToLeaveTheCache(b_floats * 4, llc_bytes);
  std::vector<std::vector<float>> b(copies, RandomFloats(b_floats, 1));
  std::vector<Timing> timings;
  for (int64_t m : ms) {
    before_each(m);
    const std::vector<float> a = RandomFloats(m * shape.k, 2);
    std::vector<float> c(m * shape.n);
    timings.push_back(TimeCalls(
        [&](int call) {
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, shape.n,
                      shape.k, 1.0f, a.data(), shape.k, b[call % copies].data(),
                      shape.n, 0.0f, c.data(), shape.n);
        },
        repeats));
  }
  // OpenBLAS's threads spin for a while after a call; let them go to sleep
  // before the kernels are timed on the same cores.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  return timings;
#else
  return absl::UnimplementedError(OpenBlasDescription());
#endif
}

}  // namespace nibble::bench
