// Tests the fp16 and bf16 conversions and the dtype names of format/dtype.h.
#include "format/dtype.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "format/dequant.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

using ::testing::HasSubstr;

struct Conversion {
  float input;
  uint16_t want;
  const char* what;
};

bool IsHalfNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu); }
bool IsBf16Nan(uint16_t b) { return (b & 0x7f80u) == 0x7f80u && (b & 0x7fu); }

// The value of fp16 bits, computed in double from the IEEE definition.
double HalfValueFromDefinition(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (h & 0x8000u) ? -magnitude : magnitude;
}

float FloatFromBits(uint32_t bits) { return std::bit_cast<float>(bits); }

TEST(HalfToFloatTest, EveryNonNanPatternMatchesTheIeeeDefinition) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    if (IsHalfNan(half)) continue;
    const float value = HalfToFloat(half);
    ASSERT_EQ(static_cast<double>(value), HalfValueFromDefinition(half))
        << "half bits 0x" << std::hex << bits;
    ASSERT_EQ(std::signbit(value), (half & 0x8000u) != 0)
        << "half bits 0x" << std::hex << bits;
  }
}

TEST(HalfTest, EveryPatternRoundTripsAndNanStaysNan) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t half = static_cast<uint16_t>(bits);
    const float value = HalfToFloat(half);
    if (IsHalfNan(half)) {
      ASSERT_TRUE(std::isnan(value)) << "half bits 0x" << std::hex << bits;
      ASSERT_TRUE(IsHalfNan(FloatToHalf(value)))
          << "half bits 0x" << std::hex << bits;
    } else {
      ASSERT_EQ(FloatToHalf(value), half) << "half bits 0x" << std::hex << bits;
    }
  }
}

TEST(FloatToHalfTest, RoundsToNearestEvenAndOverflowsToInfinity) {
  const float kInfinity = std::numeric_limits<float>::infinity();
  const std::vector<Conversion> conversions = {
      {1.0f, 0x3c00, "one"},
      {-2.0f, 0xc000, "minus two"},
      {1.0f + 0x1p-11f, 0x3c00, "halfway above 1, rounds down to even"},
      {1.0f + 3 * 0x1p-11f, 0x3c02, "halfway above 1+2^-10, rounds up to even"},
      {1.0f + 0x1p-11f + 0x1p-23f, 0x3c01, "just above halfway rounds up"},
      {1.0f + 0x1p-11f - 0x1p-23f, 0x3c00, "just below halfway rounds down"},
      {-(1.0f + 0x1p-11f), 0xbc00, "negative halfway rounds to even"},
      {2049.0f, 0x6800, "2049 is halfway, rounds to 2048"},
      {2051.0f, 0x6802, "2051 is halfway, rounds to 2052"},
      {65504.0f, 0x7bff, "largest finite half"},
      {std::nextafter(65520.0f, 0.0f), 0x7bff, "just below 65520 stays finite"},
      {65520.0f, 0x7c00, "65520 is halfway to 2^16, rounds to infinity"},
      {65536.0f, 0x7c00, "2^16 overflows"},
      {-1e10f, 0xfc00, "large negative overflows to -infinity"},
      {std::numeric_limits<float>::max(), 0x7c00, "largest float overflows"},
      {kInfinity, 0x7c00, "infinity"},
      {-kInfinity, 0xfc00, "-infinity"},
      {0.0f, 0x0000, "zero"},
      {-0.0f, 0x8000, "negative zero keeps its sign"},
      {0x1p-14f, 0x0400, "smallest normal half"},
      {0x1p-24f, 0x0001, "smallest subnormal half"},
      {-0x1p-24f, 0x8001, "negative smallest subnormal"},
      {1023 * 0x1p-24f, 0x03ff, "largest subnormal half"},
      {0x1p-25f, 0x0000, "half the smallest subnormal rounds to even zero"},
      {0x1p-25f + 0x1p-40f, 0x0001, "just above half a subnormal rounds up"},
      {3 * 0x1p-25f, 0x0002, "1.5 subnormal units round to even 2"},
      {5 * 0x1p-25f, 0x0002, "2.5 subnormal units round to even 2"},
      {1023.5f * 0x1p-24f, 0x0400, "halfway above the largest subnormal"},
      {0x1p-26f, 0x0000, "a quarter of a subnormal unit underflows"},
      {FloatFromBits(0x00000001u), 0x0000, "float subnormal underflows"},
      {-FloatFromBits(0x00000001u), 0x8000, "negative float subnormal"},
  };
  for (const Conversion& conversion : conversions) {
    SCOPED_TRACE(absl::StrCat(conversion.what, ": ", conversion.input));
    EXPECT_EQ(FloatToHalf(conversion.input), conversion.want);
  }
}

TEST(FloatToHalfTest, NanStaysNan) {
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                        0x7f802000u, 0x7fffffffu}) {
    SCOPED_TRACE(absl::StrCat("float bits 0x", absl::Hex(bits)));
    EXPECT_TRUE(IsHalfNan(FloatToHalf(FloatFromBits(bits))));
  }
}

