// Latency samples of the load generator and their exact percentiles.
//
// Example:
//   nibble::LatencyStats stats;
//   stats.Add(absl::Microseconds(120));
//   stats.Merge(other_thread_stats);
//   nibble::LatencySummary summary = stats.Summarize();
//   absl::Duration p99 = summary.p99;
#ifndef NIBBLE_CLIENT_LATENCY_STATS_H_
#define NIBBLE_CLIENT_LATENCY_STATS_H_

#include <cstdint>
#include <vector>

#include "absl/time/time.h"

namespace nibble {

struct LatencySummary {
  int64_t count = 0;
  absl::Duration p50;
  absl::Duration p90;
  absl::Duration p99;
  absl::Duration max;
};

// Keeps every sample, so percentiles are exact rather than estimated. Not
// thread-safe: give each thread its own and Merge them.
class LatencyStats {
 public:
  void Add(absl::Duration latency) { samples_.push_back(latency); }
  void Merge(const LatencyStats& other);
  int64_t count() const { return static_cast<int64_t>(samples_.size()); }

  // Nearest-rank percentiles: pN is the smallest sample that at least N% of
  // the samples do not exceed. All zero when there are no samples.
  LatencySummary Summarize() const;

 private:
  std::vector<absl::Duration> samples_;
};

}  // namespace nibble

#endif  // NIBBLE_CLIENT_LATENCY_STATS_H_
