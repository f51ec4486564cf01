// Tests 4-bit code dequantization and the canonical weight layout.
#include "format/weight_format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "format/dequant.h"
#include "format/dtype.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

using ::testing::HasSubstr;

// `group_size` where the format lets it choose, else the format's own.
int64_t GroupFor(WeightFormat format, int64_t group_size) {
  return FixedGroupSize(format) != 0 ? FixedGroupSize(format) : group_size;
}

TEST(DequantTest, EveryFp4CodeMatchesTheE2M1Table) {
  constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,
                               4.0f,  6.0f,  -0.0f, -0.5f, -1.0f, -1.5f,
                               -2.0f, -3.0f, -4.0f, -6.0f};
  for (uint8_t code = 0; code < 16; ++code) {
    SCOPED_TRACE(absl::StrCat("code ", code));
    EXPECT_EQ(Fp4CodeToFloat(code), kE2M1[code]);
    EXPECT_EQ(std::signbit(Fp4CodeToFloat(code)), code >= 8);
    EXPECT_EQ(DequantizeCode(WeightFormat::kFp4, code, 0.25f, /*zero=*/5),
              kE2M1[code] * 0.25f);
  }
}

TEST(DequantTest, EveryU4b8CodeIsCodeMinusEight) {
  for (uint8_t code = 0; code < 16; ++code) {
    SCOPED_TRACE(absl::StrCat("code ", code));
    EXPECT_EQ(Int4CodeMinusZero(code, 8), code - 8.0f);
    EXPECT_EQ(DequantizeCode(WeightFormat::kU4b8, code, 1.0f, /*zero=*/3),
              code - 8.0f);
    EXPECT_EQ(DequantizeCode(WeightFormat::kU4b8, code, 0.125f, /*zero=*/0),
              (code - 8.0f) * 0.125f);
  }
}

TEST(DequantTest, EveryU4CodeIsCodeMinusEveryZeroPoint) {
  for (uint8_t code = 0; code < 16; ++code) {
    for (uint8_t zero = 0; zero < 16; ++zero) {
      SCOPED_TRACE(absl::StrCat("code ", code, " zero ", zero));
      EXPECT_EQ(Int4CodeMinusZero(code, zero), static_cast<float>(code - zero));
      EXPECT_EQ(DequantizeCode(WeightFormat::kU4, code, 0.5f, zero),
                static_cast<float>(code - zero) * 0.5f);
    }
  }
}

