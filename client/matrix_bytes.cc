#include "client/matrix_bytes.h"

#include <random>

namespace nibble {

std::string RandomMatrixBytes(int64_t rows, int64_t cols, DType dtype,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(rows * cols);
  for (float& value : values) value = uniform(rng);
  std::string bytes(values.size() * DTypeSize(dtype), '\0');
  ConvertFromFloat(dtype, values.data(), values.size(), bytes.data());
  return bytes;
}

std::vector<double> MatrixBytesToDoubles(DType dtype, absl::string_view bytes) {
  std::vector<float> values(bytes.size() / DTypeSize(dtype));
  ConvertToFloat(dtype, bytes.data(), values.size(), values.data());
  return std::vector<double>(values.begin(), values.end());
}

}  // namespace nibble
