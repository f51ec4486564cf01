// Tests the idle watchdog: quiet work is cancelled once, work that keeps
// making progress and work no longer watched are not.
#include "server/core/idle_watchdog.h"

#include <atomic>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

TEST(IdleWatchdogTest, CancelsIdleWorkOnce) {
  IdleWatchdog watchdog(absl::Milliseconds(20));
  std::atomic<int> cancels = 0;
  absl::Notification cancelled;
  IdleWatchdog::Watch watch = watchdog.Start([&] {
    ++cancels;
    cancelled.Notify();
  });
  EXPECT_FALSE(watch.expired());
  ASSERT_TRUE(cancelled.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_TRUE(watch.expired());
  // Further ticks leave expired work alone.
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(cancels.load(), 1);
}

// Bounds that hold on a busy machine: touches 1 ms apart against a limit of
// 10 s.
TEST(IdleWatchdogTest, WorkThatMakesProgressIsNotCancelled) {
  IdleWatchdog watchdog(absl::Seconds(10));
  std::atomic<bool> cancelled = false;
  IdleWatchdog::Watch watch = watchdog.Start([&] { cancelled = true; });
  for (int i = 0; i < 200; ++i) {
    watch.Touch();
    absl::SleepFor(absl::Milliseconds(1));
  }
  EXPECT_FALSE(watch.expired());
  EXPECT_FALSE(cancelled.load());
}

// Whether the work was cancelled while watched depends on timing; after its
// Watch is gone it never is.
TEST(IdleWatchdogTest, WorkNoLongerWatchedIsNeverCancelled) {
  IdleWatchdog watchdog(absl::Milliseconds(10));
  std::atomic<bool> unwatched = false;
  std::atomic<bool> cancelled_unwatched = false;
  {
    IdleWatchdog::Watch watch = watchdog.Start(
        [&] { cancelled_unwatched = cancelled_unwatched || unwatched; });
  }
  unwatched = true;
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_FALSE(cancelled_unwatched.load());
}

}  // namespace
}  // namespace nibble::server
