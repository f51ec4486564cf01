#include "kernels/cpu/float_operands.h"

#include <vector>

namespace nibble::cpu {

void WithFloatOperands(const GemmProblem& problem, const GemmOperands& operands,
                       absl::FunctionRef<void(const float* a, float* c)> body) {
  std::vector<float> widened;
  const float* a = static_cast<const float*>(operands.a);
  if (problem.dtype != DType::kF32) {
    widened.resize(problem.m * problem.k);
    ConvertToFloat(problem.dtype, operands.a, widened.size(), widened.data());
    a = widened.data();
  }
  WithFloatOutput(problem, operands, [&](float* c) { body(a, c); });
}

void WithFloatOutput(const GemmProblem& problem, const GemmOperands& operands,
                     absl::FunctionRef<void(float* c)> body) {
  if (problem.dtype == DType::kF32) {
    body(static_cast<float*>(operands.c));
    return;
  }
  std::vector<float> c(problem.m * problem.n);
  body(c.data());
  ConvertFromFloat(problem.dtype, c.data(), c.size(), operands.c);
}

}  // namespace nibble::cpu
