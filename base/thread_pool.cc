#include "base/thread_pool.h"

#include <algorithm>
#include <string>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include "base/thread_name.h"

namespace nibble {

ThreadPool::ThreadPool(int threads, absl::string_view name) {
  if (threads <= 0) {
    threads = std::max(1u, std::thread::hardware_concurrency());
  }
  workers_.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) {
    workers_.emplace_back([this, name = std::string(name)] {
      NameCurrentThread(name);
      WorkerLoop();
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  work_available_.notify_all();
  for (std::thread& worker : workers_) worker.join();
}

void ThreadPool::SpinWhileIdle() const {
  const auto give_up = std::chrono::steady_clock::now() + kSpinBeforeSleep;
  while (queued_.load(std::memory_order_relaxed) == 0) {
    if (stopping_.load(std::memory_order_relaxed) ||
        std::chrono::steady_clock::now() >= give_up) {
      return;
    }
#if defined(__x86_64__) || defined(__i386__)
    _mm_pause();
#endif
  }
}

void ThreadPool::WorkerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    if (queue_.empty() && !stopping_) {
      lock.unlock();
      SpinWhileIdle();
      lock.lock();
    }
    work_available_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and nothing left to run
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    queued_.fetch_sub(1, std::memory_order_relaxed);
    lock.unlock();
    task();
    lock.lock();
  }
}

void ThreadPool::ParallelFor(int64_t n,
                             absl::FunctionRef<void(int64_t, int64_t)> fn,
                             int max_tasks) {
  if (n <= 0) return;
  if (max_tasks <= 0) max_tasks = threads();
  const int64_t tasks = std::min<int64_t>(n, max_tasks);
  if (tasks == 1) {
    fn(0, n);
    return;
  }
  int64_t remaining = tasks - 1;  // queued pieces not yet finished
  const auto piece = [n, tasks](int64_t i) { return n * i / tasks; };
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int64_t i = 1; i < tasks; ++i) {
      queue_.emplace_back(
          [this, &fn, &remaining, begin = piece(i), end = piece(i + 1)] {
            fn(begin, end);
            std::lock_guard<std::mutex> done_lock(mutex_);
            if (--remaining == 0) work_done_.notify_all();
          });
    }
    queued_.fetch_add(tasks - 1, std::memory_order_relaxed);
  }
  work_available_.notify_all();
  fn(piece(0), piece(1));

  // Help with queued work (ours or another caller's) until ours is done.
  std::unique_lock<std::mutex> lock(mutex_);
  while (remaining > 0) {
    if (!queue_.empty()) {
      std::function<void()> task = std::move(queue_.front());
      queue_.pop_front();
      queued_.fetch_sub(1, std::memory_order_relaxed);
      lock.unlock();
      task();
      lock.lock();
    } else {
      work_done_.wait(lock);
    }
  }
}

}  // namespace nibble
