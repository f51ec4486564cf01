// Tests that PackedWeight::Pack regroups the canonical layout into panels,
// and that PackColumns and PanelCodeWriter make the same panels from
// checkpoint columns and from codes arriving in pieces, in either layout.
#include "kernels/packed_weight.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/dequant.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "tests/format/column_layout.h"
#include "tests/kernels/same_panels.h"

namespace nibble {
namespace {

constexpr int64_t kWidth = PackedWeight::kPanelWidth;

struct PackCase {
  WeightSpec spec;
};

void PrintTo(const PackCase& pack_case, std::ostream* os) {
  *os << pack_case.spec.DebugString();
}

class PackedWeightTest : public ::testing::TestWithParam<PackCase> {};

TEST_P(PackedWeightTest, EveryCodeScaleAndZeroSitsAtItsPanelPosition) {
  const WeightSpec& spec = GetParam().spec;
  const QuantizedWeight weight = RandomQuantizedWeight(spec, /*seed=*/99);
  const absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(weight);
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(packed->spec(), spec);
  ASSERT_EQ(packed->panels(), (spec.n + kWidth - 1) / kWidth);
  EXPECT_EQ(packed->panel_zeros(0) != nullptr, HasZeros(spec.format));
  const int64_t padded_n = packed->panels() * kWidth;
  const int64_t zero_rows = HasZeros(spec.format) ? spec.groups() : 0;
  EXPECT_EQ(
      packed->resident_bytes(),
      padded_n * (spec.k / kCodesPerWord * 4 + spec.groups() * 2 + zero_rows));

  for (int64_t panel = 0; panel < packed->panels(); ++panel) {
    const uint32_t* words = packed->panel_codes(panel);
    const uint16_t* scales = packed->panel_scales(panel);
    const uint8_t* zeros = packed->panel_zeros(panel);
    for (int64_t lane = 0; lane < kWidth; ++lane) {
      const int64_t col = panel * kWidth + lane;
      SCOPED_TRACE(absl::StrCat("panel ", panel, " lane ", lane, " col ", col));
      for (int64_t row = 0; row < spec.k; ++row) {
        const uint32_t word = words[row / kCodesPerWord * kWidth + lane];
        const uint8_t code =
            (word >> PackedWeight::CodeShift(row % kCodesPerWord)) & 0xf;
        ASSERT_EQ(code, col < spec.n ? weight.Code(row, col) : 0)
            << "row " << row;
      }
      for (int64_t group = 0; group < spec.groups(); ++group) {
        const int64_t row = group * spec.group_size;
        // The same value, converted exactly where the format's scales are
        // 8-bit (see ScaleValue); padding columns have scale 0.
        ASSERT_EQ(PackedWeight::ScaleValue(spec.format,
                                           scales[group * kWidth + lane]),
                  col < spec.n
                      ? ScaleToFloat(spec.format, weight.Scale(row, col))
                      : 0.0f)
            << "group " << group;
        if (zeros != nullptr) {
          ASSERT_EQ(zeros[group * kWidth + lane],
                    col < spec.n ? weight.Zero(row, col) : 0)
              << "group " << group;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PackedWeightTest,
    ::testing::Values(PackCase{{WeightFormat::kFp4, 128, 40, 32}},
                      PackCase{{WeightFormat::kU4b8, 64, 16, 64}},
                      PackCase{{WeightFormat::kU4, 256, 40, 256}},
                      PackCase{{WeightFormat::kU4, 96, 8, 32}},
                      PackCase{{WeightFormat::kU4b8, 384, 72, 128}},
                      // 25 word rows: the last block of rows is short.
                      PackCase{{WeightFormat::kFp4, 200, 33, 200}},
                      // Codes past 2 MiB: huge-page memory.
                      PackCase{{WeightFormat::kU4b8, 8192, 520, 128}},
                      PackCase{{WeightFormat::kMxfp4, 128, 40, 32}},
                      PackCase{{WeightFormat::kNvfp4, 64, 24, 16, 0.25f}}),
    [](const ::testing::TestParamInfo<PackCase>& info) {
      const WeightSpec& spec = info.param.spec;
      return absl::StrCat(WeightFormatName(spec.format), "_k", spec.k, "_n",
                          spec.n, "_g", spec.group_size);
    });

// The packed scale of a one-column weight whose every scale slot is `slot`.
uint16_t PackedScale(WeightFormat format, uint16_t slot) {
  const WeightSpec spec{format, /*k=*/32, /*n=*/1, FixedGroupSize(format)};
  QuantizedWeight weight = RandomQuantizedWeight(spec, /*seed=*/5);
  std::fill(weight.scales.begin(), weight.scales.end(), slot);
  const absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(weight);
  EXPECT_TRUE(packed.ok()) << packed.status();
  return packed.ok() ? packed->panel_scales(0)[0] : 0;
}

TEST(PackedWeightPackTest, Mxfp4ScalesBecomeBf16) {
  // E8M0 code e is 2^(e - 127): bf16 has the same exponent field.
  EXPECT_EQ(PackedScale(WeightFormat::kMxfp4, 127), 0x3f80);  // 1
  EXPECT_EQ(PackedScale(WeightFormat::kMxfp4, 1), 0x0080);    // 2^-126
  EXPECT_EQ(PackedScale(WeightFormat::kMxfp4, 254), 0x7f00);  // 2^127
  // Code 0, 2^-127, is a bf16 subnormal.
  EXPECT_EQ(PackedScale(WeightFormat::kMxfp4, 0), 0x0040);
  EXPECT_EQ(PackedWeight::ScaleValue(WeightFormat::kMxfp4, 0x0040),
            std::ldexp(1.0f, -127));
}

TEST(PackedWeightPackTest, Nvfp4ScalesBecomeExactFp16) {
  EXPECT_EQ(PackedScale(WeightFormat::kNvfp4, 0x38), 0x3c00);  // 1
  EXPECT_EQ(PackedScale(WeightFormat::kNvfp4, 0x7e), 0x5f00);  // 448, max
  EXPECT_EQ(PackedScale(WeightFormat::kNvfp4, 0xb8), 0xbc00);  // -1
  // The smallest E4M3 subnormal, 2^-9, is a normal fp16.
  EXPECT_EQ(PackedScale(WeightFormat::kNvfp4, 0x01), 0x1800);
  EXPECT_EQ(PackedWeight::ScaleValue(WeightFormat::kNvfp4, 0x1800),
            std::ldexp(1.0f, -9));
  // The largest subnormal, 7 * 2^-9.
  EXPECT_EQ(PackedWeight::ScaleValue(WeightFormat::kNvfp4,
                                     PackedScale(WeightFormat::kNvfp4, 0x07)),
            7 * std::ldexp(1.0f, -9));
}

TEST(PackedWeightPackTest, KeepsTheActivationOrderAndCountsIt) {
  constexpr uint64_t kSeed = 21;
  const WeightSpec spec{WeightFormat::kU4, /*k=*/64, /*n=*/40,
                        /*group_size=*/32};
  QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
  const absl::StatusOr<PackedWeight> plain = PackedWeight::Pack(weight);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->activation_order().empty());
  weight.activation_order = RandomActivationOrder(spec.k, kSeed);
  const absl::StatusOr<PackedWeight> ordered = PackedWeight::Pack(weight);
  ASSERT_TRUE(ordered.ok()) << ordered.status();
  EXPECT_EQ(std::vector<int32_t>(ordered->activation_order().begin(),
                                 ordered->activation_order().end()),
            weight.activation_order)
      << "seed " << kSeed;
  EXPECT_EQ(ordered->resident_bytes(),
            plain->resident_bytes() + spec.k * int64_t{sizeof(int32_t)});
  weight.activation_order[3] = weight.activation_order[4];
  EXPECT_EQ(PackedWeight::Pack(weight).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PackedWeightPackColumnsTest, PacksAsPackDoesFromTheCanonicalWeight) {
  constexpr uint64_t kSeed = 41;
  for (const WeightSpec& spec :
       {WeightSpec{WeightFormat::kMxfp4, 128, 40, 32},
        WeightSpec{WeightFormat::kMxfp4, 96, 16, 32},
        // 40 word rows: the last block of rows is short.
        WeightSpec{WeightFormat::kNvfp4, 320, 33, 16, 0.5f},
        WeightSpec{WeightFormat::kNvfp4, 4096, 72, 16, 0.25f}}) {
    SCOPED_TRACE(absl::StrCat(spec.DebugString(), ", seed ", kSeed));
    const QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
    const testing::ColumnLayout columns = testing::ToColumns(weight);
    const absl::StatusOr<PackedWeight> want = PackedWeight::Pack(weight);
    const absl::StatusOr<PackedWeight> got =
        PackedWeight::PackColumns(columns.View(spec));
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(testing::SamePanels(*got, *want));
  }
}

TEST(PackedWeightPackColumnsTest, RefusesNaNScalesAndOtherFormats) {
  const WeightSpec spec{WeightFormat::kNvfp4, 64, 24, 16, 0.25f};
  testing::ColumnLayout columns =
      testing::ToColumns(RandomQuantizedWeight(spec, /*seed=*/3));
  columns.scale_codes[5 * spec.groups() + 2] = 0xff;
  absl::Status status = PackedWeight::PackColumns(columns.View(spec)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "scale of column 5, group 2 is NaN (E4M3 code 0xff): scales must "
            "be finite");

  const WeightSpec fp4{WeightFormat::kFp4, 64, 24, 32};
  status = PackedWeight::PackColumns(columns.View(fp4)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "PackColumns is for mxfp4 and nvfp4 weights, not fp4");
}

TEST(PackedWeightPackColumnsTest,
     KeepsAnActivationOrderAndRefusesMissingCodes) {
  constexpr uint64_t kSeed = 9;
  SCOPED_TRACE(absl::StrCat("seed ", kSeed));
  const WeightSpec spec{WeightFormat::kMxfp4, 64, 24, 32};
  QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
  weight.activation_order = RandomActivationOrder(spec.k, kSeed);
  const testing::ColumnLayout columns = testing::ToColumns(weight);
  const absl::string_view code_bytes(
      reinterpret_cast<const char*>(columns.codes.data()),
      columns.codes.size());
  const auto codes_of = [&spec](absl::string_view bytes) {
    PanelCodeWriter codes(spec, CodeLayout::kColumns);
    codes.Append(bytes);
    return codes;
  };

  const absl::StatusOr<PackedWeight> got = PackedWeight::PackWithColumnScales(
      codes_of(code_bytes), columns.scale_codes.data(),
      weight.activation_order);
  const absl::StatusOr<PackedWeight> want = PackedWeight::Pack(weight);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_TRUE(testing::SamePanels(*got, *want));
  EXPECT_EQ(got->activation_order(), want->activation_order());

  std::vector<int32_t> repeated = weight.activation_order;
  repeated[1] = repeated[2];
  EXPECT_EQ(PackedWeight::PackWithColumnScales(
                codes_of(code_bytes), columns.scale_codes.data(), repeated)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status short_codes =
      PackedWeight::PackWithColumnScales(codes_of(code_bytes.substr(0, 100)),
                                         columns.scale_codes.data())
          .status();
  EXPECT_EQ(short_codes.message(),
            "qweight has 100 bytes, the shape needs 768");
}

// Writes `bytes` to `codes` in pieces of random sizes, from one byte to three
// units (rows of words, or panels' columns), so that pieces end inside words
// and units.
void AppendInPieces(absl::string_view bytes, size_t unit_bytes, uint64_t seed,
                    PanelCodeWriter& codes) {
  std::mt19937_64 rng(seed);
  for (size_t offset = 0; offset < bytes.size();) {
    const size_t size =
        std::min(bytes.size() - offset, size_t{1} + rng() % (3 * unit_bytes));
    codes.Append(bytes.substr(offset, size));
    offset += size;
  }
}

absl::string_view QweightBytes(const QuantizedWeight& weight) {
  return absl::string_view(reinterpret_cast<const char*>(weight.qweight.data()),
                           weight.qweight.size() * sizeof(uint32_t));
}

TEST(PanelCodeWriterTest, PacksCodesArrivingInPiecesAsPackDoes) {
  struct Case {
    WeightSpec spec;
    CodeLayout layout;
  };
  for (const auto& [spec, layout] : {
           Case{{WeightFormat::kU4b8, 128, 40, 32}, CodeLayout::kCanonical},
           Case{{WeightFormat::kU4, 256, 16, 64}, CodeLayout::kCanonical},
           Case{{WeightFormat::kFp4, 64, 33, 32}, CodeLayout::kCanonical},
           Case{{WeightFormat::kNvfp4, 96, 24, 16, 0.5f},
                CodeLayout::kCanonical},
           Case{{WeightFormat::kMxfp4, 128, 40, 32}, CodeLayout::kColumns},
           Case{{WeightFormat::kNvfp4, 48, 37, 16, 0.5f}, CodeLayout::kColumns},
           Case{{WeightFormat::kNvfp4, 64, 16, 16, 2.0f}, CodeLayout::kColumns},
       }) {
    for (uint64_t seed = 1; seed <= 3; ++seed) {
      SCOPED_TRACE(absl::StrCat(
          spec.DebugString(), layout == CodeLayout::kColumns ? ", columns" : "",
          ", seed ", seed));
      const QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
      const testing::ColumnLayout columns = testing::ToColumns(weight);
      PanelCodeWriter codes(spec, layout);
      if (layout == CodeLayout::kColumns) {
        AppendInPieces(absl::string_view(
                           reinterpret_cast<const char*>(columns.codes.data()),
                           columns.codes.size()),
                       kWidth * spec.k / 2, seed, codes);
      } else {
        AppendInPieces(QweightBytes(weight), spec.n * sizeof(uint32_t), seed,
                       codes);
      }
      EXPECT_EQ(codes.received_bytes(), spec.qweight_bytes());
      QuantizedWeight rest = weight;
      rest.qweight.clear();
      const absl::StatusOr<PackedWeight> got =
          PackedWeight::PackWithCodes(std::move(codes), rest);
      const absl::StatusOr<PackedWeight> want = PackedWeight::Pack(weight);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_TRUE(testing::SamePanels(*got, *want));
    }
  }
}

TEST(PanelCodeWriterTest, RefusesMissingCodesAndWhatPackRefuses) {
  const WeightSpec spec{WeightFormat::kU4, 64, 40, 32};
  const QuantizedWeight weight = RandomQuantizedWeight(spec, /*seed=*/7);
  PanelCodeWriter short_codes(spec, CodeLayout::kCanonical);
  short_codes.Append(QweightBytes(weight).substr(0, 100));
  absl::Status status =
      PackedWeight::PackWithCodes(std::move(short_codes), weight).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "qweight has 100 bytes, the shape needs 1280");

  QuantizedWeight large_zero = weight;
  large_zero.zeros.back() = 16;
  PanelCodeWriter codes(spec, CodeLayout::kCanonical);
  AppendInPieces(QweightBytes(weight), spec.n * sizeof(uint32_t), /*seed=*/7,
                 codes);
  status = PackedWeight::PackWithCodes(std::move(codes), large_zero).status();
  EXPECT_EQ(status, PackedWeight::Pack(large_zero).status());
}

TEST(PackedWeightWithoutPanelsTest, KeepsTheSpecAndActivationOrderOnly) {
  constexpr uint64_t kSeed = 23;
  const WeightSpec spec{WeightFormat::kU4, /*k=*/64, /*n=*/40,
                        /*group_size=*/32};
  QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
  weight.activation_order = RandomActivationOrder(spec.k, kSeed);
  const absl::StatusOr<PackedWeight> described =
      PackedWeight::WithoutPanels(weight);
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_FALSE(described->has_panels());
  EXPECT_EQ(described->panels(), 0);
  EXPECT_EQ(described->spec(), spec);
  EXPECT_EQ(std::vector<int32_t>(described->activation_order().begin(),
                                 described->activation_order().end()),
            weight.activation_order)
      << "seed " << kSeed;
  EXPECT_EQ(described->resident_bytes(), spec.k * int64_t{sizeof(int32_t)});
  EXPECT_TRUE(PackedWeight::Pack(weight)->has_panels());
}

TEST(PackedWeightWithoutPanelsTest, ASpecAloneNeedsAValidSpecAndOrder) {
  const WeightSpec spec{WeightFormat::kNvfp4, /*k=*/64, /*n=*/40,
                        /*group_size=*/16, /*global_scale=*/0.5f};
  absl::StatusOr<PackedWeight> described =
      PackedWeight::WithoutPanels(spec, RandomActivationOrder(spec.k, 9));
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_FALSE(described->has_panels());
  EXPECT_EQ(described->spec(), spec);
  EXPECT_EQ(described->activation_order().size(), spec.k);
  std::vector<int32_t> repeated = RandomActivationOrder(spec.k, 9);
  repeated[1] = repeated[0];
  EXPECT_EQ(PackedWeight::WithoutPanels(spec, repeated).status().code(),
            absl::StatusCode::kInvalidArgument);
  WeightSpec bad_group = spec;
  bad_group.group_size = 32;
  EXPECT_EQ(PackedWeight::WithoutPanels(bad_group, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PackedWeightWithoutPanelsTest, RejectsWhatPackRejects) {
  const WeightSpec spec{WeightFormat::kMxfp4, /*k=*/64, /*n=*/40,
                        /*group_size=*/32};
  QuantizedWeight nan_scale = RandomQuantizedWeight(spec, /*seed=*/4);
  nan_scale.scales[5] = 0xff;  // E8M0's NaN
  QuantizedWeight short_codes = RandomQuantizedWeight(spec, /*seed=*/4);
  short_codes.qweight.pop_back();
  for (const QuantizedWeight* weight : {&nan_scale, &short_codes}) {
    const absl::Status status = PackedWeight::WithoutPanels(*weight).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(status, PackedWeight::Pack(*weight).status());
  }
}

TEST(PackedWeightPackTest, RejectsAnInvalidWeight) {
  const WeightSpec spec{WeightFormat::kU4, /*k=*/64, /*n=*/40,
                        /*group_size=*/32};
  QuantizedWeight short_scales = RandomQuantizedWeight(spec, /*seed=*/1);
  short_scales.scales.pop_back();
  QuantizedWeight large_zero = RandomQuantizedWeight(spec, /*seed=*/1);
  large_zero.zeros.back() = 16;
  QuantizedWeight bad_group = RandomQuantizedWeight(spec, /*seed=*/1);
  bad_group.spec.group_size = 16;
  for (const QuantizedWeight* weight :
       {&short_scales, &large_zero, &bad_group}) {
    const absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(*weight);
    ASSERT_FALSE(packed.ok());
    EXPECT_EQ(packed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(packed.status(), weight->Validate());
  }
}

}  // namespace
}  // namespace nibble
