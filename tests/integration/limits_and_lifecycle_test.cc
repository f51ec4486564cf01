// Runs real nibbled processes against their limits and through their
// lifecycle: --max_weight_bytes refuses an upload whole, counts uploads in
// progress, and skips files at start, --max_request_rows refuses large M, a
// reply past --max_message_bytes is refused before it is computed, the soft
// limit on open files is raised to the hard one, SIGTERM during the load
// stops nibbled before it serves, health turns SERVING once the weights are
// loaded, and SIGTERM drains: NOT_SERVING during
// --drain_delay_seconds, every in-flight request answered, exit code 0.
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"
#include "tests/integration/upload_messages.h"

namespace nibble {
namespace {

using ::grpc::health::v1::HealthCheckResponse;
using ::nibble::client::ToProto;
using ::nibble::testing::Bytes;
using ::nibble::testing::FileNames;
using ::nibble::testing::FreshDirectory;
using ::nibble::testing::MetricsPort;
using ::nibble::testing::ReadFile;
using ::nibble::testing::ScrapeSample;
using ::nibble::testing::StartNibbledLoggingTo;
using ::nibble::testing::UploadHeader;
using ::nibble::testing::UploadWeight;
using ::nibble::testing::WaitForSample;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

v1::MatmulRequest MatmulRequestFor(const std::string& name, int64_t m,
                                   int64_t k) {
  v1::MatmulRequest request;
  request.set_weight_name(name);
  request.set_m(m);
  request.set_dtype(ToProto(DType::kF32));
  request.set_a(Bytes(std::vector<float>(m * k, 0.25f)));
  return request;
}

class Client {
 public:
  explicit Client(const std::string& target)
      : channel_(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials())),
        stub_(v1::NibbleService::NewStub(channel_)),
        health_(grpc::health::v1::Health::NewStub(channel_)),
        kserve_(inference::GRPCInferenceService::NewStub(channel_)) {}

  v1::NibbleService::Stub& stub() { return *stub_; }
  inference::GRPCInferenceService::Stub& kserve() { return *kserve_; }

  grpc::Status Upload(const std::string& name, const QuantizedWeight& weight) {
    return UploadWeight(*stub_, name, weight);
  }

  // Sends only the header of an upload of `name` with `spec`.
  grpc::Status UploadHeaderOnly(const std::string& name,
                                const WeightSpec& spec) {
    return UploadWeight(*stub_, {UploadHeader(name, spec)});
  }

  grpc::Status Delete(const std::string& name) {
    grpc::ClientContext context;
    v1::DeleteWeightRequest request;
    request.set_name(name);
    v1::DeleteWeightResponse response;
    return stub_->DeleteWeight(&context, request, &response);
  }

  grpc::Status Matmul(const std::string& name, int64_t m, int64_t k) {
    grpc::ClientContext context;
    v1::MatmulResponse response;
    return stub_->Matmul(&context, MatmulRequestFor(name, m, k), &response);
  }

  // The health of `service` ("" for the server), or UNKNOWN when the check
  // itself fails.
  HealthCheckResponse::ServingStatus Health(const std::string& service) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    HealthCheckResponse response;
    if (!health_->Check(&context, request, &response).ok()) {
      return HealthCheckResponse::UNKNOWN;
    }
    return response.status();
  }

  bool KServeReady() {
    grpc::ClientContext context;
    inference::ServerReadyResponse response;
    return kserve_
               ->ServerReady(&context, inference::ServerReadyRequest(),
                             &response)
               .ok() &&
           response.ready();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::NibbleService::Stub> stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> kserve_;
};

constexpr WeightSpec kSmallSpec = {WeightFormat::kU4b8, 128, 64, 32};
// What one kSmallSpec weight holds resident: 4 panels of 16 columns, each
// 16 code words and 4 scales per column.
constexpr int64_t kSmallResidentBytes = 4 * 16 * (16 * 4 + 4 * 2);
constexpr absl::string_view kReservedSample = "nibble_reserved_weight_bytes";

TEST(WeightBudgetTest, UploadPastTheBudgetIsRefusedAndLeavesNothing) {
  const std::string dir = FreshDirectory("budget");
  const std::string log = dir + ".stderr";
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {"--data_dir=" + dir,
       absl::StrCat("--max_weight_bytes=", kSmallResidentBytes * 5 / 2)});
  ASSERT_TRUE(server.ok()) << server.status();
  Client client((*server)->target());
  ASSERT_TRUE(client.Upload("a", RandomQuantizedWeight(kSmallSpec, 1)).ok());
  ASSERT_TRUE(client.Upload("b", RandomQuantizedWeight(kSmallSpec, 2)).ok());

