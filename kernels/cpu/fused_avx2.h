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

#include <string>

#include "kernels/gemm_kernel.h"

namespace nibble::cpu {

class FusedAvx2Kernel final : public GemmKernel {
 public:
  explicit FusedAvx2Kernel(WeightFormat format);

  absl::string_view name() const override { return name_; }
  KernelVariant variant() const override { return KernelVariant::kFused; }
  bool Supports(const GemmProblem& problem) const override;
  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override;

 private:
  WeightFormat format_;
  std::string name_;
};

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_FUSED_AVX2_H_
