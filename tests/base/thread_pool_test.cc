// Tests ThreadPool::ParallelFor: coverage, splitting, concurrency; the
// workers' name.
#include "base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/thread_name.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

// How often ParallelFor visited each index of [0, n), and the ranges it gave.
struct Coverage {
  std::vector<int> visits;
  std::vector<std::pair<int64_t, int64_t>> ranges;
};

Coverage RunParallelFor(ThreadPool& pool, int64_t n, int max_tasks) {
  std::vector<std::atomic<int>> visits(n);
  std::mutex mutex;
  Coverage coverage;
  pool.ParallelFor(
      n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) visits[i].fetch_add(1);
        std::lock_guard<std::mutex> lock(mutex);
        coverage.ranges.emplace_back(begin, end);
      },
      max_tasks);
  for (const std::atomic<int>& count : visits) {
    coverage.visits.push_back(count.load());
  }
  return coverage;
}

TEST(ThreadPoolTest, CountsTheCallerAmongItsThreads) {
  EXPECT_EQ(ThreadPool(1).threads(), 1);
  EXPECT_EQ(ThreadPool(4).threads(), 4);
  EXPECT_EQ(
      ThreadPool(0).threads(),
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
}

TEST(ThreadPoolTest, CoversEveryIndexExactlyOnceInNearlyEqualPieces) {
  for (int threads : {1, 2, 4}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 7, 16, 100, 1001}) {
      for (int max_tasks : {0, 1, 2, 3, 8, 64}) {
        SCOPED_TRACE(absl::StrCat("threads=", threads, " n=", n,
                                  " max_tasks=", max_tasks));
        const Coverage coverage = RunParallelFor(pool, n, max_tasks);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(coverage.visits[i], 1) << "index " << i;
        }
        const int64_t task_limit = max_tasks > 0 ? max_tasks : threads;
        EXPECT_EQ(static_cast<int64_t>(coverage.ranges.size()),
                  std::min(n, task_limit));
        int64_t smallest = n;
        int64_t largest = 0;
        for (const auto& [begin, end] : coverage.ranges) {
          smallest = std::min(smallest, end - begin);
          largest = std::max(largest, end - begin);
        }
        if (n > 0) {
          EXPECT_LE(largest - smallest, 1);
        }
      }
    }
  }
}

TEST(ThreadPoolTest, SingleThreadPoolRunsEverythingOnTheCaller) {
  ThreadPool pool(1);
  const std::thread::id caller = std::this_thread::get_id();
  for (int max_tasks : {0, 4}) {
    SCOPED_TRACE(absl::StrCat("max_tasks=", max_tasks));
    std::vector<std::thread::id> runners;
    std::vector<std::pair<int64_t, int64_t>> ranges;
    pool.ParallelFor(
        10,
        [&](int64_t begin, int64_t end) {
          runners.push_back(std::this_thread::get_id());
          ranges.emplace_back(begin, end);
        },
        max_tasks);
    for (const std::thread::id& runner : runners) EXPECT_EQ(runner, caller);
    if (max_tasks == 0) {
      ASSERT_EQ(ranges.size(), 1u);
      EXPECT_EQ(ranges[0], std::make_pair(int64_t{0}, int64_t{10}));
    } else {
      EXPECT_EQ(ranges.size(), 4u);
    }
  }
}

// Whether both pieces of a 2-piece call ran at the same time, the second on
// a worker (waiting up to 10 s for it).
bool BothPiecesOverlap(ThreadPool& pool) {
  std::atomic<int> started = 0;
  std::atomic<bool> overlapped = true;
  pool.ParallelFor(2, [&](int64_t, int64_t) {
    started.fetch_add(1);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2) {
      if (std::chrono::steady_clock::now() > deadline) {
        overlapped = false;
        return;
      }
      std::this_thread::yield();
    }
  });
  return overlapped;
}

TEST(ThreadPoolTest, WorkersTakeCallsWhileSpinningAndAfterSleeping) {
  ThreadPool pool(2);
  for (const std::chrono::microseconds idle :
       {std::chrono::microseconds(0), ThreadPool::kSpinBeforeSleep / 2,
        3 * ThreadPool::kSpinBeforeSleep}) {
    for (int call = 0; call < 20; ++call) {
      std::this_thread::sleep_for(idle);
      ASSERT_TRUE(BothPiecesOverlap(pool))
          << "call " << call << " after " << idle.count() << " us idle";
    }
  }
}

TEST(ThreadPoolTest, StopsWhileItsWorkersSpin) {
  for (int pool_index = 0; pool_index < 20; ++pool_index) {
    auto pool = std::make_unique<ThreadPool>(3);
    ASSERT_TRUE(BothPiecesOverlap(*pool));
    const auto start = std::chrono::steady_clock::now();
    pool.reset();  // the workers are still spinning
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5))
        << "pool " << pool_index;
  }
}

TEST(ThreadPoolTest, RunsPiecesInParallel) {
  ThreadPool pool(2);
  EXPECT_TRUE(BothPiecesOverlap(pool))
      << "the second piece never started while the first was running";
}

TEST(ThreadPoolTest, WorkersCarryThePoolsName) {
  ThreadPool pool(2, "test-workers");
  std::mutex mutex;
  std::vector<std::string> names;
  std::atomic<int> started = 0;
  // Both pieces wait for each other, so one of them runs on the worker.
  pool.ParallelFor(2, [&](int64_t, int64_t) {
    started.fetch_add(1);
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (started.load() < 2 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::yield();
    }
    std::lock_guard<std::mutex> lock(mutex);
    names.push_back(CurrentThreadName());
  });
  EXPECT_THAT(names, ::testing::Contains("test-workers"));
}

TEST(ThreadPoolTest, ConcurrentCallersOnOnePoolAllComplete) {
  constexpr int kCallers = 4;
  constexpr int kCallsPerCaller = 200;
  ThreadPool pool(3);
  std::vector<int> wrong_results(kCallers, 0);
  std::vector<std::thread> callers;
  for (int caller = 0; caller < kCallers; ++caller) {
    callers.emplace_back([&pool, &wrong_results, caller] {
      for (int call = 0; call < kCallsPerCaller; ++call) {
        const int64_t n = 1 + (call * 37 + caller * 11) % 300;
        const Coverage coverage = RunParallelFor(pool, n, 1 + call % 5);
        if (std::count(coverage.visits.begin(), coverage.visits.end(), 1) !=
            n) {
          ++wrong_results[caller];
        }
      }
    });
  }
  for (std::thread& thread : callers) thread.join();
  for (int caller = 0; caller < kCallers; ++caller) {
    EXPECT_EQ(wrong_results[caller], 0) << "caller " << caller;
  }
}

}  // namespace
}  // namespace nibble