TEST(DequantTest, EveryE4m3CodeMatchesItsDefinition) {
  for (int bits = 0; bits < 256; ++bits) {
    SCOPED_TRACE(absl::StrCat("E4M3 bits ", bits));
    const int exponent = (bits >> 3) & 0xf;
    const int mantissa = bits & 0x7;
    const double magnitude =
        exponent == 0 ? std::ldexp(mantissa / 8.0, -6)
                      : std::ldexp(1.0 + mantissa / 8.0, exponent - 7);
    const double want = (bits & 0x80) != 0 ? -magnitude : magnitude;
    EXPECT_EQ(IsE4m3Nan(bits), (bits & 0x7f) == 0x7f);
    if (IsE4m3Nan(bits)) continue;
    EXPECT_EQ(E4m3ToFloat(bits), want);
    EXPECT_EQ(ScaleToFloat(WeightFormat::kNvfp4, bits), want);
    // Every E4M3 value is an fp16 value: nvfp4 scales pack into fp16 exactly.
    EXPECT_EQ(HalfToFloat(FloatToHalf(E4m3ToFloat(bits))), want);
  }
  EXPECT_EQ(E4m3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(E4m3ToFloat(0x01), 0x1p-9f);
}

TEST(DequantTest, EveryE8m0CodeIsAPowerOfTwo) {
  for (int bits = 0; bits < 255; ++bits) {
    SCOPED_TRACE(absl::StrCat("E8M0 bits ", bits));
    EXPECT_EQ(E8m0ToFloat(bits), std::ldexp(1.0f, bits - 127));
    EXPECT_EQ(ScaleToFloat(WeightFormat::kMxfp4, bits),
              std::ldexp(1.0f, bits - 127));
    EXPECT_EQ(Bf16ToFloat(E8m0ToBf16(bits)), std::ldexp(1.0f, bits - 127));
  }
  EXPECT_EQ(E8m0ToBf16(0), 0x0040);
  EXPECT_EQ(E8m0ToBf16(127), 0x3f80);
}

TEST(DequantTest, Fp4FormatsShareTheE2M1Codes) {
  for (WeightFormat format : {WeightFormat::kMxfp4, WeightFormat::kNvfp4}) {
    EXPECT_TRUE(HasFp4Codes(format));
    for (uint8_t code = 0; code < 16; ++code) {
      EXPECT_EQ(DequantizeCode(format, code, 0.25f, /*zero=*/7),
                Fp4CodeToFloat(code) * 0.25f);
    }
  }
  EXPECT_FALSE(HasFp4Codes(WeightFormat::kU4b8));
  EXPECT_FALSE(HasFp4Codes(WeightFormat::kU4));
}

TEST(QuantizedWeightTest, SetCodeWritesTheCanonicalBits) {
  QuantizedWeight weight;
  weight.spec = {WeightFormat::kU4b8, /*k=*/32, /*n=*/3, /*group_size=*/32};
  weight.qweight.assign(weight.spec.qweight_bytes() / 4, 0);
  weight.SetCode(/*row=*/11, /*col=*/2, 0xa);
  EXPECT_EQ(weight.qweight[1 * 3 + 2], 0xau << 12);
  weight.SetCode(/*row=*/31, /*col=*/0, 0xf);
  EXPECT_EQ(weight.qweight[3 * 3 + 0], 0xfu << 28);
  weight.SetCode(/*row=*/31, /*col=*/0, 0x1);
  EXPECT_EQ(weight.qweight[3 * 3 + 0], 0x1u << 28);
}

TEST(QuantizedWeightTest, SetCodeAndCodeRoundTripAtRandomPositions) {
  QuantizedWeight weight;
  weight.spec = {WeightFormat::kU4, /*k=*/64, /*n=*/24, /*group_size=*/32};
  std::mt19937_64 rng(20240611);
  weight.qweight.resize(weight.spec.qweight_bytes() / 4);
  for (uint32_t& word : weight.qweight) word = static_cast<uint32_t>(rng());
  std::vector<uint8_t> expected(weight.spec.k * weight.spec.n);
  for (int64_t row = 0; row < weight.spec.k; ++row) {
    for (int64_t col = 0; col < weight.spec.n; ++col) {
      expected[row * weight.spec.n + col] = weight.Code(row, col);
    }
  }
  for (int write = 0; write < 2000; ++write) {
    const int64_t row = rng() % weight.spec.k;
    const int64_t col = rng() % weight.spec.n;
    const uint8_t code = rng() & 0xf;
    weight.SetCode(row, col, code);
    expected[row * weight.spec.n + col] = code;
  }
  for (int64_t row = 0; row < weight.spec.k; ++row) {
    for (int64_t col = 0; col < weight.spec.n; ++col) {
      ASSERT_EQ(weight.Code(row, col), expected[row * weight.spec.n + col])
          << "row " << row << " col " << col;
    }
  }
}

TEST(WeightSpecTest, ByteCountsFollowTheShape) {
  const WeightSpec u4{WeightFormat::kU4, /*k=*/256, /*n=*/40,
                      /*group_size=*/64};
  EXPECT_EQ(u4.groups(), 4);
  EXPECT_EQ(u4.qweight_bytes(), 256 / 8 * 40 * 4);
  EXPECT_EQ(u4.scales_bytes(), 4 * 40 * 2);
  EXPECT_EQ(u4.zeros_bytes(), 4 * 40);
  EXPECT_EQ(u4.canonical_bytes(), 5120 + 320 + 160);
  const WeightSpec fp4{WeightFormat::kFp4, /*k=*/256, /*n=*/40,
                       /*group_size=*/64};
  EXPECT_EQ(fp4.zeros_bytes(), 0);
  EXPECT_EQ(fp4.canonical_bytes(), 5120 + 320);
  EXPECT_EQ(u4.DebugString(), "u4 k=256 n=40 group=64");
}

TEST(WeightSpecTest, AcceptsEverySupportedGroupSize) {
  for (WeightFormat format :
       {WeightFormat::kFp4, WeightFormat::kU4b8, WeightFormat::kU4}) {
    for (int64_t group_size : {32, 64, 128, 384}) {
      const WeightSpec spec{format, /*k=*/384, /*n=*/40, group_size};
      EXPECT_TRUE(spec.Validate().ok()) << spec.DebugString();
    }
  }
}

TEST(WeightSpecTest, AcceptsPerChannelGroupForAnyMultipleOfEight) {
  const WeightSpec spec{WeightFormat::kU4, /*k=*/200, /*n=*/8,
                        /*group_size=*/200};
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
}

TEST(WeightSpecTest, AcceptsTheLargestDimensions) {
  const WeightSpec spec{WeightFormat::kU4b8, kMaxDimension, kMaxDimension,
                        /*group_size=*/128};
  EXPECT_TRUE(spec.Validate().ok()) << spec.Validate();
}

struct InvalidSpec {
  WeightSpec spec;
  std::string problem;  // a substring the error message must contain
};

TEST(WeightSpecTest, RejectsInvalidShapesNamingTheProblem) {
  const std::vector<InvalidSpec> invalid_specs = {
      {{WeightFormat::kU4b8, 100, 40, 100}, "k=100 is not a multiple of 8"},
      {{WeightFormat::kU4b8, 36, 40, 36}, "k=36 is not a multiple of 8"},
      {{WeightFormat::kU4b8, 96, 40, 64}, "multiple of the group size 64"},
      {{WeightFormat::kFp4, 160, 40, 128}, "multiple of the group size 128"},
      {{WeightFormat::kU4, 256, 40, 16}, "group size 16 is not supported"},
      {{WeightFormat::kU4, 256, 40, 0}, "group size 0 is not supported"},
      {{WeightFormat::kU4, 256, 40, -32}, "group size -32 is not supported"},
      {{WeightFormat::kU4, 256, 40, 512}, "group size 512 is not supported"},
      {{WeightFormat::kU4b8, 0, 40, 32}, "must be positive, got k=0 n=40"},
      {{WeightFormat::kU4b8, 256, 0, 32}, "must be positive, got k=256 n=0"},
      {{WeightFormat::kU4b8, -256, 40, 32}, "must be positive"},
      {{WeightFormat::kU4b8, 256, -1, 32}, "must be positive"},
      {{WeightFormat::kU4b8, kMaxDimension + 8, 40, 128},
       absl::StrCat("at most ", kMaxDimension)},
      {{WeightFormat::kU4b8, 256, kMaxDimension + 1, 128},
       absl::StrCat("at most ", kMaxDimension)},
  };
  for (const InvalidSpec& invalid : invalid_specs) {
    SCOPED_TRACE(invalid.spec.DebugString());
    const absl::Status status = invalid.spec.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(invalid.problem));
  }
}

