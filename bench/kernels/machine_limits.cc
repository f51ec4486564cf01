#include "bench/kernels/machine_limits.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace nibble::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The first line of a small text file, trimmed; empty when unreadable.
std::string ReadLine(const std::filesystem::path& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return std::string(absl::StripAsciiWhitespace(line));
}

// Keeps results that nothing else reads from being optimized away.
std::atomic<uint64_t> sink{0};

// Eight independent sums so that the loads, not the adds, set the pace; the
// compiler vectorizes it.
uint64_t SumWords(const uint64_t* words, int64_t count) {
  uint64_t sums[8] = {};
  for (int64_t i = 0; i + 8 <= count; i += 8) {
    for (int j = 0; j < 8; ++j) sums[j] += words[i + j];
  }
  uint64_t total = 0;
  for (uint64_t sum : sums) total += sum;
  return total;
}

// The same sum over kReadStreams contiguous parts of the words, a cache line
// of each in turn, each prefetched kReadPrefetchBytes ahead: the way the M = 1
// kernels read several panels at once. Some machines read faster this way
// than with one plain stream (a 2-core Xeon VM: 32 against 27 GB/s), and the
// floor is what the machine can do.
constexpr int kReadStreams = 4;
constexpr int64_t kReadPrefetchBytes = 1024;

uint64_t SumWordsInStreams(const uint64_t* words, int64_t count) {
  constexpr int64_t kLineWords = 8;
  const int64_t part = count / kReadStreams / kLineWords * kLineWords;
  uint64_t sums[kReadStreams][kLineWords] = {};
  for (int64_t i = 0; i < part; i += kLineWords) {
    for (int stream = 0; stream < kReadStreams; ++stream) {
      const uint64_t* line = words + stream * part + i;
      __builtin_prefetch(line + kReadPrefetchBytes / 8);
      for (int j = 0; j < kLineWords; ++j) sums[stream][j] += line[j];
    }
  }
  uint64_t total =
      SumWords(words + kReadStreams * part, count - kReadStreams * part);
  for (const auto& stream_sums : sums) {
    for (uint64_t sum : stream_sums) total += sum;
  }
  return total;
}

// Chains of dependent FMAs, kChains of them independent so that both FMA
// ports stay busy despite the 4-cycle latency. kChains is a compile-time
// constant and the inner loop is unrolled fully, so every accumulator lives in
// a register; a runtime-length array would go through memory at a fraction of
// the peak.
template <int kChains>
__attribute__((target("avx512f"))) float FmaChainsAvx512(int64_t iterations) {
  __m512 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm512_set1_ps(1.0f + c);
  // Converges towards 1 instead of overflowing or going subnormal.
  const __m512 mul = _mm512_set1_ps(0.999999f);
  const __m512 add = _mm512_set1_ps(0.000001f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm512_fmadd_ps(acc[c], mul, add);
    }
  }
  __m512 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm512_add_ps(total, acc[c]);
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, total);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

template <int kChains>
__attribute__((target("avx2,fma"))) float FmaChainsAvx2(int64_t iterations) {
  __m256 acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = _mm256_set1_ps(1.0f + c);
  const __m256 mul = _mm256_set1_ps(0.999999f);
  const __m256 add = _mm256_set1_ps(0.000001f);
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 32
    for (int c = 0; c < kChains; ++c) {
      acc[c] = _mm256_fmadd_ps(acc[c], mul, add);
    }
  }
  __m256 total = acc[0];
  for (int c = 1; c < kChains; ++c) total = _mm256_add_ps(total, acc[c]);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, total);
  float sum = 0;
  for (float lane : lanes) sum += lane;
  return sum;
}

// 32 zmm registers hold 16 chains and the constants; 16 ymm registers hold 12.
constexpr int kAvx512Chains = 16;
constexpr int kAvx2Chains = 12;

}  // namespace

int64_t ParseCacheSize(absl::string_view text) {
  text = absl::StripAsciiWhitespace(text);
  int64_t unit = 1;
  if (absl::ConsumeSuffix(&text, "K")) {
    unit = int64_t{1} << 10;
  } else if (absl::ConsumeSuffix(&text, "M")) {
    unit = int64_t{1} << 20;
  } else if (absl::ConsumeSuffix(&text, "G")) {
    unit = int64_t{1} << 30;
  }
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value <= 0) return 0;
  return value * unit;
}

int64_t LastLevelCacheBytes() {
  const std::filesystem::path caches = "/sys/devices/system/cpu/cpu0/cache";
  std::error_code error;
  int64_t largest = 0;
  for (const auto& entry : std::filesystem::directory_iterator(caches, error)) {
    if (!absl::StartsWith(entry.path().filename().string(), "index")) continue;
    if (ReadLine(entry.path() / "type") == "Instruction") continue;
    largest =
        std::max(largest, ParseCacheSize(ReadLine(entry.path() / "size")));
  }
  return largest;
}

