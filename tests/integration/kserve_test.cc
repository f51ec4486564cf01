// Calls a real nibbled through the Open Inference Protocol (KServe v2) stub:
// health and metadata, ModelInfer against the float64 reference for every
// datatype and both ways of sending A, the same bytes and kernel as nibble.v1
// Matmul for the same A, and every bad request answered with its status code
// while the server stays up. Weights are uploaded through nibble.v1, as a
// deployment would.
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/activations.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/upload_messages.h"

namespace nibble {
namespace {

using ::nibble::client::ToProto;
using ::nibble::testing::Activations;
using ::nibble::testing::KServeErrorBound;
using ::nibble::testing::OutputValues;
using ::nibble::testing::RandomActivations;
using ::nibble::testing::UploadWeight;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The weight every test shares: model "kserve-u4" with K=128, N=40.
constexpr char kModel[] = "kserve-u4";
constexpr uint64_t kWeightSeed = 7001;
const WeightSpec kSpec{WeightFormat::kU4, 128, 40, 32};

// The weight behind kModel, made once.
const QuantizedWeight& Weight() {
  static const QuantizedWeight* weight =
      new QuantizedWeight(RandomQuantizedWeight(kSpec, kWeightSeed));
  return *weight;
}

// The KServe v2 datatype of `dtype`.
std::string Datatype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "FP32";
    case DType::kF16:
      return "FP16";
    case DType::kBF16:
      return "BF16";
  }
  return "unknown";
}

// Model kModel, input "a" [m, K] of `datatype`, no data yet.
inference::ModelInferRequest InferRequest(const std::string& datatype,
                                          int64_t m) {
  inference::ModelInferRequest request;
  request.set_model_name(kModel);
  auto* input = request.add_inputs();
  input->set_name("a");
  input->set_datatype(datatype);
  input->add_shape(m);
  input->add_shape(kSpec.k);
  return request;
}

class KServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH, {"--threads=2"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    auto stub = v1::NibbleService::NewStub(grpc::CreateChannel(
        server_->target(), grpc::InsecureChannelCredentials()));
    const grpc::Status status = UploadWeight(*stub, kModel, Weight());
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << "nibbled did not exit cleanly";
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(server_, nullptr);
    channel_ = grpc::CreateChannel(server_->target(),
                                   grpc::InsecureChannelCredentials());
    nibble_ = v1::NibbleService::NewStub(channel_);
    kserve_ = inference::GRPCInferenceService::NewStub(channel_);
  }
  void TearDown() override {
    EXPECT_TRUE(server_->Running()) << "nibbled died during the test";
  }

  grpc::Status Infer(const inference::ModelInferRequest& request,
                     inference::ModelInferResponse* response) {
    grpc::ClientContext context;
    return kserve_->ModelInfer(&context, request, response);
  }

  void ExpectInferError(const inference::ModelInferRequest& request,
                        grpc::StatusCode code, const std::string& message) {
    inference::ModelInferResponse response;
    const grpc::Status status = Infer(request, &response);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(message));
  }

  bool ModelReady(const std::string& name, const std::string& version) {
    grpc::ClientContext context;
    inference::ModelReadyRequest request;
    request.set_name(name);
    request.set_version(version);
    inference::ModelReadyResponse response;
    const grpc::Status status =
        kserve_->ModelReady(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.ready();
  }

  grpc::Status ModelMetadata(const std::string& name,
                             const std::string& version,
                             inference::ModelMetadataResponse* response) {
    grpc::ClientContext context;
    inference::ModelMetadataRequest request;
    request.set_name(name);
    request.set_version(version);
    return kserve_->ModelMetadata(&context, request, response);
  }

  static testing::NibbledProcess* server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::NibbleService::Stub> nibble_;
  std::unique_ptr<inference::GRPCInferenceService::Stub> kserve_;
};

testing::NibbledProcess* KServeTest::server_ = nullptr;

