#include "server/operations/metrics_histogram.h"

#include <algorithm>

namespace nibble::server {

Histogram::Histogram(std::span<const double> upper_bounds)
    : upper_bounds_(upper_bounds), bucket_counts_(upper_bounds.size() + 1, 0) {}

void Histogram::Record(double value) {
  const auto bucket =
      std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value);
  ++bucket_counts_[bucket - upper_bounds_.begin()];
  ++count_;
  sum_ += value;
}

void Histogram::Add(const Histogram& other) {
  for (size_t i = 0; i < bucket_counts_.size(); ++i) {
    bucket_counts_[i] += other.bucket_counts_[i];
  }
  count_ += other.count_;
  sum_ += other.sum_;
}

std::vector<int64_t> Histogram::CumulativeCounts() const {
  std::vector<int64_t> cumulative(bucket_counts_.size());
  int64_t total = 0;
  for (size_t i = 0; i < bucket_counts_.size(); ++i) {
    total += bucket_counts_[i];
    cumulative[i] = total;
  }
  return cumulative;
}

}  // namespace nibble::server
