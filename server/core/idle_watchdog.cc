#include "server/core/idle_watchdog.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace nibble::server {

IdleWatchdog::Watch::Watch(Watch&& other) noexcept
    : watchdog_(std::exchange(other.watchdog_, nullptr)), id_(other.id_) {}

IdleWatchdog::Watch::~Watch() {
  if (watchdog_ == nullptr) return;
  absl::MutexLock lock(&watchdog_->mu_);
  watchdog_->entries_.erase(id_);
}

void IdleWatchdog::Watch::Touch() {
  absl::MutexLock lock(&watchdog_->mu_);
  watchdog_->entries_.at(id_).last_progress = absl::Now();
}

bool IdleWatchdog::Watch::expired() const {
  absl::MutexLock lock(&watchdog_->mu_);
  return watchdog_->entries_.at(id_).expired;
}

IdleWatchdog::IdleWatchdog(absl::Duration idle_limit)
    : idle_limit_(idle_limit), thread_([this] { CancelIdleWork(); }) {}

IdleWatchdog::~IdleWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

IdleWatchdog::Watch IdleWatchdog::Start(std::function<void()> cancel) {
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  entries_.emplace(
      id, Entry{.last_progress = absl::Now(), .cancel = std::move(cancel)});
  return Watch(this, id);
}

void IdleWatchdog::CancelIdleWork() {
  // Work is cancelled at most a quarter of the limit late.
  const absl::Duration tick =
      std::clamp(idle_limit_ / 4, absl::Milliseconds(10), absl::Seconds(1));
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), tick)) {
    const absl::Time now = absl::Now();
    for (auto& [id, entry] : entries_) {
      if (!entry.expired && now - entry.last_progress > idle_limit_) {
        entry.expired = true;
        entry.cancel();
      }
    }
  }
}

}  // namespace nibble::server