TEST_F(KServeTest, ServerIsLiveAndReady) {
  {
    grpc::ClientContext context;
    inference::ServerLiveResponse response;
    ASSERT_TRUE(kserve_->ServerLive(&context, {}, &response).ok());
    EXPECT_TRUE(response.live());
  }
  grpc::ClientContext context;
  inference::ServerReadyResponse response;
  ASSERT_TRUE(kserve_->ServerReady(&context, {}, &response).ok());
  EXPECT_TRUE(response.ready());
}

TEST_F(KServeTest, ServerMetadataNamesNibbleItsVersionAndTritonExtensions) {
  grpc::ClientContext context;
  inference::ServerMetadataResponse response;
  ASSERT_TRUE(kserve_->ServerMetadata(&context, {}, &response).ok());
  EXPECT_EQ(response.name(), "nibble");
  EXPECT_EQ(response.version(), NIBBLE_VERSION);
  EXPECT_THAT(
      response.extensions(),
      ElementsAre("model_configuration", "model_repository", "statistics"));
}

TEST_F(KServeTest, ModelMetadataReportsTheWeightsShapes) {
  for (const std::string version : {"", "1"}) {
    SCOPED_TRACE("version \"" + version + "\"");
    inference::ModelMetadataResponse response;
    const grpc::Status status = ModelMetadata(kModel, version, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(response.name(), kModel);
    EXPECT_THAT(response.versions(), ElementsAre("1"));
    EXPECT_EQ(response.platform(), "nibble");
    ASSERT_EQ(response.inputs_size(), 1);
    EXPECT_EQ(response.inputs(0).name(), "a");
    EXPECT_EQ(response.inputs(0).datatype(), "FP32");
    EXPECT_THAT(response.inputs(0).shape(), ElementsAre(-1, kSpec.k));
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).name(), "c");
    EXPECT_EQ(response.outputs(0).datatype(), "FP32");
    EXPECT_THAT(response.outputs(0).shape(), ElementsAre(-1, kSpec.n));
  }
}

TEST_F(KServeTest, ModelMetadataOfAnUnknownModelOrVersionIsNotFound) {
  inference::ModelMetadataResponse response;
  grpc::Status status = ModelMetadata("no-such-model", "", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(),
              HasSubstr("no model named \"no-such-model\""));
  status = ModelMetadata(kModel, "2", &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("has no version \"2\""));
}

TEST_F(KServeTest, ModelReadyFollowsTheResidentWeights) {
  EXPECT_TRUE(ModelReady(kModel, ""));
  EXPECT_TRUE(ModelReady(kModel, "1"));
  EXPECT_FALSE(ModelReady(kModel, "2"));
  EXPECT_FALSE(ModelReady("no-such-model", ""));

  const std::string name = "kserve-deleted";
  ASSERT_TRUE(UploadWeight(*nibble_, name,
                           RandomQuantizedWeight(kSpec, kWeightSeed + 1))
                  .ok());
  EXPECT_TRUE(ModelReady(name, ""));
  grpc::ClientContext context;
  v1::DeleteWeightRequest request;
  request.set_name(name);
  v1::DeleteWeightResponse response;
  ASSERT_TRUE(nibble_->DeleteWeight(&context, request, &response).ok());
  EXPECT_FALSE(ModelReady(name, ""));
  inference::ModelInferRequest deleted = InferRequest("FP32", 1);
  deleted.set_model_name(name);
  deleted.add_raw_input_contents(
      RandomActivations(1, kSpec.k, DType::kF32, 9).bytes);
  ExpectInferError(deleted, grpc::StatusCode::NOT_FOUND, "no model named");
}

struct InferCase {
  DType dtype;
  bool fp32_contents;  // A in contents.fp32_contents instead of raw
};

void PrintTo(const InferCase& c, std::ostream* os) {
  *os << DTypeName(c.dtype) << (c.fp32_contents ? " contents" : " raw");
}

class KServeInferTest : public KServeTest,
                        public ::testing::WithParamInterface<InferCase> {};

