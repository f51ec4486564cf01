// Gives a CPU kernel's body fp32 views of A and C whatever the problem's
// dtype: fp16 and bf16 inputs are widened once, outputs rounded once.
#ifndef NIBBLE_KERNELS_CPU_FLOAT_OPERANDS_H_
#define NIBBLE_KERNELS_CPU_FLOAT_OPERANDS_H_

#include "absl/functional/function_ref.h"
#include "kernels/gemm_kernel.h"

namespace nibble::cpu {

// Calls body(a, c) with A [M, K] and C [M, N] in fp32. The body must write
// every element of C.
void WithFloatOperands(const GemmProblem& problem, const GemmOperands& operands,
                       absl::FunctionRef<void(const float* a, float* c)> body);

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_FLOAT_OPERANDS_H_
