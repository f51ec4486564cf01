// The common shape of the CPU kernels: one variant, one weight format, one
// ISA, named "<variant>_<format>_<isa>" (e.g. "fused_u4b8_avx2"), with
// "_<precision>" after it for a kernel that quantizes A (e.g.
// "double_buffered_u4b8_avx512_vnni_int8"). A kernel
// derives from it and implements Run, which can hand its format to loops
// templated on it through WithFormatConstant (format/weight_format.h).
//
// Example:
//   class FusedAvx2Kernel final : public FormatKernel {
//    public:
//     explicit FusedAvx2Kernel(WeightFormat format)
//         : FormatKernel(KernelVariant::kFused, format, "avx2") {}
//     absl::Status Run(...) const override;
//   };
#ifndef NIBBLE_KERNELS_CPU_FORMAT_KERNEL_H_
#define NIBBLE_KERNELS_CPU_FORMAT_KERNEL_H_

#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "kernels/gemm_kernel.h"

namespace nibble::cpu {

// The fewest rows of A that the int8 kernels quantize, and that the kernels
// the amx level lists round to bf16 (f32 and f16 A; cpu_kernels.cc says why).
inline constexpr int64_t kMinConvertedRows = 16;

// Whether a kernel that rounds f32 and f16 A to bf16 from `min_rounded_rows`
// rows takes `problem`: bf16 A (nothing to round) at any M.
inline bool RoundingToBf16Allowed(const GemmProblem& problem,
                                  int64_t min_rounded_rows) {
  return problem.dtype == DType::kBF16 || problem.m >= min_rounded_rows;
}

class FormatKernel : public GemmKernel {
 public:
  FormatKernel(KernelVariant variant, WeightFormat format,
               absl::string_view isa, absl::string_view precision = "")
      : variant_(variant),
        format_(format),
        isa_(isa),
        name_(absl::StrCat(KernelVariantName(variant), "_",
                           WeightFormatName(format), "_", isa,
                           precision.empty() ? "" : "_", precision)) {}

  absl::string_view name() const override { return name_; }
  KernelVariant variant() const override { return variant_; }
  absl::string_view isa() const override { return isa_; }
  // Any problem of the kernel's format with at least one row and a weight
  // packed into panels.
  bool Supports(const GemmProblem& problem) const override {
    return problem.format == format_ && problem.m > 0 && problem.cpu_panels;
  }

 protected:
  WeightFormat format() const { return format_; }

 private:
  KernelVariant variant_;
  WeightFormat format_;
  std::string isa_;
  std::string name_;
};

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_FORMAT_KERNEL_H_
