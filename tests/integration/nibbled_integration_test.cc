// Calls a real nibbled on loopback through the generated stub: results
// against the float64 reference for every format, group size and dtype, and
// every bad input answered with its status code while the server stays up.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/gemm_kernel.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/activations.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/upload_messages.h"

namespace nibble {
namespace {

using ::nibble::client::ToProto;
using ::nibble::testing::Activations;
using ::nibble::testing::OutputValues;
using ::nibble::testing::RandomActivations;
using ::nibble::testing::UploadHeader;
using ::nibble::testing::UploadMessages;
using ::nibble::testing::UploadWeight;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

class NibbledTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH, {"--threads=2"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << "nibbled did not exit cleanly";
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    grpc::ChannelArguments arguments;
    arguments.SetMaxReceiveMessageSize(64 << 20);
    channel_ = grpc::CreateCustomChannel(
        server_->target(), grpc::InsecureChannelCredentials(), arguments);
    stub_ = v1::NibbleService::NewStub(channel_);
  }
  void TearDown() override {
    EXPECT_TRUE(server_->Running()) << "nibbled died during the test";
  }

  grpc::Status Upload(const std::vector<v1::UploadWeightRequest>& messages,
                      v1::WeightInfo* info = nullptr) {
    return UploadWeight(*stub_, messages, info);
  }

  grpc::Status Matmul(const v1::MatmulRequest& request,
                      v1::MatmulResponse* response) {
    grpc::ClientContext context;
    return stub_->Matmul(&context, request, response);
  }

  grpc::StatusCode GetWeightCode(const std::string& name) {
    grpc::ClientContext context;
    v1::GetWeightRequest request;
    request.set_name(name);
    v1::WeightInfo info;
    return stub_->GetWeight(&context, request, &info).error_code();
  }

  static v1::MatmulRequest MatmulRequest(const std::string& name, int64_t m,
                                         DType dtype, std::string a) {
    v1::MatmulRequest request;
    request.set_weight_name(name);
    request.set_m(m);
    request.set_dtype(ToProto(dtype));
    request.set_a(std::move(a));
    return request;
  }

