// Random activations for integration tests, as the wire carries them and as
// the float64 reference takes them, outputs read back from the wire, and the
// error a KServe or Triton reply may show.
//
// Example:
//   const Activations a = RandomActivations(4, spec.k, DType::kBF16, 7);
//   request.set_a(a.bytes);
//   ...
//   EXPECT_LE(MaxRelativeError(OutputValues(response.c(), DType::kBF16),
//                              ReferenceMatmul(a.values, 4, weight)),
//             1e-2);
#ifndef NIBBLE_TESTS_INTEGRATION_ACTIVATIONS_H_
#define NIBBLE_TESTS_INTEGRATION_ACTIVATIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/dtype.h"
#include "gtest/gtest.h"
#include "kernels/gemm_kernel.h"

namespace nibble::testing {

// A [m, k] in [-1, 1), rounded to `dtype`: the same values three ways.
struct Activations {
  std::vector<float> floats;
  std::string bytes;  // in `dtype`, little-endian
  std::vector<double> values;
};

Activations RandomActivations(int64_t m, int64_t k, DType dtype, uint64_t seed);

// The elements of `bytes`, little-endian `dtype`, as doubles.
std::vector<double> OutputValues(const std::string& bytes, DType dtype);

// MatmulErrorBound of what a KServe or Triton reply's "activation_precision"
// parameter says its kernel made of A, for C of `dtype`; a failure and 0 for
// a reply without a valid one.
template <class InferResponse>
double KServeErrorBound(const InferResponse& response, DType dtype) {
  const auto parameter = response.parameters().find("activation_precision");
  if (parameter == response.parameters().end()) {
    ADD_FAILURE() << "the reply has no activation_precision parameter";
    return 0;
  }
  const absl::StatusOr<ActivationPrecision> precision =
      ParseActivationPrecision(parameter->second.string_param());
  EXPECT_TRUE(precision.ok()) << precision.status();
  return precision.ok() ? MatmulErrorBound(*precision, dtype) : 0;
}

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_INTEGRATION_ACTIVATIONS_H_
