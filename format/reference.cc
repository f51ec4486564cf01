#include "format/reference.h"

#include <algorithm>
#include <cmath>

#include "format/dequant.h"
#include "format/dtype.h"

namespace nibble {

std::vector<double> ReferenceDequantize(const QuantizedWeight& weight) {
  const WeightSpec& spec = weight.spec;
  std::vector<double> b(spec.k * spec.n);
  for (int64_t row = 0; row < spec.k; ++row) {
    for (int64_t col = 0; col < spec.n; ++col) {
      const uint8_t zero = HasZeros(spec.format) ? weight.Zero(row, col) : 0;
      b[row * spec.n + col] =
          static_cast<double>(DequantizeCode(
              spec.format, weight.Code(row, col),
              ScaleToFloat(spec.format, weight.Scale(row, col)), zero)) *
          spec.global_scale;
    }
  }
  return b;
}

std::vector<double> ReferenceMatmul(std::span<const double> a, int64_t m,
                                    const QuantizedWeight& weight) {
  const int64_t k = weight.spec.k;
  const int64_t n = weight.spec.n;
  const std::vector<double> b = ReferenceDequantize(weight);
  std::vector<double> c(m * n, 0.0);
  for (int64_t row = 0; row < m; ++row) {
    for (int64_t kk = 0; kk < k; ++kk) {
      const double a_value = a[row * k + kk];
      const double* b_row = &b[kk * n];
      double* c_row = &c[row * n];
      for (int64_t col = 0; col < n; ++col) c_row[col] += a_value * b_row[col];
    }
  }
  return c;
}

double MaxRelativeError(std::span<const double> got,
                        std::span<const double> want) {
  double max_error = 0.0;
  double max_magnitude = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double error = std::abs(got[i] - want[i]);
    if (std::isnan(error)) return error;  // a NaN anywhere fails any bound
    max_error = std::max(max_error, error);
    max_magnitude = std::max(max_magnitude, std::abs(want[i]));
  }
  if (max_magnitude == 0.0) return max_error;
  return max_error / max_magnitude;
}

}  // namespace nibble
