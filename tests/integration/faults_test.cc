// Injects faults into a real nibbled (issue 8, deliverable 3): SIGKILL in the
// middle of an upload and under Matmul load (a restart on the same
// --data_dir serves the same weights with byte-identical results and no
// trace of the unfinished upload), a full or read-only --data_dir (the upload
// fails with a clear status and leaves no file), and storms of Matmul calls
// that miss their deadlines or are cancelled (no queue rows or memory leak).
#include <signal.h>
#include <sys/mount.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"
#include "tests/integration/upload_messages.h"
#include "tests/integration/weight_client.h"

namespace nibble {
namespace {

using ::nibble::client::ToProto;
using ::nibble::testing::Bytes;
using ::nibble::testing::FileNames;
using ::nibble::testing::FreshDirectory;
using ::nibble::testing::MetricsPort;
using ::nibble::testing::NibbledProcess;
using ::nibble::testing::ReadFile;
using ::nibble::testing::ResidentBytes;
using ::nibble::testing::ScrapeSample;
using ::nibble::testing::StartNibbledLoggingTo;
using ::nibble::testing::UploadMessages;
using ::nibble::testing::WaitForSample;
using ::nibble::testing::WeightClient;
using ::nibble::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// SIGKILL, as the OOM killer or a power cut would stop nibbled: no drain and
// no cleanup. Stop() then only reaps it, and says it died of a signal.
void Kill(NibbledProcess& server) {
  ASSERT_EQ(kill(server.pid(), SIGKILL), 0) << std::strerror(errno);
  EXPECT_EQ(server.Stop(), -1);
}

// Weights by name, uploaded with random data.
using NamedSpecs = std::vector<std::pair<std::string, WeightSpec>>;

// Uploads each of `weights`, random from `first_seed` on, and appends its
// Matmul result for fixed activations to `results`.
void UploadAndRecordResults(WeightClient& client, const NamedSpecs& weights,
                            uint64_t first_seed,
                            std::vector<std::string>& results) {
  uint64_t seed = first_seed;
  for (const auto& [name, spec] : weights) {
    ASSERT_TRUE(client.Upload(name, RandomQuantizedWeight(spec, seed++)).ok());
    results.push_back(client.Matmul(name, spec.k));
    ASSERT_THAT(results.back(), Not(StartsWith("error")));
  }
}

// Every one of `weights` answers with the bytes recorded before the kill.
void ExpectSameResults(WeightClient& client, const NamedSpecs& weights,
                       const std::vector<std::string>& results) {
  for (size_t i = 0; i < weights.size(); ++i) {
    EXPECT_EQ(client.Matmul(weights[i].first, weights[i].second.k), results[i])
        << weights[i].first << " gives other bytes after the kill";
  }
}

// A 1 MiB tmpfs holds one ~530 KiB weight but not two.
constexpr char kTmpfsSize[] = "1m";
constexpr WeightSpec kHalfMiBSpec = {WeightFormat::kU4b8, 1024, 1024, 128};

class FaultTest : public ::testing::Test {
 protected:
  void TearDown() override {
    server_.reset();
    // Unmounted even when the test failed, so that a failure does not leave
    // mounts behind; lazily if nibbled somehow still holds a file there.
    for (const std::string& dir : mounts_) {
      if (umount(dir.c_str()) != 0) umount2(dir.c_str(), MNT_DETACH);
      std::filesystem::remove_all(dir);
    }
  }

  // Mounts a fresh tmpfs of `size` (as mount's size= option) at a fresh
  // directory named after `name`, and returns its path; PERMISSION_DENIED
  // where this process may not mount.
  absl::StatusOr<std::string> MountTmpfs(const std::string& name,
                                         const std::string& size) {
    const std::string dir = FreshDirectory(name);
    std::filesystem::create_directories(dir);
    if (mount("tmpfs", dir.c_str(), "tmpfs", 0, ("size=" + size).c_str()) !=
        0) {
      const int error = errno;
      const std::string message = absl::StrCat("cannot mount a tmpfs at ", dir,
                                               ": ", std::strerror(error));
      return error == EPERM ? absl::PermissionDeniedError(message)
                            : absl::InternalError(message);
    }
    mounts_.push_back(dir);
    return dir;
  }

