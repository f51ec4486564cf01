// The float64 reference that every kernel is tested against: dequantize B
// element by element from its canonical layout, then multiply in double.
//
// Example:
//   std::vector<double> b = nibble::ReferenceDequantize(weight);   // [K, N]
//   std::vector<double> c = nibble::ReferenceMatmul(a, m, weight); // [M, N]
#ifndef NIBBLE_FORMAT_REFERENCE_H_
#define NIBBLE_FORMAT_REFERENCE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "format/weight_format.h"

namespace nibble {

// B [K, N] row-major.
std::vector<double> ReferenceDequantize(const QuantizedWeight& weight);

// C [M, N] = A [M, K] · B, all in float64.
std::vector<double> ReferenceMatmul(std::span<const double> a, int64_t m,
                                    const QuantizedWeight& weight);

// max |got - want| / max |want|: the error relative to the output's scale, so
// that entries near zero do not dominate. 0 when both are all zero.
double MaxRelativeError(std::span<const double> got,
                        std::span<const double> want);

}  // namespace nibble

#endif  // NIBBLE_FORMAT_REFERENCE_H_
