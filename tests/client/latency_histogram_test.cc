#include "client/latency_histogram.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace nibble {
namespace client {
namespace {

constexpr int64_t kMaxValue = std::numeric_limits<int64_t>::max();
constexpr int64_t kOneHourUs = int64_t{3600} * 1000 * 1000;
constexpr double kQuantiles[] = {0,    0.001, 0.01, 0.1,   0.25,   0.5,
                                 0.75, 0.9,   0.99, 0.999, 0.9999, 1};

static_assert(LatencyHistogram::kMaxRelativeError <= 0.01);

// Nearest rank, as ValueAtQuantile defines it, on the samples themselves.
int64_t ExactQuantile(std::vector<int64_t> samples, double q) {
  std::sort(samples.begin(), samples.end());
  const int64_t n = static_cast<int64_t>(samples.size());
  const int64_t rank = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(q * static_cast<double>(n))), 1, n);
  return samples[rank - 1];
}

LatencyHistogram HistogramOf(const std::vector<int64_t>& samples) {
  LatencyHistogram histogram;
  for (int64_t sample : samples) histogram.Record(sample);
  return histogram;
}

void ExpectQuantilesClose(const std::vector<int64_t>& samples) {
  const LatencyHistogram histogram = HistogramOf(samples);
  ASSERT_EQ(histogram.count(), static_cast<int64_t>(samples.size()));
  EXPECT_EQ(histogram.min(), *std::min_element(samples.begin(), samples.end()));
  EXPECT_EQ(histogram.max(), *std::max_element(samples.begin(), samples.end()));
  const double exact_mean =
      std::accumulate(samples.begin(), samples.end(), 0.0) / samples.size();
  EXPECT_NEAR(histogram.mean(), exact_mean, 1e-9 * exact_mean);
  for (double q : kQuantiles) {
    const int64_t exact = ExactQuantile(samples, q);
    const int64_t estimate = histogram.ValueAtQuantile(q);
    const double relative_error =
        std::abs(static_cast<double>(estimate - exact)) / exact;
    EXPECT_LE(relative_error, 0.01)
        << "q " << q << ": estimate " << estimate << ", exact " << exact;
    EXPECT_LE(relative_error, LatencyHistogram::kMaxRelativeError)
        << "q " << q << ": estimate " << estimate << ", exact " << exact;
  }
}

// 100000 samples of `draw`, at least 1 us, for each of a few fixed seeds.
void CheckDistribution(const std::function<double(std::mt19937_64&)>& draw) {
  for (uint64_t seed : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 random(seed);
    std::vector<int64_t> samples(100000);
    for (int64_t& sample : samples) {
      sample = std::max<int64_t>(1, std::llround(draw(random)));
    }
    ExpectQuantilesClose(samples);
  }
}

TEST(LatencyHistogramTest, UniformQuantiles) {
  CheckDistribution([](std::mt19937_64& random) {
    return std::uniform_real_distribution<double>(1, 200000)(random);
  });
}

TEST(LatencyHistogramTest, ExponentialQuantiles) {
  CheckDistribution([](std::mt19937_64& random) {
    return std::exponential_distribution<double>(1.0 / 3000)(random);
  });
}

TEST(LatencyHistogramTest, BimodalQuantiles) {
  // Mostly fast requests, with a slow tenth far above them.
  CheckDistribution([](std::mt19937_64& random) {
    if (std::bernoulli_distribution(0.9)(random)) {
      return std::normal_distribution<double>(2000, 200)(random);
    }
    return std::normal_distribution<double>(500000, 50000)(random);
  });
}

TEST(LatencyHistogramTest, SpanningEveryMagnitudeUpToAnHour) {
  for (uint64_t seed : {1, 2}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    std::mt19937_64 random(seed);
    std::uniform_real_distribution<double> exponent(
        0, std::log(static_cast<double>(kOneHourUs)));
    std::vector<int64_t> samples(20000);
    for (int64_t& sample : samples) {
      sample = std::max<int64_t>(1, std::llround(std::exp(exponent(random))));
    }
    ExpectQuantilesClose(samples);
  }
}

TEST(LatencyHistogramTest, SmallValuesAreExact) {
  std::vector<int64_t> samples;
  for (int64_t value = 255; value >= 1; --value) samples.push_back(value);
  const LatencyHistogram histogram = HistogramOf(samples);
  for (double q : kQuantiles) {
    EXPECT_EQ(histogram.ValueAtQuantile(q), ExactQuantile(samples, q))
        << "q " << q;
  }
  EXPECT_EQ(histogram.ValueAtQuantile(0.5), 128);
  EXPECT_EQ(histogram.ValueAtQuantile(0.9), 230);  // ceil(229.5)
}

TEST(LatencyHistogramTest, EmptyIsAllZero) {
  const LatencyHistogram histogram;
  EXPECT_EQ(histogram.count(), 0);
  EXPECT_EQ(histogram.min(), 0);
  EXPECT_EQ(histogram.max(), 0);
  EXPECT_EQ(histogram.mean(), 0);
  EXPECT_EQ(histogram.ValueAtQuantile(0), 0);
  EXPECT_EQ(histogram.ValueAtQuantile(0.5), 0);
  EXPECT_EQ(histogram.ValueAtQuantile(1), 0);
  EXPECT_TRUE(histogram.NonEmptyBuckets().empty());
}

TEST(LatencyHistogramTest, ZeroIsRecorded) {
  LatencyHistogram histogram;
  histogram.Record(0);
  EXPECT_EQ(histogram.count(), 1);
  EXPECT_EQ(histogram.min(), 0);
  EXPECT_EQ(histogram.max(), 0);
  EXPECT_EQ(histogram.ValueAtQuantile(0.5), 0);
  EXPECT_EQ(histogram.NonEmptyBuckets(),
            std::vector<LatencyHistogram::Bucket>({{0, 0, 1}}));
}

