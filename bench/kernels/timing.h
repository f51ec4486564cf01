// Timing one kernel call the way nibble-bench reports it: a warm-up call,
// then the median of repeated calls. Each call should read an operand that
// is not in cache, as a served weight is not; CopiesToLeaveTheCache says how
// many copies to rotate through for that.
//
// Example:
//   const int copies = nibble::bench::CopiesToLeaveTheCache(bytes, llc_bytes);
//   std::vector<PackedWeight> weights(copies, packed);
//   nibble::bench::Timing timing = nibble::bench::TimeCalls(
//       [&](int call) { Run(weights[call % copies]); }, /*repeats=*/10);
#ifndef NIBBLE_BENCH_KERNELS_TIMING_H_
#define NIBBLE_BENCH_KERNELS_TIMING_H_

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"

namespace nibble::bench {

struct Timing {
  double median_us = 0;
  int calls = 0;  // timed calls, after the warm-up
};

// Never fewer timed calls than this, whatever the time they take.
inline constexpr int kMinTimedCalls = 3;
// Past this many seconds of timed calls, and kMinTimedCalls, timing stops.
inline constexpr double kTimeBudgetSeconds = 2.0;

// Calls call(0) to warm up, then call(1), call(2), ... and returns the median
// wall time of the timed calls: `repeats` of them, or fewer (at least
// kMinTimedCalls) once they have taken kTimeBudgetSeconds.
Timing TimeCalls(absl::FunctionRef<void(int)> call, int repeats);

// The median; the mean of the middle two for an even count. 0 when empty.
double Median(std::vector<double> values);
// The nearest-rank `q` quantile (0 < q <= 1): the smallest value that at
// least q of them do not exceed. 0 when empty.
double Percentile(std::vector<double> values, double q);

// How many copies of an operand of `bytes` to rotate through so that together
// they are at least twice the last-level cache (0: unknown, taken as 256 MiB)
// and none is still cached when its turn comes again. 1 for large operands.
int CopiesToLeaveTheCache(int64_t bytes, int64_t llc_bytes);

// `count` values in [-1, 1) from a fast generator, for operands of up to a
// gigabyte (activations, OpenBLAS's fp32 weights).
std::vector<float> RandomFloats(int64_t count, uint64_t seed);

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_TIMING_H_
