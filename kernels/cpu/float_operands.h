// Gives a CPU kernel's body fp32 views of A and C whatever the problem's
// dtype: fp16 and bf16 inputs are widened once, outputs rounded once.
#ifndef NIBBLE_KERNELS_CPU_FLOAT_OPERANDS_H_
#define NIBBLE_KERNELS_CPU_FLOAT_OPERANDS_H_

#include <algorithm>
#include <cstdint>

#include "absl/functional/function_ref.h"
#include "kernels/gemm_kernel.h"

namespace nibble::cpu {

// Calls body(a, c) with A [M, K] and C [M, N] in fp32. The body must write
// every element of C.
void WithFloatOperands(const GemmProblem& problem, const GemmOperands& operands,
                       absl::FunctionRef<void(const float* a, float* c)> body);

// Calls body(c) with C [M, N] in fp32, for a body that reads A as it is.
// The body must write every element of C.
void WithFloatOutput(const GemmProblem& problem, const GemmOperands& operands,
                     absl::FunctionRef<void(float* c)> body);

// Copies a block of C's columns, rows of `block_width` floats starting at
// column `first_column`, into C [m, n], leaving out columns past n.
inline void StoreBlockColumns(const float* block, int64_t block_width,
                              int64_t m, int64_t n, int64_t first_column,
                              float* c) {
  const int64_t columns = std::min(block_width, n - first_column);
  for (int64_t row = 0; row < m; ++row) {
    std::copy_n(block + row * block_width, columns, c + row * n + first_column);
  }
}

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_FLOAT_OPERANDS_H_
