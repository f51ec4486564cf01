// Activations and outputs as the bytes kernels read and write, for the
// kernel tests: values encoded in a dtype together with the values the bytes
// hold after rounding, and bytes decoded back, element by element.
//
// Example:
//   nibble::testing::Encoded a = nibble::testing::Encode(DType::kBF16, floats);
//   std::vector<double> c = nibble::testing::Decode(DType::kBF16, c_bytes);
#ifndef NIBBLE_TESTS_KERNELS_ENCODED_VALUES_H_
#define NIBBLE_TESTS_KERNELS_ENCODED_VALUES_H_

#include <cstdint>
#include <vector>

#include "format/dtype.h"

namespace nibble::testing {

struct Encoded {
  std::vector<uint8_t> bytes;
  std::vector<double> values;  // what `bytes` hold, after rounding
};

Encoded Encode(DType dtype, const std::vector<float>& values);

std::vector<double> Decode(DType dtype, const std::vector<uint8_t>& bytes);

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_KERNELS_ENCODED_VALUES_H_
