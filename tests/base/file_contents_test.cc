// Tests reading whole files: their bytes, and an error per kind of failure.
#include "base/file_contents.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

using ::testing::HasSubstr;

TEST(ReadFileContentsTest, ReturnsEveryByte) {
  constexpr uint32_t kSeed = 7;
  std::mt19937 random(kSeed);
  std::string bytes(100'003, '\0');
  for (char& byte : bytes) byte = static_cast<char>(random());
  const std::string path = ::testing::TempDir() + "/file_contents_bytes";
  std::ofstream(path, std::ios::binary) << bytes;
  const absl::StatusOr<std::string> read = ReadFileContents(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == bytes) << "seed " << kSeed;
  std::remove(path.c_str());
}

TEST(ReadFileContentsTest, EmptyFileIsEmpty) {
  const std::string path = ::testing::TempDir() + "/file_contents_empty";
  std::ofstream{path};
  const absl::StatusOr<std::string> read = ReadFileContents(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, "");
  std::remove(path.c_str());
}

TEST(ReadFileContentsTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = ::testing::TempDir() + "/no/such/file";
  const absl::StatusOr<std::string> read = ReadFileContents(path);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(read.status().message(), HasSubstr(path));
  EXPECT_THAT(read.status().message(), HasSubstr("No such file"));
}

TEST(ReadFileContentsTest, DirectoryIsNotARegularFile) {
  const absl::StatusOr<std::string> read =
      ReadFileContents(::testing::TempDir());
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace nibble