  grpc::Status refused =
      client.Upload("c", RandomQuantizedWeight(kSmallSpec, 3));
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr(absl::StrCat("\"c\" needs ", kSmallResidentBytes)));
  EXPECT_THAT(refused.error_message(), HasSubstr("--max_weight_bytes"));
  EXPECT_THAT(FileNames(dir), ElementsAre("a.nibble", "b.nibble"));
  EXPECT_TRUE(client.Matmul("a", 2, kSmallSpec.k).ok());
  EXPECT_TRUE(client.Matmul("b", 2, kSmallSpec.k).ok());
  EXPECT_EQ(client.Matmul("c", 2, kSmallSpec.k).error_code(),
            grpc::StatusCode::NOT_FOUND);

  // The header alone is refused: without the early check this upload would
  // fail for ending before its data.
  grpc::Status huge =
      client.UploadHeaderOnly("huge", {WeightFormat::kU4b8, 4096, 4096, 128});
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);

  ASSERT_TRUE(client.Delete("a").ok());
  EXPECT_TRUE(client.Upload("c", RandomQuantizedWeight(kSmallSpec, 3)).ok());
  EXPECT_TRUE(client.Matmul("c", 2, kSmallSpec.k).ok());
  EXPECT_EQ((*server)->Stop(), 0);
  EXPECT_THAT(ReadFile(log),
              HasSubstr("msg=\"upload refused: over a limit\" name=c"));
  EXPECT_THAT(ReadFile(log), HasSubstr("allowed by --max_weight_bytes"));
}

// The largest shape a header may name is 512 GiB of codes: refused by the
// budget before any memory is set aside for it, and the server goes on.
TEST(WeightBudgetTest, HeaderOfTheLargestShapeIsRefusedWithoutAllocating) {
  const std::string log = FreshDirectory("largest_header") + ".stderr";
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {});
  ASSERT_TRUE(server.ok()) << server.status();
  Client client((*server)->target());
  grpc::Status huge = client.UploadHeaderOnly(
      "huge", {WeightFormat::kU4b8, kMaxDimension, kMaxDimension, 128});
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << huge.error_message();
  ASSERT_TRUE(
      client.Upload("small", RandomQuantizedWeight(kSmallSpec, 1)).ok());
  EXPECT_TRUE(client.Matmul("small", 2, kSmallSpec.k).ok());
  EXPECT_EQ((*server)->Stop(), 0);
}

