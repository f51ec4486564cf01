// Cancels work that has gone quiet for too long, such as an upload whose
// client sent a header and then nothing (nibbled --upload_idle_seconds), so
// that it cannot hold its thread and its reserved budget for as long as the
// connection lives. Each piece of work is watched from Watch() on with the
// function that cancels it, and reports progress with Touch(); one thread
// calls the cancel function of every piece not touched within the idle limit.
//
// Example:
//   nibble::server::IdleWatchdog watchdog(absl::Seconds(20));
//   nibble::server::IdleWatchdog::Watch watch =
//       watchdog.Start([context] { context->TryCancel(); });
//   while (reader->Read(&message)) { watch.Touch(); ... }
//   if (watch.expired()) return absl::DeadlineExceededError("idle");
#ifndef NIBBLE_SERVER_CORE_IDLE_WATCHDOG_H_
#define NIBBLE_SERVER_CORE_IDLE_WATCHDOG_H_

#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace nibble::server {

class IdleWatchdog {
 public:
  // One piece of work being watched, until the Watch is destroyed.
  class Watch {
   public:
    Watch(Watch&& other) noexcept;
    Watch& operator=(Watch&&) = delete;
    ~Watch();

    // The work made progress: its idle time starts again.
    void Touch();
    // Whether the watchdog cancelled the work for being idle.
    bool expired() const;

   private:
    friend class IdleWatchdog;
    Watch(IdleWatchdog* watchdog, uint64_t id) : watchdog_(watchdog), id_(id) {}

    IdleWatchdog* watchdog_;
    uint64_t id_;
  };

  // Cancels work idle for longer than `idle_limit`, checked several times
  // within each limit.
  explicit IdleWatchdog(absl::Duration idle_limit);
  // Stops the thread; every Watch must be gone by then.
  ~IdleWatchdog();

  IdleWatchdog(const IdleWatchdog&) = delete;
  IdleWatchdog& operator=(const IdleWatchdog&) = delete;

  absl::Duration idle_limit() const { return idle_limit_; }

  // Watches work from now on; `cancel` is called at most once, under the
  // watchdog's lock, and never after the Watch is destroyed, so it must be
  // quick and must not use the Watch.
  Watch Start(std::function<void()> cancel);

 private:
  struct Entry {
    absl::Time last_progress;
    std::function<void()> cancel;
    bool expired = false;
  };

  void CancelIdleWork() ABSL_LOCKS_EXCLUDED(mu_);

  const absl::Duration idle_limit_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Last: started once everything above is.
  std::thread thread_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_IDLE_WATCHDOG_H_
