#include "bench/kernels/bench_grid.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "kernels/packed_weight.h"

namespace nibble::bench {

std::vector<const GemmKernel*> FastKernels(
    std::span<const GemmKernel* const> kernels, const GemmProblem& problem) {
  std::vector<const GemmKernel*> fast;
  for (KernelVariant variant : kFastVariants) {
    for (const GemmKernel* kernel : kernels) {
      if (kernel->variant() == variant && kernel->Supports(problem)) {
        fast.push_back(kernel);
        break;
      }
    }
  }
  return fast;
}

std::vector<PointResult> MedianOverRounds(
    const std::vector<std::vector<PointResult>>& rounds) {
  if (rounds.empty()) return {};
  std::vector<PointResult> merged = rounds.front();
  for (size_t point = 0; point < merged.size(); ++point) {
    for (size_t kernel = 0; kernel < merged[point].kernels.size(); ++kernel) {
      std::vector<double> medians;
      int calls = 0;
      for (const std::vector<PointResult>& round : rounds) {
        const Timing& timing = round[point].kernels[kernel].timing;
        medians.push_back(timing.median_us);
        calls += timing.calls;
      }
      merged[point].kernels[kernel].timing = {.median_us = Median(medians),
                                              .calls = calls};
    }
  }
  return merged;
}

absl::StatusOr<std::vector<PointResult>> TimeWeight(
    const WeightKind& kind, const Shape& shape, const std::vector<int64_t>& ms,
    ActivationPrecision precision, DType dtype, const Scheduler& scheduler,
    ThreadPool& pool, int repeats, int64_t llc_bytes,
    absl::FunctionRef<void(int64_t m)> before_each) {
  const WeightSpec spec{kind.format, shape.k, shape.n, kind.group_size};
  absl::StatusOr<PackedWeight> packed =
      PackedWeight::Pack(RandomQuantizedWeight(spec, /*seed=*/42));
  if (!packed.ok()) return packed.status();
  const int copies = CopiesToLeaveTheCache(packed->resident_bytes(), llc_bytes);
  const std::vector<PackedWeight> weights(copies, *packed);

  std::vector<PointResult> results;
  for (int64_t m : ms) {
    before_each(m);
    const GemmProblem bf16_problem =
        MakeGemmProblem(*packed, m, dtype, pool.threads());
    GemmProblem problem = bf16_problem;
    problem.activation_precision = precision;
    const std::vector<float> a_values = RandomFloats(m * shape.k, /*seed=*/m);
    std::vector<uint8_t> a(a_values.size() * DTypeSize(dtype));
    ConvertFromFloat(dtype, a_values.data(), a_values.size(), a.data());
    std::vector<uint8_t> c(m * shape.n * DTypeSize(dtype));
    absl::StatusOr<const GemmKernel*> pick = scheduler.Pick(problem);
    if (!pick.ok()) return pick.status();

    std::vector<const GemmKernel*> timed =
        FastKernels(scheduler.kernels(), bf16_problem);
    if (std::find(timed.begin(), timed.end(), *pick) == timed.end() &&
        (*pick)->variant() != KernelVariant::kReference) {
      timed.push_back(*pick);
    }
    PointResult result{.weight = kind,
                       .shape = shape,
                       .m = m,
                       .threads = pool.threads(),
                       .weight_bytes = packed->resident_bytes(),
                       .kernels = {},
                       .pick = std::string((*pick)->name())};
    for (const GemmKernel* kernel : timed) {
      absl::Status status;
      const Timing timing = TimeCalls(
          [&](int call) {
            if (!status.ok()) return;
            status = kernel->Run(
                problem, {&weights[call % copies], a.data(), c.data()}, pool);
          },
          repeats);
      if (!status.ok()) {
        return absl::InternalError(absl::StrCat(kernel->name(), " failed on ",
                                                problem.DebugString(), ": ",
                                                status.message()));
      }
      result.kernels.push_back({.kernel = std::string(kernel->name()),
                                .variant = kernel->variant(),
                                .pick = kernel == *pick,
                                .int8 = kernel->QuantizesActivationsToInt8(),
                                .timing = timing});
    }
    results.push_back(std::move(result));
  }
  return results;
}

}  // namespace nibble::bench
