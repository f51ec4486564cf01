// Calls a real nibbled the way Triton's clients do: every method by Triton's
// name (/inference.GRPCInferenceService/...), with messages written from
// Triton's published proto (triton_fixture.proto), not nibble's. Covers
// ModelConfig, ModelStatistics, RepositoryIndex, RepositoryModelLoad and
// Unload, and ModelStreamInfer against the float64 reference, with their
// error cases and --auth_token_file. Weights are uploaded through nibble.v1,
// as a deployment would.
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/client_unary_call.h"
#include "grpcpp/support/sync_stream.h"
#include "gtest/gtest.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/activations.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"
#include "tests/integration/upload_messages.h"
#include "triton_fixture.pb.h"

namespace nibble {
namespace {

using ::nibble::testing::Activations;
using ::nibble::testing::KServeErrorBound;
using ::nibble::testing::OutputValues;
using ::nibble::testing::RandomActivations;
using ::nibble::testing::UploadWeight;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

namespace triton = ::triton_fixture;

constexpr char kModel[] = "triton-u4";
constexpr uint64_t kWeightSeed = 7301;
const WeightSpec kSpec{WeightFormat::kU4, 128, 40, 32};
constexpr int64_t kMaxBatchRows = 48;

const QuantizedWeight& Weight() {
  static const QuantizedWeight* weight =
      new QuantizedWeight(RandomQuantizedWeight(kSpec, kWeightSeed));
  return *weight;
}

std::string MethodPath(const std::string& method) {
  return "/inference.GRPCInferenceService/" + method;
}

// A Triton client: unary calls and ModelStreamInfer by method name.
class TritonClient {
 public:
  explicit TritonClient(const std::string& target, std::string token = "")
      : channel_(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials())),
        token_(std::move(token)) {}

  template <typename Request, typename Response>
  grpc::Status Call(const std::string& method, const Request& request,
                    Response* response) {
    grpc::ClientContext context;
    Authorize(context);
    const std::string path = MethodPath(method);
    const grpc::internal::RpcMethod rpc(path.c_str(),
                                        grpc::internal::RpcMethod::NORMAL_RPC);
    return grpc::internal::BlockingUnaryCall<Request, Response,
                                             google::protobuf::MessageLite,
                                             google::protobuf::MessageLite>(
        channel_.get(), rpc, &context, request, response);
  }

  // Writes `requests` on one ModelStreamInfer call, half-closes, and reads
  // every reply until the server ends the stream, whose status it returns.
  grpc::Status Stream(const std::vector<triton::ModelInferRequest>& requests,
                      std::vector<triton::ModelStreamInferResponse>* replies) {
    grpc::ClientContext context;
    Authorize(context);
    const std::string path = MethodPath("ModelStreamInfer");
    const grpc::internal::RpcMethod rpc(
        path.c_str(), grpc::internal::RpcMethod::BIDI_STREAMING);
    std::unique_ptr<grpc::ClientReaderWriter<triton::ModelInferRequest,
                                             triton::ModelStreamInferResponse>>
        stream(grpc::internal::ClientReaderWriterFactory<
               triton::ModelInferRequest,
               triton::ModelStreamInferResponse>::Create(channel_.get(), rpc,
                                                         &context));
    for (const auto& request : requests) {
      if (!stream->Write(request)) break;
    }
    stream->WritesDone();
    triton::ModelStreamInferResponse reply;
    while (stream->Read(&reply)) replies->push_back(reply);
    return stream->Finish();
  }

  triton::ModelConfigResponse Config(const std::string& name,
                                     grpc::Status* status) {
    triton::ModelConfigRequest request;
    request.set_name(name);
    triton::ModelConfigResponse response;
    *status = Call("ModelConfig", request, &response);
    return response;
  }

 private:
  void Authorize(grpc::ClientContext& context) const {
    if (!token_.empty()) {
      context.AddMetadata("authorization", "Bearer " + token_);
    }
  }

