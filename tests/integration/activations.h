// Random activations for integration tests, as the wire carries them and as
// the float64 reference takes them, and outputs read back from the wire.
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

#include "format/dtype.h"

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

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_INTEGRATION_ACTIVATIONS_H_