// An upload reserves its weight's bytes once its header arrives, so uploads
// that stall after the header cannot together buffer more than the budget.
// The test waits on nibbled's reserved-bytes gauge rather than probing with
// uploads: a probe's own reservation could make nibbled refuse the stalled
// header instead.
TEST(WeightBudgetTest, StalledUploadReservesItsBytesUntilCancelled) {
  const std::string log = FreshDirectory("reservation") + ".stderr";
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {absl::StrCat("--max_weight_bytes=", kSmallResidentBytes),
       "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = MetricsPort((*server)->startup_line());
  ASSERT_NE(metrics_port, 0) << (*server)->startup_line();
  Client client((*server)->target());

  grpc::ClientContext stalled_context;
  v1::WeightInfo stalled_info;
  auto stalled = client.stub().UploadWeight(&stalled_context, &stalled_info);
  ASSERT_TRUE(stalled->Write(UploadHeader("a", kSmallSpec)));
  ASSERT_EQ(WaitForSample(metrics_port, kReservedSample, kSmallResidentBytes,
                          absl::Seconds(30)),
            kSmallResidentBytes)
      << "nibbled never reserved the stalled upload's header";

  const QuantizedWeight b = RandomQuantizedWeight(kSmallSpec, 9);
  grpc::Status refused = client.Upload("b", b);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr(absl::StrCat(kSmallResidentBytes,
                                     " reserved by uploads in progress")));

  stalled_context.TryCancel();
  EXPECT_EQ(stalled->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // nibbled releases the reservation when it sees the cancellation, just
  // after the client does.
  EXPECT_EQ(WaitForSample(metrics_port, kReservedSample, 0, absl::Seconds(30)),
            0);
  grpc::Status uploaded = client.Upload("b", b);
  EXPECT_TRUE(uploaded.ok()) << uploaded.error_message();
  EXPECT_TRUE(client.Matmul("b", 1, kSmallSpec.k).ok());
  EXPECT_EQ(client.Matmul("a", 1, kSmallSpec.k).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ((*server)->Stop(), 0);
}

// A client that sends an upload's header and then nothing loses the upload
// after --upload_idle_seconds, and with it the budget it reserved.
TEST(WeightBudgetTest, StalledUploadIsCancelledAfterTheIdleTime) {
  const std::string log = FreshDirectory("idle_upload") + ".stderr";
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {absl::StrCat("--max_weight_bytes=", kSmallResidentBytes),
       "--upload_idle_seconds=0.5", "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = MetricsPort((*server)->startup_line());
  Client client((*server)->target());

  grpc::ClientContext stalled_context;
  // Far longer than the idle time, so that only nibbled ends the call.
  stalled_context.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::WeightInfo stalled_info;
  auto stalled = client.stub().UploadWeight(&stalled_context, &stalled_info);
  ASSERT_TRUE(stalled->Write(UploadHeader("a", kSmallSpec)));
  const grpc::Status ended = stalled->Finish();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::CANCELLED)
      << ended.error_message();
  EXPECT_EQ(WaitForSample(metrics_port, kReservedSample, 0, absl::Seconds(30)),
            0);
  SCOPED_TRACE("seed 10");
  EXPECT_TRUE(client.Upload("b", RandomQuantizedWeight(kSmallSpec, 10)).ok());
  EXPECT_EQ((*server)->Stop(), 0);
  EXPECT_THAT(ReadFile(log), HasSubstr("msg=\"upload cancelled: idle\" name=a "
                                       "upload_idle_seconds=0.5"));
}

// One connection may hold --max_uploads_per_connection uploads in progress;
// one more is refused at once, while other connections may still upload.
TEST(WeightBudgetTest, UploadsPerConnectionAreCapped) {
  const std::string log = FreshDirectory("uploads_per_connection") + ".stderr";
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {"--max_uploads_per_connection=2", "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = MetricsPort((*server)->startup_line());
  Client client((*server)->target());
  grpc::ClientContext stalled_contexts[2];
  v1::WeightInfo stalled_info;
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::UploadWeightRequest>>>
      stalled;
  for (int i = 0; i < 2; ++i) {
    stalled.push_back(
        client.stub().UploadWeight(&stalled_contexts[i], &stalled_info));
    ASSERT_TRUE(stalled[i]->Write(
        UploadHeader(absl::StrCat("stalled", i), kSmallSpec)));
  }
  ASSERT_EQ(WaitForSample(metrics_port, kReservedSample,
                          2 * kSmallResidentBytes, absl::Seconds(30)),
            2 * kSmallResidentBytes);

  SCOPED_TRACE("seed 11");
  const QuantizedWeight weight = RandomQuantizedWeight(kSmallSpec, 11);
  const grpc::Status refused = client.Upload("third", weight);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("this connection already has 2 uploads in progress"));
  EXPECT_THAT(refused.error_message(),
              HasSubstr("--max_uploads_per_connection"));
  // A channel of its own subchannel pool opens a connection of its own.
  grpc::ChannelArguments own_connection;
  own_connection.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto other_stub = v1::NibbleService::NewStub(grpc::CreateCustomChannel(
      (*server)->target(), grpc::InsecureChannelCredentials(), own_connection));
  const grpc::Status elsewhere = UploadWeight(*other_stub, "other", weight);
  EXPECT_TRUE(elsewhere.ok()) << elsewhere.error_message();

  for (int i = 0; i < 2; ++i) {
    stalled_contexts[i].TryCancel();
    EXPECT_EQ(stalled[i]->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // nibbled gives the connection's slots back as the cancelled uploads
  // return, just after the client sees them end.
  grpc::Status third = client.Upload("third", weight);
  for (const absl::Time give_up = absl::Now() + absl::Seconds(30);
       third.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED &&
       absl::Now() < give_up;
       third = client.Upload("third", weight)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_TRUE(third.ok()) << third.error_message();
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST(WeightBudgetTest, DefaultBudgetIsAShareOfMemoryAndMinusOneIsNone) {
  const std::string log = FreshDirectory("default_budget") + ".stderr";
  {
    auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->Stop(), 0);
  }
  const std::string automatic = ReadFile(log);
  EXPECT_THAT(automatic, HasSubstr("max_weight_bytes_from=\"3/4 of "));
  EXPECT_THAT(automatic, Not(HasSubstr("max_weight_bytes=none")));
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--max_weight_bytes=-1"});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_EQ((*server)->Stop(), 0);
  }
  EXPECT_THAT(ReadFile(log), HasSubstr("max_weight_bytes=none"));

  std::string output;
  EXPECT_EQ(testing::RunCommand(
                absl::StrCat(NIBBLED_PATH, " --max_weight_bytes=-2"), &output),
            2);
  EXPECT_THAT(output, HasSubstr("--max_weight_bytes=-2 is below -1"));
}

TEST(WeightBudgetTest, WeightsPastTheBudgetAreSkippedAtStart) {
  const std::string dir = FreshDirectory("budget_at_start");
  const std::string log = dir + ".stderr";
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    Client client((*server)->target());
    for (const char* name : {"a", "b", "c"}) {
      ASSERT_TRUE(
          client.Upload(name, RandomQuantizedWeight(kSmallSpec, 5)).ok());
    }
    EXPECT_EQ((*server)->Stop(), 0);
  }
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {"--data_dir=" + dir,
       absl::StrCat("--max_weight_bytes=", kSmallResidentBytes * 2)});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(),
              HasSubstr(", 2 weights loaded from " + dir));
  Client client((*server)->target());
  EXPECT_TRUE(client.Matmul("b", 1, kSmallSpec.k).ok());
  EXPECT_EQ(client.Matmul("c", 1, kSmallSpec.k).error_code(),
            grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ((*server)->Stop(), 0);
  const std::string messages = ReadFile(log);
  EXPECT_THAT(messages, HasSubstr("nibbled: skipped " + dir + "/c.nibble"));
  EXPECT_THAT(messages, HasSubstr("--max_weight_bytes"));
  // Skipped files stay, to be served once the budget allows.
  EXPECT_THAT(FileNames(dir), ElementsAre("a.nibble", "b.nibble", "c.nibble"));
}

TEST(RequestLimitTest, MoreRowsThanMaxRequestRowsIsInvalid) {
  const std::string log = FreshDirectory("max_rows") + ".stderr";
  auto server =
      StartNibbledLoggingTo(NIBBLED_PATH, log, {"--max_request_rows=4"});
  ASSERT_TRUE(server.ok()) << server.status();
  Client client((*server)->target());
  ASSERT_TRUE(client.Upload("w", RandomQuantizedWeight(kSmallSpec, 6)).ok());
  EXPECT_TRUE(client.Matmul("w", 4, kSmallSpec.k).ok());
  grpc::Status status = client.Matmul("w", 5, kSmallSpec.k);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("--max_request_rows"));
}

// A reply past --max_message_bytes is refused before its C is computed, on
// each of the three matmul RPCs: the error names the flag and the most rows
// that fit, and the weight's row count in /metrics shows that nothing ran.
TEST(RequestLimitTest, ReplyPastMaxMessageBytesIsRefusedBeforeComputing) {
  constexpr int kMaxMessageBytes = 64 << 10;
  // An f32 row of C is 4 KiB, so 15 rows fit beside the reply's other fields
  // and 16 do not.
  constexpr WeightSpec kWideSpec = {WeightFormat::kU4b8, 32, 1024, 32};
  constexpr int64_t kRowsThatFit = 15;
  const std::string log = FreshDirectory("reply_limit") + ".stderr";
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
       "--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = MetricsPort((*server)->startup_line());
  Client client((*server)->target());
  ASSERT_TRUE(client.Upload("w", RandomQuantizedWeight(kWideSpec, 8)).ok());
  ASSERT_TRUE(client.Matmul("w", kRowsThatFit, kWideSpec.k).ok());
  const std::string rows_sample = "nibble_matmul_rows_total{weight=\"w\"}";
  ASSERT_EQ(ScrapeSample(metrics_port, rows_sample), kRowsThatFit);
  const auto expect_refused = [&](const grpc::Status& status) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("C is ", kRowsThatFit + 1, " x ",
                                       kWideSpec.n, " f32")));
    EXPECT_THAT(status.error_message(),
                HasSubstr(absl::StrCat("--max_message_bytes=", kMaxMessageBytes,
                                       " allows; send at most ", kRowsThatFit,
                                       " rows")));
  };

  {
    SCOPED_TRACE("Matmul");
    expect_refused(client.Matmul("w", kRowsThatFit + 1, kWideSpec.k));
  }
  {
    SCOPED_TRACE("MatmulStream");
    grpc::ClientContext context;
    auto stream = client.stub().MatmulStream(&context);
    v1::MatmulStreamRequest request;
    request.set_id(7);
    *request.mutable_request() =
        MatmulRequestFor("w", kRowsThatFit + 1, kWideSpec.k);
    ASSERT_TRUE(stream->Write(request));
    ASSERT_TRUE(stream->WritesDone());
    v1::MatmulStreamResponse reply;
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.id(), 7u);
    ASSERT_TRUE(reply.has_error());
    expect_refused(
        grpc::Status(static_cast<grpc::StatusCode>(reply.error().code()),
                     reply.error().message()));
    EXPECT_TRUE(stream->Finish().ok());
  }
  {
    SCOPED_TRACE("ModelInfer");
    inference::ModelInferRequest request;
    request.set_model_name("w");
    auto* input = request.add_inputs();
    input->set_name("a");
    input->set_datatype("FP32");
    input->add_shape(kRowsThatFit + 1);
    input->add_shape(kWideSpec.k);
    request.add_raw_input_contents(
        MatmulRequestFor("w", kRowsThatFit + 1, kWideSpec.k).a());
    grpc::ClientContext context;
    inference::ModelInferResponse response;
    expect_refused(client.kserve().ModelInfer(&context, request, &response));
  }
  EXPECT_EQ(ScrapeSample(metrics_port, rows_sample), kRowsThatFit);
  EXPECT_EQ((*server)->Stop(), 0);
}

