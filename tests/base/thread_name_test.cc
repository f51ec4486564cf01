// Tests NameCurrentThread: the name reads back, cut to what Linux keeps.
#include "base/thread_name.h"

#include <string>
#include <thread>

#include "gtest/gtest.h"

namespace nibble {
namespace {

std::string NameInNewThread(const std::string& name) {
  std::string seen;
  std::thread([&] {
    NameCurrentThread(name);
    seen = CurrentThreadName();
  }).join();
  return seen;
}

TEST(ThreadNameTest, ReadsBack) {
  EXPECT_EQ(NameInNewThread("nibble-batch"), "nibble-batch");
}

TEST(ThreadNameTest, LongNamesAreCutToWhatLinuxKeeps) {
  EXPECT_EQ(NameInNewThread("nibble-a-very-long-thread-name"),
            std::string("nibble-a-very-long-thread-name")
                .substr(0, kMaxThreadNameLength));
}

}  // namespace
}  // namespace nibble
