// What nibble-load saw during one run, recorded as replies arrive on gRPC's
// threads: the totals of the measured window (latency histogram, errors by
// code, kernels) and a series of one entry per second of the clock, for the
// live progress line and the JSON report.
//
// Example:
//   nibble::client::LoadRecorder recorder(measure_start);
//   recorder.RecordSent(Clock::now());
//   recorder.RecordOk(Clock::now(), /*latency_us=*/850, "fused_u4_avx512",
//                     /*measured=*/true);
//   std::optional<nibble::client::SecondStats> last =
//       recorder.Progress(Clock::now()).last_second;
//   nibble::client::RunResult result = recorder.Finish(Clock::now());
#ifndef NIBBLE_CLIENT_LOAD_RECORDER_H_
#define NIBBLE_CLIENT_LOAD_RECORDER_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "client/latency_histogram.h"

namespace nibble {
namespace client {

// Steady, unlike absl::Now(), so that clock adjustments cannot skew latencies.
using LoadClock = std::chrono::steady_clock;

// One second of the clock: requests sent in it, replies that came in it and
// the latencies of the successful ones.
struct SecondStats {
  // Seconds since the start of the measured window; negative in the warmup.
  int64_t second = 0;
  int64_t sent = 0;
  int64_t ok = 0;
  int64_t errors = 0;
  // 0 without successful replies.
  int64_t p50_us = 0;
  int64_t p99_us = 0;
};

// The requests that count: in the measured window.
struct MeasuredTotals {
  // Microseconds.
  LatencyHistogram latencies;
  // By status code name, or a client-side label.
  absl::flat_hash_map<std::string, int64_t> errors;
  absl::flat_hash_map<std::string, int64_t> kernels;
};

struct RunResult {
  MeasuredTotals totals;
  // Seconds 0, 1, ... of the measured window and of the draining after it.
  // They count by the clock: a warmup request answered in second 0 shows
  // there, though not in `totals`.
  std::vector<SecondStats> series;
};

// Thread-safe. Events are filed under the second in which they are recorded;
// one that waited for the lock across a second's end goes into the next.
class LoadRecorder {
 public:
  explicit LoadRecorder(LoadClock::time_point measure_start);

  void RecordSent(LoadClock::time_point when);
  void RecordOk(LoadClock::time_point when, int64_t latency_us,
                absl::string_view kernel, bool measured);
  void RecordError(LoadClock::time_point when, absl::string_view label,
                   bool measured);

  struct ProgressSnapshot {
    // Replies so far, warmup included.
    int64_t ok = 0;
    int64_t errors = 0;
    // The last second that ended by `now`, if any did.
    std::optional<SecondStats> last_second;
  };
  ProgressSnapshot Progress(LoadClock::time_point now);

  // Closes the second running at `now` and hands over what was recorded.
  RunResult Finish(LoadClock::time_point now);

 private:
  int64_t SecondOf(LoadClock::time_point when) const;
  // Closes the current second and any empty ones up to `second`; a `second`
  // in the past changes nothing.
  void AdvanceTo(int64_t second);

  const LoadClock::time_point measure_start_;
  std::mutex mutex_;
  int64_t ok_ = 0;
  int64_t errors_ = 0;
  MeasuredTotals totals_;
  bool started_ = false;
  SecondStats current_;
  LatencyHistogram current_latencies_;
  std::optional<SecondStats> last_closed_;
  std::vector<SecondStats> series_;
};

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_LOAD_RECORDER_H_