TEST_P(KServeInferTest, MatchesTheFloat64Reference) {
  const InferCase& param = GetParam();
  const std::string datatype = Datatype(param.dtype);
  const uint64_t seed =
      7100 + 10 * static_cast<int>(param.dtype) + (param.fp32_contents ? 1 : 0);
  SCOPED_TRACE(::testing::Message()
               << datatype << " activation seed " << seed << ", weight "
               << kSpec.DebugString() << " seed " << kWeightSeed);
  const int64_t m = 5;
  const Activations a = RandomActivations(m, kSpec.k, param.dtype, seed);
  inference::ModelInferRequest request = InferRequest(datatype, m);
  request.set_id(absl::StrCat("request-", seed));
  request.add_outputs()->set_name("c");
  if (param.fp32_contents) {
    for (float value : a.floats) {
      request.mutable_inputs(0)->mutable_contents()->add_fp32_contents(value);
    }
  } else {
    request.add_raw_input_contents(a.bytes);
  }

  inference::ModelInferResponse response;
  const grpc::Status status = Infer(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.model_name(), kModel);
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_EQ(response.id(), request.id());
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "c");
  EXPECT_EQ(response.outputs(0).datatype(), datatype);
  EXPECT_THAT(response.outputs(0).shape(), ElementsAre(m, kSpec.n));
  ASSERT_EQ(response.raw_output_contents_size(), 1);
  const std::string& c = response.raw_output_contents(0);
  ASSERT_EQ(c.size(), m * kSpec.n * DTypeSize(param.dtype));
  EXPECT_LE(MaxRelativeError(OutputValues(c, param.dtype),
                             ReferenceMatmul(a.values, m, Weight())),
            KServeErrorBound(response, param.dtype));
}

INSTANTIATE_TEST_SUITE_P(EveryDatatype, KServeInferTest,
                         ::testing::Values(InferCase{DType::kF32, false},
                                           InferCase{DType::kF16, false},
                                           InferCase{DType::kBF16, false},
                                           InferCase{DType::kF32, true}),
                         [](const auto& info) {
                           return absl::StrCat(
                               DTypeName(info.param.dtype),
                               info.param.fp32_contents ? "_contents" : "_raw");
                         });

