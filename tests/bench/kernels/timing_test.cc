// Tests the median and percentiles, the call loop of TimeCalls and the copy
// count that keeps operands out of cache.
#include "bench/kernels/timing.h"

#include <algorithm>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::bench {
namespace {

TEST(MedianTest, OddEvenAndEmpty) {
  EXPECT_EQ(Median({}), 0);
  EXPECT_EQ(Median({5}), 5);
  EXPECT_EQ(Median({9, 1, 5}), 5);
  EXPECT_EQ(Median({4, 1, 3, 2}), 2.5);
  EXPECT_EQ(Median({100, 1, 2, 3, 1000}), 3);
}

TEST(PercentileTest, NearestRank) {
  EXPECT_EQ(Percentile({}, 0.9), 0);
  EXPECT_EQ(Percentile({7}, 0.9), 7);
  // Ten values 1..10 shuffled: the 90th percentile is the 9th smallest.
  EXPECT_EQ(Percentile({4, 10, 1, 9, 3, 8, 2, 7, 6, 5}, 0.9), 9);
  EXPECT_EQ(Percentile({4, 10, 1, 9, 3, 8, 2, 7, 6, 5}, 0.5), 5);
  EXPECT_EQ(Percentile({4, 10, 1, 9, 3, 8, 2, 7, 6, 5}, 1.0), 10);
  EXPECT_EQ(Percentile({3, 1, 2}, 0.01), 1);
}

TEST(TimeCallsTest, WarmsUpThenTimesEachRepeat) {
  std::vector<int> calls;
  const Timing timing = TimeCalls([&](int call) { calls.push_back(call); }, 4);
  EXPECT_THAT(calls, ::testing::ElementsAre(0, 1, 2, 3, 4));
  EXPECT_EQ(timing.calls, 4);
  EXPECT_GE(timing.median_us, 0);
}

TEST(CopiesToLeaveTheCacheTest, AtLeastTwiceTheCache) {
  const int64_t llc = int64_t{100} << 20;
  EXPECT_EQ(CopiesToLeaveTheCache(int64_t{8} << 20, llc), 25);
  EXPECT_EQ(CopiesToLeaveTheCache(int64_t{7} << 20, llc), 29);
  EXPECT_EQ(CopiesToLeaveTheCache(int64_t{150} << 20, llc), 2);
  EXPECT_EQ(CopiesToLeaveTheCache(int64_t{200} << 20, llc), 1);
  EXPECT_EQ(CopiesToLeaveTheCache(int64_t{1} << 30, llc), 1);
  // Unknown cache: taken as 256 MiB.
  EXPECT_EQ(CopiesToLeaveTheCache(int64_t{64} << 20, 0), 8);
  // Tiny operands are capped.
  EXPECT_EQ(CopiesToLeaveTheCache(64, llc), 4096);
}

TEST(RandomFloatsTest, InRangeAndSeeded) {
  const std::vector<float> values = RandomFloats(10000, 7);
  ASSERT_EQ(values.size(), 10000u);
  EXPECT_GE(*std::min_element(values.begin(), values.end()), -1.0f);
  EXPECT_LT(*std::max_element(values.begin(), values.end()), 1.0f);
  EXPECT_EQ(values, RandomFloats(10000, 7));
  EXPECT_NE(values, RandomFloats(10000, 8));
}

}  // namespace
}  // namespace nibble::bench
