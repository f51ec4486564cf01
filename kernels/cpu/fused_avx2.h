// The fused kernel for AVX2 (with FMA and F16C): each packed word is
// dequantized in registers, bitwise, and fed straight into the FMAs of up to
// four rows of A at once; nothing is staged in memory. Threads split N by
// panels. Best for small M, where reading B dominates.
//
// Example:
//   nibble::cpu::FusedAvx2Kernel kernel(nibble::WeightFormat::kU4b8);
//   kernel.name();  // "fused_u4b8_avx2"
#ifndef NIBBLE_KERNELS_CPU_FUSED_AVX2_H_
#define NIBBLE_KERNELS_CPU_FUSED_AVX2_H_

#include "kernels/cpu/format_kernel.h"

namespace nibble::cpu {

class FusedAvx2Kernel final : public FormatKernel {
 public:
  explicit FusedAvx2Kernel(WeightFormat format)
      : FormatKernel(KernelVariant::kFused, format, "avx2") {}

  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override;
};

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_FUSED_AVX2_H_
