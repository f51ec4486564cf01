// Picks the kernel for a problem among the registered ones: the tuning table
// names the variant that should win for the problem's shape, and the first
// registered kernel of that variant that supports the problem runs. When none
// does, the other fast variants are tried, then the scalar reference. A
// kernel that treats A more lossily than the problem accepts
// (GemmProblem::activation_precision) never runs. The
// table answers with the rules of the first ISA level among the kernels' (in
// their order: cpu::CpuKernels lists the CPU's own level first, then the ones
// below; the CUDA kernels' level is their GPU's, and cuda::ForGpu leaves a
// table only that level's rules) that it has rules for. Where the table has
// no rule, a rule function
// given at construction decides (an accelerator backend's, by shape and
// device), or by default M alone.
//
// Example:
//   nibble::Scheduler scheduler(nibble::CpuKernels());
//   absl::StatusOr<const nibble::GemmKernel*> kernel =
//       scheduler.Pick(problem);
//
//   // GPU kernels first, the CPU's for the shapes they refuse:
//   std::vector<const nibble::GemmKernel*> kernels =
//       nibble::cuda::CudaKernels();
//   kernels.insert(kernels.end(), cpu_kernels.begin(), cpu_kernels.end());
//   nibble::Scheduler gpu_scheduler(
//       std::move(kernels), nibble::cuda::ForGpu(table, 0),
//       [](const nibble::GemmProblem& problem) {
//         return nibble::cuda::PreferredVariant(problem, 0);
//       });
#ifndef NIBBLE_KERNELS_SCHEDULER_H_
#define NIBBLE_KERNELS_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/gemm_kernel.h"
#include "kernels/tuning_table.h"

namespace nibble {

// The variant that should win for a problem the tuning table has no rule for.
using VariantRule = std::function<KernelVariant(const GemmProblem&)>;

// Fused up to M of 8, double_buffered above: below that many rows the weight
// read dominates and fused wins on every CPU measured so far.
KernelVariant DefaultVariantRule(const GemmProblem& problem);

class Scheduler {
 public:
  // The kernels must outlive the scheduler; their order breaks ties and
  // ranks their ISA levels for the table (TuningTable::ForIsas).
  explicit Scheduler(std::vector<const GemmKernel*> kernels,
                     TuningTable table = TuningTable::Default(),
                     VariantRule rule = DefaultVariantRule);

  // The variant the table prefers for the problem's shape; without a rule for
  // the problem's format, the one `rule` names.
  KernelVariant PreferredVariant(const GemmProblem& problem) const;

  // NOT_FOUND, naming the problem, when no kernel supports it.
  absl::StatusOr<const GemmKernel*> Pick(const GemmProblem& problem) const;

  std::span<const GemmKernel* const> kernels() const { return kernels_; }
  // The table as the scheduler reads it: table().isa() is the level whose
  // rules answer.
  const TuningTable& table() const { return table_; }

 private:
  std::vector<const GemmKernel*> kernels_;
  TuningTable table_;
  VariantRule rule_;
};

}  // namespace nibble

#endif  // NIBBLE_KERNELS_SCHEDULER_H_
