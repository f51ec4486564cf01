// Tests the format table of format/weight_format.h: every format through
// every property, the lookups built on it, and the table in docs/formats.md,
// which must match it.
#include <cstdint>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "format/dequant.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

using ::testing::HasSubstr;

// The facts of each format as its producers define them, written out here
// independently of the table.
struct ExpectedRow {
  WeightFormat format;
  const char* name;
  int wire_value;
  uint32_t file_code;
  bool fp4_codes;
  ScaleType scale_type;
  ZeroPoint zero_point;
  int64_t fixed_group_size;
  bool global_scale;
};

constexpr ExpectedRow kExpected[] = {
    {WeightFormat::kFp4, "fp4", 1, 0, true, ScaleType::kFp16, ZeroPoint::kNone,
     0, false},
    {WeightFormat::kU4b8, "u4b8", 2, 1, false, ScaleType::kFp16,
     ZeroPoint::kEight, 0, false},
    {WeightFormat::kU4, "u4", 3, 2, false, ScaleType::kFp16,
     ZeroPoint::kPerGroup, 0, false},
    {WeightFormat::kMxfp4, "mxfp4", 4, 3, true, ScaleType::kE8m0,
     ZeroPoint::kNone, 32, false},
    {WeightFormat::kNvfp4, "nvfp4", 5, 4, true, ScaleType::kE4m3,
     ZeroPoint::kNone, 16, true},
};

TEST(FormatTableTest, EveryFormatHasItsProperties) {
  ASSERT_EQ(std::size(kExpected), kWeightFormatCount);
  for (const ExpectedRow& want : kExpected) {
    const WeightFormatTraits& row = Traits(want.format);
    SCOPED_TRACE(row.name);
    EXPECT_EQ(row.format, want.format);
    EXPECT_EQ(row.name, want.name);
    EXPECT_EQ(row.wire_value, want.wire_value);
    EXPECT_EQ(row.file_code, want.file_code);
    EXPECT_EQ(HasFp4Codes(want.format), want.fp4_codes);
    EXPECT_EQ(row.code_kind, want.fp4_codes ? CodeKind::kFp4 : CodeKind::kInt4);
    EXPECT_EQ(row.scale_type, want.scale_type);
    EXPECT_EQ(row.zero_point, want.zero_point);
    EXPECT_EQ(HasZeros(want.format), want.zero_point == ZeroPoint::kPerGroup);
    EXPECT_EQ(FixedGroupSize(want.format), want.fixed_group_size);
    EXPECT_EQ(HasEightBitScales(want.format),
              want.scale_type != ScaleType::kFp16);
    EXPECT_EQ(HasColumnLayout(want.format),
              want.scale_type != ScaleType::kFp16);
    EXPECT_EQ(HasGlobalScale(want.format), want.global_scale);
    EXPECT_FALSE(row.math.empty());
    EXPECT_FALSE(row.origin.empty());
  }
}

TEST(FormatTableTest, NamesWireValuesAndFileCodesAreUnique) {
  std::set<absl::string_view> names;
  std::set<int> wire_values;
  std::set<uint32_t> file_codes;
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    EXPECT_TRUE(names.insert(row.name).second) << row.name;
    EXPECT_TRUE(wire_values.insert(row.wire_value).second) << row.name;
    EXPECT_TRUE(file_codes.insert(row.file_code).second) << row.name;
    // 0 is the proto's UNSPECIFIED.
    EXPECT_NE(row.wire_value, 0) << row.name;
  }
}

TEST(FormatTableTest, LookupsRoundTripEveryFormat) {
  for (WeightFormat format : kAllWeightFormats) {
    const WeightFormatTraits& row = Traits(format);
    SCOPED_TRACE(row.name);
    absl::StatusOr<WeightFormat> parsed = ParseWeightFormat(row.name);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, format);
    absl::StatusOr<WeightFormat> from_wire =
        WeightFormatFromWire(row.wire_value, "");
    ASSERT_TRUE(from_wire.ok()) << from_wire.status();
    EXPECT_EQ(*from_wire, format);
    absl::StatusOr<WeightFormat> from_file =
        WeightFormatFromFileCode(row.file_code);
    ASSERT_TRUE(from_file.ok()) << from_file.status();
    EXPECT_EQ(*from_file, format);
  }
}

TEST(FormatTableTest, UnknownWireValuesAndFileCodesAreRefusedClearly) {
  const absl::StatusOr<WeightFormat> wire = WeightFormatFromWire(0, "");
  EXPECT_EQ(wire.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(wire.status().message()),
              HasSubstr("weight format 0 is not supported: use "
                        "WEIGHT_FORMAT_FP4, WEIGHT_FORMAT_U4B8, "
                        "WEIGHT_FORMAT_U4, WEIGHT_FORMAT_MXFP4 or "
                        "WEIGHT_FORMAT_NVFP4"));
  const absl::StatusOr<WeightFormat> named =
      WeightFormatFromWire(0, "WEIGHT_FORMAT_UNSPECIFIED");
  EXPECT_THAT(std::string(named.status().message()),
              HasSubstr("weight format WEIGHT_FORMAT_UNSPECIFIED is not"));
  const absl::StatusOr<WeightFormat> file = WeightFormatFromFileCode(99);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(file.status().message()), HasSubstr("code 99"));
}

