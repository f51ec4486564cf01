// Element types of activations and outputs, their nibble.v1 wire values, and
// their conversion to and from fp32, done bitwise so that results do not
// depend on the compiler's or the CPU's half-precision support.
//
// Example:
//   absl::StatusOr<nibble::DType> dtype = nibble::ParseDType("bf16");
//   std::vector<float> a(m * k);
//   nibble::ConvertToFloat(*dtype, bytes.data(), a.size(), a.data());
#ifndef NIBBLE_FORMAT_DTYPE_H_
#define NIBBLE_FORMAT_DTYPE_H_

#include <bit>
#include <cstddef>
#include <cstdint>
#include <iterator>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nibble {

enum class DType { kF32, kF16, kBF16 };

struct DTypeTraits {
  DType dtype;
  // The nibble.v1.DType value, so that the server and the client each
  // translate by the table instead of a switch of their own.
  int wire_value;
};

// One row per dtype, in the enum's order.
inline constexpr DTypeTraits kDTypeTable[] = {
    {DType::kF32, 1}, {DType::kF16, 2}, {DType::kBF16, 3}};

inline constexpr const DTypeTraits& Traits(DType dtype) {
  return kDTypeTable[static_cast<size_t>(dtype)];
}

static_assert(
    [] {
      for (size_t i = 0; i < std::size(kDTypeTable); ++i) {
        if (static_cast<size_t>(kDTypeTable[i].dtype) != i) return false;
      }
      return true;
    }(),
    "kDTypeTable: rows in the enum's order");

// "f32", "f16" or "bf16".
absl::string_view DTypeName(DType dtype);
absl::StatusOr<DType> ParseDType(absl::string_view name);
size_t DTypeSize(DType dtype);
// The dtype of a nibble.v1.DType value; INVALID_ARGUMENT listing the valid
// ones (DTYPE_<NAME>) for any other.
absl::StatusOr<DType> DTypeFromWire(int wire_value,
                                    absl::string_view wire_name);

// IEEE binary16 to fp32, exact for every input (subnormals, infinities, NaN).
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1f) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mantissa << 13));
  }
  if (exponent != 0) {
    return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                                (mantissa << 13));
  }
  // Subnormal or zero: mantissa * 2^-24, exact in fp32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

// fp32 to IEEE binary16, rounding to nearest even; overflow gives infinity.
uint16_t FloatToHalf(float f);

inline float Bf16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// fp32 to bfloat16, rounding to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

// fp32 to FP8 E4M3 (bias 7, largest finite 448), rounding to nearest even
// and saturating at ±448; NaN gives 0x7f.
uint8_t FloatToE4m3(float f);

// Converts `count` little-endian elements of `dtype` at `src` to fp32.
void ConvertToFloat(DType dtype, const void* src, size_t count, float* dst);
// Converts `count` fp32 values to little-endian elements of `dtype` at `dst`.
void ConvertFromFloat(DType dtype, const float* src, size_t count, void* dst);

}  // namespace nibble

#endif  // NIBBLE_FORMAT_DTYPE_H_