TEST(QuantizedWeightTest, RandomWeightsAreValidAndDeterministic) {
  for (WeightFormat format : kAllWeightFormats) {
    const WeightSpec spec{
        format, /*k=*/128, /*n=*/24, GroupFor(format, 32),
        /*global_scale=*/format == WeightFormat::kNvfp4 ? 0.0123f : 1.0f};
    const QuantizedWeight weight = RandomQuantizedWeight(spec, /*seed=*/7);
    SCOPED_TRACE(spec.DebugString());
    EXPECT_TRUE(weight.Validate().ok()) << weight.Validate();
    const QuantizedWeight again = RandomQuantizedWeight(spec, /*seed=*/7);
    EXPECT_EQ(weight.qweight, again.qweight);
    EXPECT_EQ(weight.scales, again.scales);
    EXPECT_EQ(weight.zeros, again.zeros);
    EXPECT_NE(weight.qweight, RandomQuantizedWeight(spec, 8).qweight);
    for (uint16_t scale : weight.scales) {
      // E4M3 rounding may step just past the range; a tenth covers it.
      const float value = ScaleToFloat(format, scale) * spec.global_scale;
      EXPECT_GE(value, 0x1p-8f * 0.9f);
      EXPECT_LE(value, 0x1p-4f * 1.1f);
    }
  }
}

// A valid kU4 weight to break one array of.
QuantizedWeight ValidU4Weight() {
  return RandomQuantizedWeight(
      {WeightFormat::kU4, /*k=*/64, /*n=*/16, /*group_size=*/32}, /*seed=*/3);
}

