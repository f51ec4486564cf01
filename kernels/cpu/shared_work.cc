#include "kernels/cpu/shared_work.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>

namespace nibble::cpu {
namespace {

// How long a thread out of pieces waits awake for the others' last ones:
// longer than a piece of a 16 MB weight at M = 1 takes (about 70 us).
constexpr std::chrono::microseconds kAwakeWait(100);

}  // namespace

int ThreadsForWork(int64_t work, int threads) {
  return static_cast<int>(
      std::clamp<int64_t>(work / kMinBytesPerThread, 1, std::max(threads, 1)));
}

void ParallelForShared(ThreadPool& pool, int64_t n, int threads,
                       absl::FunctionRef<void(int64_t, int64_t)> fn) {
  if (n <= 0) return;
  if (threads <= 1 || n == 1) {
    fn(0, n);
    return;
  }
  const int64_t pieces = std::min<int64_t>(n, threads * kPiecesPerThread);
  const int64_t piece = (n + pieces - 1) / pieces;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};  // indices whose piece has run
  pool.ParallelFor(
      threads,
      [&](int64_t, int64_t) {
        for (int64_t begin = next.fetch_add(piece, std::memory_order_relaxed);
             begin < n;
             begin = next.fetch_add(piece, std::memory_order_relaxed)) {
          const int64_t end = std::min(n, begin + piece);
          fn(begin, end);
          done.fetch_add(end - begin, std::memory_order_release);
        }
        // The pieces still running started on other threads and usually end
        // within a piece's time: waiting for them here, awake, spares the
        // caller the pool's sleep and wake-up at the end of ParallelFor. A
        // thread that lost its core takes longer; then ParallelFor waits.
        const auto give_up = std::chrono::steady_clock::now() + kAwakeWait;
        while (done.load(std::memory_order_acquire) < n &&
               std::chrono::steady_clock::now() < give_up) {
          _mm_pause();
        }
      },
      threads);
}

}  // namespace nibble::cpu