// Many clients send a single vector as [K]: one row, answered as [N].
TEST_F(KServeTest, OneDimensionalInputIsOneRow) {
  const uint64_t seed = 7150;
  SCOPED_TRACE(::testing::Message() << "activation seed " << seed);
  const Activations a = RandomActivations(1, kSpec.k, DType::kF32, seed);
  inference::ModelInferRequest request = InferRequest("FP32", 1);
  request.mutable_inputs(0)->clear_shape();
  request.mutable_inputs(0)->add_shape(kSpec.k);
  request.add_raw_input_contents(a.bytes);
  inference::ModelInferResponse response;
  const grpc::Status status = Infer(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_THAT(response.outputs(0).shape(), ElementsAre(kSpec.n));
  ASSERT_EQ(response.raw_output_contents_size(), 1);
  EXPECT_LE(MaxRelativeError(
                OutputValues(response.raw_output_contents(0), DType::kF32),
                ReferenceMatmul(a.values, 1, Weight())),
            KServeErrorBound(response, DType::kF32));
}

// Clients that fill every field send an empty contents beside the raw bytes.
TEST_F(KServeTest, RawDataWithAnEmptyContentsMessageIsAccepted) {
  const uint64_t seed = 7160;
  SCOPED_TRACE(::testing::Message() << "activation seed " << seed);
  const Activations a = RandomActivations(2, kSpec.k, DType::kBF16, seed);
  inference::ModelInferRequest request = InferRequest("BF16", 2);
  request.mutable_inputs(0)->mutable_contents();
  request.add_raw_input_contents(a.bytes);
  inference::ModelInferResponse response;
  const grpc::Status status = Infer(request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.raw_output_contents_size(), 1);
  EXPECT_LE(MaxRelativeError(
                OutputValues(response.raw_output_contents(0), DType::kBF16),
                ReferenceMatmul(a.values, 2, Weight())),
            1e-2);
}

class KServeMatchesMatmulTest : public KServeTest,
                                public ::testing::WithParamInterface<DType> {};

// Both front doors lead to the same runner, so the same A must give the same
// bits and the same kernel, not merely close values.
TEST_P(KServeMatchesMatmulTest, SameBytesAndKernelAsMatmul) {
  const DType dtype = GetParam();
  const uint64_t seed = 7300 + static_cast<int>(dtype);
  SCOPED_TRACE(::testing::Message()
               << Datatype(dtype) << " activation seed " << seed << ", weight "
               << kSpec.DebugString() << " seed " << kWeightSeed);
  const int64_t m = 3;
  const Activations a = RandomActivations(m, kSpec.k, dtype, seed);

  v1::MatmulRequest matmul_request;
  matmul_request.set_weight_name(kModel);
  matmul_request.set_m(m);
  matmul_request.set_dtype(ToProto(dtype));
  matmul_request.set_a(a.bytes);
  v1::MatmulResponse matmul;
  grpc::ClientContext context;
  const grpc::Status matmul_status =
      nibble_->Matmul(&context, matmul_request, &matmul);
  ASSERT_TRUE(matmul_status.ok()) << matmul_status.error_message();

  inference::ModelInferRequest infer_request = InferRequest(Datatype(dtype), m);
  infer_request.add_raw_input_contents(a.bytes);
  inference::ModelInferResponse infer;
  const grpc::Status infer_status = Infer(infer_request, &infer);
  ASSERT_TRUE(infer_status.ok()) << infer_status.error_message();

  ASSERT_EQ(infer.raw_output_contents_size(), 1);
  const std::string& infer_c = infer.raw_output_contents(0);
  ASSERT_EQ(matmul.c().size(), m * kSpec.n * DTypeSize(dtype));
  ASSERT_EQ(infer_c.size(), matmul.c().size());
  EXPECT_EQ(std::memcmp(infer_c.data(), matmul.c().data(), infer_c.size()), 0)
      << "ModelInfer's C differs from Matmul's";
  EXPECT_FALSE(matmul.kernel().empty());
  const auto kernel = infer.parameters().find("kernel");
  ASSERT_NE(kernel, infer.parameters().end())
      << "ModelInfer's response has no \"kernel\" parameter";
  EXPECT_EQ(kernel->second.string_param(), matmul.kernel());
}

INSTANTIATE_TEST_SUITE_P(EveryDatatype, KServeMatchesMatmulTest,
                         ::testing::Values(DType::kF32, DType::kF16,
                                           DType::kBF16),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param));
                         });

class KServeBadInputTest : public KServeTest {
 protected:
  // A request that would succeed: FP32 [2, K], raw.
  inference::ModelInferRequest Good() const {
    inference::ModelInferRequest request = InferRequest("FP32", 2);
    request.add_raw_input_contents(a_.bytes);
    return request;
  }

  const Activations a_ = RandomActivations(2, kSpec.k, DType::kF32, 7200);
};

TEST_F(KServeBadInputTest, TheGoodRequestSucceeds) {
  inference::ModelInferResponse response;
  EXPECT_TRUE(Infer(Good(), &response).ok());
}

TEST_F(KServeBadInputTest, UnknownModelOrVersion) {
  inference::ModelInferRequest request = Good();
  request.set_model_name("no-such-model");
  ExpectInferError(request, grpc::StatusCode::NOT_FOUND,
                   "no model named \"no-such-model\"");
  request = Good();
  request.set_model_version("3");
  ExpectInferError(request, grpc::StatusCode::NOT_FOUND,
                   "has no version \"3\"");
}

TEST_F(KServeBadInputTest, WrongInputCountOrName) {
  inference::ModelInferRequest two = Good();
  *two.add_inputs() = two.inputs(0);
  ExpectInferError(two, grpc::StatusCode::INVALID_ARGUMENT,
                   "the request has 2 inputs");
  inference::ModelInferRequest none = Good();
  none.clear_inputs();
  ExpectInferError(none, grpc::StatusCode::INVALID_ARGUMENT,
                   "the request has 0 inputs");
  inference::ModelInferRequest renamed = Good();
  renamed.mutable_inputs(0)->set_name("input0");
  ExpectInferError(renamed, grpc::StatusCode::INVALID_ARGUMENT,
                   "input \"input0\" is unknown");
}