TEST(QuantizedWeightTest, RejectsArraysOfTheWrongSize) {
  QuantizedWeight short_qweight = ValidU4Weight();
  short_qweight.qweight.pop_back();
  QuantizedWeight long_scales = ValidU4Weight();
  long_scales.scales.push_back(0x3c00);
  QuantizedWeight missing_zeros = ValidU4Weight();
  missing_zeros.zeros.clear();
  QuantizedWeight unexpected_zeros = RandomQuantizedWeight(
      {WeightFormat::kU4b8, /*k=*/64, /*n=*/16, /*group_size=*/32}, 3);
  unexpected_zeros.zeros.assign(2 * 16, 8);

  const std::vector<std::pair<const QuantizedWeight*, std::string>> cases = {
      {&short_qweight, "qweight has 508 bytes, the shape needs 512"},
      {&long_scales, "scales has 66 bytes, the shape needs 64"},
      {&missing_zeros, "zeros has 0 bytes, the shape needs 32"},
      {&unexpected_zeros, "zeros has 32 bytes, the shape needs 0"},
  };
  for (const auto& [weight, problem] : cases) {
    SCOPED_TRACE(problem);
    const absl::Status status = weight->Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(problem));
  }
}

TEST(QuantizedWeightTest, RejectsZeroPointsAboveFifteen) {
  QuantizedWeight weight = ValidU4Weight();
  weight.zeros[5] = 15;
  EXPECT_TRUE(weight.Validate().ok()) << weight.Validate();
  weight.zeros[5] = 16;
  const absl::Status status = weight.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("zero point 16 at index 5"));
}

TEST(QuantizedWeightTest, AcceptsAPermutationAsActivationOrder) {
  constexpr uint64_t kSeed = 11;
  QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 128, 8, 32}, kSeed);
  weight.activation_order = RandomActivationOrder(128, kSeed);
  EXPECT_TRUE(weight.Validate().ok()) << weight.Validate() << " seed " << kSeed;
  std::vector<int32_t> sorted = weight.activation_order;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int32_t> identity(128);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(sorted, identity) << "seed " << kSeed;
  EXPECT_NE(weight.activation_order, identity) << "seed " << kSeed;
}

TEST(QuantizedWeightTest, RejectsABadActivationOrderSayingWhatToFix) {
  QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 128, 8, 32}, 3);
  const std::vector<int32_t> permutation = RandomActivationOrder(128, 3);
  const auto expect_error = [&](std::vector<int32_t> order,
                                absl::string_view message) {
    weight.activation_order = std::move(order);
    const absl::Status status = weight.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(message));
  };
  expect_error(
      std::vector<int32_t>(permutation.begin(), permutation.begin() + 100),
      "activation_order has 100 entries for K=128");
  std::vector<int32_t> twice = permutation;
  twice[5] = twice[2];
  expect_error(twice, absl::StrCat("activation_order[5] = ", permutation[2],
                                   " appears twice (also at 2): it must be a "
                                   "permutation of 0..K-1"));
  std::vector<int32_t> too_large = permutation;
  too_large[7] = 128;
  expect_error(too_large, "activation_order[7] = 128 is outside 0..127");
  std::vector<int32_t> negative = permutation;
  negative[0] = -1;
  expect_error(negative, "activation_order[0] = -1 is outside 0..127");
}

TEST(QuantizedWeightTest, RejectsNanAndInfiniteScalesNamingWhere) {
  QuantizedWeight weight = ValidU4Weight();
  const int64_t n = weight.spec.n;
  // The largest finite fp16, either sign, and the smallest subnormal pass.
  for (uint16_t finite : {0x7bff, 0xfbff, 0x0001, 0x0000}) {
    weight.scales[n + 3] = finite;
    EXPECT_TRUE(weight.Validate().ok()) << finite << ": " << weight.Validate();
  }
  for (const auto& [bits, what] :
       {std::pair<uint16_t, const char*>{0x7c00, "infinite"},
        {0xfc00, "infinite"},
        {0x7e00, "NaN"},
        {0xfd01, "NaN"}}) {
    weight.scales[n + 3] = bits;
    const absl::Status status = weight.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bits;
    EXPECT_THAT(
        std::string(status.message()),
        HasSubstr(absl::StrCat("scale of column 3, group 1 is ", what)));
  }
}

TEST(QuantizedWeightTest, RejectsNanAndWideEightBitScales) {
  for (const auto& [format, nan] :
       {std::pair{WeightFormat::kMxfp4, uint16_t{0xff}},
        std::pair{WeightFormat::kNvfp4, uint16_t{0x7f}},
        std::pair{WeightFormat::kNvfp4, uint16_t{0xff}}}) {
    SCOPED_TRACE(WeightFormatName(format));
    QuantizedWeight weight = RandomQuantizedWeight(
        {format, /*k=*/64, /*n=*/16, FixedGroupSize(format)}, /*seed=*/9);
    ASSERT_TRUE(weight.Validate().ok()) << weight.Validate();
    weight.scales[16 + 5] = nan;
    absl::Status status = weight.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr(absl::StrCat(
                    "scale of column 5, group 1 is NaN (",
                    format == WeightFormat::kMxfp4 ? "E8M0" : "E4M3")));
    weight.scales[16 + 5] = 0x0100;
    status = weight.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("is wider than 8 bits"));
    EXPECT_THAT(
        std::string(status.message()),
        HasSubstr("one 8-bit code in the low byte of each 16-bit slot"));
  }
}

