#include "tests/integration/activations.h"

#include <random>

namespace nibble::testing {

Activations RandomActivations(int64_t m, int64_t k, DType dtype,
                              uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Activations a;
  a.floats.resize(m * k);
  for (float& f : a.floats) f = uniform(rng);
  a.bytes.resize(a.floats.size() * DTypeSize(dtype));
  ConvertFromFloat(dtype, a.floats.data(), a.floats.size(), a.bytes.data());
  ConvertToFloat(dtype, a.bytes.data(), a.floats.size(), a.floats.data());
  a.values.assign(a.floats.begin(), a.floats.end());
  return a;
}

std::vector<double> OutputValues(const std::string& bytes, DType dtype) {
  std::vector<float> floats(bytes.size() / DTypeSize(dtype));
  ConvertToFloat(dtype, bytes.data(), floats.size(), floats.data());
  return std::vector<double>(floats.begin(), floats.end());
}

}  // namespace nibble::testing
