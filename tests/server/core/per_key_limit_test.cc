// Tests the per-key limit: slots are counted per key, given back when
// destroyed or moved from, and unlimited with a limit of 0.
#include "server/core/per_key_limit.h"

#include <optional>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace nibble::server {
namespace {

TEST(PerKeyLimitTest, CountsSlotsPerKeyUntilTheyAreDestroyed) {
  PerKeyLimit limit(2);
  std::vector<PerKeyLimit::Slot> held;
  for (int i = 0; i < 2; ++i) {
    std::optional<PerKeyLimit::Slot> slot = limit.TryAcquire("a");
    ASSERT_TRUE(slot.has_value()) << i;
    held.push_back(*std::move(slot));
  }
  EXPECT_FALSE(limit.TryAcquire("a").has_value());
  // Another key has slots of its own.
  std::optional<PerKeyLimit::Slot> other = limit.TryAcquire("b");
  EXPECT_TRUE(other.has_value());
  // A moved-from slot holds nothing; the one it moved into still does.
  PerKeyLimit::Slot moved = std::move(held.back());
  held.pop_back();
  EXPECT_FALSE(limit.TryAcquire("a").has_value());
  { PerKeyLimit::Slot released = std::move(moved); }
  EXPECT_TRUE(limit.TryAcquire("a").has_value());
}

TEST(PerKeyLimitTest, ZeroIsNoLimit) {
  PerKeyLimit limit(0);
  std::vector<PerKeyLimit::Slot> held;
  for (int i = 0; i < 1000; ++i) {
    std::optional<PerKeyLimit::Slot> slot = limit.TryAcquire("a");
    ASSERT_TRUE(slot.has_value()) << i;
    held.push_back(*std::move(slot));
  }
}

}  // namespace
}  // namespace nibble::server