  // Starts `server_`, a nibbled whose --data_dir is `dir_`, a fresh tmpfs of
  // kTmpfsSize named after `name`. Leaves `server_` null, with the test
  // skipped where this process may not mount, or failed otherwise.
  void StartOnTmpfs(const std::string& name) {
    absl::StatusOr<std::string> mounted = MountTmpfs(name, kTmpfsSize);
    if (absl::IsPermissionDenied(mounted.status())) {
      GTEST_SKIP() << mounted.status();
    }
    ASSERT_TRUE(mounted.ok()) << mounted.status();
    dir_ = *mounted;
    auto server = StartNibbledLoggingTo(NIBBLED_PATH, dir_ + ".stderr",
                                        {"--data_dir=" + dir_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Remounts the tmpfs at `dir` read-only or read-write, keeping its files.
  static bool Remount(const std::string& dir, const std::string& size,
                      bool read_only) {
    return mount("tmpfs", dir.c_str(), "tmpfs",
                 MS_REMOUNT | (read_only ? MS_RDONLY : 0),
                 ("size=" + size).c_str()) == 0;
  }

  std::string dir_;
  std::unique_ptr<NibbledProcess> server_;

 private:
  std::vector<std::string> mounts_;
};

TEST_F(FaultTest, SigkillDuringUploadLeavesNoTraceAndKeepsEarlierWeights) {
  const std::string dir = FreshDirectory("kill_upload");
  const std::string log = dir + ".stderr";
  const NamedSpecs weights = {{"a", {WeightFormat::kU4b8, 256, 64, 32}},
                              {"b", {WeightFormat::kFp4, 128, 48, 64}}};
  // Three 1 MiB chunks of codes, so that the kill lands between chunks.
  const WeightSpec partial_spec = {WeightFormat::kU4, 2048, 3072, 128};
  SCOPED_TRACE("seeds 101, 102; partial upload seed 103");
  std::vector<std::string> listed;
  std::vector<std::string> results;
  {
    auto server = StartNibbledLoggingTo(
        NIBBLED_PATH, log,
        {"--data_dir=" + dir, "--metrics_listen=127.0.0.1:0"});
    ASSERT_TRUE(server.ok()) << server.status();
    const int metrics_port = MetricsPort((*server)->startup_line());
    ASSERT_NE(metrics_port, 0) << (*server)->startup_line();
    WeightClient client((*server)->target());
    ASSERT_NO_FATAL_FAILURE(
        UploadAndRecordResults(client, weights, 101, results));
    listed = client.List();
    ASSERT_EQ(listed.size(), 2u);

    const std::vector<v1::UploadWeightRequest> messages =
        UploadMessages("c", RandomQuantizedWeight(partial_spec, 103));
    ASSERT_GT(messages.size(), 4u);
    auto stub = v1::NibbleService::NewStub(grpc::CreateChannel(
        (*server)->target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    v1::WeightInfo info;
    auto writer = stub->UploadWeight(&context, &info);
    for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(writer->Write(messages[i]));
    // nibbled reserves the weight's bytes when it reads the header: then the
    // upload is in progress on its side, and the chunks are on their way.
    const absl::Time give_up = absl::Now() + absl::Seconds(5);
    while (ScrapeSample(metrics_port, "nibble_reserved_weight_bytes") <= 0 &&
           absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    EXPECT_GT(ScrapeSample(metrics_port, "nibble_reserved_weight_bytes"), 0)
        << "the partial upload never reached nibbled";
    absl::SleepFor(absl::Milliseconds(100));
    Kill(**server);
    EXPECT_FALSE(writer->Finish().ok());
  }
  // What a kill between creating and renaming the temporary file leaves.
  WriteFile(dir + "/x.nibble.tmp-1-1", "torn");

  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(),
              HasSubstr(", 2 weights loaded from " + dir));
  WeightClient client((*server)->target());
  EXPECT_EQ(client.List(), listed);
  ExpectSameResults(client, weights, results);
  EXPECT_THAT(client.Matmul("c", partial_spec.k), HasSubstr("no weight named"));
  EXPECT_THAT(FileNames(dir), ElementsAre("a.nibble", "b.nibble"));
  const std::string messages = ReadFile(log);
  EXPECT_THAT(messages, HasSubstr("removed " + dir + "/x.nibble.tmp-1-1"));
  EXPECT_THAT(messages, Not(HasSubstr("skipped")));
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST_F(FaultTest, SigkillUnderLoadKeepsWeightsAndResults) {
  const std::string dir = FreshDirectory("kill_load");
  const std::string log = dir + ".stderr";
  const NamedSpecs weights = {{"u4b8", {WeightFormat::kU4b8, 1024, 256, 128}},
                              {"u4", {WeightFormat::kU4, 512, 128, 64}},
                              {"fp4", {WeightFormat::kFp4, 256, 96, 32}}};
  SCOPED_TRACE("seeds 111, 112, 113");
  std::vector<std::string> listed;
  std::vector<std::string> results;
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    WeightClient client((*server)->target());
    ASSERT_NO_FATAL_FAILURE(
        UploadAndRecordResults(client, weights, 111, results));
    listed = client.List();
    ASSERT_EQ(listed.size(), weights.size());

    std::atomic<bool> stop = false;
    std::atomic<int64_t> answered = 0;
    std::vector<std::thread> load;
    for (int thread = 0; thread < 4; ++thread) {
      load.emplace_back([&, thread] {
        WeightClient loader((*server)->target());
        for (size_t i = thread; !stop.load(); ++i) {
          const auto& [name, spec] = weights[i % weights.size()];
          if (!absl::StartsWith(loader.Matmul(name, spec.k), "error")) {
            ++answered;
          }
        }
      });
    }
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (answered.load() < 200 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    Kill(**server);
    stop = true;
    for (std::thread& thread : load) thread.join();
    EXPECT_GE(answered.load(), 200) << "the load never got going";
  }
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(),
              HasSubstr(", 3 weights loaded from " + dir));
  WeightClient client((*server)->target());
  EXPECT_EQ(client.List(), listed);
  ExpectSameResults(client, weights, results);
  EXPECT_THAT(FileNames(dir),
              ElementsAre("fp4.nibble", "u4.nibble", "u4b8.nibble"));
  EXPECT_THAT(ReadFile(log), Not(HasSubstr("skipped")));
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST_F(FaultTest, DiskFullFailsTheUploadClearlyAndLeavesNothing) {
  StartOnTmpfs("disk_full");
  if (server_ == nullptr) return;
  const std::string& dir = dir_;
  NibbledProcess* server = server_.get();
  SCOPED_TRACE("seeds 121, 122, 123");
  WeightClient client(server->target());
  ASSERT_TRUE(
      client.Upload("a", RandomQuantizedWeight(kHalfMiBSpec, 121)).ok());
  const std::string a_result = client.Matmul("a", kHalfMiBSpec.k);
  ASSERT_THAT(a_result, Not(StartsWith("error")));

  const QuantizedWeight too_big =
      RandomQuantizedWeight({WeightFormat::kU4b8, 2048, 1024, 128}, 122);
  const QuantizedWeight b = RandomQuantizedWeight(kHalfMiBSpec, 123);
  for (const auto& [name, weight] :
       {std::pair<std::string, const QuantizedWeight*>{"big", &too_big},
        {"b", &b}}) {
    SCOPED_TRACE(name);
    const grpc::Status status = client.Upload(name, *weight);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << status.error_message();
    EXPECT_THAT(status.error_message(),
                HasSubstr("weight \"" + name + "\" was not stored"));
    EXPECT_THAT(status.error_message(), HasSubstr(dir + "/" + name));
    EXPECT_THAT(status.error_message(), HasSubstr("No space left on device"));
    // No temporary file left filling the disk, and nothing served.
    EXPECT_THAT(FileNames(dir), ElementsAre("a.nibble"));
    EXPECT_THAT(client.Matmul(name, weight->spec.k),
                HasSubstr("no weight named"));
  }
  EXPECT_EQ(client.List().size(), 1u);
  EXPECT_EQ(client.Matmul("a", kHalfMiBSpec.k), a_result);

  // Deleting frees the space: the upload refused above now fits.
  ASSERT_TRUE(client.Delete("a").ok());
  const grpc::Status retried = client.Upload("b", b);
  EXPECT_TRUE(retried.ok()) << retried.error_message();
  EXPECT_THAT(FileNames(dir), ElementsAre("b.nibble"));
  EXPECT_THAT(client.Matmul("b", kHalfMiBSpec.k), Not(StartsWith("error")));
  EXPECT_TRUE(server->Running());
  EXPECT_EQ(server->Stop(), 0);
}

// PersistenceTest.FailedSaveFailsTheUploadAndStoresNothing covers a data dir
// that vanished; a read-only one fails at another step (EROFS, not ENOENT).
TEST_F(FaultTest, ReadOnlyDataDirFailsTheUploadClearlyAndLeavesNothing) {
  StartOnTmpfs("read_only");
  if (server_ == nullptr) return;
  const std::string& dir = dir_;
  NibbledProcess* server = server_.get();
  SCOPED_TRACE("seeds 131, 132");
  WeightClient client(server->target());
  const WeightSpec spec = {WeightFormat::kU4b8, 256, 64, 32};
  ASSERT_TRUE(client.Upload("a", RandomQuantizedWeight(spec, 131)).ok());
  const std::string a_result = client.Matmul("a", spec.k);
  ASSERT_TRUE(Remount(dir, kTmpfsSize, /*read_only=*/true))
      << std::strerror(errno);

  const QuantizedWeight b = RandomQuantizedWeight(spec, 132);
  const grpc::Status status = client.Upload("b", b);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("weight \"b\" was not stored: cannot create " + dir +
                        "/b.nibble.tmp-"));
  EXPECT_THAT(status.error_message(), HasSubstr("Read-only file system"));
  EXPECT_THAT(FileNames(dir), ElementsAre("a.nibble"));
  EXPECT_EQ(client.List().size(), 1u);
  EXPECT_EQ(client.Matmul("a", spec.k), a_result);
  EXPECT_THAT(client.Matmul("b", spec.k), HasSubstr("no weight named"));

  ASSERT_TRUE(Remount(dir, kTmpfsSize, /*read_only=*/false))
      << std::strerror(errno);
  const grpc::Status retried = client.Upload("b", b);
  EXPECT_TRUE(retried.ok()) << retried.error_message();
  EXPECT_THAT(FileNames(dir), ElementsAre("a.nibble", "b.nibble"));
  EXPECT_EQ(server->Stop(), 0);
}

// One storm: `calls` Matmul calls, one every `spacing`, faster than nibbled
// answers them, so that they wait in its queue behind each other; even ones
// with a deadline of 1 to 400 ms, odd ones cancelled by the client 1 to 400 ms
// after they were sent. Counts the answers by status code into `codes`.
void MatmulStorm(v1::NibbleService::Stub& stub,
                 const v1::MatmulRequest& request, int calls,
                 absl::Duration spacing,
                 std::map<grpc::StatusCode, int>* codes) {
  struct Call {
    grpc::ClientContext context;
    absl::Time cancel_at = absl::InfiniteFuture();
    v1::MatmulResponse response;
    grpc::Status status;
    std::unique_ptr<grpc::ClientAsyncResponseReader<v1::MatmulResponse>> rpc;
  };
  grpc::CompletionQueue queue;
  std::vector<std::unique_ptr<Call>> storm;
  const int delays_ms[] = {1, 5, 20, 50, 100, 200, 400};
  // Cancels the calls due by now; whether any is left to cancel.
  const auto cancel_due = [&storm] {
    bool pending = false;
    for (std::unique_ptr<Call>& call : storm) {
      if (call->cancel_at <= absl::Now()) {
        call->context.TryCancel();
        call->cancel_at = absl::InfiniteFuture();
      }
      pending = pending || call->cancel_at != absl::InfiniteFuture();
    }
    return pending;
  };
  // The completion queue's poller is what moves the calls along.
  std::thread drain([&queue, calls, codes] {
    void* tag = nullptr;
    bool ok = false;
    for (int i = 0; i < calls && queue.Next(&tag, &ok); ++i) {
      ++(*codes)[static_cast<Call*>(tag)->status.error_code()];
    }
  });
  for (int i = 0; i < calls; ++i) {
    auto call = std::make_unique<Call>();
    const absl::Duration delay = absl::Milliseconds(delays_ms[(i / 2) % 7]);
    if (i % 2 == 0) {
      call->context.set_deadline(absl::ToChronoTime(absl::Now() + delay));
    } else {
      call->cancel_at = absl::Now() + delay;
    }
    call->rpc = stub.AsyncMatmul(&call->context, request, &queue);
    call->rpc->Finish(&call->response, &call->status, call.get());
    storm.push_back(std::move(call));
    cancel_due();
    absl::SleepFor(spacing);
  }
  while (cancel_due()) absl::SleepFor(absl::Milliseconds(1));
  drain.join();
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
}

TEST_F(FaultTest, DeadlinesAndCancelsUnderLoadLeakNothing) {
  const std::string log = FreshDirectory("storm") + ".stderr";
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log,
                                      {"--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = MetricsPort((*server)->startup_line());
  ASSERT_NE(metrics_port, 0) << (*server)->startup_line();
  // Large enough that one M=64 matmul takes a while on two threads, so that
  // calls queue behind it and expire or are cancelled there.
  const WeightSpec spec = {WeightFormat::kU4b8, 4096, 4096, 128};
  SCOPED_TRACE("weight seed 141, activations 0.25");
  WeightClient client((*server)->target());
  ASSERT_TRUE(client.Upload("w", RandomQuantizedWeight(spec, 141)).ok());
  const std::string before = client.Matmul("w", spec.k);
  ASSERT_THAT(before, Not(StartsWith("error")));

  v1::MatmulRequest request;
  request.set_weight_name("w");
  request.set_m(64);
  request.set_dtype(ToProto(DType::kF32));
  request.set_a(Bytes(std::vector<float>(64 * spec.k, 0.25f)));
  auto stub = v1::NibbleService::NewStub(grpc::CreateChannel(
      (*server)->target(), grpc::InsecureChannelCredentials()));
  // Calls must arrive faster than nibbled answers them, or none waits in the
  // queue long enough to be dropped there; on a fast machine (AMX) one call
  // takes about a millisecond.
  absl::Duration fastest_call = absl::InfiniteDuration();
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext context;
    v1::MatmulResponse response;
    const absl::Time start = absl::Now();
    ASSERT_TRUE(stub->Matmul(&context, request, &response).ok());
    fastest_call = std::min(fastest_call, absl::Now() - start);
  }
  const absl::Duration spacing = std::clamp(
      fastest_call / 4, absl::Microseconds(200), absl::Milliseconds(5));
  SCOPED_TRACE(absl::StrCat("one call ", absl::FormatDuration(fastest_call),
                            ", one sent every ",
                            absl::FormatDuration(spacing)));

  int64_t resident[2] = {};
  for (int storm = 0; storm < 2; ++storm) {
    SCOPED_TRACE(absl::StrCat("storm ", storm));
    std::map<grpc::StatusCode, int> codes;
    MatmulStorm(*stub, request, 120, spacing, &codes);
    std::string summary;
    for (const auto& [code, count] : codes) {
      absl::StrAppend(&summary, " code ", code, ": ", count);
    }
    SCOPED_TRACE(absl::StrCat("answers:", summary));
    EXPECT_GT(codes[grpc::StatusCode::DEADLINE_EXCEEDED], 0);
    EXPECT_GT(codes[grpc::StatusCode::CANCELLED], 0);
    // The queue drains: every expired or cancelled call gives its rows back.
    EXPECT_EQ(
        WaitForSample(metrics_port, "nibble_queued_rows", 0, absl::Seconds(10)),
        0);
    const int64_t expired = ScrapeSample(
        metrics_port, "nibble_matmul_dropped_total{reason=\"expired\"}");
    const int64_t cancelled = ScrapeSample(
        metrics_port, "nibble_matmul_dropped_total{reason=\"cancelled\"}");
    EXPECT_GT(expired + cancelled, 0)
        << "expired " << expired << ", cancelled " << cancelled;
    std::cout << "storm " << storm << ":" << summary << "; dropped expired "
              << expired << ", cancelled " << cancelled << "\n";
    resident[storm] = ResidentBytes((*server)->pid());
    ASSERT_GT(resident[storm], 0);
    EXPECT_EQ(client.Matmul("w", spec.k), before);
  }
  std::cout << "VmRSS after the storms: " << resident[0] << ", " << resident[1]
            << "\n";
  // The first storm warms up the allocators; the second, identical one must
  // not need much more.
  EXPECT_LT(resident[1] - resident[0], int64_t{64} << 20)
      << "VmRSS " << resident[0] << " after the first storm, " << resident[1]
      << " after the second";
  // Queue slots are free again: concurrent normal calls are all served.
  std::vector<std::thread> normal;
  std::atomic<int> failed = 0;
  for (int i = 0; i < 8; ++i) {
    normal.emplace_back([&] {
      grpc::ClientContext context;
      v1::MatmulResponse response;
      if (!stub->Matmul(&context, request, &response).ok()) ++failed;
    });
  }
  for (std::thread& thread : normal) thread.join();
  EXPECT_EQ(failed.load(), 0);
  EXPECT_TRUE((*server)->Running());
  EXPECT_EQ((*server)->Stop(), 0);
}

}  // namespace
}  // namespace nibble