TEST(FormatTableTest, NameListsFollowTheTable) {
  EXPECT_EQ(WeightFormatNames(), "fp4, u4b8, u4, mxfp4 or nvfp4");
  EXPECT_EQ(WeightFormatNames(", "), "fp4, u4b8, u4, mxfp4, nvfp4");
  EXPECT_EQ(WeightFormatNamesWhere(HasZeros), "u4");
  EXPECT_EQ(WeightFormatNamesWhere(HasColumnLayout, " and "),
            "mxfp4 and nvfp4");
  EXPECT_EQ(FixedGroupSizesText(), "mxfp4:32, nvfp4:16");
}

TEST(FormatTableTest, EveryFormatValidatesAtItsGroupSizesOnly) {
  for (WeightFormat format : kAllWeightFormats) {
    SCOPED_TRACE(WeightFormatName(format));
    const float global_scale = HasGlobalScale(format) ? 0.5f : 1.0f;
    for (int64_t group : {16, 32, 64, 128, 256}) {
      const WeightSpec spec{format, 256, 8, group, global_scale};
      const bool allowed = FixedGroupSize(format) != 0
                               ? group == FixedGroupSize(format)
                               : group != 16;
      EXPECT_EQ(spec.Validate().ok(), allowed) << "group " << group;
    }
    const int64_t group =
        FixedGroupSize(format) != 0 ? FixedGroupSize(format) : 128;
    const WeightSpec wrong_scale{format, 256, 8, group,
                                 HasGlobalScale(format) ? 0.0f : 0.5f};
    EXPECT_EQ(wrong_scale.Validate().code(),
              absl::StatusCode::kInvalidArgument);
  }
}

TEST(FormatTableTest, ScalesDecodeAsTheirTypeSays) {
  // 0x3c00 is fp16 1.0; code 127 is E8M0 2^0; 0x38 is E4M3 1.0.
  for (WeightFormat format : kAllWeightFormats) {
    SCOPED_TRACE(WeightFormatName(format));
    switch (Traits(format).scale_type) {
      case ScaleType::kFp16:
        EXPECT_EQ(ScaleToFloat(format, 0x3c00), 1.0f);
        break;
      case ScaleType::kE8m0:
        EXPECT_EQ(ScaleToFloat(format, 127), 1.0f);
        EXPECT_EQ(ScaleToFloat(format, 130), 8.0f);
        break;
      case ScaleType::kE4m3:
        EXPECT_EQ(ScaleToFloat(format, 0x38), 1.0f);
        EXPECT_EQ(ScaleToFloat(format, 0x40), 2.0f);
        break;
    }
  }
}

// docs/formats.md's table, as the format table renders it.
std::string MarkdownTable() {
  const auto group_text = [](const WeightFormatTraits& row) {
    return row.fixed_group_size != 0 ? absl::StrCat(row.fixed_group_size)
                                     : std::string("32, 64, 128 or K");
  };
  const auto zero_text = [](ZeroPoint zero) -> std::string {
    switch (zero) {
      case ZeroPoint::kNone:
        return "none";
      case ZeroPoint::kEight:
        return "8";
      case ZeroPoint::kPerGroup:
        return "per group (`zeros`)";
    }
    return "?";
  };
  std::string table =
      "| format | element | codes | scales | zero point | group | column "
      "layout | global scale | wire value | file code | from |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    absl::StrAppend(&table, "| `", row.name, "` | `", row.math, "` | ",
                    row.code_kind == CodeKind::kFp4 ? "FP4 E2M1" : "INT4",
                    " | ", ScaleTypeName(row.scale_type), " | ",
                    zero_text(row.zero_point), " | ", group_text(row), " | ",
                    row.column_layout ? "yes" : "no", " | ",
                    row.global_scale ? "fp32" : "no", " | ", row.wire_value,
                    " | ", row.file_code, " | ", row.origin, " |\n");
  }
  return table;
}

TEST(FormatTableTest, DocsTableMatchesTheFormatTable) {
  const std::string path = NIBBLE_SOURCE_DIR "/docs/formats.md";
  std::ifstream file(path);
  ASSERT_TRUE(file) << "cannot read " << path;
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_THAT(text.str(), HasSubstr(MarkdownTable()))
      << path << " must hold the format table as it is now:\n"
      << MarkdownTable();
}

}  // namespace
}  // namespace nibble