TEST(LatencyHistogramTest, NegativeCountsAsZero) {
  LatencyHistogram histogram;
  histogram.Record(-5);
  EXPECT_EQ(histogram.min(), 0);
  EXPECT_EQ(histogram.ValueAtQuantile(1), 0);
}

TEST(LatencyHistogramTest, VeryLargeValues) {
  LatencyHistogram histogram;
  histogram.Record(1);
  histogram.Record(kOneHourUs);
  histogram.Record(kMaxValue);
  histogram.Record(kMaxValue);
  EXPECT_EQ(histogram.min(), 1);
  EXPECT_EQ(histogram.max(), kMaxValue);
  EXPECT_EQ(histogram.ValueAtQuantile(1), kMaxValue);
  // Rank 3 of 4: a bucket midpoint, not max.
  const double top = static_cast<double>(histogram.ValueAtQuantile(0.75));
  EXPECT_NEAR(top, kMaxValue, kMaxValue * LatencyHistogram::kMaxRelativeError);
  const double hour = static_cast<double>(histogram.ValueAtQuantile(0.5));
  EXPECT_NEAR(hour, kOneHourUs,
              kOneHourUs * LatencyHistogram::kMaxRelativeError);
  EXPECT_GT(histogram.mean(), 0);
  const std::vector<LatencyHistogram::Bucket> buckets =
      histogram.NonEmptyBuckets();
  ASSERT_EQ(buckets.size(), 3u);
  EXPECT_EQ(buckets.back().upper, kMaxValue);
  EXPECT_EQ(buckets.back().count, 2);
}

TEST(LatencyHistogramTest, QuantileEndsAreMinAndMax) {
  const LatencyHistogram histogram = HistogramOf({1001, 5003, 70001, 123457});
  EXPECT_EQ(histogram.ValueAtQuantile(0), 1001);
  EXPECT_EQ(histogram.ValueAtQuantile(-1), 1001);
  EXPECT_EQ(histogram.ValueAtQuantile(1), 123457);
  EXPECT_EQ(histogram.ValueAtQuantile(2), 123457);
}

TEST(LatencyHistogramTest, MergeEqualsRecordingIntoOne) {
  std::mt19937_64 random(7);
  std::exponential_distribution<double> draw(1.0 / 5000);
  std::vector<LatencyHistogram> parts(4);
  LatencyHistogram all;
  for (int i = 0; i < 40000; ++i) {
    const int64_t value = std::llround(draw(random));
    parts[i % 3].Record(value);  // parts[3] stays empty.
    all.Record(value);
  }
  LatencyHistogram merged;
  for (const LatencyHistogram& part : parts) merged.Merge(part);
  EXPECT_EQ(merged.count(), all.count());
  EXPECT_EQ(merged.min(), all.min());
  EXPECT_EQ(merged.max(), all.max());
  EXPECT_DOUBLE_EQ(merged.mean(), all.mean());
  EXPECT_EQ(merged.NonEmptyBuckets(), all.NonEmptyBuckets());
  for (double q : kQuantiles) {
    EXPECT_EQ(merged.ValueAtQuantile(q), all.ValueAtQuantile(q)) << "q " << q;
  }
}

TEST(LatencyHistogramTest, MergeIntoNonEmptyKeepsMinAndMax) {
  LatencyHistogram first = HistogramOf({50, 60});
  first.Merge(HistogramOf({10, 40}));
  first.Merge(LatencyHistogram());
  EXPECT_EQ(first.count(), 4);
  EXPECT_EQ(first.min(), 10);
  EXPECT_EQ(first.max(), 60);
  EXPECT_DOUBLE_EQ(first.mean(), 40);
}

TEST(LatencyHistogramTest, BucketsSumToCountInOrder) {
  std::mt19937_64 random(11);
  std::uniform_real_distribution<double> exponent(0, 40);
  std::vector<int64_t> samples(10000);
  for (int64_t& sample : samples) {
    sample = std::llround(std::exp2(exponent(random)));
  }
  const LatencyHistogram histogram = HistogramOf(samples);
  const std::vector<LatencyHistogram::Bucket> buckets =
      histogram.NonEmptyBuckets();
  int64_t total = 0;
  int64_t previous_upper = -1;
  for (const LatencyHistogram::Bucket& bucket : buckets) {
    EXPECT_GT(bucket.count, 0);
    EXPECT_GT(bucket.lower, previous_upper);
    EXPECT_LE(bucket.lower, bucket.upper);
    total += bucket.count;
    previous_upper = bucket.upper;
  }
  EXPECT_EQ(total, histogram.count());
  EXPECT_EQ(buckets.front().lower, histogram.min());
  EXPECT_GE(buckets.back().upper, histogram.max());
}

TEST(LatencyHistogramTest, EachValueLiesInANarrowBucket) {
  // Both sides of every power of two, where the bucket width changes.
  for (int bit = 0; bit < 63; ++bit) {
    const int64_t power = int64_t{1} << bit;
    for (int64_t value : {power - 1, power, power + 1, 3 * (power / 2)}) {
      LatencyHistogram histogram;
      histogram.Record(value);
      const std::vector<LatencyHistogram::Bucket> buckets =
          histogram.NonEmptyBuckets();
      ASSERT_EQ(buckets.size(), 1u) << value;
      EXPECT_LE(buckets[0].lower, value);
      EXPECT_GE(buckets[0].upper, value);
      const double width =
          static_cast<double>(buckets[0].upper - buckets[0].lower) + 1;
      EXPECT_LE(width, std::max(1.0, buckets[0].lower / 128.0)) << value;
    }
  }
}

}  // namespace
}  // namespace client
}  // namespace nibble
