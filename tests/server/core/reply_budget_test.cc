// Tests the reply budget: bytes are counted over all connections and per
// connection against its share and what the budget keeps free, released with
// the last copy of a hold, and only counted with a budget of 0.
#include "server/core/reply_budget.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kBudget = 4000;
constexpr int64_t kShare = kBudget / ReplyBudget::kConnectionShares;

TEST(ReplyBudgetTest, OneConnectionHoldsAtMostItsShare) {
  ReplyBudget budget(kBudget);
  absl::StatusOr<ReplyBudget::Hold> first = budget.TryHold("a", kShare - 1);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<ReplyBudget::Hold> refused = budget.TryHold("a", 2);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("--max_held_reply_bytes=4000"));
  EXPECT_THAT(refused.status().message(), HasSubstr("Read your replies"));
  // Another connection has a share of its own.
  EXPECT_TRUE(budget.TryHold("b", kShare).ok());
  EXPECT_EQ(budget.held_bytes(), kShare - 1);
}

TEST(ReplyBudgetTest, AConnectionHoldsNoMoreThanTheBudgetKeepsFree) {
  ReplyBudget budget(kBudget);
  std::vector<ReplyBudget::Hold> held;
  for (const std::string connection : {"a", "b", "c"}) {
    absl::StatusOr<ReplyBudget::Hold> hold = budget.TryHold(connection, kShare);
    ASSERT_TRUE(hold.ok()) << connection << ": " << hold.status();
    held.push_back(*hold);
  }
  // kShare is free: "d" may hold half of it, leaving as much to the others.
  absl::StatusOr<ReplyBudget::Hold> refused =
      budget.TryHold("d", kShare / 2 + 1);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("never more than the budget keeps free"));
  absl::StatusOr<ReplyBudget::Hold> half = budget.TryHold("d", kShare / 2);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_EQ(budget.held_bytes(), 3 * kShare + kShare / 2);
}

TEST(ReplyBudgetTest, AFewConnectionsLeaveRoomForAnother) {
  // Each of them holds as many small replies as it is let, the way a client
  // that never reads its replies does.
  constexpr int kConnections = 6;
  constexpr int64_t kReply = 10;
  ReplyBudget budget(kBudget);
  std::vector<ReplyBudget::Hold> held;
  for (int connection = 0; connection < kConnections; ++connection) {
    while (true) {
      absl::StatusOr<ReplyBudget::Hold> hold =
          budget.TryHold(std::to_string(connection), kReply);
      if (!hold.ok()) break;
      held.push_back(*hold);
    }
  }
  EXPECT_GE(kBudget - budget.held_bytes(), kBudget >> kConnections);
  EXPECT_TRUE(budget.TryHold("bystander", kReply).ok());
}

TEST(ReplyBudgetTest, TheLastCopyOfAHoldReleasesIt) {
  ReplyBudget budget(kBudget);
  absl::StatusOr<ReplyBudget::Hold> hold = budget.TryHold("a", kShare);
  ASSERT_TRUE(hold.ok()) << hold.status();
  ReplyBudget::Hold copy = *hold;
  hold->reset();
  EXPECT_EQ(budget.held_bytes(), kShare);
  EXPECT_FALSE(budget.TryHold("a", 1).ok());
  copy.reset();
  EXPECT_EQ(budget.held_bytes(), 0);
  EXPECT_TRUE(budget.TryHold("a", kShare).ok());
}

TEST(ReplyBudgetTest, ZeroCountsWithoutLimit) {
  ReplyBudget budget(0);
  std::vector<ReplyBudget::Hold> held;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<ReplyBudget::Hold> hold = budget.TryHold("a", 1 << 30);
    ASSERT_TRUE(hold.ok()) << i << ": " << hold.status();
    held.push_back(*hold);
  }
  EXPECT_EQ(budget.held_bytes(), int64_t{100} << 30);
}

}  // namespace
}  // namespace nibble::server
