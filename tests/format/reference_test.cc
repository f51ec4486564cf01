// Tests the float64 reference of format/reference.h on hand-computed cases.
#include "format/reference.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <vector>

#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;

// kU4, K = 8, N = 2, per-channel: column 0 has codes 0..7, scale 0.5 and zero
// 3, so B[r][0] = (r - 3) * 0.5; column 1 has codes 15..8, scale 2 and zero 8,
// so B[r][1] = (7 - r) * 2.
QuantizedWeight HandMadeU4Weight() {
  QuantizedWeight weight;
  weight.spec = {WeightFormat::kU4, /*k=*/8, /*n=*/2, /*group_size=*/8};
  weight.qweight.assign(2, 0);
  for (int row = 0; row < 8; ++row) {
    weight.SetCode(row, 0, row);
    weight.SetCode(row, 1, 15 - row);
  }
  weight.scales = {FloatToHalf(0.5f), FloatToHalf(2.0f)};
  weight.zeros = {3, 8};
  return weight;
}

TEST(ReferenceTest, DequantizesU4WithScalesAndZeros) {
  const QuantizedWeight weight = HandMadeU4Weight();
  ASSERT_TRUE(weight.Validate().ok()) << weight.Validate();
  EXPECT_THAT(ReferenceDequantize(weight),
              ElementsAre(-1.5, 14, -1, 12, -0.5, 10, 0, 8, 0.5, 6, 1, 4, 1.5,
                          2, 2, 0));
}

TEST(ReferenceTest, DequantizesFp4AndU4b8IgnoringZeros) {
  QuantizedWeight weight;
  weight.spec = {WeightFormat::kFp4, /*k=*/8, /*n=*/1, /*group_size=*/8};
  weight.qweight = {0xfedc9810u};
  weight.scales = {FloatToHalf(-2.0f)};
  EXPECT_THAT(ReferenceDequantize(weight),
              ElementsAre(0, -1, 0, 1, 4, 6, 8, 12));
  weight.spec.format = WeightFormat::kU4b8;
  EXPECT_THAT(ReferenceDequantize(weight),
              ElementsAre(16, 14, 0, -2, -8, -10, -12, -14));
}

TEST(ReferenceTest, DequantizesMxfp4WithPowerOfTwoScales) {
  QuantizedWeight weight;
  weight.spec = {WeightFormat::kMxfp4, /*k=*/32, /*n=*/1, /*group_size=*/32};
  weight.qweight = {0xfedc9810u, 0, 0, 0};
  weight.scales = {129};  // E8M0: 2^(129 - 127) = 4
  ASSERT_TRUE(weight.Validate().ok()) << weight.Validate();
  std::vector<double> want(32, 0.0);
  const double first_word[] = {0, 2, -0.0, -2, -8, -12, -16, -24};
  std::copy(std::begin(first_word), std::end(first_word), want.begin());
  EXPECT_THAT(ReferenceDequantize(weight), ElementsAreArray(want));
}

TEST(ReferenceTest, DequantizesNvfp4WithE4m3AndGlobalScalesInFloat64) {
  QuantizedWeight weight;
  weight.spec = {WeightFormat::kNvfp4, /*k=*/16, /*n=*/1, /*group_size=*/16,
                 /*global_scale=*/0.1f};
  weight.qweight = {0xfedc9810u, 0x00000072u};
  weight.scales = {0x3c};  // E4M3: 2^(7 - 7) * (1 + 4/8) = 1.5
  ASSERT_TRUE(weight.Validate().ok()) << weight.Validate();
  const double global = 0.1f;  // the fp32 value, not 0.1
  std::vector<double> want(16, 0.0);
  const double codes[] = {0, 0.5, -0.0, -0.5, -2, -3, -4, -6, 1, 6};
  for (int i = 0; i < 10; ++i) want[i] = codes[i] * 1.5 * global;
  EXPECT_THAT(ReferenceDequantize(weight), ElementsAreArray(want));
}

TEST(ReferenceTest, MultipliesInFloat64) {
  // Row 0 is 1..8, row 1 is all -1.
  const std::vector<double> a = {1,  2,  3,  4,  5,  6,  7,  8,
                                 -1, -1, -1, -1, -1, -1, -1, -1};
  EXPECT_THAT(ReferenceMatmul(a, /*m=*/2, HandMadeU4Weight()),
              ElementsAre(30, 168, -2, -56));
}

TEST(MaxRelativeErrorTest, IsRelativeToTheLargestWantedMagnitude) {
  EXPECT_EQ(
      MaxRelativeError(std::vector<double>{1, -4}, std::vector<double>{1, -4}),
      0.0);
  EXPECT_EQ(MaxRelativeError(std::vector<double>{1.5, -4},
                             std::vector<double>{1, -4}),
            0.125);
  EXPECT_EQ(
      MaxRelativeError(std::vector<double>{0, 0}, std::vector<double>{0, 0}),
      0.0);
  EXPECT_EQ(
      MaxRelativeError(std::vector<double>{0, 0.5}, std::vector<double>{0, 0}),
      0.5);
}

TEST(MaxRelativeErrorTest, NanAnywhereFailsEveryBound) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_TRUE(std::isnan(MaxRelativeError(std::vector<double>{1, nan, 3},
                                          std::vector<double>{1, 2, 3})));
  EXPECT_TRUE(std::isnan(
      MaxRelativeError(std::vector<double>{nan}, std::vector<double>{0})));
}

}  // namespace
}  // namespace nibble