  static testing::NibbledProcess* server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::NibbleService::Stub> stub_;
};

testing::NibbledProcess* NibbledTest::server_ = nullptr;

TEST_F(NibbledTest, HealthIsServing) {
  auto health = grpc::health::v1::Health::NewStub(channel_);
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  ASSERT_TRUE(health->Check(&context, request, &response).ok());
  EXPECT_EQ(response.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(NibbledTest, SecondServerOnTheSamePortRefusesToStart) {
  std::string output;
  const int exit_code =
      testing::RunCommand(absl::StrCat("timeout 10 ", NIBBLED_PATH,
                                       " --listen=", server_->target()),
                          &output);
  EXPECT_EQ(exit_code, 1) << output;
  EXPECT_THAT(output, HasSubstr("cannot listen on " + server_->target()));
}

TEST_F(NibbledTest, BadFlagsAreUsageErrors) {
  std::string output;
  EXPECT_EQ(
      testing::RunCommand(
          absl::StrCat(NIBBLED_PATH, " --threads=-3 --listen=127.0.0.1:0"),
          &output),
      2);
  EXPECT_THAT(output, HasSubstr("--threads=-3 is negative"));

  EXPECT_EQ(testing::RunCommand(
                absl::StrCat(NIBBLED_PATH,
                             " --max_weights=-1 --max_receive_buffer_bytes=4096"
                             " --listen=127.0.0.1:0"),
                &output),
            2);
  EXPECT_THAT(output, HasSubstr("--max_weights=-1 is negative"));
  EXPECT_THAT(output, HasSubstr("--max_receive_buffer_bytes=4096 must be at "
                                "least --max_message_bytes"));
}

TEST_F(NibbledTest, StartupLineNamesTheBuiltInTuningTableAndItsLevel) {
  EXPECT_THAT(server_->startup_line(),
              ContainsRegex("tuning table built-in \\([a-z0-9_]+ rules\\)"));
}

TEST(NibbledTuningTableTest, MissingOrMalformedTableIsAUsageError) {
  const std::string missing = ::testing::TempDir() + "/no_such_tuning.txt";
  std::string output;
  EXPECT_EQ(testing::RunCommand(absl::StrCat(NIBBLED_PATH,
                                             " --listen=127.0.0.1:0"
                                             " --tuning_table=",
                                             missing),
                                &output),
            2);
  EXPECT_THAT(output, HasSubstr("--tuning_table: cannot open " + missing));

  const std::string malformed = ::testing::TempDir() + "/bad_tuning.txt";
  std::ofstream(malformed) << "# format group k n threads max_m variant\n"
                           << "u4b8 128 4096 4096 2 fused\n";
  EXPECT_EQ(testing::RunCommand(absl::StrCat(NIBBLED_PATH,
                                             " --listen=127.0.0.1:0"
                                             " --tuning_table=",
                                             malformed),
                                &output),
            2);
  EXPECT_THAT(output, HasSubstr(malformed + ": line 2: expected 7 columns"));
  std::remove(malformed.c_str());
}

TEST(NibbledTuningTableTest, TheTableChoosesTheKernel) {
  const WeightSpec spec{WeightFormat::kU4b8, 256, 64, 128};
  const std::vector<int64_t> ms = {1, 64};
  for (int64_t m : ms) {
    const GemmProblem problem{.m = m,
                              .n = spec.n,
                              .k = spec.k,
                              .format = spec.format,
                              .group_size = spec.group_size,
                              .dtype = DType::kF32,
                              .threads = 2};
    const std::vector<const GemmKernel*> kernels = cpu::CpuKernels();
    if (std::none_of(kernels.begin(), kernels.end(), [&](const auto* kernel) {
          return kernel->variant() == KernelVariant::kStriped &&
                 kernel->Supports(problem);
        })) {
      GTEST_SKIP() << "no striped kernel runs " << problem.DebugString()
                   << " on this CPU";
    }
  }
  const std::string path = ::testing::TempDir() + "/striped_tuning.txt";
  std::ofstream(path) << "# every u4b8 problem to striped\n"
                      << "u4b8 128 4096 4096 2 0 striped\n";
  absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
      testing::NibbledProcess::Start(NIBBLED_PATH,
                                     {"--threads=2", "--tuning_table=" + path});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(), HasSubstr("tuning table " + path));
  auto stub = v1::NibbleService::NewStub(grpc::CreateChannel(
      (*server)->target(), grpc::InsecureChannelCredentials()));
  const QuantizedWeight weight = RandomQuantizedWeight(spec, 51);
  ASSERT_TRUE(UploadWeight(*stub, "striped", weight).ok());
  for (int64_t m : ms) {
    SCOPED_TRACE(::testing::Message() << "m=" << m);
    const Activations a = RandomActivations(m, spec.k, DType::kF32, 52);
    v1::MatmulRequest request;
    request.set_weight_name("striped");
    request.set_m(m);
    request.set_dtype(ToProto(DType::kF32));
    request.set_a(a.bytes);
    grpc::ClientContext context;
    v1::MatmulResponse response;
    const grpc::Status status = stub->Matmul(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_THAT(response.kernel(), ::testing::StartsWith("striped_"));
    EXPECT_LE(MaxRelativeError(OutputValues(response.c(), DType::kF32),
                               ReferenceMatmul(a.values, m, weight)),
              client::ErrorBoundOf(response));
  }
  // An open channel would hold nibbled for its shutdown grace period.
  stub.reset();
  EXPECT_EQ((*server)->Stop(), 0);
  std::remove(path.c_str());
}

struct MatmulCase {
  WeightFormat format;
  int64_t group_size;  // 0: per-channel (group = K)
  DType dtype;
};

void PrintTo(const MatmulCase& c, std::ostream* os) {
  *os << WeightFormatName(c.format) << " group "
      << (c.group_size == 0 ? "K" : absl::StrCat(c.group_size)) << " "
      << DTypeName(c.dtype);
}

class NibbledMatmulTest : public NibbledTest,
                          public ::testing::WithParamInterface<MatmulCase> {};

TEST_P(NibbledMatmulTest, MatchesTheFloat64Reference) {
  const MatmulCase& param = GetParam();
  const int64_t k = 256;
  const WeightSpec spec{param.format, k, 72,
                        param.group_size == 0 ? k : param.group_size,
                        param.format == WeightFormat::kNvfp4 ? 0.0123f : 1.0f};
  const uint64_t seed = 1000 + static_cast<int>(param.format) * 10 +
                        static_cast<int>(param.dtype);
  SCOPED_TRACE(::testing::Message() << spec.DebugString() << " seed " << seed);
  const std::string name = absl::StrCat("ref-", seed, "-", spec.group_size);
  const QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
  v1::WeightInfo info;
  ASSERT_TRUE(Upload(UploadMessages(name, weight), &info).ok());
  EXPECT_EQ(info.canonical_bytes(), spec.canonical_bytes());

  const int64_t m = 5;
  const Activations a = RandomActivations(m, k, param.dtype, seed + 1);
  v1::MatmulResponse response;
  grpc::Status status =
      Matmul(MatmulRequest(name, m, param.dtype, a.bytes), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.m(), m);
  EXPECT_EQ(response.n(), spec.n);
  EXPECT_FALSE(response.kernel().empty());
  ASSERT_EQ(response.c().size(), m * spec.n * DTypeSize(param.dtype));
  EXPECT_LE(MaxRelativeError(OutputValues(response.c(), param.dtype),
                             ReferenceMatmul(a.values, m, weight)),
            client::ErrorBoundOf(response))
      << "kernel " << response.kernel();
}

std::vector<MatmulCase> AllMatmulCases() {
  std::vector<MatmulCase> cases;
  for (WeightFormat format : kAllWeightFormats) {
    std::vector<int64_t> groups = {32, 64, 128, 0};
    if (FixedGroupSize(format) != 0) groups = {FixedGroupSize(format)};
    for (int64_t group : groups) {
      for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
        cases.push_back({format, group, dtype});
      }
    }
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryFormatGroupAndDtype, NibbledMatmulTest,
                         ::testing::ValuesIn(AllMatmulCases()),
                         [](const auto& info) {
                           const MatmulCase& c = info.param;
                           return absl::StrCat(WeightFormatName(c.format), "_g",
                                               c.group_size == 0
                                                   ? "K"
                                                   : absl::StrCat(c.group_size),
                                               "_", DTypeName(c.dtype));
                         });

TEST_F(NibbledTest, UploadsAWeightFarAboveOneMessage) {
  const WeightSpec spec{WeightFormat::kU4b8, 4096, 4096, 128};
  const QuantizedWeight weight = RandomQuantizedWeight(spec, 11);
  v1::WeightInfo info;
  grpc::Status status = Upload(UploadMessages("big", weight), &info);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(info.k(), 4096);
  EXPECT_EQ(info.canonical_bytes(), 4096 * 4096 / 2 + 32 * 4096 * 2);

  const Activations a = RandomActivations(1, spec.k, DType::kF32, 12);
  v1::MatmulResponse response;
  ASSERT_TRUE(
      Matmul(MatmulRequest("big", 1, DType::kF32, a.bytes), &response).ok());
  EXPECT_LE(MaxRelativeError(OutputValues(response.c(), DType::kF32),
                             ReferenceMatmul(a.values, 1, weight)),
            client::ErrorBoundOf(response));
}

TEST_F(NibbledTest, ListGetAndDelete) {
  const WeightSpec spec{WeightFormat::kU4, 64, 16, 32};
  ASSERT_TRUE(
      Upload(UploadMessages("list-b", RandomQuantizedWeight(spec, 1))).ok());
  ASSERT_TRUE(
      Upload(UploadMessages("list-a", RandomQuantizedWeight(spec, 2))).ok());
  {
    grpc::ClientContext context;
    v1::ListWeightsResponse list;
    ASSERT_TRUE(stub_->ListWeights(&context, {}, &list).ok());
    std::vector<std::string> names;
    for (const auto& weight : list.weights()) names.push_back(weight.name());
    EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
    EXPECT_THAT(names, ::testing::IsSupersetOf({"list-a", "list-b"}));
  }
  EXPECT_EQ(GetWeightCode("list-a"), grpc::StatusCode::OK);
  grpc::ClientContext context;
  v1::DeleteWeightRequest request;
  request.set_name("list-a");
  v1::DeleteWeightResponse response;
  ASSERT_TRUE(stub_->DeleteWeight(&context, request, &response).ok());
  EXPECT_EQ(GetWeightCode("list-a"), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(GetWeightCode("list-b"), grpc::StatusCode::OK);
}

TEST_F(NibbledTest, ConcurrentMatmulsAreEachCorrect) {
  const WeightSpec spec{WeightFormat::kFp4, 512, 96, 32};
  const QuantizedWeight weight = RandomQuantizedWeight(spec, 21);
  ASSERT_TRUE(Upload(UploadMessages("shared", weight)).ok());
  // Each client's error over the bound its reply says.
  std::vector<double> errors(8, 1.0);
  std::vector<std::thread> clients;
  for (int i = 0; i < 8; ++i) {
    clients.emplace_back([&, i] {
      const int64_t m = 1 + i;
      const Activations a = RandomActivations(m, spec.k, DType::kF32, 30 + i);
      v1::MatmulResponse response;
      if (Matmul(MatmulRequest("shared", m, DType::kF32, a.bytes), &response)
              .ok()) {
        errors[i] = MaxRelativeError(OutputValues(response.c(), DType::kF32),
                                     ReferenceMatmul(a.values, m, weight)) /
                    client::ErrorBoundOf(response);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < 8; ++i) EXPECT_LE(errors[i], 1.0) << "client " << i;
}

class NibbledBadInputTest : public NibbledTest {
 protected:
  void SetUp() override {
    NibbledTest::SetUp();
    if (GetWeightCode("good") == grpc::StatusCode::NOT_FOUND) {
      ASSERT_TRUE(Upload(UploadMessages("good", weight_)).ok());
    }
  }

  void ExpectMatmulError(const v1::MatmulRequest& request,
                         grpc::StatusCode code, const std::string& message) {
    v1::MatmulResponse response;
    grpc::Status status = Matmul(request, &response);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  }

  void ExpectUploadError(const std::vector<v1::UploadWeightRequest>& messages,
                         grpc::StatusCode code, const std::string& message) {
    grpc::Status status = Upload(messages);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  }

  const WeightSpec spec_{WeightFormat::kU4b8, 64, 16, 32};
  const QuantizedWeight weight_ = RandomQuantizedWeight(spec_, 40);
  const std::string a_ = RandomActivations(2, 64, DType::kF32, 41).bytes;
};

TEST_F(NibbledBadInputTest, MatmulKThatDoesNotMatchTheWeight) {
  v1::MatmulRequest request = MatmulRequest("good", 2, DType::kF32, a_);
  request.set_k(32);
  ExpectMatmulError(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "k=32 does not match weight \"good\"");
}

TEST_F(NibbledBadInputTest, MatmulUnknownDtype) {
  v1::MatmulRequest request = MatmulRequest("good", 2, DType::kF32, a_);
  request.set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectMatmulError(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "dtype DTYPE_UNSPECIFIED is not supported");
  request.set_dtype(static_cast<v1::DType>(77));
  ExpectMatmulError(request, grpc::StatusCode::INVALID_ARGUMENT,
                    "dtype 77 is not supported");
}

TEST_F(NibbledBadInputTest, MatmulByteLengthNotMatchingTheShape) {
  ExpectMatmulError(MatmulRequest("good", 3, DType::kF32, a_),
                    grpc::StatusCode::INVALID_ARGUMENT, "A has 512 bytes");
  ExpectMatmulError(MatmulRequest("good", 2, DType::kF32, a_.substr(1)),
                    grpc::StatusCode::INVALID_ARGUMENT, "A has 511 bytes");
  ExpectMatmulError(MatmulRequest("good", int64_t{1} << 62, DType::kF32, a_),
                    grpc::StatusCode::INVALID_ARGUMENT, "A has 512 bytes");
}

TEST_F(NibbledBadInputTest, MatmulUnknownWeight) {
  ExpectMatmulError(MatmulRequest("missing", 2, DType::kF32, a_),
                    grpc::StatusCode::NOT_FOUND, "no weight named \"missing\"");
}

TEST_F(NibbledBadInputTest, MatmulZeroOrNegativeM) {
  ExpectMatmulError(MatmulRequest("good", 0, DType::kF32, ""),
                    grpc::StatusCode::INVALID_ARGUMENT, "m=0");
  ExpectMatmulError(MatmulRequest("good", -1, DType::kF32, a_),
                    grpc::StatusCode::INVALID_ARGUMENT, "m=-1");
}

TEST_F(NibbledBadInputTest, UploadKNotAMultipleOfTheGroupOr8) {
  ExpectUploadError({UploadHeader("bad-g", {WeightFormat::kU4b8, 96, 16, 64})},
                    grpc::StatusCode::INVALID_ARGUMENT,
                    "not a multiple of the group size 64");
  ExpectUploadError(
      {UploadHeader("bad-8", {WeightFormat::kU4b8, 100, 16, 100})},
      grpc::StatusCode::INVALID_ARGUMENT, "not a multiple of 8");
  ExpectUploadError(
      {UploadHeader("bad-group", {WeightFormat::kU4b8, 64, 16, 16})},
      grpc::StatusCode::INVALID_ARGUMENT, "group size 16 is not supported");
  ExpectUploadError({UploadHeader("bad-n", {WeightFormat::kU4b8, 64, 0, 32})},
                    grpc::StatusCode::INVALID_ARGUMENT, "must be positive");
}

TEST_F(NibbledBadInputTest, UploadUnknownFormat) {
  v1::UploadWeightRequest header = UploadHeader("bad-format", spec_);
  header.mutable_header()->set_format(v1::WEIGHT_FORMAT_UNSPECIFIED);
  ExpectUploadError({header}, grpc::StatusCode::INVALID_ARGUMENT,
                    "weight format WEIGHT_FORMAT_UNSPECIFIED is not supported");
}

TEST_F(NibbledBadInputTest, UploadDuplicateName) {
  ExpectUploadError(UploadMessages("good", weight_),
                    grpc::StatusCode::ALREADY_EXISTS,
                    "\"good\" already exists");
}

TEST_F(NibbledBadInputTest, UploadThatEndsEarlyLeavesNothing) {
  std::vector<v1::UploadWeightRequest> messages =
      UploadMessages("partial", weight_);
  messages.pop_back();  // the scales
  ExpectUploadError(messages, grpc::StatusCode::INVALID_ARGUMENT,
                    "ended early: 0 of 64 bytes of scales");
  EXPECT_EQ(GetWeightCode("partial"), grpc::StatusCode::NOT_FOUND);
  // The name is free again: a complete upload under it succeeds.
  EXPECT_TRUE(Upload(UploadMessages("partial", weight_)).ok());
}

TEST_F(NibbledBadInputTest, UploadCancelledByTheClientLeavesNothing) {
  grpc::ClientContext context;
  v1::WeightInfo info;
  auto writer = stub_->UploadWeight(&context, &info);
  const std::vector<v1::UploadWeightRequest> messages =
      UploadMessages("cancelled", weight_);
  ASSERT_TRUE(writer->Write(messages[0]));
  ASSERT_TRUE(writer->Write(messages[1]));
  context.TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::StatusCode::CANCELLED);
  EXPECT_EQ(GetWeightCode("cancelled"), grpc::StatusCode::NOT_FOUND);
}

TEST_F(NibbledBadInputTest, UploadChunksOutOfOrder) {
  std::vector<v1::UploadWeightRequest> messages =
      UploadMessages("disorder", weight_);
  std::swap(messages[1], messages[2]);
  ExpectUploadError(messages, grpc::StatusCode::INVALID_ARGUMENT,
                    "before finishing qweight");
  ExpectUploadError({UploadMessages("no-header", weight_)[1]},
                    grpc::StatusCode::INVALID_ARGUMENT, "before the header");
  EXPECT_EQ(GetWeightCode("disorder"), grpc::StatusCode::NOT_FOUND);
}

TEST_F(NibbledBadInputTest, UploadBadNames) {
  ExpectUploadError({UploadHeader("a/../escape", spec_)},
                    grpc::StatusCode::INVALID_ARGUMENT, "may only contain");
  ExpectUploadError({UploadHeader("", spec_)},
                    grpc::StatusCode::INVALID_ARGUMENT, "empty");
}

TEST_F(NibbledBadInputTest, UploadNanOrInfiniteScale) {
  for (uint16_t bits : {0x7e00, 0x7c00, 0xfc00}) {
    QuantizedWeight weight = weight_;
    weight.scales[spec_.n + 1] = bits;  // column 1 of group 1
    ExpectUploadError(UploadMessages("bad-scale", weight),
                      grpc::StatusCode::INVALID_ARGUMENT,
                      "scale of column 1, group 1 is");
  }
  EXPECT_EQ(GetWeightCode("bad-scale"), grpc::StatusCode::NOT_FOUND);
}

// Names are checked before anything reaches the disk: none of these may name
// a file outside --data_dir, or any file at all.
TEST_F(NibbledBadInputTest, UploadHostileNames) {
  for (const std::string& name :
       {std::string(".."), std::string("."), std::string("/etc/passwd"),
        std::string("../../tmp/escape"), std::string("a\\b"),
        std::string("a\0b", 3), std::string("caf\xc3\xa9"),
        std::string("two words"), std::string(100'000, 'x')}) {
    SCOPED_TRACE(name.substr(0, 40));
    ExpectUploadError(UploadMessages(name, weight_),
                      grpc::StatusCode::INVALID_ARGUMENT, "weight name");
    EXPECT_EQ(GetWeightCode(name), grpc::StatusCode::NOT_FOUND);
  }
}

// gRPC refuses the message before nibbled sees it; the server goes on.
TEST_F(NibbledBadInputTest, MatmulLargerThanTheMessageLimit) {
  const std::string huge((64 << 20) + 1, '\x01');
  ExpectMatmulError(MatmulRequest("good", 1, DType::kF32, huge),
                    grpc::StatusCode::RESOURCE_EXHAUSTED, "");
  v1::MatmulResponse response;
  EXPECT_TRUE(
      Matmul(MatmulRequest("good", 2, DType::kF32, a_), &response).ok());
}

// Requests already queued on a weight when it is deleted either finish with
// the weight they found or fail with NOT_FOUND: never a wrong answer.
TEST_F(NibbledBadInputTest, DeleteWhileMatmulsAreInFlight) {
  const WeightSpec spec{WeightFormat::kU4b8, 2048, 2048, 128};
  ASSERT_TRUE(
      Upload(UploadMessages("doomed", RandomQuantizedWeight(spec, 42))).ok());
  const v1::MatmulRequest request =
      MatmulRequest("doomed", 16, DType::kF32,
                    RandomActivations(16, 2048, DType::kF32, 43).bytes);
  v1::MatmulResponse expected;
  ASSERT_TRUE(Matmul(request, &expected).ok());

  constexpr int kClients = 8;
  std::vector<int> answered(kClients, 0), not_found(kClients, 0),
      wrong(kClients, 0);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      for (int call = 0; call < 40; ++call) {
        v1::MatmulResponse response;
        const grpc::Status status = Matmul(request, &response);
        if (status.ok()) {
          ++answered[i];
          if (response.c() != expected.c()) ++wrong[i];
        } else if (status.error_code() == grpc::StatusCode::NOT_FOUND) {
          ++not_found[i];
        } else {
          ADD_FAILURE() << "client " << i << ": " << status.error_message();
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  grpc::ClientContext context;
  v1::DeleteWeightRequest delete_request;
  delete_request.set_name("doomed");
  v1::DeleteWeightResponse delete_response;
  EXPECT_TRUE(
      stub_->DeleteWeight(&context, delete_request, &delete_response).ok());
  for (std::thread& client : clients) client.join();
  for (int i = 0; i < kClients; ++i) {
    EXPECT_EQ(wrong[i], 0) << "client " << i;
    EXPECT_EQ(answered[i] + not_found[i], 40) << "client " << i;
  }
  EXPECT_GT(std::accumulate(not_found.begin(), not_found.end(), 0), 0);
  EXPECT_EQ(GetWeightCode("doomed"), grpc::StatusCode::NOT_FOUND);
}

TEST_F(NibbledBadInputTest, DeleteUnknownWeight) {
  grpc::ClientContext context;
  v1::DeleteWeightRequest request;
  request.set_name("never-uploaded");
  v1::DeleteWeightResponse response;
  EXPECT_EQ(stub_->DeleteWeight(&context, request, &response).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

}  // namespace
}  // namespace nibble
