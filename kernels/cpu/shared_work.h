// Splits a kernel's loop over a thread pool in pieces that the threads take
// from a shared counter, instead of one fixed share each: a thread that
// starts late (a pool worker still waking up, or one whose core runs another
// process) takes fewer pieces rather than holding up the whole call. The
// caller starts at once, a worker that wakes after the last piece is taken
// finds nothing to do, and the threads wait for the last pieces awake (for
// up to 100 us).
//
// Example:
//   nibble::cpu::ParallelForShared(pool, tiles, /*threads=*/2,
//                                  [&](int64_t first, int64_t end) {
//                                    for (int64_t t = first; t < end; ++t) ...
//                                  });
#ifndef NIBBLE_KERNELS_CPU_SHARED_WORK_H_
#define NIBBLE_KERNELS_CPU_SHARED_WORK_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "base/thread_pool.h"

namespace nibble::cpu {

// Pieces per thread: enough that the threads that started can make up for
// one that starts late, few enough that each piece still streams long runs.
inline constexpr int64_t kPiecesPerThread = 8;

// The work, in weight bytes read times rows of A, that a thread must get
// for a second one to pay: waking a worker and waiting for it cost 15-25 us
// on the 2-core Zen 4 machine (nibble-bench's wake-up line), while two
// threads save half of a call, which for 1 MiB at M = 1 is about 35 us.
inline constexpr int64_t kMinBytesPerThread = int64_t{1} << 20;

// `threads`, or fewer so that each gets kMinBytesPerThread of `work`; at
// least 1.
int ThreadsForWork(int64_t work, int threads);

// Calls fn(begin, end) on disjoint ranges covering [0, n), in pieces of
// ceil(n / (threads * kPiecesPerThread)), on up to `threads` threads of
// `pool`, and returns when all have run.
void ParallelForShared(ThreadPool& pool, int64_t n, int threads,
                       absl::FunctionRef<void(int64_t, int64_t)> fn);

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_SHARED_WORK_H_
