// Restarts a real nibbled on one --data_dir: acknowledged uploads, in either
// code layout, come back with identical results, deletes stay deleted, corrupt
// files are skipped with a message, and an unusable directory fails at start or
// at upload.
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "client/nibble_client.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/storage/weight_file.h"
#include "tests/format/column_layout.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"
#include "tests/integration/weight_client.h"

namespace nibble {
namespace {

using ::nibble::testing::FreshDirectory;
using ::nibble::testing::ReadFile;
using ::nibble::testing::StartNibbledLoggingTo;
using ::nibble::testing::WeightClient;
using ::nibble::testing::WriteFile;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(PersistenceTest, RestartKeepsUploadsAndDeletes) {
  const std::string dir = FreshDirectory("restart");
  const std::string log = dir + ".stderr";
  const std::vector<std::pair<std::string, WeightSpec>> weights = {
      {"fp4", {WeightFormat::kFp4, 128, 40, 32}},
      {"u4", {WeightFormat::kU4, 256, 24, 64}},
      {"u4b8", {WeightFormat::kU4b8, 128, 16, 128}}};
  std::vector<std::string> listed;
  std::vector<std::string> results;
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_THAT((*server)->startup_line(),
                HasSubstr(", 0 weights loaded from " + dir));
    WeightClient client((*server)->target());
    uint64_t seed = 21;
    for (const auto& [name, spec] : weights) {
      SCOPED_TRACE(absl::StrCat(name, " seed=", seed));
      ASSERT_TRUE(
          client.Upload(name, RandomQuantizedWeight(spec, seed++)).ok());
      results.push_back(client.Matmul(name, spec.k));
      ASSERT_THAT(results.back(), Not(HasSubstr("error")));
    }
    listed = client.List();
    ASSERT_EQ(listed.size(), 3u);
    EXPECT_EQ((*server)->Stop(), 0);
  }
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_THAT((*server)->startup_line(),
                HasSubstr(", 3 weights loaded from " + dir));
    WeightClient client((*server)->target());
    EXPECT_EQ(client.List(), listed);
    for (size_t i = 0; i < weights.size(); ++i) {
      EXPECT_EQ(client.Matmul(weights[i].first, weights[i].second.k),
                results[i])
          << weights[i].first << " gives other bytes after the restart";
    }
    ASSERT_TRUE(client.Delete("u4").ok());
    EXPECT_EQ((*server)->Stop(), 0);
  }
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_THAT((*server)->startup_line(),
                HasSubstr(", 2 weights loaded from " + dir));
    WeightClient client((*server)->target());
    EXPECT_EQ(client.List(), (std::vector<std::string>{listed[0], listed[2]}));
    EXPECT_THAT(client.Matmul("u4", 256), HasSubstr("no weight named"));
  }
  EXPECT_THAT(ReadFile(log), Not(HasSubstr("skipped")));
}

// An upload in the column layout is packed as it arrives and its file
// written from the panels at the end: the file holds the same weight as the
// canonical upload's.
TEST(PersistenceTest, RestartKeepsAColumnLayoutUpload) {
  const std::string dir = FreshDirectory("restart_columns");
  const std::string log = dir + ".stderr";
  // N = 40: the last panel is short.
  const WeightSpec spec{WeightFormat::kMxfp4, 256, 40, 32};
  SCOPED_TRACE("seed 41");
  const QuantizedWeight weight = RandomQuantizedWeight(spec, 41);
  const testing::ColumnLayout columns = testing::ToColumns(weight);
  std::string result;
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    NibbleClient uploader(CreateChannel((*server)->target()));
    absl::StatusOr<v1::WeightInfo> uploaded =
        uploader.UploadBytes(columns.View(spec).bytes(), "columns");
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    WeightClient client((*server)->target());
    ASSERT_TRUE(client.Upload("canonical", weight).ok());
    result = client.Matmul("columns", spec.k);
    ASSERT_THAT(result, Not(HasSubstr("error")));
    EXPECT_EQ(client.Matmul("canonical", spec.k), result);
    EXPECT_EQ((*server)->Stop(), 0);
  }
  const auto tensors = [&](const std::string& name) {
    return ReadFile(dir + "/" + name + ".nibble")
        .substr(server::kWeightFileHeaderBytes + name.size(),
                spec.canonical_bytes());
  };
  EXPECT_TRUE(tensors("columns") == tensors("canonical"));
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(),
              HasSubstr(", 2 weights loaded from " + dir));
  EXPECT_EQ(WeightClient((*server)->target()).Matmul("columns", spec.k),
            result);
}

