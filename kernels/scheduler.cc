#include "kernels/scheduler.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace nibble {

KernelVariant DefaultVariantRule(const GemmProblem& problem) {
  constexpr int64_t kFusedMaxM = 8;
  return problem.m <= kFusedMaxM ? KernelVariant::kFused
                                 : KernelVariant::kDoubleBuffered;
}

namespace {

// The ISA levels of `kernels` in their order, each once.
std::vector<absl::string_view> IsaLevels(
    const std::vector<const GemmKernel*>& kernels) {
  std::vector<absl::string_view> levels;
  for (const GemmKernel* kernel : kernels) {
    if (!kernel->isa().empty() && std::find(levels.begin(), levels.end(),
                                            kernel->isa()) == levels.end()) {
      levels.push_back(kernel->isa());
    }
  }
  return levels;
}

}  // namespace

Scheduler::Scheduler(std::vector<const GemmKernel*> kernels, TuningTable table,
                     VariantRule rule)
    : kernels_(std::move(kernels)),
      table_(table.ForIsas(IsaLevels(kernels_))),
      rule_(std::move(rule)) {}

KernelVariant Scheduler::PreferredVariant(const GemmProblem& problem) const {
  if (std::optional<KernelVariant> variant = table_.Lookup(problem)) {
    return *variant;
  }
  return rule_(problem);
}

absl::StatusOr<const GemmKernel*> Scheduler::Pick(
    const GemmProblem& problem) const {
  // A problem that accepts int8 (opt-in) runs an int8 kernel wherever one
  // takes it, whatever variant the rules, measured on bf16 kernels, prefer.
  if (problem.activation_precision == ActivationPrecision::kInt8) {
    for (const GemmKernel* kernel : kernels_) {
      if (kernel->QuantizesActivationsToInt8() && kernel->Supports(problem)) {
        return kernel;
      }
    }
  }
  const KernelVariant order[] = {
      PreferredVariant(problem), KernelVariant::kFused,
      KernelVariant::kDoubleBuffered, KernelVariant::kStriped,
      KernelVariant::kReference};
  for (KernelVariant variant : order) {
    for (const GemmKernel* kernel : kernels_) {
      if (kernel->variant() == variant &&
          ActivationPrecisionOf(*kernel, problem.dtype) <=
              problem.activation_precision &&
          kernel->Supports(problem)) {
        return kernel;
      }
    }
  }
  return absl::NotFoundError(
      absl::StrCat("no kernel supports ", problem.DebugString()));
}

}  // namespace nibble