std::string CpuModelName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, "model name")) continue;
    const size_t colon = rest.find(':');
    if (colon == absl::string_view::npos) continue;
    return std::string(absl::StripAsciiWhitespace(rest.substr(colon + 1)));
  }
  return "unknown";
}

int64_t StreamingBufferBytes(int64_t llc_bytes) {
  return std::max(4 * llc_bytes, int64_t{512} << 20);
}

double MeasureReadBandwidth(ThreadPool& pool, int64_t bytes, int passes) {
  // Blocks of 4 KiB, so that each thread reads whole pages.
  constexpr int64_t kBlockWords = 512;
  const int64_t blocks = std::max<int64_t>(1, bytes / 8 / kBlockWords);
  std::unique_ptr<uint64_t[]> words(new uint64_t[blocks * kBlockWords]);
  // Written by the threads that read it later, so that its pages are local.
  pool.ParallelFor(blocks, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * kBlockWords; i < end * kBlockWords; ++i) {
      words[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15u;
    }
  });
  double best_seconds = 0;
  for (int pass = 0; pass < passes; ++pass) {
    for (uint64_t (*sum)(const uint64_t*, int64_t) :
         {SumWords, SumWordsInStreams}) {
      const Clock::time_point start = Clock::now();
      pool.ParallelFor(blocks, [&](int64_t begin, int64_t end) {
        sink +=
            sum(words.get() + begin * kBlockWords, (end - begin) * kBlockWords);
      });
      const double seconds = SecondsSince(start);
      if (best_seconds == 0 || seconds < best_seconds) best_seconds = seconds;
    }
  }
  return static_cast<double>(blocks * kBlockWords * 8) / best_seconds / 1e9;
}

FmaPeak MeasureFmaPeak(ThreadPool& pool) {
  __builtin_cpu_init();
  FmaPeak peak;
  float (*chains)(int64_t) = nullptr;
  int flops_per_iteration = 0;
  if (__builtin_cpu_supports("avx512f")) {
    chains = FmaChainsAvx512<kAvx512Chains>;
    flops_per_iteration = kAvx512Chains * 16 * 2;
    peak.isa = "avx512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    chains = FmaChainsAvx2<kAvx2Chains>;
    flops_per_iteration = kAvx2Chains * 8 * 2;
    peak.isa = "avx2";
  } else {
    peak.isa = "none";
    return peak;
  }
  // About 0.04 s per pass at 2 GHz. Many short passes, of which the best
  // counts, so that other work on the machine and the cores' climb to their
  // vector clock do not lower the result.
  constexpr int64_t kIterations = 10'000'000;
  constexpr int kPasses = 8;
  const int threads = pool.threads();
  double best_seconds = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    const Clock::time_point start = Clock::now();
    pool.ParallelFor(threads, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        sink += static_cast<uint64_t>(chains(kIterations));
      }
    });
    const double seconds = SecondsSince(start);
    if (pass == 0 || seconds < best_seconds) best_seconds = seconds;
  }
  peak.gflops = static_cast<double>(threads) * kIterations *
                flops_per_iteration / best_seconds / 1e9;
  return peak;
}

double MeasureWakeUpMicros(ThreadPool& pool, int calls) {
  const int threads = pool.threads();
  if (threads <= 1 || calls <= 0) return 0;
  std::vector<double> micros;
  for (int call = 0; call < calls; ++call) {
    // Long enough for every worker to block waiting for work.
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    std::atomic<int> started{0};
    double all_started_us = 0;
    const Clock::time_point start = Clock::now();
    pool.ParallelFor(
        threads,
        [&](int64_t, int64_t) {
          if (started.fetch_add(1) + 1 == threads) {
            all_started_us =
                std::chrono::duration<double, std::micro>(Clock::now() - start)
                    .count();
          }
          // Each piece holds its thread until all have started, so that no
          // thread runs two pieces and every worker has to wake.
          while (started.load() < threads) {
          }
        },
        threads);
    micros.push_back(all_started_us);
  }
  std::nth_element(micros.begin(), micros.begin() + micros.size() / 2,
                   micros.end());
  return micros[micros.size() / 2];
}

MachineLimits MeasureMachineLimits(ThreadPool& pool) {
  MachineLimits limits;
  limits.cpu_model = CpuModelName();
  limits.threads = pool.threads();
  limits.llc_bytes = LastLevelCacheBytes();
  limits.read_buffer_bytes = StreamingBufferBytes(limits.llc_bytes);
  limits.read_gbps = MeasureReadBandwidth(pool, limits.read_buffer_bytes,
                                          kReadBandwidthPasses);
  const FmaPeak peak = MeasureFmaPeak(pool);
  limits.fma_peak_gflops = peak.gflops;
  limits.fma_isa = peak.isa;
  limits.wake_us = MeasureWakeUpMicros(pool, kWakeUpCalls);
  return limits;
}

}  // namespace nibble::bench
