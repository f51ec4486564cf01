#include "kernels/scheduler.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace nibble {

Scheduler::Scheduler(std::vector<const GemmKernel*> kernels, TuningTable table)
    : kernels_(std::move(kernels)), table_(table) {}

KernelVariant Scheduler::PreferredVariant(const GemmProblem& problem) const {
  // Below this many rows the weight read dominates and fused wins on every
  // machine measured so far.
  constexpr int64_t kFusedMaxMWithoutRules = 8;
  return table_.Lookup(problem).value_or(problem.m <= kFusedMaxMWithoutRules
                                             ? KernelVariant::kFused
                                             : KernelVariant::kDoubleBuffered);
}

absl::StatusOr<const GemmKernel*> Scheduler::Pick(
    const GemmProblem& problem) const {
  const KernelVariant order[] = {
      PreferredVariant(problem), KernelVariant::kFused,
      KernelVariant::kDoubleBuffered, KernelVariant::kStriped,
      KernelVariant::kReference};
  for (KernelVariant variant : order) {
    for (const GemmKernel* kernel : kernels_) {
      if (kernel->variant() == variant && kernel->Supports(problem)) {
        return kernel;
      }
    }
  }
  return absl::NotFoundError(
      absl::StrCat("no kernel supports ", problem.DebugString()));
}

}  // namespace nibble
