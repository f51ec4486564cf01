// Tests how nibbled finds the memory it may use: parsing cgroup limit files,
// and picking the smallest of physical memory and the cgroup v2 and v1 limits.
#include "server/operations/memory_limit.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

TEST(ParseCgroupMemoryLimitTest, ReadsByteCountsAndMax) {
  EXPECT_EQ(*ParseCgroupMemoryLimit("536870912\n"), 536870912);
  EXPECT_EQ(*ParseCgroupMemoryLimit("4096"), 4096);
  EXPECT_EQ(*ParseCgroupMemoryLimit("max\n"), std::nullopt);
  EXPECT_EQ(*ParseCgroupMemoryLimit("max"), std::nullopt);
  // cgroup v1's "no limit": LONG_MAX rounded down to a page.
  EXPECT_EQ(*ParseCgroupMemoryLimit("9223372036854771712\n"),
            int64_t{9223372036854771712});
}

TEST(ParseCgroupMemoryLimitTest, RefusesAnythingElse) {
  for (const char* contents :
       {"", "\n", "0\n", "-1\n", "+5\n", " 5\n", "5 \n", "5\n\n", "12k\n",
        "maximum\n", "99999999999999999999\n"}) {
    absl::StatusOr<std::optional<int64_t>> parsed =
        ParseCgroupMemoryLimit(contents);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << '"' << contents << '"';
  }
  EXPECT_THAT(ParseCgroupMemoryLimit("12k\n").status().message(),
              HasSubstr("\"12k\\n\" is neither a positive byte count"));
}

class AvailableMemoryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = absl::StrCat(
        ::testing::TempDir(), "/memory_limit_test-", getpid(), "-",
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_ + "/memory");
  }
  void TearDown() override { std::filesystem::remove_all(root_); }

  void Write(const std::string& file, const std::string& contents) {
    std::ofstream(root_ + file) << contents;
  }

  std::string root_;
};

TEST_F(AvailableMemoryTest, PhysicalMemoryWithoutCgroupFiles) {
  MemoryLimit limit = AvailableMemory(8 << 20, root_);
  EXPECT_EQ(limit.bytes, 8 << 20);
  EXPECT_EQ(limit.source, "physical memory");
}

TEST_F(AvailableMemoryTest, CgroupV2LimitBelowPhysicalMemoryWins) {
  Write("/memory.max", "4194304\n");
  MemoryLimit limit = AvailableMemory(8 << 20, root_);
  EXPECT_EQ(limit.bytes, 4 << 20);
  EXPECT_EQ(limit.source, "cgroup limit " + root_ + "/memory.max");
}

TEST_F(AvailableMemoryTest, NoLimitOrALargerOneKeepsPhysicalMemory) {
  Write("/memory.max", "max\n");
  Write("/memory/memory.limit_in_bytes", "9223372036854771712\n");
  MemoryLimit limit = AvailableMemory(8 << 20, root_);
  EXPECT_EQ(limit.bytes, 8 << 20);
  EXPECT_EQ(limit.source, "physical memory");
}

TEST_F(AvailableMemoryTest, SmallestOfCgroupV1AndV2Wins) {
  Write("/memory.max", "6291456\n");
  Write("/memory/memory.limit_in_bytes", "2097152\n");
  MemoryLimit limit = AvailableMemory(8 << 20, root_);
  EXPECT_EQ(limit.bytes, 2 << 20);
  EXPECT_EQ(limit.source,
            "cgroup limit " + root_ + "/memory/memory.limit_in_bytes");
}

TEST_F(AvailableMemoryTest, MalformedFileIsIgnored) {
  Write("/memory.max", "garbage\n");
  EXPECT_EQ(AvailableMemory(8 << 20, root_).bytes, 8 << 20);
}

TEST(PhysicalMemoryBytesTest, IsPositive) {
  EXPECT_GT(PhysicalMemoryBytes(), 0);
}

}  // namespace
}  // namespace nibble::server
