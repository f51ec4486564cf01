#include "kernels/cpu/float_operands.h"

#include <vector>

namespace nibble::cpu {

void WithFloatOperands(const GemmProblem& problem, const GemmOperands& operands,
                       absl::FunctionRef<void(const float* a, float* c)> body) {
  if (problem.dtype == DType::kF32) {
    body(static_cast<const float*>(operands.a),
         static_cast<float*>(operands.c));
    return;
  }
  std::vector<float> a(problem.m * problem.k);
  std::vector<float> c(problem.m * problem.n);
  ConvertToFloat(problem.dtype, operands.a, a.size(), a.data());
  body(a.data(), c.data());
  ConvertFromFloat(problem.dtype, c.data(), c.size(), operands.c);
}

}  // namespace nibble::cpu