TEST(PersistenceTest, CorruptFileIsSkippedWithAMessage) {
  const std::string dir = FreshDirectory("corrupt");
  const std::string log = dir + ".stderr";
  const WeightSpec spec{WeightFormat::kU4b8, 64, 16, 32};
  std::string good_result;
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    WeightClient client((*server)->target());
    SCOPED_TRACE("seeds 31, 32");
    ASSERT_TRUE(client.Upload("good", RandomQuantizedWeight(spec, 31)).ok());
    ASSERT_TRUE(client.Upload("bad", RandomQuantizedWeight(spec, 32)).ok());
    good_result = client.Matmul("good", spec.k);
    EXPECT_EQ((*server)->Stop(), 0);
  }
  std::string bad = ReadFile(dir + "/bad.nibble");
  ASSERT_FALSE(bad.empty());
  bad[bad.size() - 20] ^= 0x40;
  WriteFile(dir + "/bad.nibble", bad);
  WriteFile(dir + "/good.nibble.tmp-1-0", "torn");

  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(),
              HasSubstr(", 1 weights loaded from " + dir));
  const std::string messages = ReadFile(log);
  EXPECT_THAT(messages, HasSubstr("nibbled: skipped " + dir +
                                  "/bad.nibble, not serving it: checksum"));
  EXPECT_THAT(messages, HasSubstr("removed " + dir + "/good.nibble.tmp-1-0"));
  WeightClient client((*server)->target());
  ASSERT_EQ(client.List().size(), 1u);
  EXPECT_EQ(client.Matmul("good", spec.k), good_result);
  EXPECT_THAT(client.Matmul("bad", spec.k), HasSubstr("no weight named"));
  EXPECT_FALSE(std::filesystem::exists(dir + "/good.nibble.tmp-1-0"));
  // The corrupt file stays for the operator; a new upload replaces it.
  ASSERT_TRUE(client.Upload("bad", RandomQuantizedWeight(spec, 33)).ok());
  EXPECT_NE(ReadFile(dir + "/bad.nibble"), bad);
}

TEST(PersistenceTest, ConcurrentUploadsOfOneNameKeepTheAcknowledgedOne) {
  const std::string dir = FreshDirectory("race");
  const std::string log = dir + ".stderr";
  const WeightSpec spec{WeightFormat::kU4, 128, 32, 32};
  constexpr int kRounds = 4;
  std::vector<std::string> winners;  // C from the weight that was stored
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    for (int round = 0; round < kRounds; ++round) {
      const std::string name = absl::StrCat("w", round);
      SCOPED_TRACE(
          absl::StrCat(name, " seeds ", 2 * round + 50, ", ", 2 * round + 51));
      const QuantizedWeight candidates[2] = {
          RandomQuantizedWeight(spec, 2 * round + 50),
          RandomQuantizedWeight(spec, 2 * round + 51)};
      grpc::Status statuses[2];
      std::vector<std::thread> uploads;
      for (int i = 0; i < 2; ++i) {
        uploads.emplace_back([&, i] {
          statuses[i] =
              WeightClient((*server)->target()).Upload(name, candidates[i]);
        });
      }
      for (std::thread& upload : uploads) upload.join();
      ASSERT_NE(statuses[0].ok(), statuses[1].ok())
          << statuses[0].error_message() << " / "
          << statuses[1].error_message();
      const int loser = statuses[0].ok() ? 1 : 0;
      EXPECT_EQ(statuses[loser].error_code(), grpc::StatusCode::ALREADY_EXISTS);
      winners.push_back(WeightClient((*server)->target()).Matmul(name, spec.k));
    }
    EXPECT_EQ((*server)->Stop(), 0);
  }
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
  ASSERT_TRUE(server.ok()) << server.status();
  WeightClient client((*server)->target());
  for (int round = 0; round < kRounds; ++round) {
    EXPECT_EQ(client.Matmul(absl::StrCat("w", round), spec.k), winners[round])
        << "round " << round;
  }
}

TEST(PersistenceTest, UnusableDataDirIsAUsageError) {
  const std::string dir = FreshDirectory("unusable");
  std::filesystem::create_directories(dir);
  WriteFile(dir + "/file", "x");
  std::string output;
  EXPECT_EQ(testing::RunCommand(
                absl::StrCat(NIBBLED_PATH, " --listen=127.0.0.1:0 --data_dir=",
                             dir, "/file/sub"),
                &output),
            2);
  EXPECT_THAT(output,
              HasSubstr("cannot create data directory " + dir + "/file/sub"));
}

TEST(PersistenceTest, FailedSaveFailsTheUploadAndStoresNothing) {
  const std::string dir = FreshDirectory("vanished");
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, dir + ".stderr",
                                      {"--data_dir=" + dir});
  ASSERT_TRUE(server.ok()) << server.status();
  std::filesystem::remove_all(dir);
  WeightClient client((*server)->target());
  const grpc::Status status = client.Upload(
      "w", RandomQuantizedWeight({WeightFormat::kU4b8, 32, 8, 32}, 41));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(),
              HasSubstr("weight \"w\" was not stored: cannot create " + dir +
                        "/w.nibble.tmp-"));
  EXPECT_THAT(client.List(), IsEmpty());
  EXPECT_TRUE((*server)->Running());
}

}  // namespace
}  // namespace nibble