TEST_F(KServeBadInputTest, UnknownDatatype) {
  inference::ModelInferRequest request = Good();
  request.mutable_inputs(0)->set_datatype("FP64");
  ExpectInferError(request, grpc::StatusCode::INVALID_ARGUMENT,
                   "datatype \"FP64\" is not supported: use FP32, FP16 or "
                   "BF16");
}

TEST_F(KServeBadInputTest, ShapeNotTwoDimensional) {
  inference::ModelInferRequest request = Good();
  request.mutable_inputs(0)->add_shape(1);
  ExpectInferError(request, grpc::StatusCode::INVALID_ARGUMENT,
                   "it must be 2-D");
}

TEST_F(KServeBadInputTest, NegativeOrZeroDimensions) {
  inference::ModelInferRequest negative = Good();
  negative.mutable_inputs(0)->set_shape(0, -2);
  ExpectInferError(negative, grpc::StatusCode::INVALID_ARGUMENT,
                   "dimensions cannot be negative");
  inference::ModelInferRequest empty = Good();
  empty.mutable_inputs(0)->set_shape(0, 0);
  ExpectInferError(empty, grpc::StatusCode::INVALID_ARGUMENT,
                   "at least one row");
}

TEST_F(KServeBadInputTest, KNotMatchingTheWeight) {
  inference::ModelInferRequest request = Good();
  request.mutable_inputs(0)->set_shape(1, 2 * kSpec.k);
  request.mutable_inputs(0)->set_shape(0, 1);
  ExpectInferError(request, grpc::StatusCode::INVALID_ARGUMENT,
                   "has K = 256 columns but model \"kserve-u4\" takes K = 128");
}

TEST_F(KServeBadInputTest, ByteCountNotMatchingTheShape) {
  inference::ModelInferRequest request = Good();
  request.mutable_raw_input_contents(0)->pop_back();
  ExpectInferError(request, grpc::StatusCode::INVALID_ARGUMENT,
                   "raw_input_contents[0] has 1023 bytes");
  inference::ModelInferRequest half = Good();
  half.mutable_inputs(0)->set_datatype("FP16");  // FP32 bytes: twice too many
  ExpectInferError(half, grpc::StatusCode::INVALID_ARGUMENT,
                   "raw_input_contents[0] has 1024 bytes");
}

TEST_F(KServeBadInputTest, BothRawAndContents) {
  inference::ModelInferRequest request = Good();
  for (float value : a_.floats) {
    request.mutable_inputs(0)->mutable_contents()->add_fp32_contents(value);
  }
  ExpectInferError(request, grpc::StatusCode::INVALID_ARGUMENT,
                   "both in raw_input_contents and in contents");
}

TEST_F(KServeBadInputTest, NoDataOrDataInTheWrongList) {
  ExpectInferError(InferRequest("FP32", 2), grpc::StatusCode::INVALID_ARGUMENT,
                   "has no data");
  inference::ModelInferRequest half = InferRequest("FP16", 2);
  for (float value : a_.floats) {
    half.mutable_inputs(0)->mutable_contents()->add_fp32_contents(value);
  }
  ExpectInferError(half, grpc::StatusCode::INVALID_ARGUMENT,
                   "send it in raw_input_contents");
  inference::ModelInferRequest too_few = InferRequest("FP32", 2);
  for (size_t i = 1; i < a_.floats.size(); ++i) {
    too_few.mutable_inputs(0)->mutable_contents()->add_fp32_contents(
        a_.floats[i]);
  }
  ExpectInferError(too_few, grpc::StatusCode::INVALID_ARGUMENT,
                   "has 255 values but shape [2, 128] needs 2 x 128");
}

TEST_F(KServeBadInputTest, UnknownRequestedOutput) {
  inference::ModelInferRequest request = Good();
  request.add_outputs()->set_name("OUTPUT0");
  ExpectInferError(request, grpc::StatusCode::INVALID_ARGUMENT,
                   "requested output \"OUTPUT0\" is unknown");
}

}  // namespace
}  // namespace nibble
