#include "client/sweep_range.h"

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace client {
namespace {

using ::testing::DoubleNear;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(SweepRangeTest, StepsFromFromToTo) {
  absl::StatusOr<SweepRange> range = ParseSweepRange("50:200:50", false);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_THAT(range->Values(), ElementsAre(50, 100, 150, 200));
}

TEST(SweepRangeTest, StopsBeforeOvershootingTo) {
  absl::StatusOr<SweepRange> range = ParseSweepRange("1:10:4", true);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_THAT(range->Values(), ElementsAre(1, 5, 9));
}

TEST(SweepRangeTest, FractionalStepsReachTo) {
  absl::StatusOr<SweepRange> range = ParseSweepRange("0.1:0.3:0.1", false);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_THAT(range->Values(),
              ElementsAre(DoubleNear(0.1, 1e-12), DoubleNear(0.2, 1e-12),
                          DoubleNear(0.3, 1e-12)));
}

TEST(SweepRangeTest, OneStepWhenFromIsTo) {
  absl::StatusOr<SweepRange> range = ParseSweepRange("4:4:1", true);
  ASSERT_TRUE(range.ok()) << range.status();
  EXPECT_THAT(range->Values(), ElementsAre(4));
}

TEST(SweepRangeTest, RejectsBadSpecs) {
  EXPECT_THAT(ParseSweepRange("50:200", false).status().message(),
              HasSubstr("FROM:TO:STEP"));
  EXPECT_THAT(ParseSweepRange("200:50:50", false).status().message(),
              HasSubstr("must not exceed TO"));
  EXPECT_THAT(ParseSweepRange("50:200:0", false).status().message(),
              HasSubstr("STEP in \"50:200:0\" must be a positive number"));
  EXPECT_THAT(ParseSweepRange("-1:2:1", false).status().message(),
              HasSubstr("FROM"));
  EXPECT_THAT(ParseSweepRange("a:2:1", false).status().message(),
              HasSubstr("positive number"));
  EXPECT_THAT(ParseSweepRange("1:8:1.5", true).status().message(),
              HasSubstr("STEP in \"1:8:1.5\" must be a whole number"));
  EXPECT_EQ(ParseSweepRange("1:inf:1", false).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace client
}  // namespace nibble
