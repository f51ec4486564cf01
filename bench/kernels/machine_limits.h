// What the machine can do at best, measured once, so that kernel timings can
// be read as a fraction of it: the DRAM read bandwidth (the floor of a
// small-M matmul, which streams the weight once), the fp32 FMA peak (the
// ceiling of a large-M one) and what waking the pool's idle threads costs
// (a fixed price of every multi-threaded call, which small weights feel).
//
// Example:
//   nibble::ThreadPool pool(2);
//   nibble::bench::MachineLimits limits =
//       nibble::bench::MeasureMachineLimits(pool);
//   double floor_us = weight_bytes / (limits.read_gbps * 1e3);
#ifndef NIBBLE_BENCH_KERNELS_MACHINE_LIMITS_H_
#define NIBBLE_BENCH_KERNELS_MACHINE_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "base/thread_pool.h"

namespace nibble::bench {

struct MachineLimits {
  std::string cpu_model;  // "model name" of /proc/cpuinfo
  int threads = 1;
  // The largest cache of CPU 0; 0 when sysfs does not say.
  int64_t llc_bytes = 0;
  // Streaming reads over read_buffer_bytes on all threads, the best pass of
  // one stream per thread and of four interleaved prefetched streams.
  double read_gbps = 0;
  int64_t read_buffer_bytes = 0;
  // Independent FMA chains in registers on all threads, best pass; 0 without
  // AVX2 and FMA.
  double fma_peak_gflops = 0;
  std::string fma_isa;  // "avx512", "avx2" or "none"
  // Median microseconds from the start of a ParallelFor until every thread
  // runs its piece, the workers idle before it; 0 with one thread.
  double wake_us = 0;
};

// A cache size as sysfs writes it: "48K", "2048K", "32M" or plain bytes; 0
// when malformed.
int64_t ParseCacheSize(absl::string_view text);

// The largest data or unified cache of CPU 0 in bytes, 0 when unknown.
int64_t LastLevelCacheBytes();

// "model name" from /proc/cpuinfo, "unknown" when absent.
std::string CpuModelName();

// A buffer this large cannot stay in the last-level cache: at least 4x it and
// at least 512 MiB.
int64_t StreamingBufferBytes(int64_t llc_bytes);

// Passes over the buffer MeasureMachineLimits makes; the best one counts.
inline constexpr int kReadBandwidthPasses = 5;

// GB/s (1e9 bytes per second) reading `bytes` on every thread of the pool,
// the best of `passes` passes each way (one stream per thread, four
// interleaved prefetched streams per thread).
double MeasureReadBandwidth(ThreadPool& pool, int64_t bytes, int passes);

struct FmaPeak {
  double gflops = 0;
  std::string isa;
};

// fp32 FMA throughput on every thread of the pool: AVX-512 when the CPU has
// it, else AVX2 with FMA, else none (0 GFLOP/s).
FmaPeak MeasureFmaPeak(ThreadPool& pool);

// Calls of ParallelFor that MeasureWakeUpMicros makes; the median counts.
inline constexpr int kWakeUpCalls = 200;

// Microseconds from the start of a ParallelFor over every thread of the pool
// until the last of them starts its piece, after the workers have gone idle,
// as they do between requests: the median of `calls`.
double MeasureWakeUpMicros(ThreadPool& pool, int calls);

// All of the above, once.
MachineLimits MeasureMachineLimits(ThreadPool& pool);

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_MACHINE_LIMITS_H_
