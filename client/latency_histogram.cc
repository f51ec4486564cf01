#include "client/latency_histogram.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

namespace nibble {
namespace client {
namespace {

constexpr int kSubBucketBits = 7;
constexpr int kSubBuckets = 1 << kSubBucketBits;
// A value of bit width w > 7 lands in magnitude w - 8, and INT64_MAX has bit
// width 63: 56 magnitudes of 128 buckets after the 128 exact ones below 128.
constexpr int kBucketCount = (64 - kSubBucketBits) * kSubBuckets;

// Below 128 the value itself. Above, the top 8 bits of the value select one
// of the buckets 128..255 of its magnitude; magnitude 0 (values 128..255)
// continues the exact ones, so that every bucket of it is one wide.
int BucketIndex(int64_t value) {
  const uint64_t v = static_cast<uint64_t>(value);
  if (v < kSubBuckets) return static_cast<int>(v);
  const int shift = std::bit_width(v) - kSubBucketBits - 1;
  return shift * kSubBuckets + static_cast<int>(v >> shift);
}

int BucketShift(int index) {
  return index < kSubBuckets ? 0 : index / kSubBuckets - 1;
}

int64_t BucketLower(int index) {
  if (index < kSubBuckets) return index;
  const int shift = BucketShift(index);
  return static_cast<int64_t>(index - shift * kSubBuckets) << shift;
}

// Written as lower + width - 1 so that the last bucket ends at INT64_MAX
// without overflowing.
int64_t BucketUpper(int index) {
  return BucketLower(index) + ((int64_t{1} << BucketShift(index)) - 1);
}

}  // namespace

LatencyHistogram::LatencyHistogram() : counts_(kBucketCount, 0) {}

void LatencyHistogram::Record(int64_t value) {
  value = std::max<int64_t>(value, 0);
  ++counts_[BucketIndex(value)];
  if (count_ == 0 || value < min_) min_ = value;
  if (count_ == 0 || value > max_) max_ = value;
  ++count_;
  sum_ += static_cast<double>(value);
}

void LatencyHistogram::Merge(const LatencyHistogram& other) {
  if (other.count_ == 0) return;
  for (int i = 0; i < kBucketCount; ++i) counts_[i] += other.counts_[i];
  min_ = count_ == 0 ? other.min_ : std::min(min_, other.min_);
  max_ = count_ == 0 ? other.max_ : std::max(max_, other.max_);
  count_ += other.count_;
  sum_ += other.sum_;
}

double LatencyHistogram::mean() const {
  return count_ == 0 ? 0 : sum_ / static_cast<double>(count_);
}

int64_t LatencyHistogram::ValueAtQuantile(double q) const {
  if (count_ == 0) return 0;
  const int64_t rank = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil(q * static_cast<double>(count_))), 1,
      count_);
  if (rank == 1) return min_;
  if (rank == count_) return max_;
  int64_t seen = 0;
  for (int i = 0; i < kBucketCount; ++i) {
    seen += counts_[i];
    if (seen < rank) continue;
    const int64_t lower = BucketLower(i);
    const int64_t midpoint = lower + (BucketUpper(i) - lower) / 2;
    // The exact quantile also lies in [min, max], so clamping only helps.
    return std::clamp(midpoint, min_, max_);
  }
  return max_;
}

std::vector<LatencyHistogram::Bucket> LatencyHistogram::NonEmptyBuckets()
    const {
  std::vector<Bucket> buckets;
  for (int i = 0; i < kBucketCount; ++i) {
    if (counts_[i] == 0) continue;
    buckets.push_back({BucketLower(i), BucketUpper(i), counts_[i]});
  }
  return buckets;
}

}  // namespace client
}  // namespace nibble
