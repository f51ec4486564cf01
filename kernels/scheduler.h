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
#include "kernels/tuning_table.h"

namespace nibble {

class Scheduler {
 public:
  // The kernels must outlive the scheduler; their order breaks ties.
  explicit Scheduler(std::vector<const GemmKernel*> kernels,
                     TuningTable table = TuningTable::Default());

  // The variant the table prefers for the problem's shape; without a rule for
  // the problem's format, fused for small M and double_buffered above.
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
