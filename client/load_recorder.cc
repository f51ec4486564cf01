#include "client/load_recorder.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>

namespace nibble {
namespace client {

LoadRecorder::LoadRecorder(LoadClock::time_point measure_start)
    : measure_start_(measure_start) {}

int64_t LoadRecorder::SecondOf(LoadClock::time_point when) const {
  // Rounded down, so that the warmup's last second is -1, not 0.
  const auto offset = when - measure_start_;
  const int64_t second =
      std::chrono::duration_cast<std::chrono::seconds>(offset).count();
  return offset < std::chrono::seconds(second) ? second - 1 : second;
}

void LoadRecorder::AdvanceTo(int64_t second) {
  // From the first event, which may be in the warmup, or else second 0.
  if (!started_) {
    current_.second = std::min<int64_t>(second, 0);
    started_ = true;
  }
  while (current_.second < second) {
    current_.p50_us = current_latencies_.ValueAtQuantile(0.50);
    current_.p99_us = current_latencies_.ValueAtQuantile(0.99);
    if (current_.second >= 0) series_.push_back(current_);
    last_closed_ = current_;
    current_ = SecondStats{.second = current_.second + 1};
    if (current_latencies_.count() > 0) current_latencies_ = LatencyHistogram();
  }
}

void LoadRecorder::RecordSent(LoadClock::time_point when) {
  std::lock_guard<std::mutex> lock(mutex_);
  AdvanceTo(SecondOf(when));
  ++current_.sent;
}

void LoadRecorder::RecordOk(LoadClock::time_point when, int64_t latency_us,
                            absl::string_view kernel, bool measured) {
  std::lock_guard<std::mutex> lock(mutex_);
  AdvanceTo(SecondOf(when));
  ++ok_;
  ++current_.ok;
  current_latencies_.Record(latency_us);
  if (!measured) return;
  totals_.latencies.Record(latency_us);
  ++totals_.kernels[kernel];
}

void LoadRecorder::RecordError(LoadClock::time_point when,
                               absl::string_view label, bool measured) {
  std::lock_guard<std::mutex> lock(mutex_);
  AdvanceTo(SecondOf(when));
  ++errors_;
  ++current_.errors;
  if (measured) ++totals_.errors[label];
}

LoadRecorder::ProgressSnapshot LoadRecorder::Progress(
    LoadClock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  AdvanceTo(SecondOf(now));
  return {.ok = ok_, .errors = errors_, .last_second = last_closed_};
}

RunResult LoadRecorder::Finish(LoadClock::time_point now) {
  std::lock_guard<std::mutex> lock(mutex_);
  AdvanceTo(SecondOf(now) + 1);
  return {.totals = std::move(totals_), .series = std::move(series_)};
}

}  // namespace client
}  // namespace nibble