// The soft and hard "Max open files" of process `pid`, from /proc; {-1, -1}
// when unreadable.
std::pair<int64_t, int64_t> OpenFileLimits(pid_t pid) {
  std::ifstream limits(absl::StrCat("/proc/", pid, "/limits"));
  for (std::string line; std::getline(limits, line);) {
    if (!absl::StartsWith(line, "Max open files")) continue;
    std::istringstream fields(line.substr(std::strlen("Max open files")));
    int64_t soft = -1;
    int64_t hard = -1;
    fields >> soft >> hard;
    return {soft, hard};
  }
  return {-1, -1};
}

// nibbled starts with its soft limit on open files raised to the hard one,
// so that idle connections must be many more to fill its descriptor table.
TEST(LifecycleTest, StartRaisesTheOpenFileLimitToTheHardLimit) {
  rlimit ours{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &ours), 0);
  constexpr rlim_t kLowered = 256;
  if (ours.rlim_max == RLIM_INFINITY || ours.rlim_max <= kLowered) {
    GTEST_SKIP() << "the hard limit leaves nothing to raise: " << ours.rlim_max;
  }
  // nibbled inherits the lowered soft limit; ours goes back at once.
  rlimit lowered = ours;
  lowered.rlim_cur = kLowered;
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &lowered), 0);
  const std::string log = FreshDirectory("open_files") + ".stderr";
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {});
  ASSERT_EQ(setrlimit(RLIMIT_NOFILE, &ours), 0);
  ASSERT_TRUE(server.ok()) << server.status();
  const auto [soft, hard] = OpenFileLimits((*server)->pid());
  EXPECT_EQ(hard, static_cast<int64_t>(ours.rlim_max));
  EXPECT_EQ(soft, hard);
  EXPECT_EQ((*server)->Stop(), 0);
  EXPECT_THAT(ReadFile(log),
              HasSubstr(absl::StrCat("msg=\"open file limit\" max_open_files=",
                                     ours.rlim_max, " was=", kLowered)));
}