TEST(Bf16Test, EveryPatternRoundTripsAndNanStaysNan) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const uint16_t bf16 = static_cast<uint16_t>(bits);
    const float value = Bf16ToFloat(bf16);
    ASSERT_EQ(std::bit_cast<uint32_t>(value), bits << 16)
        << "bf16 bits 0x" << std::hex << bits;
    if (IsBf16Nan(bf16)) {
      ASSERT_TRUE(IsBf16Nan(FloatToBf16(value)))
          << "bf16 bits 0x" << std::hex << bits;
    } else {
      ASSERT_EQ(FloatToBf16(value), bf16) << "bf16 bits 0x" << std::hex << bits;
    }
  }
}

TEST(FloatToBf16Test, RoundsToNearestEvenAndOverflowsToInfinity) {
  const float kInfinity = std::numeric_limits<float>::infinity();
  const std::vector<Conversion> conversions = {
      {1.0f, 0x3f80, "one"},
      {-2.0f, 0xc000, "minus two"},
      {3.140625f, 0x4049, "exact bf16 value"},
      {1.0f + 0x1p-8f, 0x3f80, "halfway above 1, rounds down to even"},
      {1.0f + 3 * 0x1p-8f, 0x3f82, "halfway above 1+2^-7, rounds up to even"},
      {1.0f + 0x1p-8f + 0x1p-23f, 0x3f81, "just above halfway rounds up"},
      {1.0f + 0x1p-8f - 0x1p-23f, 0x3f80, "just below halfway rounds down"},
      {-(1.0f + 3 * 0x1p-8f), 0xbf82, "negative halfway rounds to even"},
      {FloatFromBits(0x7f7f7fffu), 0x7f7f, "just below halfway to overflow"},
      {FloatFromBits(0x7f7f8000u), 0x7f80, "halfway to overflow rounds to inf"},
      {std::numeric_limits<float>::max(), 0x7f80, "largest float overflows"},
      {kInfinity, 0x7f80, "infinity"},
      {-kInfinity, 0xff80, "-infinity"},
      {-0.0f, 0x8000, "negative zero keeps its sign"},
      {FloatFromBits(0x00010000u), 0x0001, "smallest bf16 subnormal"},
      {FloatFromBits(0x00008000u), 0x0000, "half a subnormal unit, to even 0"},
      {FloatFromBits(0x00018000u), 0x0002, "1.5 subnormal units, to even 2"},
      {FloatFromBits(0x00010001u), 0x0001, "just above one unit rounds down"},
      {FloatFromBits(0x80018000u), 0x8002, "negative subnormal halfway"},
  };
  for (const Conversion& conversion : conversions) {
    SCOPED_TRACE(absl::StrCat(conversion.what, ": ", conversion.input));
    EXPECT_EQ(FloatToBf16(conversion.input), conversion.want);
  }
}

TEST(FloatToBf16Test, NanStaysNan) {
  for (uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff800001u,
                        0x7f80ffffu, 0x7fffffffu}) {
    SCOPED_TRACE(absl::StrCat("float bits 0x", absl::Hex(bits)));
    EXPECT_TRUE(IsBf16Nan(FloatToBf16(FloatFromBits(bits))));
  }
}

// The value of bf16 bits, computed in double from the format's definition.
double Bf16ValueFromDefinition(uint16_t b) {
  const int exponent = (b >> 7) & 0xff;
  const int mantissa = b & 0x7f;
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -133)
                               : std::ldexp(128 + mantissa, exponent - 134);
  return (b & 0x8000u) ? -magnitude : magnitude;
}

// The bits of `magnitude` rounded to the nearest of `finite` (the format's
// non-negative finite values, indexed by bit pattern), ties to the even
// pattern; from the midpoint above the largest on, `infinity_bits`.
uint16_t RoundToNearestEven(double magnitude, const std::vector<double>& finite,
                            uint16_t infinity_bits) {
  const double largest = finite.back();
  const double overflow = largest + (largest - finite[finite.size() - 2]) / 2;
  if (magnitude >= overflow) return infinity_bits;
  const auto above = std::lower_bound(finite.begin(), finite.end(), magnitude);
  if (above == finite.end()) return finite.size() - 1;
  const size_t upper = above - finite.begin();
  if (*above == magnitude || upper == 0) return upper;
  const size_t lower = upper - 1;
  const double below_distance = magnitude - finite[lower];
  const double above_distance = finite[upper] - magnitude;
  if (below_distance != above_distance) {
    return below_distance < above_distance ? lower : upper;
  }
  return lower % 2 == 0 ? lower : upper;
}

