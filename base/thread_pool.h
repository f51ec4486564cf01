// A persistent pool of worker threads for the kernels. Several callers may run
// ParallelFor at once (one per concurrent request); a waiting caller runs
// queued work itself, so no call waits on threads that are idle elsewhere.
// A worker that runs out of work stays awake for kSpinBeforeSleep before it
// sleeps, so that back-to-back calls do not pay a wake-up each (15-25 us on
// a VM, against a few hundred us for a small matmul).
//
// Example:
//   nibble::ThreadPool pool(/*threads=*/4);
//   pool.ParallelFor(panels, [&](int64_t begin, int64_t end) { ... });
#ifndef NIBBLE_BASE_THREAD_POOL_H_
#define NIBBLE_BASE_THREAD_POOL_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/strings/string_view.h"

namespace nibble {

class ThreadPool {
 public:
  // How long an idle worker polls for work before it blocks: several times
  // the wake-up it saves, short enough that an idle server's workers soon
  // leave the cores to other processes.
  static constexpr std::chrono::microseconds kSpinBeforeSleep{100};

  // `threads` counts the caller: ThreadPool(1) starts no worker. 0 means one
  // per hardware thread. The workers are named `name` (base/thread_name.h).
  explicit ThreadPool(int threads = 0, absl::string_view name = "nibble-pool");
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(begin, end) on disjoint ranges covering [0, n), split into at
  // most `max_tasks` (default: threads()) nearly equal pieces, and returns
  // when all have run.
  void ParallelFor(int64_t n, absl::FunctionRef<void(int64_t, int64_t)> fn,
                   int max_tasks = 0);

 private:
  void WorkerLoop();
  // Returns when work is queued, the pool stops, or kSpinBeforeSleep passed.
  void SpinWhileIdle() const;

  std::mutex mutex_;
  std::condition_variable work_available_;
  std::condition_variable work_done_;
  std::deque<std::function<void()>> queue_;
  // queue_.size() (written under mutex_), for workers polling without it.
  std::atomic<int64_t> queued_{0};
  std::atomic<bool> stopping_{false};
  std::vector<std::thread> workers_;
};

}  // namespace nibble

#endif  // NIBBLE_BASE_THREAD_POOL_H_