// Runs `nibbled args...`, sends it SIGTERM the moment it logs `trigger` on
// stderr, and waits for it; its exit code (-1 when a signal killed it), with
// what it printed on stdout in `output` and on stderr in `log`.
int StopWhenLogged(const std::vector<std::string>& args,
                   absl::string_view trigger, std::string* output,
                   std::string* log) {
  int out_pipe[2];
  int err_pipe[2];
  if (pipe(out_pipe) != 0 || pipe(err_pipe) != 0) return -2;
  const pid_t pid = fork();
  if (pid < 0) return -2;
  if (pid == 0) {
    dup2(out_pipe[1], STDOUT_FILENO);
    dup2(err_pipe[1], STDERR_FILENO);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      close(fd);
    }
    std::vector<std::string> argv_strings = {NIBBLED_PATH};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(NIBBLED_PATH, argv.data());
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  bool signalled = false;
  char buffer[4096];
  for (ssize_t got; (got = read(err_pipe[0], buffer, sizeof(buffer))) > 0;) {
    log->append(buffer, got);
    if (!signalled && absl::StrContains(*log, trigger)) {
      kill(pid, SIGTERM);
      signalled = true;
    }
  }
  for (ssize_t got; (got = read(out_pipe[0], buffer, sizeof(buffer))) > 0;) {
    output->append(buffer, got);
  }
  close(out_pipe[0]);
  close(err_pipe[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// A stop signal while nibbled loads its data directory ends it before it
// serves, with exit 0, instead of waiting for the load. The signal goes the
// moment nibbled logs that it starts loading, before it even listens; the
// load itself takes over 100 ms here.
TEST(LifecycleTest, SigtermWhileLoadingStopsBeforeServing) {
  const std::string dir = FreshDirectory("stop_while_loading");
  constexpr WeightSpec kLargeSpec = {WeightFormat::kU4b8, 4096, 2048, 128};
  constexpr int kWeights = 40;
  {
    auto server = StartNibbledLoggingTo(NIBBLED_PATH, dir + ".upload.stderr",
                                        {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    Client client((*server)->target());
    SCOPED_TRACE("seed 9");
    const QuantizedWeight weight = RandomQuantizedWeight(kLargeSpec, 9);
    for (int i = 0; i < kWeights; ++i) {
      ASSERT_TRUE(client.Upload(absl::StrCat("w", i), weight).ok());
    }
    EXPECT_EQ((*server)->Stop(), 0);
  }
  std::string output;
  std::string log;
  EXPECT_EQ(StopWhenLogged({"--listen=127.0.0.1:0", "--backend=cpu",
                            "--threads=2", "--data_dir=" + dir},
                           "msg=\"loading weights\"", &output, &log),
            0)
      << log;
  EXPECT_THAT(output, Not(HasSubstr("listening on")));
  EXPECT_THAT(log, HasSubstr("msg=\"signal received while starting, "
                             "stopping before serving\" signal=Terminated"));
}

TEST(LifecycleTest, ServesOnAUnixSocketAndPrintsItsPath) {
  const std::string socket_path = FreshDirectory("unix") + ".sock";
  auto server = nibble::testing::NibbledProcess::Start(
      NIBBLED_PATH, {"--threads=2", "--shutdown_grace_seconds=0.5",
                     "--listen=unix:" + socket_path});
  ASSERT_TRUE(server.ok()) << server.status();
  // Scripts and the container's entrypoint read the address from this line.
  EXPECT_EQ((*server)->target(), "unix:" + socket_path);
  Client client((*server)->target());
  EXPECT_EQ(client.Health(""), HealthCheckResponse::SERVING);
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST(LifecycleTest, HealthIsServingOnceDataDirWeightsAreLoaded) {
  const std::string dir = FreshDirectory("health");
  const std::string log = dir + ".stderr";
  {
    auto server =
        StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
    ASSERT_TRUE(server.ok()) << server.status();
    Client client((*server)->target());
    ASSERT_TRUE(client.Upload("w", RandomQuantizedWeight(kSmallSpec, 7)).ok());
    EXPECT_EQ((*server)->Stop(), 0);
  }
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {"--data_dir=" + dir});
  ASSERT_TRUE(server.ok()) << server.status();
  Client client((*server)->target());
  for (const char* service :
       {"", "nibble.v1.NibbleService", "inference.GRPCInferenceService"}) {
    EXPECT_EQ(client.Health(service), HealthCheckResponse::SERVING)
        << "service \"" << service << "\"";
  }
  EXPECT_TRUE(client.KServeReady());
  EXPECT_TRUE(client.Matmul("w", 1, kSmallSpec.k).ok());
  EXPECT_EQ((*server)->Stop(), 0);
  EXPECT_THAT(ReadFile(log), HasSubstr("msg=\"listening\""));
}

// gRPC's client-side health checking keeps a Watch open on every channel.
// On SIGTERM the watcher hears NOT_SERVING, its stream then ends with the
// drain, and nibbled exits long before the grace period has passed.
TEST(LifecycleTest, HealthWatchersDoNotHoldTheShutdown) {
  const std::string log = FreshDirectory("watch_drain") + ".stderr";
  const absl::Duration grace = absl::Seconds(60);
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {"--drain_delay_seconds=0.5",
       absl::StrCat("--shutdown_grace_seconds=", absl::ToInt64Seconds(grace))});
  ASSERT_TRUE(server.ok()) << server.status();
  auto channel = grpc::CreateChannel((*server)->target(),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  auto watch = health->Watch(&context, grpc::health::v1::HealthCheckRequest());
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);

  ASSERT_EQ(kill((*server)->pid(), SIGTERM), 0);
  const absl::Time signalled = absl::Now();
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  while (watch->Read(&response)) {
    EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  }
  // The server ended the stream as a drain ends it, not by cancelling it.
  const grpc::Status ended = watch->Finish();
  EXPECT_TRUE(ended.ok()) << ended.error_code() << ": "
                          << ended.error_message();
  EXPECT_EQ((*server)->Stop(), 0);
  // Exits in well under a second; a third of the grace leaves a busy machine
  // room while a watcher holding the drain would take all of it.
  EXPECT_LT(absl::Now() - signalled, grace / 3)
      << "the open Watch held the shutdown";
}

// A watcher that goes away is a cancelled call, counted as CANCELLED, so that
// alerts on errors do not fire for every disconnecting client.
TEST(LifecycleTest, CancelledHealthWatchIsCountedAsCancelled) {
  const std::string log = FreshDirectory("watch_cancel") + ".stderr";
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log,
                                      {"--metrics_listen=127.0.0.1:0"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int metrics_port = MetricsPort((*server)->startup_line());
  ASSERT_NE(metrics_port, 0) << (*server)->startup_line();
  auto channel = grpc::CreateChannel((*server)->target(),
                                     grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  auto watch = health->Watch(&context, grpc::health::v1::HealthCheckRequest());
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  context.TryCancel();
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::CANCELLED);

  constexpr char kWatch[] =
      "nibble_rpc_requests_total{method=\"/grpc.health.v1.Health/Watch\",";
  EXPECT_EQ(
      WaitForSample(metrics_port, absl::StrCat(kWatch, "code=\"CANCELLED\"}"),
                    1, absl::Seconds(30)),
      1);
  EXPECT_EQ(
      ScrapeSample(metrics_port, absl::StrCat(kWatch, "code=\"UNKNOWN\"}")),
      -1);
  EXPECT_EQ((*server)->Stop(), 0);
}

// SIGTERM while a MatmulStream keeps sending: health turns NOT_SERVING
// during the drain delay while calls are still accepted, every request sent
// on the stream is answered OK, and nibbled exits 0.
TEST(LifecycleTest, SigtermDrainsInFlightRequestsAndExitsZero) {
  const std::string log = FreshDirectory("drain") + ".stderr";
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {"--drain_delay_seconds=1", "--shutdown_grace_seconds=10"});
  ASSERT_TRUE(server.ok()) << server.status();
  Client client((*server)->target());
  const WeightSpec spec = {WeightFormat::kU4b8, 1024, 1024, 128};
  ASSERT_TRUE(client.Upload("w", RandomQuantizedWeight(spec, 8)).ok());

  grpc::ClientContext context;
  auto stream = client.stub().MatmulStream(&context);
  std::atomic<bool> stop_writing = false;
  std::atomic<int64_t> sent = 0;
  std::thread writer([&] {
    v1::MatmulStreamRequest request;
    *request.mutable_request() = MatmulRequestFor("w", 16, spec.k);
    while (!stop_writing.load()) {
      request.set_id(sent.load());
      if (!stream->Write(request)) break;
      ++sent;
      absl::SleepFor(absl::Milliseconds(5));
    }
    stream->WritesDone();
  });
  std::atomic<int64_t> answered_ok = 0;
  std::atomic<int64_t> failed = 0;
  std::string first_failure;
  std::thread reader([&] {
    v1::MatmulStreamResponse response;
    while (stream->Read(&response)) {
      if (response.has_response()) {
        ++answered_ok;
      } else {
        if (failed++ == 0) first_failure = response.error().message();
      }
    }
  });
  // The stream is in flight once its first answers are back.
  while (answered_ok == 0 && sent < 1000) {
    absl::SleepFor(absl::Milliseconds(10));
  }

  ASSERT_EQ(kill((*server)->pid(), SIGTERM), 0);
  const absl::Time signalled = absl::Now();
  HealthCheckResponse::ServingStatus health = HealthCheckResponse::SERVING;
  while (health == HealthCheckResponse::SERVING &&
         absl::Now() - signalled < absl::Milliseconds(800)) {
    health = client.Health("");
  }
  EXPECT_EQ(health, HealthCheckResponse::NOT_SERVING);
  EXPECT_EQ(client.Health("nibble.v1.NibbleService"),
            HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(client.KServeReady());
  // Still inside the drain delay: new calls are served.
  EXPECT_LT(absl::Now() - signalled, absl::Seconds(1));
  EXPECT_TRUE(client.Matmul("w", 1, spec.k).ok());

  // Past the delay nibbled stops accepting calls; the stream, in flight,
  // keeps being answered.
  absl::SleepFor(absl::Milliseconds(1500) - (absl::Now() - signalled));
  stop_writing = true;
  writer.join();
  reader.join();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(failed.load(), 0) << first_failure;
  EXPECT_GT(sent.load(), 0);
  EXPECT_EQ(answered_ok.load(), sent.load());
  EXPECT_EQ((*server)->Stop(), 0);
  const std::string messages = ReadFile(log);
  EXPECT_THAT(messages, HasSubstr("msg=\"signal received, draining\""));
  EXPECT_THAT(messages, HasSubstr("msg=\"stopped\""));
}

}  // namespace
}  // namespace nibble
