// The scalar reference kernel: one dequantized weight at a time, plain loops,
// every format and dtype. The scheduler's last resort, and readable proof of
// what the fast kernels must compute.
//
// Example:
//   nibble::cpu::ReferenceKernel kernel(nibble::WeightFormat::kFp4);
//   kernel.name();  // "reference_fp4_scalar"
#ifndef NIBBLE_KERNELS_CPU_REFERENCE_KERNEL_H_
#define NIBBLE_KERNELS_CPU_REFERENCE_KERNEL_H_

#include <string>

#include "kernels/gemm_kernel.h"

namespace nibble::cpu {

class ReferenceKernel final : public GemmKernel {
 public:
  explicit ReferenceKernel(WeightFormat format);

  absl::string_view name() const override { return name_; }
  KernelVariant variant() const override { return KernelVariant::kReference; }
  bool Supports(const GemmProblem& problem) const override;
  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override;

 private:
  WeightFormat format_;
  std::string name_;
};

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_REFERENCE_KERNEL_H_
