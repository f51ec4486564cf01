// A log-bucketed latency histogram in the style of HdrHistogram: constant
// memory and O(1) recording however many samples, with quantiles to within
// kMaxRelativeError of the exact sample quantiles.
//
// Example:
//   nibble::client::LatencyHistogram histogram;  // One per thread.
//   histogram.Record(120);                        // Microseconds.
//   total.Merge(histogram);
//   int64_t p99 = total.ValueAtQuantile(0.99);
//   for (const auto& bucket : total.NonEmptyBuckets()) {
//     // bucket.lower, bucket.upper, bucket.count
//   }
#ifndef NIBBLE_CLIENT_LATENCY_HISTOGRAM_H_
#define NIBBLE_CLIENT_LATENCY_HISTOGRAM_H_

#include <cstdint>
#include <vector>

namespace nibble {
namespace client {

// Values 0 to 255 each have a bucket of their own; above that, every power of
// two [2^e, 2^(e+1)) is split into 128 equal buckets, up to INT64_MAX. That
// is 7296 buckets (57 KiB), so nothing is ever out of range. Count, min, max
// and the sum for the mean are kept exactly. Not thread-safe: give each thread
// its own and Merge them.
class LatencyHistogram {
 public:
  // Values falling into one bucket, [lower, upper] inclusive.
  struct Bucket {
    int64_t lower = 0;
    int64_t upper = 0;
    int64_t count = 0;

    friend bool operator==(const Bucket&, const Bucket&) = default;
  };

  // A bucket is at most 1/128 of its lower bound wide, and a quantile is
  // reported as its bucket's midpoint.
  static constexpr double kMaxRelativeError = 1.0 / 256;

  LatencyHistogram();

  // Negative values, which a steady clock never gives, are recorded as 0.
  void Record(int64_t value);
  void Merge(const LatencyHistogram& other);

  int64_t count() const { return count_; }
  // Exact; 0 when empty.
  int64_t min() const { return count_ == 0 ? 0 : min_; }
  int64_t max() const { return count_ == 0 ? 0 : max_; }
  double mean() const;

  // Estimates the nearest-rank quantile: the smallest recorded value that at
  // least ceil(q * count) values do not exceed. Within kMaxRelativeError of
  // it, and exact for values below 256, for q <= 0 (min) and q >= 1 (max).
  // 0 when empty.
  int64_t ValueAtQuantile(double q) const;

  // In increasing order of value.
  std::vector<Bucket> NonEmptyBuckets() const;

 private:
  std::vector<int64_t> counts_;
  int64_t count_ = 0;
  int64_t min_ = 0;
  int64_t max_ = 0;
  // A double, as an int64 sum of large values could overflow.
  double sum_ = 0;
};

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_LATENCY_HISTOGRAM_H_