TEST(WeightSpecTest, Fp4BlockFormatsFixTheirGroupAndGlobalScale) {
  EXPECT_EQ(FixedGroupSize(WeightFormat::kMxfp4), 32);
  EXPECT_EQ(FixedGroupSize(WeightFormat::kNvfp4), 16);
  EXPECT_EQ(FixedGroupSize(WeightFormat::kFp4), 0);
  EXPECT_TRUE((WeightSpec{WeightFormat::kMxfp4, 64, 8, 32}).Validate().ok());
  EXPECT_TRUE(
      (WeightSpec{WeightFormat::kNvfp4, 64, 8, 16, 0.5f}).Validate().ok());
  struct InvalidSpec {
    WeightSpec spec;
    std::string problem;
  };
  const InvalidSpec invalid_specs[] = {
      {{WeightFormat::kMxfp4, 64, 8, 64}, "group size must be 32, got 64"},
      {{WeightFormat::kMxfp4, 64, 8, 16}, "group size must be 32, got 16"},
      {{WeightFormat::kNvfp4, 64, 8, 32}, "group size must be 16, got 32"},
      {{WeightFormat::kNvfp4, 40, 8, 16}, "multiple of the group size 16"},
      {{WeightFormat::kNvfp4, 64, 8, 16, 0.0f}, "finite and positive"},
      {{WeightFormat::kNvfp4, 64, 8, 16, -1.0f}, "finite and positive"},
      {{WeightFormat::kNvfp4, 64, 8, 16, NAN}, "finite and positive"},
      {{WeightFormat::kNvfp4, 64, 8, 16, INFINITY}, "finite and positive"},
      {{WeightFormat::kFp4, 64, 8, 32, 2.0f}, "only for nvfp4, not fp4"},
      {{WeightFormat::kMxfp4, 64, 8, 32, 0.5f}, "only for nvfp4, not mxfp4"},
  };
  for (const InvalidSpec& invalid : invalid_specs) {
    SCOPED_TRACE(invalid.spec.DebugString());
    const absl::Status status = invalid.spec.Validate();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr(invalid.problem));
  }
  EXPECT_EQ((WeightSpec{WeightFormat::kNvfp4, 64, 8, 16, 0.5f}).DebugString(),
            "nvfp4 k=64 n=8 group=16 global_scale=0.5");
}

TEST(QuantizedWeightTest, RejectsAnInvalidSpec) {
  QuantizedWeight weight = ValidU4Weight();
  weight.spec.group_size = 16;
  const absl::Status status = weight.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), HasSubstr("group size 16"));
}

TEST(WeightFormatTest, NamesAndParsingRoundTrip) {
  EXPECT_EQ(WeightFormatName(WeightFormat::kFp4), "fp4");
  EXPECT_EQ(WeightFormatName(WeightFormat::kU4b8), "u4b8");
  EXPECT_EQ(WeightFormatName(WeightFormat::kU4), "u4");
  EXPECT_EQ(WeightFormatName(WeightFormat::kMxfp4), "mxfp4");
  EXPECT_EQ(WeightFormatName(WeightFormat::kNvfp4), "nvfp4");
  for (WeightFormat format : kAllWeightFormats) {
    const absl::StatusOr<WeightFormat> parsed =
        ParseWeightFormat(WeightFormatName(format));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, format);
    EXPECT_EQ(HasZeros(format), format == WeightFormat::kU4);
  }
}

TEST(WeightFormatTest, ParseRejectsUnknownNamesClearly) {
  for (absl::string_view name : {"int4", "", "U4", "u4b"}) {
    SCOPED_TRACE(name);
    const absl::StatusOr<WeightFormat> parsed = ParseWeightFormat(name);
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr(absl::StrCat("\"", name, "\"")));
    EXPECT_THAT(std::string(parsed.status().message()),
                HasSubstr("fp4, u4b8, u4, mxfp4 or nvfp4"));
  }
}

}  // namespace
}  // namespace nibble
