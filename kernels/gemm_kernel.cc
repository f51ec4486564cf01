#include "kernels/gemm_kernel.h"

#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"

namespace nibble {

absl::string_view KernelVariantName(KernelVariant variant) {
  switch (variant) {
    case KernelVariant::kReference:
      return "reference";
    case KernelVariant::kFused:
      return "fused";
    case KernelVariant::kDoubleBuffered:
      return "double_buffered";
    case KernelVariant::kStriped:
      return "striped";
  }
  return "unknown";
}

absl::string_view ActivationPrecisionName(ActivationPrecision precision) {
  switch (precision) {
    case ActivationPrecision::kExact:
      return "exact";
    case ActivationPrecision::kBf16:
      return "bf16";
    case ActivationPrecision::kInt8:
      return "int8";
  }
  return "unknown";
}

int ActivationPrecisionWireValue(ActivationPrecision precision) {
  switch (precision) {
    case ActivationPrecision::kExact:
      return 1;
    case ActivationPrecision::kBf16:
      return 2;
    case ActivationPrecision::kInt8:
      return 3;
  }
  return 0;
}

absl::StatusOr<ActivationPrecision> ParseActivationPrecision(
    absl::string_view name) {
  for (ActivationPrecision precision : kAllActivationPrecisions) {
    if (ActivationPrecisionName(precision) == name) return precision;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown activation precision \"", name, "\": use exact, bf16 or int8"));
}

double MatmulErrorBound(ActivationPrecision precision, DType dtype) {
  switch (precision) {
    case ActivationPrecision::kExact:
      return dtype == DType::kF32 ? 1e-4 : 1e-2;
    case ActivationPrecision::kBf16:
      return 1e-2;
    case ActivationPrecision::kInt8:
      return 5e-2;
  }
  return 0;
}

ActivationPrecision ActivationPrecisionOf(const GemmKernel& kernel,
                                          DType dtype) {
  if (kernel.QuantizesActivationsToInt8()) return ActivationPrecision::kInt8;
  if (kernel.RoundsActivationsToBf16(dtype)) return ActivationPrecision::kBf16;
  return ActivationPrecision::kExact;
}

std::string GemmProblem::DebugString() const {
  return absl::StrCat(
      "m=", m, " n=", n, " k=", k, " ", WeightFormatName(format),
      " group=", group_size, " ", DTypeName(dtype), " threads=", threads,
      cpu_panels ? "" : " without CPU panels",
      activation_precision == ActivationPrecision::kBf16
          ? ""
          : absl::StrCat(" activations=",
                         ActivationPrecisionName(activation_precision)));
}

GemmProblem MakeGemmProblem(const PackedWeight& weight, int64_t m, DType dtype,
                            int threads) {
  const WeightSpec& spec = weight.spec();
  return GemmProblem{.m = m,
                     .n = spec.n,
                     .k = spec.k,
                     .format = spec.format,
                     .group_size = spec.group_size,
                     .dtype = dtype,
                     .threads = threads,
                     .cpu_panels = weight.has_panels()};
}

absl::Status GemmKernel::RunBlocks(const GemmProblem& problem,
                                   const PackedWeight* b,
                                   const DeviceWeight* device,
                                   absl::Span<const RowBlock> blocks,
                                   ThreadPool& pool) const {
  if (blocks.size() == 1) {
    return Run(problem,
               {.b = b, .a = blocks[0].a, .c = blocks[0].c, .device = device},
               pool);
  }
  const int64_t a_row_bytes = problem.k * DTypeSize(problem.dtype);
  const int64_t c_row_bytes = problem.n * DTypeSize(problem.dtype);
  auto a = std::make_unique_for_overwrite<char[]>(problem.m * a_row_bytes);
  auto c = std::make_unique_for_overwrite<char[]>(problem.m * c_row_bytes);
  int64_t row = 0;
  for (const RowBlock& block : blocks) {
    std::memcpy(a.get() + row * a_row_bytes, block.a, block.rows * a_row_bytes);
    row += block.rows;
  }
  if (absl::Status status =
          Run(problem, {.b = b, .a = a.get(), .c = c.get(), .device = device},
              pool);
      !status.ok()) {
    return status;
  }
  row = 0;
  for (const RowBlock& block : blocks) {
    std::memcpy(block.c, c.get() + row * c_row_bytes, block.rows * c_row_bytes);
    row += block.rows;
  }
  return absl::OkStatus();
}

}  // namespace nibble
