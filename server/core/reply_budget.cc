#include "server/core/reply_budget.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace nibble::server {

ReplyBudget::Held::~Held() { budget_->Release(connection_, bytes_); }

int64_t ReplyBudget::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

absl::StatusOr<ReplyBudget::Hold> ReplyBudget::TryHold(std::string connection,
                                                       int64_t bytes) {
  absl::MutexLock lock(&mu_);
  int64_t& held_by_connection = held_by_connection_[connection];
  const int64_t free_after = max_bytes_ - held_bytes_ - bytes;
  if (max_bytes_ > 0 && held_by_connection + bytes >
                            std::min(max_bytes_per_connection(), free_after)) {
    const int64_t held_here = held_by_connection;
    if (held_here == 0) held_by_connection_.erase(connection);
    return absl::ResourceExhaustedError(absl::StrCat(
        "nibbled holds ", held_bytes_, " bytes of replies not yet sent (",
        held_here, " for this connection, which may hold ",
        max_bytes_per_connection(),
        " and never more than the budget keeps free for the others); a "
        "reply of ",
        bytes, " more would pass --max_held_reply_bytes=", max_bytes_,
        ". Read your replies as they come, or send fewer or smaller requests "
        "at once"));
  }
  held_by_connection += bytes;
  held_bytes_ += bytes;
  return Hold(new Held(this, std::move(connection), bytes));
}

void ReplyBudget::Release(const std::string& connection, int64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_bytes_ -= bytes;
  const auto held = held_by_connection_.find(connection);
  held->second -= bytes;
  if (held->second == 0) held_by_connection_.erase(held);
}

}  // namespace nibble::server
