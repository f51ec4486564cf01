#include "format/dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/choice_list.h"

namespace nibble {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (name == DTypeName(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", name, "\": use f32, f16 or bf16"));
}

size_t DTypeSize(DType dtype) { return dtype == DType::kF32 ? 4 : 2; }

absl::StatusOr<DType> DTypeFromWire(int wire_value,
                                    absl::string_view wire_name) {
  std::vector<std::string> valid;
  for (const DTypeTraits& row : kDTypeTable) {
    if (wire_value == row.wire_value) return row.dtype;
    valid.push_back(
        absl::StrCat("DTYPE_", absl::AsciiStrToUpper(DTypeName(row.dtype))));
  }
  return UnsupportedChoiceError(
      "dtype",
      wire_name.empty() ? absl::StrCat(wire_value) : std::string(wire_name),
      valid);
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (magnitude >= 0x477ff000u) return sign | 0x7c00u;  // rounds to infinity
  if (magnitude < 0x38800000u) {
    // Result is subnormal or zero: round |f| * 2^24 to an integer mantissa.
    // Adding 0.5 (as 2^-1 in the fp32 exponent) makes the FPU round for us.
    const float scaled =
        std::bit_cast<float>(magnitude) + std::bit_cast<float>(0x3f000000u);
    return sign |
           static_cast<uint16_t>(std::bit_cast<uint32_t>(scaled) - 0x3f000000u);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to even.
  const uint32_t odd = (magnitude >> 13) & 1u;
  const uint32_t rounded = magnitude + 0xc8000fffu + odd;  // -112 << 23, +round
  return sign | static_cast<uint16_t>(rounded >> 13);
}

uint8_t FloatToE4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  constexpr float kLargest = 448.0f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const float magnitude = std::min(std::abs(f), kLargest);
  constexpr float kSmallestNormal = 0x1p-6f;
  if (magnitude < kSmallestNormal) {
    // Subnormals are multiples of 2^-9; 8 of them reach the smallest normal,
    // whose code follows the subnormals' directly.
    return sign | static_cast<uint8_t>(std::nearbyint(magnitude * 0x1p9f));
  }
  int exponent = 0;
  const float fraction = std::frexp(magnitude, &exponent);  // [0.5, 1)
  int mantissa = static_cast<int>(std::nearbyint((fraction * 2 - 1) * 8));
  --exponent;
  if (mantissa == 8) {
    mantissa = 0;
    ++exponent;
  }
  return sign | static_cast<uint8_t>(((exponent + 7) << 3) | mantissa);
}

void ConvertToFloat(DType dtype, const void* src, size_t count, float* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  const auto* in = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < count; ++i) {
    dst[i] = dtype == DType::kF16 ? HalfToFloat(in[i]) : Bf16ToFloat(in[i]);
  }
}

void ConvertFromFloat(DType dtype, const float* src, size_t count, void* dst) {
  if (dtype == DType::kF32) {
    std::memcpy(dst, src, count * sizeof(float));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < count; ++i) {
    out[i] = dtype == DType::kF16 ? FloatToHalf(src[i]) : FloatToBf16(src[i]);
  }
}

}  // namespace nibble
