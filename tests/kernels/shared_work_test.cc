// Tests ParallelForShared: every index runs once, in pieces of the promised
// size, on no more threads than asked for.
#include "kernels/cpu/shared_work.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "base/thread_pool.h"
#include "gtest/gtest.h"

namespace nibble::cpu {
namespace {

struct Calls {
  std::vector<int> runs;  // how often each index ran
  int64_t longest_piece = 0;
  std::set<std::thread::id> threads_seen;
};

Calls RunShared(ThreadPool& pool, int64_t n, int threads) {
  Calls calls;
  calls.runs.assign(n, 0);
  std::mutex mutex;
  ParallelForShared(pool, n, threads, [&](int64_t begin, int64_t end) {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_LT(begin, end);
    for (int64_t i = begin; i < end; ++i) ++calls.runs[i];
    calls.longest_piece = std::max(calls.longest_piece, end - begin);
    calls.threads_seen.insert(std::this_thread::get_id());
  });
  return calls;
}

TEST(SharedWorkTest, RunsEveryIndexOnceInPiecesOfTheStatedSize) {
  ThreadPool pool(4);
  for (int threads : {1, 2, 3, 4}) {
    for (int64_t n : {1, 2, 7, 16, 63, 64, 65, 1000}) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " threads=" << threads);
      const Calls calls = RunShared(pool, n, threads);
      EXPECT_EQ(std::count(calls.runs.begin(), calls.runs.end(), 1), n);
      const int64_t pieces =
          threads == 1 ? 1 : std::min<int64_t>(n, threads * kPiecesPerThread);
      EXPECT_LE(calls.longest_piece, (n + pieces - 1) / pieces);
      EXPECT_LE(calls.threads_seen.size(), static_cast<size_t>(threads));
    }
  }
}

TEST(SharedWorkTest, ThreadsForWorkGivesEachThreadItsShare) {
  EXPECT_EQ(ThreadsForWork(0, 2), 1);
  EXPECT_EQ(ThreadsForWork(kMinBytesPerThread - 1, 2), 1);
  EXPECT_EQ(ThreadsForWork(2 * kMinBytesPerThread - 1, 4), 1);
  EXPECT_EQ(ThreadsForWork(2 * kMinBytesPerThread, 4), 2);
  EXPECT_EQ(ThreadsForWork(100 * kMinBytesPerThread, 4), 4);
  EXPECT_EQ(ThreadsForWork(100 * kMinBytesPerThread, 0), 1);
}

TEST(SharedWorkTest, NothingToDoCallsNothing) {
  ThreadPool pool(2);
  int calls = 0;
  ParallelForShared(pool, 0, 2, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(SharedWorkTest, OneThreadRunsTheWholeRangeOnTheCaller) {
  ThreadPool pool(2);
  const Calls calls = RunShared(pool, 100, 1);
  EXPECT_EQ(calls.longest_piece, 100);
  EXPECT_EQ(calls.threads_seen,
            std::set<std::thread::id>{std::this_thread::get_id()});
}

}  // namespace
}  // namespace nibble::cpu
