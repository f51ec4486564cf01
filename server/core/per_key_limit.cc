#include "server/core/per_key_limit.h"

#include <utility>

namespace nibble::server {

PerKeyLimit::Slot::Slot(Slot&& other) noexcept
    : limit_(std::exchange(other.limit_, nullptr)),
      key_(std::move(other.key_)) {}

PerKeyLimit::Slot::~Slot() {
  if (limit_ == nullptr) return;
  absl::MutexLock lock(&limit_->mu_);
  const auto held = limit_->held_.find(key_);
  if (--held->second == 0) limit_->held_.erase(held);
}

std::optional<PerKeyLimit::Slot> PerKeyLimit::TryAcquire(std::string key) {
  absl::MutexLock lock(&mu_);
  int& held = held_[key];
  if (max_per_key_ > 0 && held >= max_per_key_) return std::nullopt;
  ++held;
  return Slot(this, std::move(key));
}

}  // namespace nibble::server
