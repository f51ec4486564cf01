#include "client/load_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::client {
namespace {

using std::chrono::milliseconds;
using ::testing::ElementsAre;
using ::testing::Field;

const LoadClock::time_point kStart{std::chrono::hours(1)};

TEST(LoadRecorderTest, FilesEventsUnderTheirSecond) {
  LoadRecorder recorder(kStart);
  recorder.RecordSent(kStart + milliseconds(10));
  recorder.RecordOk(kStart + milliseconds(20), 100, "k", /*measured=*/true);
  recorder.RecordSent(kStart + milliseconds(1500));
  recorder.RecordError(kStart + milliseconds(1600), "UNAVAILABLE", true);
  // Seconds 2 and 3 pass without events.
  recorder.RecordOk(kStart + milliseconds(4100), 300, "k", true);
  const RunResult result = recorder.Finish(kStart + milliseconds(4200));
  EXPECT_THAT(result.series, ElementsAre(Field(&SecondStats::second, 0),
                                         Field(&SecondStats::second, 1),
                                         Field(&SecondStats::second, 2),
                                         Field(&SecondStats::second, 3),
                                         Field(&SecondStats::second, 4)));
  EXPECT_EQ(result.series[0].sent, 1);
  EXPECT_EQ(result.series[0].ok, 1);
  EXPECT_EQ(result.series[0].p50_us, 100);
  EXPECT_EQ(result.series[1].sent, 1);
  EXPECT_EQ(result.series[1].errors, 1);
  EXPECT_EQ(result.series[1].p99_us, 0);
  EXPECT_EQ(result.series[2].ok + result.series[2].errors, 0);
  EXPECT_EQ(result.series[4].p99_us, 300);
  EXPECT_EQ(result.totals.latencies.count(), 2);
  EXPECT_EQ(result.totals.errors.at("UNAVAILABLE"), 1);
  EXPECT_EQ(result.totals.kernels.at("k"), 2);
}

TEST(LoadRecorderTest, WarmupShowsInProgressButNotInTheTotalsOrSeries) {
  LoadRecorder recorder(kStart);
  recorder.RecordOk(kStart - milliseconds(700), 50, "k", /*measured=*/false);
  recorder.RecordError(kStart - milliseconds(600), "INTERNAL", false);
  const LoadRecorder::ProgressSnapshot progress =
      recorder.Progress(kStart + milliseconds(5));
  EXPECT_EQ(progress.ok, 1);
  EXPECT_EQ(progress.errors, 1);
  ASSERT_TRUE(progress.last_second.has_value());
  EXPECT_EQ(progress.last_second->second, -1);
  EXPECT_EQ(progress.last_second->p50_us, 50);

  const RunResult result = recorder.Finish(kStart + milliseconds(10));
  EXPECT_EQ(result.totals.latencies.count(), 0);
  EXPECT_TRUE(result.totals.errors.empty());
  ASSERT_EQ(result.series.size(), 1u);
  EXPECT_EQ(result.series[0].ok, 0);
}

TEST(LoadRecorderTest, SecondQuantilesMatchTheSamplesOfThatSecond) {
  const uint32_t seed = 20261122;
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937 random(seed);
  std::uniform_int_distribution<int64_t> latency(1000, 100000);
  LoadRecorder recorder(kStart);
  std::vector<std::vector<int64_t>> samples(3);
  for (int i = 0; i < 3000; ++i) {
    const int second = i / 1000;
    samples[second].push_back(latency(random));
    recorder.RecordOk(kStart + milliseconds(second * 1000 + i % 1000),
                      samples[second].back(), "k", true);
  }
  const RunResult result = recorder.Finish(kStart + milliseconds(2999));
  ASSERT_EQ(result.series.size(), 3u);
  for (int second = 0; second < 3; ++second) {
    std::vector<int64_t> sorted = samples[second];
    std::sort(sorted.begin(), sorted.end());
    // Nearest rank: the 500th and 990th of 1000.
    EXPECT_NEAR(result.series[second].p50_us, sorted[499],
                sorted[499] * LatencyHistogram::kMaxRelativeError);
    EXPECT_NEAR(result.series[second].p99_us, sorted[989],
                sorted[989] * LatencyHistogram::kMaxRelativeError);
    EXPECT_EQ(result.series[second].ok, 1000);
  }
}

TEST(LoadRecorderTest, LateEventsGoToTheCurrentSecond) {
  LoadRecorder recorder(kStart);
  recorder.RecordOk(kStart + milliseconds(1100), 10, "k", true);
  // Timed before a second's end but recorded after it.
  recorder.RecordOk(kStart + milliseconds(990), 20, "k", true);
  const RunResult result = recorder.Finish(kStart + milliseconds(1200));
  ASSERT_EQ(result.series.size(), 2u);
  EXPECT_EQ(result.series[0].ok, 0);
  EXPECT_EQ(result.series[1].ok, 2);
}

}  // namespace
}  // namespace nibble::client
