// The scalar reference kernel: one dequantized weight at a time, plain loops,
// every format and dtype. The scheduler's last resort, and readable proof of
// what the fast kernels must compute.
//
// Example:
//   nibble::cpu::ReferenceKernel kernel(nibble::WeightFormat::kFp4);
//   kernel.name();  // "reference_fp4_scalar"
#ifndef NIBBLE_KERNELS_CPU_REFERENCE_KERNEL_H_
#define NIBBLE_KERNELS_CPU_REFERENCE_KERNEL_H_

#include "kernels/cpu/format_kernel.h"

namespace nibble::cpu {

class ReferenceKernel final : public FormatKernel {
 public:
  explicit ReferenceKernel(WeightFormat format)
      : FormatKernel(KernelVariant::kReference, format, "scalar") {}

  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override;
};

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_REFERENCE_KERNEL_H_
