// Matrices as the service sends them: row-major, little-endian elements of a
// DType in a byte string.
//
// Example:
//   std::string a = nibble::RandomMatrixBytes(m, k, nibble::DType::kF16, 7);
//   std::vector<double> a_values =
//       nibble::MatrixBytesToDoubles(nibble::DType::kF16, a);
#ifndef NIBBLE_CLIENT_MATRIX_BYTES_H_
#define NIBBLE_CLIENT_MATRIX_BYTES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "format/dtype.h"

namespace nibble {

// A [rows, cols] matrix of values drawn uniformly from [-1, 1) by
// std::mt19937_64(seed), in row-major order, then rounded to `dtype`.
std::string RandomMatrixBytes(int64_t rows, int64_t cols, DType dtype,
                              uint64_t seed);

// Every element of `bytes`, which must hold whole elements of `dtype`.
std::vector<double> MatrixBytesToDoubles(DType dtype, absl::string_view bytes);

}  // namespace nibble

#endif  // NIBBLE_CLIENT_MATRIX_BYTES_H_
