#include "kernels/cpu/shared_work.h"

#include <algorithm>
#include <atomic>

namespace nibble::cpu {

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
  pool.ParallelFor(
      threads,
      [&](int64_t, int64_t) {
        for (int64_t begin = next.fetch_add(piece, std::memory_order_relaxed);
             begin < n;
             begin = next.fetch_add(piece, std::memory_order_relaxed)) {
          fn(begin, std::min(n, begin + piece));
        }
      },
      threads);
}

}  // namespace nibble::cpu
