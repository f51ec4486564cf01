#include "tests/kernels/encoded_values.h"

#include <cstring>

namespace nibble::testing {

Encoded Encode(DType dtype, const std::vector<float>& values) {
  Encoded encoded{std::vector<uint8_t>(values.size() * DTypeSize(dtype)), {}};
  for (size_t i = 0; i < values.size(); ++i) {
    float rounded = values[i];
    if (dtype == DType::kF32) {
      std::memcpy(&encoded.bytes[i * 4], &rounded, 4);
    } else {
      const uint16_t bits = dtype == DType::kF16 ? FloatToHalf(values[i])
                                                 : FloatToBf16(values[i]);
      rounded = dtype == DType::kF16 ? HalfToFloat(bits) : Bf16ToFloat(bits);
      std::memcpy(&encoded.bytes[i * 2], &bits, 2);
    }
    encoded.values.push_back(rounded);
  }
  return encoded;
}

std::vector<double> Decode(DType dtype, const std::vector<uint8_t>& bytes) {
  const size_t count = bytes.size() / DTypeSize(dtype);
  std::vector<double> values(count);
  for (size_t i = 0; i < count; ++i) {
    if (dtype == DType::kF32) {
      float value;
      std::memcpy(&value, &bytes[i * 4], 4);
      values[i] = value;
    } else {
      uint16_t bits;
      std::memcpy(&bits, &bytes[i * 2], 2);
      values[i] = dtype == DType::kF16 ? HalfToFloat(bits) : Bf16ToFloat(bits);
    }
  }
  return values;
}

}  // namespace nibble::testing