// Compares `convert` with RoundToNearestEven on the floats whose bits are
// (high << low_bits_width) | low for every `high` and each of `lows`.
void ExpectNearestEvenOnSweep(uint16_t (*convert)(float),
                              const std::vector<double>& finite,
                              uint16_t infinity_bits, int low_bits_width,
                              const std::vector<uint32_t>& lows) {
  int64_t mismatches = 0;
  for (uint64_t high = 0; high < (uint64_t{1} << (32 - low_bits_width));
       ++high) {
    for (uint32_t low : lows) {
      const uint32_t bits = static_cast<uint32_t>(high << low_bits_width) | low;
      const float value = FloatFromBits(bits);
      if (std::isnan(value)) continue;
      const uint16_t sign = (bits >> 16) & 0x8000u;
      const uint16_t want =
          sign | RoundToNearestEven(std::abs(value), finite, infinity_bits);
      const uint16_t got = convert(value);
      if (got != want && ++mismatches <= 5) {
        ADD_FAILURE() << "float bits 0x" << std::hex << bits << " (" << value
                      << "): got 0x" << got << ", want 0x" << want;
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(FloatToHalfTest, MatchesNearestEvenOnAFloatSweep) {
  std::vector<double> finite;
  for (uint16_t bits = 0; bits <= 0x7bff; ++bits) {
    finite.push_back(HalfValueFromDefinition(bits));
  }
  // Every sign, exponent and top 11 mantissa bits, with the low 12 bits 0, 1
  // or 0xfff: fp16 drops 13 mantissa bits, so these lie on, just above and
  // just below every rounding boundary, normal and subnormal.
  ExpectNearestEvenOnSweep(&FloatToHalf, finite, 0x7c00, 12, {0, 1, 0xfff});
}

TEST(FloatToBf16Test, MatchesNearestEvenOnAFloatSweep) {
  std::vector<double> finite;
  for (uint16_t bits = 0; bits <= 0x7f7f; ++bits) {
    finite.push_back(Bf16ValueFromDefinition(bits));
  }
  // Every bf16 pattern followed by dropped bits exact, next to exact, halfway
  // and next to halfway.
  ExpectNearestEvenOnSweep(&FloatToBf16, finite, 0x7f80, 16,
                           {0, 1, 0x7fff, 0x8000, 0x8001, 0xffff});
}

TEST(FloatToE4m3Test, EveryFiniteCodeRoundTrips) {
  for (int bits = 0; bits < 256; ++bits) {
    if (IsE4m3Nan(bits)) continue;
    EXPECT_EQ(FloatToE4m3(E4m3ToFloat(bits)), bits) << "E4M3 bits " << bits;
  }
}

TEST(FloatToE4m3Test, MidpointsRoundToEvenAndNeighboursToTheNearest) {
  for (int bits = 0; bits < 0x7e; ++bits) {
    const float low = E4m3ToFloat(bits);
    const float high = E4m3ToFloat(bits + 1);
    const float middle = (low + high) / 2;
    SCOPED_TRACE(absl::StrCat("between ", low, " and ", high));
    EXPECT_EQ(FloatToE4m3(middle), bits % 2 == 0 ? bits : bits + 1);
    EXPECT_EQ(FloatToE4m3(std::nextafter(middle, 0.0f)), bits);
    EXPECT_EQ(FloatToE4m3(std::nextafter(middle, 1e9f)), bits + 1);
    EXPECT_EQ(FloatToE4m3(-std::nextafter(middle, 1e9f)), 0x80 | (bits + 1));
  }
}

TEST(FloatToE4m3Test, SaturatesAtTheLargestFiniteAndNanStaysNan) {
  EXPECT_EQ(FloatToE4m3(448.0f), 0x7e);
  EXPECT_EQ(FloatToE4m3(1e6f), 0x7e);
  EXPECT_EQ(FloatToE4m3(-std::numeric_limits<float>::infinity()), 0xfe);
  EXPECT_EQ(FloatToE4m3(std::numeric_limits<float>::quiet_NaN()), 0x7f);
  EXPECT_EQ(FloatToE4m3(0x1p-11f), 0x00);  // below half the smallest subnormal
}

TEST(ConvertTest, UsesTheElementConversionsOfEachDType) {
  const std::vector<float> values = {1.0f, -0.3333f, 65504.0f, 0x1p-20f,
                                     1.0f + 0x1p-11f};
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<uint8_t> bytes(values.size() * DTypeSize(dtype));
    ConvertFromFloat(dtype, values.data(), values.size(), bytes.data());
    std::vector<float> back(values.size());
    ConvertToFloat(dtype, bytes.data(), values.size(), back.data());
    for (size_t i = 0; i < values.size(); ++i) {
      float want = values[i];
      if (dtype == DType::kF16) want = HalfToFloat(FloatToHalf(values[i]));
      if (dtype == DType::kBF16) want = Bf16ToFloat(FloatToBf16(values[i]));
      EXPECT_EQ(back[i], want) << "element " << i;
    }
  }
}

TEST(DTypeTest, NamesSizesAndParsingRoundTrip) {
  EXPECT_EQ(DTypeName(DType::kF32), "f32");
  EXPECT_EQ(DTypeName(DType::kF16), "f16");
  EXPECT_EQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const absl::StatusOr<DType> parsed = ParseDType(DTypeName(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
}

TEST(DTypeTest, ParseRejectsUnknownNamesClearly) {
  for (absl::string_view name : {"f64", "", "F32", "float"}) {
    SCOPED_TRACE(name);
    const absl::StatusOr<DType> parsed = ParseDType(name);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr(absl::StrCat("\"", name, "\"")));
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr("f32, f16 or bf16"));
  }
}

}  // namespace
}  // namespace nibble