  std::shared_ptr<grpc::Channel> channel_;
  std::string token_;
};

// Model `model`, input "a" [m, K] FP32 holding `a` as raw bytes.
triton::ModelInferRequest InferRequest(const std::string& model,
                                       const std::string& id,
                                       const Activations& a, int64_t m) {
  triton::ModelInferRequest request;
  request.set_model_name(model);
  request.set_id(id);
  auto* input = request.add_inputs();
  input->set_name("a");
  input->set_datatype("FP32");
  input->add_shape(m);
  input->add_shape(kSpec.k);
  request.add_raw_input_contents(a.bytes);
  return request;
}

grpc::Status Upload(const std::string& target, const std::string& name,
                    const QuantizedWeight& weight) {
  auto stub = v1::NibbleService::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  return UploadWeight(*stub, name, weight);
}

class TritonTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(
            NIBBLED_PATH,
            {"--threads=2", absl::StrCat("--max_batch_rows=", kMaxBatchRows),
             "--max_batch_delay_us=250"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    const grpc::Status status = Upload(server_->target(), kModel, Weight());
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << "nibbled did not exit cleanly";
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }
  void TearDown() override {
    EXPECT_TRUE(server_->Running()) << "nibbled died during the test";
  }

  TritonClient client() const { return TritonClient(server_->target()); }

  static testing::NibbledProcess* server_;
};

testing::NibbledProcess* TritonTest::server_ = nullptr;

TEST_F(TritonTest, ModelConfigDescribesTheWeightAndTheBatching) {
  grpc::Status status;
  const triton::ModelConfig config = client().Config(kModel, &status).config();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(config.name(), kModel);
  EXPECT_EQ(config.platform(), "nibble");
  EXPECT_EQ(config.backend(), "nibble");
  EXPECT_EQ(config.max_batch_size(), kMaxBatchRows);
  ASSERT_EQ(config.input_size(), 1);
  EXPECT_EQ(config.input(0).name(), "a");
  EXPECT_EQ(config.input(0).data_type(), triton::TYPE_FP32);
  EXPECT_THAT(config.input(0).dims(), ElementsAre(kSpec.k));
  ASSERT_EQ(config.output_size(), 1);
  EXPECT_EQ(config.output(0).name(), "c");
  EXPECT_EQ(config.output(0).data_type(), triton::TYPE_FP32);
  EXPECT_THAT(config.output(0).dims(), ElementsAre(kSpec.n));
  EXPECT_EQ(config.dynamic_batching().max_queue_delay_microseconds(), 250u);
  EXPECT_EQ(config.parameters().at("format").string_value(), "u4");
  EXPECT_EQ(config.parameters().at("group_size").string_value(), "32");
}

TEST_F(TritonTest, ModelConfigOfAnUnknownModelOrVersionIsNotFound) {
  grpc::Status status;
  client().Config("no-such-model", &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("no-such-model"));

  triton::ModelConfigRequest request;
  request.set_name(kModel);
  request.set_version("2");
  triton::ModelConfigResponse response;
  status = client().Call("ModelConfig", request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("no version \"2\""));
}

TEST_F(TritonTest, RepositoryIndexListsEveryWeightReady) {
  std::vector<std::string> names = {kModel};
  for (int i = 0; i < 3; ++i) {
    names.push_back(absl::StrCat("index-", i));
    ASSERT_TRUE(Upload(server_->target(), names.back(), Weight()).ok());
  }
  triton::RepositoryIndexRequest request;
  request.set_ready(true);
  triton::RepositoryIndexResponse response;
  const grpc::Status status =
      client().Call("RepositoryIndex", request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> listed;
  for (const auto& model : response.models()) {
    if (model.name() != kModel && model.name().rfind("index-", 0) != 0) {
      continue;  // uploaded by other tests of the suite
    }
    listed.push_back(model.name());
    EXPECT_EQ(model.version(), "1") << model.name();
    EXPECT_EQ(model.state(), "READY") << model.name();
    EXPECT_EQ(model.reason(), "") << model.name();
  }
  EXPECT_THAT(listed,
              UnorderedElementsAre(names[0], names[1], names[2], names[3]));

  request.set_repository_name("elsewhere");
  const grpc::Status named =
      client().Call("RepositoryIndex", request, &response);
  EXPECT_EQ(named.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(named.error_message(), HasSubstr("leave repository_name empty"));
}

TEST_F(TritonTest, StreamInferAnswersEveryRequestAndItsErrorsInTheStream) {
  constexpr uint64_t kSeed = 7310;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  std::vector<triton::ModelInferRequest> requests;
  std::map<std::string, std::pair<Activations, int64_t>> sent;
  std::map<std::string, std::string> bad;  // id -> what the error says
  for (int i = 0; i < 12; ++i) {
    const std::string id = absl::StrCat("req-", i);
    if (i % 4 == 1) {
      const Activations a = RandomActivations(1, kSpec.k, DType::kF32, kSeed);
      requests.push_back(InferRequest("no-such-model", id, a, 1));
      bad[id] = "no-such-model";
    } else if (i % 4 == 3) {
      const Activations a = RandomActivations(1, kSpec.k, DType::kF32, kSeed);
      triton::ModelInferRequest request = InferRequest(kModel, id, a, 1);
      request.mutable_inputs(0)->set_shape(1, kSpec.k + 8);
      requests.push_back(request);
      bad[id] = "K = 136 columns";
    } else {
      const int64_t m = 1 + i % 5;
      const Activations a =
          RandomActivations(m, kSpec.k, DType::kF32, kSeed + i);
      requests.push_back(InferRequest(kModel, id, a, m));
      sent.emplace(id, std::make_pair(a, m));
    }
  }
  std::vector<triton::ModelStreamInferResponse> replies;
  const grpc::Status status = client().Stream(requests, &replies);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(replies.size(), requests.size());
  int answered = 0;
  int failed = 0;
  for (const auto& reply : replies) {
    const std::string& id = reply.infer_response().id();
    SCOPED_TRACE(id);
    if (bad.contains(id)) {
      ++failed;
      EXPECT_THAT(reply.error_message(), HasSubstr(bad[id]));
      continue;
    }
    ASSERT_TRUE(sent.contains(id));
    ++answered;
    EXPECT_EQ(reply.error_message(), "");
    const auto& [a, m] = sent.at(id);
    const triton::ModelInferResponse& response = reply.infer_response();
    EXPECT_EQ(response.model_name(), kModel);
    ASSERT_EQ(response.outputs_size(), 1);
    EXPECT_EQ(response.outputs(0).name(), "c");
    EXPECT_EQ(response.outputs(0).datatype(), "FP32");
    EXPECT_THAT(response.outputs(0).shape(), ElementsAre(m, kSpec.n));
    ASSERT_EQ(response.raw_output_contents_size(), 1);
    EXPECT_LE(MaxRelativeError(
                  OutputValues(response.raw_output_contents(0), DType::kF32),
                  ReferenceMatmul(a.values, m, Weight())),
              KServeErrorBound(response, DType::kF32));
  }
  EXPECT_EQ(answered, static_cast<int>(sent.size()));
  EXPECT_EQ(failed, static_cast<int>(bad.size()));
}

TEST_F(TritonTest, ModelStatisticsCountTheBatcherRuns) {
  constexpr char kCounted[] = "stats-u4";
  ASSERT_TRUE(Upload(server_->target(), kCounted, Weight()).ok());
  TritonClient triton = client();
  triton::ModelStatisticsRequest request;
  request.set_name(kCounted);
  triton::ModelStatisticsResponse response;
  grpc::Status status = triton.Call("ModelStatistics", request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.model_stats_size(), 1);
  EXPECT_EQ(response.model_stats(0).name(), kCounted);
  EXPECT_EQ(response.model_stats(0).version(), "1");
  EXPECT_EQ(response.model_stats(0).inference_count(), 0u);
  EXPECT_EQ(response.model_stats(0).last_inference(), 0u);

  constexpr int kRequests = 3;
  constexpr int64_t kRows = 2;
  for (int i = 0; i < kRequests; ++i) {
    const Activations a =
        RandomActivations(kRows, kSpec.k, DType::kF32, 7320 + i);
    triton::ModelInferResponse infer;
    status = triton.Call("ModelInfer", InferRequest(kCounted, "s", a, kRows),
                         &infer);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  response.Clear();
  status = triton.Call("ModelStatistics", request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.model_stats_size(), 1);
  const triton::ModelStatistics& stats = response.model_stats(0);
  EXPECT_EQ(stats.inference_count(), kRequests * kRows);
  EXPECT_GE(stats.execution_count(), 1u);
  EXPECT_LE(stats.execution_count(), static_cast<uint64_t>(kRequests));
  EXPECT_GT(stats.last_inference(), 0u);
  EXPECT_EQ(stats.inference_stats().success().count(), kRequests);
  EXPECT_EQ(stats.inference_stats().fail().count(), 0u);
  EXPECT_EQ(stats.inference_stats().queue().count(), kRequests);
  EXPECT_EQ(stats.inference_stats().compute_infer().count(), kRequests);
  EXPECT_GT(stats.inference_stats().compute_infer().ns(), 0u);
  EXPECT_GE(stats.inference_stats().success().ns(),
            stats.inference_stats().compute_infer().ns());
  uint64_t rows = 0;
  uint64_t executions = 0;
  for (const auto& batch : stats.batch_stats()) {
    rows += batch.batch_size() * batch.compute_infer().count();
    executions += batch.compute_infer().count();
  }
  EXPECT_EQ(rows, kRequests * kRows);
  EXPECT_EQ(executions, stats.execution_count());

  // Every model for an empty name.
  triton::ModelStatisticsRequest all;
  response.Clear();
  status = triton.Call("ModelStatistics", all, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<std::string> names;
  for (const auto& model : response.model_stats())
    names.push_back(model.name());
  EXPECT_THAT(names, ::testing::IsSupersetOf(
                         {std::string(kModel), std::string(kCounted)}));

  request.set_name("no-such-model");
  status = triton.Call("ModelStatistics", request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(TritonTest, UnloadDeletesAndLoadWithoutDataDirIsRefused) {
  constexpr char kGone[] = "unload-u4";
  ASSERT_TRUE(Upload(server_->target(), kGone, Weight()).ok());
  TritonClient triton = client();
  triton::RepositoryModelLoadRequest load;
  load.set_model_name(kGone);
  triton::RepositoryModelLoadResponse loaded;
  grpc::Status status = triton.Call("RepositoryModelLoad", load, &loaded);
  EXPECT_TRUE(status.ok()) << "a resident model is loaded already: "
                           << status.error_message();

  (*load.mutable_parameters())["config"].set_string_param("{}");
  status = triton.Call("RepositoryModelLoad", load, &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(), HasSubstr("\"config\""));

  triton::RepositoryModelUnloadRequest unload;
  unload.set_model_name(kGone);
  triton::RepositoryModelUnloadResponse unloaded;
  status = triton.Call("RepositoryModelUnload", unload, &unloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  triton.Config(kGone, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  status = triton.Call("RepositoryModelUnload", unload, &unloaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);

  load.clear_parameters();
  status = triton.Call("RepositoryModelLoad", load, &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("no --data_dir"));
  EXPECT_THAT(status.error_message(), HasSubstr("UploadWeight"));
}

TEST_F(TritonTest, MethodsTritonHasButNibbledDoesNotServeAreUnimplemented) {
  triton::ModelConfigRequest request;
  triton::ModelConfigResponse response;
  const grpc::Status status =
      client().Call("SystemSharedMemoryStatus", request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

// Load reads the weight's file from --data_dir; unload deletes it there.
TEST(TritonRepositoryTest, LoadReadsDataDirAndUnloadDeletesTheFile) {
  const std::string first_dir = testing::FreshDirectory("first");
  const std::string dir = testing::FreshDirectory("repository");
  constexpr char kName[] = "from-disk";
  {
    // A file written by another nibbled, as an operator would copy it over.
    auto server = testing::StartNibbledLoggingTo(
        NIBBLED_PATH, first_dir + ".stderr", {"--data_dir=" + first_dir});
    ASSERT_TRUE(server.ok()) << server.status();
    ASSERT_TRUE(Upload((*server)->target(), kName, Weight()).ok());
    EXPECT_EQ((*server)->Stop(), 0);
  }
  auto server = testing::StartNibbledLoggingTo(NIBBLED_PATH, dir + ".stderr",
                                               {"--data_dir=" + dir});
  ASSERT_TRUE(server.ok()) << server.status();
  TritonClient triton((*server)->target());
  triton::RepositoryModelLoadRequest load;
  load.set_model_name(kName);
  triton::RepositoryModelLoadResponse loaded;
  grpc::Status status = triton.Call("RepositoryModelLoad", load, &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(), HasSubstr("has no file in --data_dir"));

  const std::string file = absl::StrCat(kName, ".nibble");
  // A file must be named after the weight in it.
  std::filesystem::copy_file(first_dir + "/" + file, dir + "/renamed.nibble");
  load.set_model_name("renamed");
  status = triton.Call("RepositoryModelLoad", load, &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(status.error_message(), HasSubstr("holds weight \"from-disk\""));
  // No name outside the directory.
  load.set_model_name("../first/from-disk");
  status = triton.Call("RepositoryModelLoad", load, &loaded);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  load.set_model_name(kName);
  std::filesystem::copy_file(first_dir + "/" + file, dir + "/" + file);
  status = triton.Call("RepositoryModelLoad", load, &loaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  triton.Config(kName, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
  const Activations a = RandomActivations(3, kSpec.k, DType::kF32, 7330);
  triton::ModelInferResponse infer;
  status = triton.Call("ModelInfer", InferRequest(kName, "d", a, 3), &infer);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_LE(
      MaxRelativeError(OutputValues(infer.raw_output_contents(0), DType::kF32),
                       ReferenceMatmul(a.values, 3, Weight())),
      KServeErrorBound(infer, DType::kF32));

  triton::RepositoryModelUnloadRequest unload;
  unload.set_model_name(kName);
  triton::RepositoryModelUnloadResponse unloaded;
  status = triton.Call("RepositoryModelUnload", unload, &unloaded);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_FALSE(std::filesystem::exists(dir + "/" + file));
  EXPECT_EQ((*server)->Stop(), 0);
}

// Every Triton RPC needs the token, as the KServe ones do.
TEST(TritonAuthTest, EveryMethodNeedsTheToken) {
  const std::string dir = testing::FreshDirectory("auth");
  std::filesystem::create_directories(dir);
  const std::string tokens = dir + "/tokens";
  testing::WriteFile(tokens, "triton-token\n");
  auto server = testing::StartNibbledLoggingTo(NIBBLED_PATH, dir + "/stderr",
                                               {"--auth_token_file=" + tokens});
  ASSERT_TRUE(server.ok()) << server.status();
  TritonClient anonymous((*server)->target());
  TritonClient holder((*server)->target(), "triton-token");

  const auto expect_refused = [](const grpc::Status& status) {
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << status.error_message();
  };
  grpc::Status status;
  anonymous.Config(kModel, &status);
  expect_refused(status);
  holder.Config(kModel, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
      << "the token lets the call through to the model lookup";

  triton::ModelStatisticsResponse statistics;
  expect_refused(anonymous.Call("ModelStatistics",
                                triton::ModelStatisticsRequest(), &statistics));
  EXPECT_TRUE(holder
                  .Call("ModelStatistics", triton::ModelStatisticsRequest(),
                        &statistics)
                  .ok());
  triton::RepositoryIndexResponse index;
  expect_refused(anonymous.Call("RepositoryIndex",
                                triton::RepositoryIndexRequest(), &index));
  EXPECT_TRUE(
      holder.Call("RepositoryIndex", triton::RepositoryIndexRequest(), &index)
          .ok());
  triton::RepositoryModelLoadRequest load;
  load.set_model_name(kModel);
  triton::RepositoryModelLoadResponse loaded;
  expect_refused(anonymous.Call("RepositoryModelLoad", load, &loaded));
  triton::RepositoryModelUnloadRequest unload;
  unload.set_model_name(kModel);
  triton::RepositoryModelUnloadResponse unloaded;
  expect_refused(anonymous.Call("RepositoryModelUnload", unload, &unloaded));

  std::vector<triton::ModelStreamInferResponse> replies;
  const Activations a = RandomActivations(1, kSpec.k, DType::kF32, 7340);
  expect_refused(anonymous.Stream({InferRequest(kModel, "x", a, 1)}, &replies));
  EXPECT_TRUE(replies.empty());
  EXPECT_EQ((*server)->Stop(), 0);
}

// With --auth_writes_only, reads are open and Load and Unload still need the
// token, like uploads and deletes.
TEST(TritonAuthTest, WritesOnlyLeavesReadsOpenAndGuardsTheRepository) {
  const std::string dir = testing::FreshDirectory("writes-only");
  std::filesystem::create_directories(dir);
  const std::string tokens = dir + "/tokens";
  testing::WriteFile(tokens, "triton-token\n");
  auto server = testing::StartNibbledLoggingTo(
      NIBBLED_PATH, dir + "/stderr",
      {"--auth_token_file=" + tokens, "--auth_writes_only"});
  ASSERT_TRUE(server.ok()) << server.status();
  TritonClient anonymous((*server)->target());

  triton::RepositoryIndexResponse index;
  EXPECT_TRUE(
      anonymous
          .Call("RepositoryIndex", triton::RepositoryIndexRequest(), &index)
          .ok());
  triton::ModelStatisticsResponse statistics;
  EXPECT_TRUE(anonymous
                  .Call("ModelStatistics", triton::ModelStatisticsRequest(),
                        &statistics)
                  .ok());
  triton::RepositoryModelLoadRequest load;
  load.set_model_name(kModel);
  triton::RepositoryModelLoadResponse loaded;
  EXPECT_EQ(anonymous.Call("RepositoryModelLoad", load, &loaded).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  triton::RepositoryModelUnloadRequest unload;
  unload.set_model_name(kModel);
  triton::RepositoryModelUnloadResponse unloaded;
  EXPECT_EQ(
      anonymous.Call("RepositoryModelUnload", unload, &unloaded).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ((*server)->Stop(), 0);
}

}  // namespace
}  // namespace nibble
