#include "kernels/gemm_kernel.h"

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

std::string GemmProblem::DebugString() const {
  return absl::StrCat("m=", m, " n=", n, " k=", k, " ",
                      WeightFormatName(format), " group=", group_size, " ",
                      DTypeName(dtype), " threads=", threads,
                      cpu_panels ? "" : " without CPU panels");
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

}  // namespace nibble
