// 4-bit weight formats and their canonical (wire and file) layout.
//
// A quantized weight B [K, N] is three arrays:
//   qweight [K/8, N] uint32: the code of row k = 8i + j, column n, sits in
//                            bits 4j..4j+3 of word [i, n];
//   scales  [K/group, N] fp16 bits;
//   zeros   [K/group, N] uint8, 0..15, only for kU4.
// and each element dequantizes to
//   kFp4:  w = fp4(q) * s          (FP4 E2M1)
//   kU4b8: w = (q - 8) * s         (symmetric INT4, GPTQ style)
//   kU4:   w = (q - z) * s         (asymmetric INT4, AWQ style)
//
// Example:
//   nibble::WeightSpec spec{nibble::WeightFormat::kU4b8, 4096, 4096, 128};
//   if (absl::Status s = spec.Validate(); !s.ok()) return s;
//   nibble::QuantizedWeight w = nibble::RandomQuantizedWeight(spec, 42);
//   uint8_t q = w.Code(/*row=*/17, /*col=*/3);
#ifndef NIBBLE_KERNELS_WEIGHT_FORMAT_H_
#define NIBBLE_KERNELS_WEIGHT_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nibble {

enum class WeightFormat { kFp4, kU4b8, kU4 };

// "fp4", "u4b8" or "u4".
absl::string_view WeightFormatName(WeightFormat format);
absl::StatusOr<WeightFormat> ParseWeightFormat(absl::string_view name);
bool HasZeros(WeightFormat format);

// Rows per packed uint32 word.
inline constexpr int64_t kCodesPerWord = 8;
// Largest K and N accepted, so that every byte count fits comfortably.
inline constexpr int64_t kMaxDimension = int64_t{1} << 20;

struct WeightSpec {
  WeightFormat format = WeightFormat::kU4b8;
  int64_t k = 0;
  int64_t n = 0;
  int64_t group_size = 0;

  // OK when K is a positive multiple of 8 and of the group size, N positive,
  // both at most kMaxDimension, and the group size is 32, 64, 128 or K.
  absl::Status Validate() const;

  int64_t groups() const { return k / group_size; }
  int64_t qweight_bytes() const { return k / kCodesPerWord * n * 4; }
  int64_t scales_bytes() const { return groups() * n * 2; }
  int64_t zeros_bytes() const { return HasZeros(format) ? groups() * n : 0; }
  int64_t canonical_bytes() const {
    return qweight_bytes() + scales_bytes() + zeros_bytes();
  }
  // e.g. "u4b8 k=4096 n=4096 group=128".
  std::string DebugString() const;

  friend bool operator==(const WeightSpec&, const WeightSpec&) = default;
};

// A weight in the canonical layout, host byte order (little-endian on x86).
struct QuantizedWeight {
  WeightSpec spec;
  std::vector<uint32_t> qweight;  // [K/8, N]
  std::vector<uint16_t> scales;   // [K/group, N] fp16 bits
  std::vector<uint8_t> zeros;     // [K/group, N]; empty unless kU4

  uint8_t Code(int64_t row, int64_t col) const {
    const uint32_t word = qweight[(row / kCodesPerWord) * spec.n + col];
    return (word >> (4 * (row % kCodesPerWord))) & 0xfu;
  }
  void SetCode(int64_t row, int64_t col, uint8_t code);
  uint16_t Scale(int64_t row, int64_t col) const {
    return scales[(row / spec.group_size) * spec.n + col];
  }
  uint8_t Zero(int64_t row, int64_t col) const {
    return zeros[(row / spec.group_size) * spec.n + col];
  }

  // OK when the arrays have the sizes the spec implies, every scale is finite
  // (neither NaN nor infinite) and every zero point is at most 15.
  absl::Status Validate() const;
};

// Random codes, zero points and positive scales in [2^-8, 2^-4), so that
// products of random activations and weights stay well inside fp16 range.
QuantizedWeight RandomQuantizedWeight(const WeightSpec& spec, uint64_t seed);

}  // namespace nibble

#endif  // NIBBLE_KERNELS_WEIGHT_FORMAT_H_
