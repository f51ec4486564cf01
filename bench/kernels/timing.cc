#include "bench/kernels/timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace nibble::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int64_t kUnknownLlcBytes = int64_t{256} << 20;
// Operands below 2 x LLC / 4096 (about 50 KiB here) get fewer copies than
// they would need; their calls are short and cache-bound either way.
constexpr int64_t kMaxCopies = 4096;

}  // namespace

Timing TimeCalls(absl::FunctionRef<void(int)> call, int repeats) {
  call(0);
  std::vector<double> micros;
  double total_seconds = 0;
  for (int i = 1; i <= std::max(repeats, 1); ++i) {
    const Clock::time_point start = Clock::now();
    call(i);
    const double seconds =
        std::chrono::duration<double>(Clock::now() - start).count();
    micros.push_back(seconds * 1e6);
    total_seconds += seconds;
    if (i >= kMinTimedCalls && total_seconds >= kTimeBudgetSeconds) break;
  }
  return Timing{.median_us = Median(micros),
                .calls = static_cast<int>(micros.size())};
}

double Median(std::vector<double> values) {
  if (values.empty()) return 0;
  const size_t middle = values.size() / 2;
  std::nth_element(values.begin(), values.begin() + middle, values.end());
  if (values.size() % 2 == 1) return values[middle];
  const double upper = values[middle];
  const double lower =
      *std::max_element(values.begin(), values.begin() + middle);
  return (lower + upper) / 2;
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  const auto rank =
      static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  const size_t index = std::clamp<size_t>(rank, 1, values.size()) - 1;
  std::nth_element(values.begin(), values.begin() + index, values.end());
  return values[index];
}

int CopiesToLeaveTheCache(int64_t bytes, int64_t llc_bytes) {
  const int64_t cache = llc_bytes > 0 ? llc_bytes : kUnknownLlcBytes;
  const int64_t needed = 2 * cache;
  if (bytes <= 0 || bytes >= needed) return 1;
  return static_cast<int>(std::min(kMaxCopies, (needed + bytes - 1) / bytes));
}

std::vector<float> RandomFloats(int64_t count, uint64_t seed) {
  std::vector<float> values(count);
  uint64_t state = seed * 0x9e3779b97f4a7c15u + 1;
  for (float& value : values) {
    // xorshift64: the values only need to be varied and in range.
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    value = static_cast<float>(state >> 40) * 0x1p-23f - 1.0f;
  }
  return values;
}

}  // namespace nibble::bench
