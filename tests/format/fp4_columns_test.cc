// Tests that CanonicalFromColumns transposes the column layout of MXFP4 and
// NVFP4 checkpoints into the canonical one, for every shape of the tiles it
// goes by.
#include "format/fp4_columns.h"

#include <cstdint>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "tests/format/column_layout.h"

namespace nibble {
namespace {

TEST(CanonicalFromColumnsTest, TransposesCodesAndScales) {
  constexpr uint64_t kSeed = 17;
  for (const WeightSpec& spec : {
           WeightSpec{WeightFormat::kMxfp4, 128, 64, 32},
           // N past a tile of 16 and a block of 32, by less than 4.
           WeightSpec{WeightFormat::kMxfp4, 256, 35, 32},
           // 6 words a column: runs of words shorter than 4.
           WeightSpec{WeightFormat::kNvfp4, 48, 19, 16, 0.5f},
           WeightSpec{WeightFormat::kNvfp4, 16, 5, 16, 2.0f},
           // 150 words, past several tiles; 75 groups, 3 past a block of 8.
           WeightSpec{WeightFormat::kNvfp4, 1200, 33, 16, 0.25f},
       }) {
    SCOPED_TRACE(absl::StrCat(spec.DebugString(), ", seed ", kSeed));
    const QuantizedWeight want = RandomQuantizedWeight(spec, kSeed);
    const testing::ColumnLayout columns = testing::ToColumns(want);
    const QuantizedWeight got = CanonicalFromColumns(columns.View(spec));
    EXPECT_EQ(got.spec, spec);
    EXPECT_EQ(got.qweight, want.qweight);
    EXPECT_EQ(got.scales, want.scales);
    EXPECT_TRUE(got.zeros.empty());
    EXPECT_TRUE(got.Validate().ok()) << got.Validate();
  }
}

}  // namespace
}  // namespace nibble
