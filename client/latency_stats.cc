#include "client/latency_stats.h"

#include <algorithm>

namespace nibble {
namespace {

// Integer arithmetic, so that e.g. p90 of 100 samples is exactly rank 90.
absl::Duration NearestRank(const std::vector<absl::Duration>& sorted,
                           size_t percent) {
  const size_t rank = (percent * sorted.size() + 99) / 100;
  return sorted[std::max<size_t>(rank, 1) - 1];
}

}  // namespace

void LatencyStats::Merge(const LatencyStats& other) {
  samples_.insert(samples_.end(), other.samples_.begin(), other.samples_.end());
}

LatencySummary LatencyStats::Summarize() const {
  LatencySummary summary;
  if (samples_.empty()) return summary;
  std::vector<absl::Duration> sorted = samples_;
  std::sort(sorted.begin(), sorted.end());
  summary.count = count();
  summary.p50 = NearestRank(sorted, 50);
  summary.p90 = NearestRank(sorted, 90);
  summary.p99 = NearestRank(sorted, 99);
  summary.max = sorted.back();
  return summary;
}

}  // namespace nibble
