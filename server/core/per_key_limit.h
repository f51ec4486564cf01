// Caps how many pieces of work may run at once per key, such as uploads per
// client connection (nibbled --max_uploads_per_connection), so that one
// connection cannot take every thread and the whole budget with stalled
// uploads.
//
// Example:
//   nibble::server::PerKeyLimit uploads(/*max_per_key=*/4);
//   std::optional<nibble::server::PerKeyLimit::Slot> slot =
//       uploads.TryAcquire(context->peer());
//   if (!slot.has_value()) return absl::ResourceExhaustedError("...");
//   ... the work, while `slot` lives ...
#ifndef NIBBLE_SERVER_CORE_PER_KEY_LIMIT_H_
#define NIBBLE_SERVER_CORE_PER_KEY_LIMIT_H_

#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

namespace nibble::server {

class PerKeyLimit {
 public:
  // One piece of work counted against its key until the Slot is destroyed.
  class Slot {
   public:
    Slot(Slot&& other) noexcept;
    Slot& operator=(Slot&&) = delete;
    ~Slot();

   private:
    friend class PerKeyLimit;
    Slot(PerKeyLimit* limit, std::string key)
        : limit_(limit), key_(std::move(key)) {}

    PerKeyLimit* limit_;
    std::string key_;
  };

  // 0 for no limit.
  explicit PerKeyLimit(int max_per_key) : max_per_key_(max_per_key) {}

  int max_per_key() const { return max_per_key_; }

  // A slot for `key`, or nullopt when max_per_key slots of it are held.
  // Slots must not outlive the limit.
  std::optional<Slot> TryAcquire(std::string key);

 private:
  const int max_per_key_;
  absl::Mutex mu_;
  // Keys with at least one slot held, so the map holds no idle keys.
  absl::flat_hash_map<std::string, int> held_ ABSL_GUARDED_BY(mu_);
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_PER_KEY_LIMIT_H_
