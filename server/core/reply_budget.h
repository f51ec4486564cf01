// Bounds the bytes of matmul replies nibbled holds for its clients, over all
// connections (nibbled --max_held_reply_bytes), with a share per connection.
// A reply is held from the moment its request is accepted until gRPC has
// sent it: a client that sends Matmuls and never reads, keeping its
// flow-control window closed, would otherwise make nibbled keep every C it
// computed. Past the budget, past its connection's share, or past what the
// budget would keep free for the other connections, a request is refused
// with RESOURCE_EXHAUSTED before it runs.
//
// Example:
//   nibble::server::ReplyBudget budget(/*max_bytes=*/256 << 20);
//   absl::StatusOr<nibble::server::ReplyBudget::Hold> hold =
//       budget.TryHold(context->peer(), reply_bytes);
//   if (!hold.ok()) return hold.status();
//   ... compute and send the reply; destroying the last copy of *hold
//   releases its bytes ...
#ifndef NIBBLE_SERVER_CORE_REPLY_BUDGET_H_
#define NIBBLE_SERVER_CORE_REPLY_BUDGET_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace nibble::server {

class ReplyBudget {
 public:
  // One connection may hold at most this fraction of the budget, and never
  // more than the budget keeps free after its reply, so that a few
  // connections that never read cannot take all of it from the others: k
  // such connections leave at least a 2^k-th of it free. 4: with the default
  // budget of 4 x --max_message_bytes, a connection alone can hold one reply
  // of the largest size.
  static constexpr int kConnectionShares = 4;

  // The bytes of one reply, counted until its last copy is destroyed.
  class Held {
   public:
    Held(const Held&) = delete;
    Held& operator=(const Held&) = delete;
    ~Held();

   private:
    friend class ReplyBudget;
    Held(ReplyBudget* budget, std::string connection, int64_t bytes)
        : budget_(budget), connection_(std::move(connection)), bytes_(bytes) {}

    ReplyBudget* const budget_;
    const std::string connection_;
    const int64_t bytes_;
  };
  // Shared: a reply's hold goes from the request's check through the
  // batcher to the call that sends it.
  using Hold = std::shared_ptr<const Held>;

  // `max_bytes` 0 for no limit (holds are still counted).
  explicit ReplyBudget(int64_t max_bytes) : max_bytes_(max_bytes) {}

  int64_t max_bytes() const { return max_bytes_; }
  int64_t max_bytes_per_connection() const {
    return max_bytes_ / kConnectionShares;
  }
  int64_t held_bytes() const ABSL_LOCKS_EXCLUDED(mu_);

  // Holds `bytes` for a reply to `connection` (ServerContext::peer), or
  // RESOURCE_EXHAUSTED saying what is held and what the client should do.
  // Holds must not outlive the budget.
  absl::StatusOr<Hold> TryHold(std::string connection, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Release(const std::string& connection, int64_t bytes)
      ABSL_LOCKS_EXCLUDED(mu_);

  const int64_t max_bytes_;
  mutable absl::Mutex mu_;
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  // Connections holding at least one reply, so the map keeps no idle ones.
  absl::flat_hash_map<std::string, int64_t> held_by_connection_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_REPLY_BUDGET_H_
