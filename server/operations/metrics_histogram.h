// A Prometheus-style histogram with fixed bucket upper bounds: counts of
// observations per bucket, their sum and their number. Not thread-safe; its
// owner records under its own lock, so that recording allocates nothing.
//
// Example:
//   nibble::server::Histogram latency(nibble::server::kLatencyBucketsSeconds);
//   latency.Record(0.0003);
//   latency.count();                // 1
//   latency.CumulativeCounts()[3];  // observations <=
//   kLatencyBucketsSeconds[3]
#ifndef NIBBLE_SERVER_OPERATIONS_METRICS_HISTOGRAM_H_
#define NIBBLE_SERVER_OPERATIONS_METRICS_HISTOGRAM_H_

#include <cstdint>
#include <span>
#include <vector>

namespace nibble::server {

// Seconds, from 50 us (a small matmul) to 10 s (a call stuck behind a full
// queue).
inline constexpr double kLatencyBucketsSeconds[] = {
    50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
    50e-3, 100e-3, 250e-3, 500e-3, 1.0,  2.5,    5.0,  10.0};

// Rows of A per kernel call, by powers of two up to the default
// max_request_rows.
inline constexpr double kBatchRowsBuckets[] = {
    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096};

class Histogram {
 public:
  // `upper_bounds` must be increasing and outlive the histogram; an implicit
  // last bucket, +Inf, takes what is above them.
  explicit Histogram(std::span<const double> upper_bounds);

  // Adds `value` to the first bucket whose upper bound is >= value.
  void Record(double value);
  // Adds every observation of `other`, which has the same upper bounds.
  void Add(const Histogram& other);

  std::span<const double> upper_bounds() const { return upper_bounds_; }
  // Observations per bucket, not cumulative: one per upper bound, then +Inf.
  const std::vector<int64_t>& bucket_counts() const { return bucket_counts_; }
  // Observations <= each upper bound, then the total, as Prometheus's
  // `_bucket{le=...}` series read.
  std::vector<int64_t> CumulativeCounts() const;
  int64_t count() const { return count_; }
  double sum() const { return sum_; }

 private:
  std::span<const double> upper_bounds_;
  std::vector<int64_t> bucket_counts_;
  int64_t count_ = 0;
  double sum_ = 0;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_METRICS_HISTOGRAM_H_
