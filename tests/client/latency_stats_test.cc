#include "client/latency_stats.h"

#include <algorithm>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace nibble {
namespace {

TEST(LatencyStatsTest, EmptyIsAllZero) {
  const LatencySummary summary = LatencyStats().Summarize();
  EXPECT_EQ(summary.count, 0);
  EXPECT_EQ(summary.p50, absl::ZeroDuration());
  EXPECT_EQ(summary.p99, absl::ZeroDuration());
  EXPECT_EQ(summary.max, absl::ZeroDuration());
}

TEST(LatencyStatsTest, OneSampleIsEveryPercentile) {
  LatencyStats stats;
  stats.Add(absl::Microseconds(42));
  const LatencySummary summary = stats.Summarize();
  EXPECT_EQ(summary.count, 1);
  EXPECT_EQ(summary.p50, absl::Microseconds(42));
  EXPECT_EQ(summary.p90, absl::Microseconds(42));
  EXPECT_EQ(summary.p99, absl::Microseconds(42));
  EXPECT_EQ(summary.max, absl::Microseconds(42));
}

TEST(LatencyStatsTest, NearestRankOfOneToHundredInAnyOrder) {
  std::vector<int> values(100);
  for (int i = 0; i < 100; ++i) values[i] = i + 1;
  std::shuffle(values.begin(), values.end(), std::mt19937(7));
  LatencyStats stats;
  for (int value : values) stats.Add(absl::Microseconds(value));
  const LatencySummary summary = stats.Summarize();
  EXPECT_EQ(summary.count, 100);
  EXPECT_EQ(summary.p50, absl::Microseconds(50));
  EXPECT_EQ(summary.p90, absl::Microseconds(90));
  EXPECT_EQ(summary.p99, absl::Microseconds(99));
  EXPECT_EQ(summary.max, absl::Microseconds(100));
}

TEST(LatencyStatsTest, NearestRankRoundsUp) {
  // Ten samples: p50 is the 5th, p90 the 9th, p99 the 10th (ceil(9.9)).
  LatencyStats stats;
  for (int i = 10; i >= 1; --i) stats.Add(absl::Milliseconds(i));
  const LatencySummary summary = stats.Summarize();
  EXPECT_EQ(summary.p50, absl::Milliseconds(5));
  EXPECT_EQ(summary.p90, absl::Milliseconds(9));
  EXPECT_EQ(summary.p99, absl::Milliseconds(10));
}

TEST(LatencyStatsTest, MergeKeepsEverySample) {
  LatencyStats first;
  LatencyStats second;
  first.Add(absl::Microseconds(3));
  second.Add(absl::Microseconds(1));
  second.Add(absl::Microseconds(2));
  first.Merge(second);
  const LatencySummary summary = first.Summarize();
  EXPECT_EQ(summary.count, 3);
  EXPECT_EQ(summary.p50, absl::Microseconds(2));
  EXPECT_EQ(summary.max, absl::Microseconds(3));
}

}  // namespace
}  // namespace nibble
