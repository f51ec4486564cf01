// Picks the kernel for a problem among the registered ones: the tuning table
// names the variant that should win for the problem's shape, and the first
// registered kernel of that variant that supports the problem runs. When none
// does, the other fast variants are tried, then the scalar reference.
//
// Example:
//   nibble::Scheduler scheduler(nibble::CpuKernels());
//   absl::StatusOr<const nibble::GemmKernel*> kernel =
//       scheduler.Pick(problem);
#ifndef NIBBLE_KERNELS_SCHEDULER_H_
#define NIBBLE_KERNELS_SCHEDULER_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gemm_kernel.h"

namespace nibble {

struct TuningTable {
  // Problems with m <= fused_max_m prefer kFused; larger ones
  // kDoubleBuffered, where dequantization is amortized over many rows.
  int64_t fused_max_m = 32;
  // Problems whose N gives fewer than this many panels per thread cannot keep
  // every thread busy by splitting N alone, and prefer kStriped.
  int64_t striped_below_panels_per_thread = 2;

  // The built-in table, used when none is given.
  static TuningTable Default() { return TuningTable(); }
};

class Scheduler {
 public:
  // The kernels must outlive the scheduler; their order breaks ties.
  explicit Scheduler(std::vector<const GemmKernel*> kernels,
                     TuningTable table = TuningTable::Default());

  // The variant the table prefers for the problem's shape.
  KernelVariant PreferredVariant(const GemmProblem& problem) const;

  // NOT_FOUND, naming the problem, when no kernel supports it.
  absl::StatusOr<const GemmKernel*> Pick(const GemmProblem& problem) const;

  std::span<const GemmKernel* const> kernels() const { return kernels_; }

 private:
  std::vector<const GemmKernel*> kernels_;
  TuningTable table_;
};

}  // namespace nibble

#endif  // NIBBLE_KERNELS_SCHEDULER_H_
