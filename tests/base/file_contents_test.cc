// Tests reading whole files and ranges of them: their bytes, and an error per
// kind of failure.
#include "base/file_contents.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
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

// A range is read without the rest: of a 1 GiB sparse file, its first
// bytes; past the end, DATA_LOSS.
TEST(ReadOnlyFileTest, ReadsARangeWithoutTheRest) {
  const std::string path = ::testing::TempDir() + "/file_contents_range";
  std::ofstream(path, std::ios::binary) << "header";
  ASSERT_EQ(truncate(path.c_str(), int64_t{1} << 30), 0);
  absl::StatusOr<ReadOnlyFile> file = ReadOnlyFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->size(), int64_t{1} << 30);
  std::string read(4, '\0');
  ASSERT_TRUE(file->ReadAt(2, absl::MakeSpan(read)).ok());
  EXPECT_EQ(read, "ader");
  const absl::Status past_end =
      file->ReadAt((int64_t{1} << 30) - 2, absl::MakeSpan(read));
  EXPECT_EQ(past_end.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(past_end.message(), HasSubstr(path));
  std::remove(path.c_str());
}

TEST(ReadOnlyFileTest, RefusesWhatReadFileContentsRefuses) {
  const absl::StatusOr<ReadOnlyFile> file =
      ReadOnlyFile::Open(::testing::TempDir());
  EXPECT_EQ(file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(file.status().message(),
              HasSubstr("not a regular file but a directory"));
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
  EXPECT_THAT(read.status().message(),
              HasSubstr("not a regular file but a directory"));
}

// A FIFO is refused at once instead of waiting for a writer. Should the read
// block, the test opens the FIFO for writing to release it, and fails.
TEST(ReadFileContentsTest, FifoIsRefusedWithoutWaitingForAWriter) {
  const std::string path = ::testing::TempDir() + "/file_contents_fifo";
  std::remove(path.c_str());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  absl::Notification done;
  absl::StatusOr<std::string> read;
  std::thread reader([&] {
    read = ReadFileContents(path);
    done.Notify();
  });
  const bool returned = done.WaitForNotificationWithTimeout(absl::Seconds(30));
  if (!returned) {
    const int writer = open(path.c_str(), O_WRONLY);
    if (writer >= 0) close(writer);
  }
  reader.join();
  EXPECT_TRUE(returned) << "ReadFileContents waited on a FIFO";
  EXPECT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(read.status().message(),
              HasSubstr("not a regular file but a FIFO"));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace nibble
