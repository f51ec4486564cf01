// Times nibble's CPU kernels on one weight at several M: every fast variant
// (fused, double_buffered, striped; the first registered kernel of each that
// supports the problem) and the scheduler's pick, with fp32 activations and
// outputs, each call reading a copy of the weight that is not in cache.
//
// Example:
//   nibble::Scheduler scheduler(nibble::cpu::CpuKernels());
//   absl::StatusOr<std::vector<nibble::bench::PointResult>> results =
//       nibble::bench::TimeWeight({nibble::WeightFormat::kU4b8, 128},
//                                 {4096, 4096}, {1, 16}, scheduler, pool,
//                                 /*repeats=*/10, llc_bytes, [](int64_t m) {});
#ifndef NIBBLE_BENCH_KERNELS_BENCH_GRID_H_
#define NIBBLE_BENCH_KERNELS_BENCH_GRID_H_

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "base/thread_pool.h"
#include "bench/kernels/bench_flags.h"
#include "bench/kernels/timing.h"
#include "kernels/gemm_kernel.h"
#include "kernels/scheduler.h"

namespace nibble::bench {

struct KernelTiming {
  std::string kernel;  // e.g. "fused_u4b8_avx512"
  KernelVariant variant = KernelVariant::kFused;
  bool pick = false;  // the scheduler's pick for the problem
  // Whether it quantizes A to int8 (--activation_precision=int8's pick).
  bool int8 = false;
  Timing timing;
};

// Everything timed at one grid point.
struct PointResult {
  WeightKind weight;
  Shape shape;
  int64_t m = 0;
  int threads = 1;
  // What one call reads of the weight: packed codes, scales and zeros.
  int64_t weight_bytes = 0;
  // The fast variants in the order fused, double_buffered, striped (those
  // that have a kernel for the problem), then the pick when it is none of
  // them and not the scalar reference, which is too slow to time.
  std::vector<KernelTiming> kernels;
  std::string pick;  // the scheduler's kernel, timed or not
};

// The variants nibble-bench times, in the order it reports them.
inline constexpr KernelVariant kFastVariants[] = {
    KernelVariant::kFused, KernelVariant::kDoubleBuffered,
    KernelVariant::kStriped};

// For each fast variant that has one, the first of `kernels` of that variant
// that supports `problem`.
std::vector<const GemmKernel*> FastKernels(
    std::span<const GemmKernel* const> kernels, const GemmProblem& problem);

// The results of rounds that timed the same points in the same order, with
// each kernel's median_us the median over the rounds and calls their sum.
std::vector<PointResult> MedianOverRounds(
    const std::vector<std::vector<PointResult>>& rounds);

// One result per m of `ms`, on a random weight of `kind` and `shape` and A
// and C of `dtype`, the pick made for problems of `precision` (the fast
// variants as for bf16).
// Calls before_each(m) before timing each m. The first kernel error, if any.
absl::StatusOr<std::vector<PointResult>> TimeWeight(
    const WeightKind& kind, const Shape& shape, const std::vector<int64_t>& ms,
    ActivationPrecision precision, DType dtype, const Scheduler& scheduler,
    ThreadPool& pool, int repeats, int64_t llc_bytes,
    absl::FunctionRef<void(int64_t m)> before_each);

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_BENCH_GRID_H_
