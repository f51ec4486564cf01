// Bitwise dequantization of single 4-bit codes, the scalar form of the tricks
// in the design documents: no lookup table, only masks, shifts and one
// floating-point operation. Vector kernels apply the same steps lane-wise.
//
// Example:
//   float w = nibble::DequantizeCode(WeightFormat::kU4, q, HalfToFloat(s), z);
#ifndef NIBBLE_KERNELS_DEQUANT_H_
#define NIBBLE_KERNELS_DEQUANT_H_

#include <bit>
#include <cstdint>

#include "kernels/dtype.h"
#include "kernels/weight_format.h"

namespace nibble {

// FP4 E2M1 [S E1 E0 M0] placed into fp16 bits: the sign goes to bit 15 and
// [E1 E0 M0] to bits 11..9, so that the fp16 exponent reads E with bias 15
// instead of 1. The result is the code's value times 2^-14.
inline uint16_t Fp4CodeToRawHalf(uint8_t code) {
  return static_cast<uint16_t>(((code & 0x8u) << 12) | ((code & 0x7u) << 9));
}

// The 2^14 that undoes the exponent-bias difference of Fp4CodeToRawHalf.
inline constexpr float kFp4Rebias = 16384.0f;

inline float Fp4CodeToFloat(uint8_t code) {
  return HalfToFloat(Fp4CodeToRawHalf(code)) * kFp4Rebias;
}

// The INT4 magic number: OR-ing q into the mantissa of 1024.0 (fp16 0x6400)
// gives 1024 + q, so subtracting 1024 + zero yields q - zero exactly.
inline constexpr uint16_t kInt4MagicHalf = 0x6400;

inline float Int4CodeMinusZero(uint8_t code, uint8_t zero) {
  const float biased =
      HalfToFloat(static_cast<uint16_t>(kInt4MagicHalf | (code & 0xfu)));
  return biased - (1024.0f + zero);
}

// The zero point a format subtracts: 8 for kU4b8, `zero` for kU4, unused for
// kFp4.
inline uint8_t EffectiveZero(WeightFormat format, uint8_t zero) {
  return format == WeightFormat::kU4b8 ? 8 : zero;
}

inline float DequantizeCode(WeightFormat format, uint8_t code, float scale,
                            uint8_t zero) {
  if (format == WeightFormat::kFp4) return Fp4CodeToFloat(code) * scale;
  return Int4CodeMinusZero(code, EffectiveZero(format, zero)) * scale;
}

}  // namespace nibble

#endif  // NIBBLE_KERNELS_DEQUANT_H_
