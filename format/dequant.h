// Bitwise dequantization of single 4-bit codes and of the 8-bit scales of
// the block formats (E8M0, E4M3), the scalar form of the tricks in the design
// documents: no lookup table, only masks, shifts and one floating-point
// operation. Vector kernels apply the same steps lane-wise.
//
// Example:
//   float w = nibble::DequantizeCode(WeightFormat::kU4, q, HalfToFloat(s), z);
//   float s = nibble::ScaleToFloat(weight.spec.format, weight.Scale(r, c));
#ifndef NIBBLE_FORMAT_DEQUANT_H_
#define NIBBLE_FORMAT_DEQUANT_H_

#include <bit>
#include <cstdint>

#include "format/dtype.h"
#include "format/weight_format.h"

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

// FP8 E4M3 [S E3..E0 M2..M0] (bias 7, no infinities, 0x7f and 0xff NaN)
// placed into fp16 bits: the sign goes to bit 15 and the other seven bits to
// bits 13..7, so that fp16 reads the exponent with bias 15 instead of 7. The
// result is the scale times 2^-8, exact for normals and subnormals alike.
inline uint16_t E4m3ToRawHalf(uint8_t bits) {
  return static_cast<uint16_t>(((bits & 0x80u) << 8) | ((bits & 0x7fu) << 7));
}

// The 2^8 that undoes the exponent-bias difference of E4m3ToRawHalf.
inline constexpr float kE4m3Rebias = 256.0f;

inline float E4m3ToFloat(uint8_t bits) {
  return HalfToFloat(E4m3ToRawHalf(bits)) * kE4m3Rebias;
}
inline bool IsE4m3Nan(uint8_t bits) { return (bits & 0x7fu) == 0x7fu; }

// E8M0 (an unsigned power-of-two exponent with bias 127, 0xff NaN) as
// bfloat16 bits: the exponent field of bf16 has the same width and bias, so
// the code moves there; code 0, 2^-127, is the bf16 subnormal 0x0040.
inline uint16_t E8m0ToBf16(uint8_t bits) {
  return bits == 0 ? uint16_t{0x0040} : static_cast<uint16_t>(bits << 7);
}

inline float E8m0ToFloat(uint8_t bits) { return Bf16ToFloat(E8m0ToBf16(bits)); }
inline constexpr uint8_t kE8m0Nan = 0xff;

// The value of an 8-bit scale code of `type` (kE8m0 or kE4m3), exact.
inline float ScaleCodeToFloat(ScaleType type, uint8_t code) {
  return type == ScaleType::kE8m0 ? E8m0ToFloat(code) : E4m3ToFloat(code);
}
inline bool IsScaleCodeNan(ScaleType type, uint8_t code) {
  return type == ScaleType::kE8m0 ? code == kE8m0Nan : IsE4m3Nan(code);
}

// The value of a scale slot (see format/weight_format.h), exact; a global
// scale is applied on top.
inline float ScaleToFloat(WeightFormat format, uint16_t slot) {
  const ScaleType type = Traits(format).scale_type;
  return type == ScaleType::kFp16
             ? HalfToFloat(slot)
             : ScaleCodeToFloat(type, static_cast<uint8_t>(slot));
}

// The zero point a format subtracts: 8, the group's `zero`, or 0 (FP4 codes,
// which DequantizeCode does not offset).
inline uint8_t EffectiveZero(WeightFormat format, uint8_t zero) {
  switch (Traits(format).zero_point) {
    case ZeroPoint::kNone:
      return 0;
    case ZeroPoint::kEight:
      return 8;
    case ZeroPoint::kPerGroup:
      return zero;
  }
  return zero;
}

inline float DequantizeCode(WeightFormat format, uint8_t code, float scale,
                            uint8_t zero) {
  if (HasFp4Codes(format)) return Fp4CodeToFloat(code) * scale;
  return Int4CodeMinusZero(code, EffectiveZero(format, zero)) * scale;
}

}  // namespace nibble

#endif  // NIBBLE_FORMAT_DEQUANT_H_
