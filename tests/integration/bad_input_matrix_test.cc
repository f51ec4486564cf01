// The bad-input matrix: for every RPC of nibble.v1, of
// KServe v2 and of health, requests that are empty, truncated, oversized,
// mismatched or hostile, against one real nibbled. Each row expects the status
// code and a message that tells the caller what to fix; after each row a good
// Matmul still matches the float64 reference and health is still SERVING.
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/proto_conversions.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "google/protobuf/message_lite.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/activations.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"
#include "tests/integration/upload_messages.h"
#include "tests/integration/weight_client.h"

namespace nibble {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::nibble::testing::Bytes;
using ::nibble::testing::OutputValues;
using ::nibble::testing::RandomActivations;
using ::nibble::testing::UploadHeader;
using ::nibble::testing::UploadMessages;
using ::testing::HasSubstr;

// Small limits, so that rows past them are cheap; the message limit still
// takes the 100,000-character names, which must reach nibbled itself.
constexpr int kMaxMessageBytes = 256 << 10;
constexpr int64_t kMaxRequestRows = 64;
constexpr int64_t kMaxWeightBytes = 16 << 20;

// The resident weight every row's aftermath is checked on.
constexpr char kGood[] = "good";
const WeightSpec kSpec{WeightFormat::kU4b8, 64, 16, 32};
constexpr uint64_t kGoodWeightSeed = 9001;
// Rows of the good activations.
constexpr int64_t kM = 8;
constexpr uint64_t kGoodActivationsSeed = 9002;
// The weight that bad uploads start from.
constexpr uint64_t kUploadSeed = 9003;

// 2^20 + 8: a multiple of 8 and of every group size, just past the limit.
constexpr int64_t kAboveMaxDimension = kMaxDimension + 8;
// M such that M * K * 4 bytes overflows 64 bits.
constexpr int64_t kOverflowingM = int64_t{1} << 61;

// A [m, k] of random f32 values, as the wire carries them.
std::string RandomABytes(int64_t m, int64_t k, uint64_t seed) {
  return RandomActivations(m, k, DType::kF32, seed).bytes;
}

const QuantizedWeight& GoodWeight() {
  static const QuantizedWeight* weight =
      new QuantizedWeight(RandomQuantizedWeight(kSpec, kGoodWeightSeed));
  return *weight;
}

v1::MatmulRequest GoodMatmul() {
  v1::MatmulRequest request;
  request.set_weight_name(kGood);
  request.set_m(kM);
  request.set_dtype(v1::DTYPE_F32);
  request.set_a(RandomABytes(kM, kSpec.k, kGoodActivationsSeed));
  return request;
}

// ModelInfer of the good weight, input "a" FP32 [kM, K] in raw bytes.
inference::ModelInferRequest GoodInfer() {
  inference::ModelInferRequest request;
  request.set_model_name(kGood);
  auto* input = request.add_inputs();
  input->set_name("a");
  input->set_datatype("FP32");
  input->add_shape(kM);
  input->add_shape(kSpec.k);
  request.add_raw_input_contents(
      RandomABytes(kM, kSpec.k, kGoodActivationsSeed));
  return request;
}

// The messages of a complete upload under `name` of a fresh random weight.
std::vector<v1::UploadWeightRequest> GoodUpload(const std::string& name) {
  return UploadMessages(name, RandomQuantizedWeight(kSpec, kUploadSeed));
}

template <typename Message, typename Edit>
Message Edited(Message message, Edit edit) {
  edit(message);
  return message;
}

// Grows `field`, a string or bytes field of `message`, with repeats of
// `fill` until `message` is one byte over --max_message_bytes.
void GrowToOneByteOverTheLimit(const google::protobuf::MessageLite& message,
                               std::string& field, const std::string& fill) {
  const auto missing_bytes = [&] {
    return kMaxMessageBytes + 1 - static_cast<int64_t>(message.ByteSizeLong());
  };
  for (int64_t missing = missing_bytes(); missing != 0;
       missing = missing_bytes()) {
    const size_t old_size = field.size();
    field.resize(old_size + missing);
    for (size_t i = old_size; i < field.size(); ++i) {
      field[i] = fill[i % fill.size()];
    }
  }
}

// A name one byte over the message limit once in its request.
template <typename Request>
Request WithNameOneByteOverTheLimit(Request request,
                                    std::string* (Request::*mutable_name)()) {
  GrowToOneByteOverTheLimit(request, *(request.*mutable_name)(), "name");
  return request;
}

// What gRPC answers for a message past --max_message_bytes.
constexpr char kTooLarge[] = "Received message larger than max";

// One client of each service, on one channel.
struct Clients {
  explicit Clients(const std::string& target)
      : channel(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials())),
        nibble(v1::NibbleService::NewStub(channel)),
        kserve(inference::GRPCInferenceService::NewStub(channel)),
        health(grpc::health::v1::Health::NewStub(channel)),
        weights(target) {}

  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::NibbleService::Stub> nibble;
  std::unique_ptr<inference::GRPCInferenceService::Stub> kserve;
  std::unique_ptr<grpc::health::v1::Health::Stub> health;
  testing::WeightClient weights;
};

grpc::Status Upload(Clients& clients,
                    const std::vector<v1::UploadWeightRequest>& messages) {
  return testing::UploadWeight(*clients.nibble, messages);
}

grpc::Status GetWeight(Clients& clients, const std::string& name) {
  v1::GetWeightRequest request;
  request.set_name(name);
  grpc::ClientContext context;
  v1::WeightInfo info;
  return clients.nibble->GetWeight(&context, request, &info);
}

grpc::Status Matmul(Clients& clients, const v1::MatmulRequest& request) {
  grpc::ClientContext context;
  v1::MatmulResponse response;
  return clients.nibble->Matmul(&context, request, &response);
}

// One request over a MatmulStream; a failed request is answered inside the
// stream, so its error becomes the status here.
grpc::Status MatmulStream(Clients& clients,
                          const v1::MatmulStreamRequest& request) {
  grpc::ClientContext context;
  auto stream = clients.nibble->MatmulStream(&context);
  stream->Write(request);
  stream->WritesDone();
  v1::MatmulStreamResponse reply;
  const bool replied = stream->Read(&reply);
  const grpc::Status status = stream->Finish();
  if (!status.ok()) return status;
  EXPECT_TRUE(replied) << "the stream ended without answering";
  EXPECT_EQ(reply.id(), request.id());
  if (!reply.has_error()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(reply.error().code()),
                      reply.error().message());
}

v1::MatmulStreamRequest StreamRequest(const v1::MatmulRequest& request) {
  v1::MatmulStreamRequest stream_request;
  stream_request.set_id(7);
  *stream_request.mutable_request() = request;
  return stream_request;
}

grpc::Status Infer(Clients& clients,
                   const inference::ModelInferRequest& request) {
  grpc::ClientContext context;
  inference::ModelInferResponse response;
  return clients.kserve->ModelInfer(&context, request, &response);
}

grpc::Status ModelMetadata(Clients& clients,
                           const inference::ModelMetadataRequest& request) {
  grpc::ClientContext context;
  inference::ModelMetadataResponse response;
  return clients.kserve->ModelMetadata(&context, request, &response);
}

inference::ModelMetadataRequest MetadataRequestFor(const std::string& name,
                                                   const std::string& version) {
  inference::ModelMetadataRequest request;
  request.set_name(name);
  request.set_version(version);
  return request;
}

// ModelReady answers an unknown model with OK and ready=false, as KServe v2
// says; the answer becomes the message, so that rows compare it.
grpc::Status ModelReady(Clients& clients,
                        const inference::ModelReadyRequest& request) {
  grpc::ClientContext context;
  inference::ModelReadyResponse response;
  const grpc::Status status =
      clients.kserve->ModelReady(&context, request, &response);
  if (!status.ok()) return status;
  return grpc::Status(grpc::StatusCode::OK,
                      response.ready() ? "ready" : "not ready");
}

inference::ModelReadyRequest ReadyRequestFor(const std::string& name,
                                             const std::string& version) {
  inference::ModelReadyRequest request;
  request.set_name(name);
  request.set_version(version);
  return request;
}

// Health answers a known service with OK and its serving status, which
// becomes the message, as for ModelReady.
grpc::Status HealthCheck(Clients& clients, const HealthCheckRequest& request) {
  grpc::ClientContext context;
  HealthCheckResponse response;
  const grpc::Status status =
      clients.health->Check(&context, request, &response);
  if (!status.ok()) return status;
  return grpc::Status(
      grpc::StatusCode::OK,
      HealthCheckResponse::ServingStatus_Name(response.status()));
}

grpc::Status HealthCheck(Clients& clients, const std::string& service) {
  HealthCheckRequest request;
  request.set_service(service);
  return HealthCheck(clients, request);
}

// One row of the matrix.
struct BadInput {
  // RPC_Category_WhatIsWrong; the test's name.
  std::string name;
  std::function<grpc::Status(Clients&)> call;
  grpc::StatusCode code;
  // Part of the message that says what to fix.
  std::string message;
};

void PrintTo(const BadInput& row, std::ostream* os) { *os << row.name; }

// Names no weight may have; lookups by them must find nothing.
struct HostileName {
  std::string case_name;
  std::string name;
};

std::vector<HostileName> HostileNames() {
  return {{"DotDotSlash", "../x"},
          {"EtcPasswd", "/etc/passwd"},
          {"Nul", std::string("nul\0name", 8)},
          {"100000Chars", std::string(100'000, 'x')}};
}

// The end of the NOT_FOUND message for a name no upload could create: the
// rule, not the advice to upload it.
constexpr char kNoSuchNameCanExist[] =
    "1 to 128 characters from [A-Za-z0-9._-], not starting with '.'";

std::vector<BadInput> UploadRows() {
  using grpc::StatusCode::ALREADY_EXISTS;
  using grpc::StatusCode::INVALID_ARGUMENT;
  using grpc::StatusCode::RESOURCE_EXHAUSTED;
  const auto header = [](const std::string& name, WeightSpec spec) {
    return std::vector<v1::UploadWeightRequest>{UploadHeader(name, spec)};
  };
  const auto with_scale = [](uint16_t bits, const WeightSpec& spec = kSpec) {
    QuantizedWeight weight = RandomQuantizedWeight(spec, kUploadSeed);
    weight.scales[spec.n + 1] = bits;  // column 1 of group 1
    return UploadMessages("bad-scale", weight);
  };
  return {
      {"Upload_Empty_NoMessages", [](Clients& c) { return Upload(c, {}); },
       INVALID_ARGUMENT,
       "upload ended without a header: the first message must be the header"},
      {"Upload_Empty_DefaultHeader",
       [](Clients& c) {
         v1::UploadWeightRequest request;
         request.mutable_header();
         return Upload(c, {request});
       },
       INVALID_ARGUMENT,
       "weight format WEIGHT_FORMAT_UNSPECIFIED is not supported: use "
       "WEIGHT_FORMAT_FP4"},
      {"Upload_Empty_MessageWithoutPayload",
       [](Clients& c) { return Upload(c, {v1::UploadWeightRequest()}); },
       INVALID_ARGUMENT, "upload message has neither a header nor a chunk"},
      {"Upload_Empty_Name",
       [](Clients& c) { return Upload(c, GoodUpload("")); }, INVALID_ARGUMENT,
       "weight name is empty"},
      {"Upload_Empty_ChunkTensor",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("no-tensor"), [](auto& messages) {
                         messages[1].mutable_chunk()->clear_tensor();
                       }));
       },
       INVALID_ARGUMENT,
       "chunk names tensor 0: use WEIGHT_TENSOR_QWEIGHT, WEIGHT_TENSOR_SCALES "
       "or WEIGHT_TENSOR_ZEROS"},
      {"Upload_Truncated_HeaderOnly",
       [=](Clients& c) { return Upload(c, header("header-only", kSpec)); },
       INVALID_ARGUMENT,
       "upload of \"header-only\" ended early: 0 of 512 bytes of qweight "
       "arrived; nothing was stored"},
      {"Upload_Truncated_EndsBeforeScales",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("no-scales"),
                                 [](auto& messages) { messages.pop_back(); }));
       },
       INVALID_ARGUMENT,
       "upload of \"no-scales\" ended early: 0 of 64 bytes of scales"},
      {"Upload_Truncated_QweightOneByteShort",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("short-qweight"), [](auto& m) {
                         m[1].mutable_chunk()->mutable_data()->pop_back();
                       }));
       },
       INVALID_ARGUMENT,
       "upload sent scales before finishing qweight (511 of 512 bytes)"},
      {"Upload_Oversized_OneByteOverTheMessageLimit",
       [](Clients& c) {
         return Upload(
             c, Edited(GoodUpload("too-large"), [](auto& messages) {
               std::string& data = *messages[1].mutable_chunk()->mutable_data();
               GrowToOneByteOverTheLimit(messages[1], data, std::string(data));
             }));
       },
       RESOURCE_EXHAUSTED, kTooLarge},
      {"Upload_Oversized_KAboveTheLimit",
       [=](Clients& c) {
         return Upload(c, header("big-k", {WeightFormat::kU4b8,
                                           kAboveMaxDimension, 16, 32}));
       },
       INVALID_ARGUMENT,
       "weight dimensions must be at most 1048576, got k=1048584 n=16"},
      {"Upload_Oversized_NAboveTheLimit",
       [=](Clients& c) {
         return Upload(c, header("big-n", {WeightFormat::kU4b8, 64,
                                           kAboveMaxDimension, 32}));
       },
       INVALID_ARGUMENT,
       "weight dimensions must be at most 1048576, got k=64 n=1048584"},
      {"Upload_Oversized_KTimesNPastTheWeightBudget",
       [=](Clients& c) {
         return Upload(c, header("huge", {WeightFormat::kU4b8, kMaxDimension,
                                          kMaxDimension, 128}));
       },
       RESOURCE_EXHAUSTED, "raise --max_weight_bytes"},
      {"Upload_Oversized_ChunkPastItsTensor",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("long-qweight"), [](auto& m) {
                         m[1].mutable_chunk()->mutable_data()->append(
                             RandomABytes(8, 2, kUploadSeed));
                       }));
       },
       INVALID_ARGUMENT,
       "upload sent 576 bytes of qweight but u4b8 k=64 n=16 group=32 needs "
       "512"},
      {"Upload_Mismatched_ZerosForAFormatWithout",
       [](Clients& c) {
         return Upload(
             c, Edited(GoodUpload("extra-zeros"), [](auto& m) {
               v1::UploadWeightRequest zeros = m[1];
               zeros.mutable_chunk()->set_tensor(v1::WEIGHT_TENSOR_ZEROS);
               m.push_back(zeros);
             }));
       },
       INVALID_ARGUMENT, "upload sent zeros but format u4b8 has none"},
      {"Upload_Mismatched_ScalesBeforeQweight",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("disorder"),
                                 [](auto& m) { std::swap(m[1], m[2]); }));
       },
       INVALID_ARGUMENT,
       "upload sent scales before finishing qweight (0 of 512 bytes): send "
       "qweight, scales, zeros in that order"},
      {"Upload_Mismatched_ChunkOffsetWithAGap",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("gap"), [](auto& m) {
                         m[1].mutable_chunk()->set_offset(8);
                       }));
       },
       INVALID_ARGUMENT,
       "upload sent qweight bytes at offset 8 but 0 bytes have arrived: send "
       "chunks in order, without gaps or repeats"},
      {"Upload_Mismatched_RepeatedChunk",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("repeat"), [](auto& m) {
                         m.insert(m.begin() + 2, m[1]);
                       }));
       },
       INVALID_ARGUMENT,
       "upload sent qweight bytes at offset 0 but 512 bytes have arrived"},
      {"Upload_Mismatched_ChunkBeforeTheHeader",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("headless"),
                                 [](auto& m) { m.erase(m.begin()); }));
       },
       INVALID_ARGUMENT,
       "upload sent a chunk before the header: the first message must be the "
       "header"},
      {"Upload_Mismatched_SecondHeader",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("two-headers"), [](auto& m) {
                         m.insert(m.begin() + 1, m[0]);
                       }));
       },
       INVALID_ARGUMENT,
       "upload sent a second header: send one header, then chunks"},
      {"Upload_Mismatched_KNotAMultipleOfTheGroup",
       [=](Clients& c) {
         return Upload(c,
                       header("bad-group", {WeightFormat::kU4b8, 96, 16, 64}));
       },
       INVALID_ARGUMENT, "k=96 is not a multiple of the group size 64"},
      {"Upload_Mismatched_NameOfTheResidentWeight",
       [](Clients& c) { return Upload(c, GoodUpload(kGood)); }, ALREADY_EXISTS,
       "a weight named \"good\" already exists: delete it first or pick "
       "another name"},
      {"Upload_Hostile_NegativeK",
       [=](Clients& c) {
         return Upload(
             c, header("negative-k", {WeightFormat::kU4b8, -64, 16, 32}));
       },
       INVALID_ARGUMENT, "weight dimensions must be positive, got k=-64 n=16"},
      {"Upload_Hostile_NegativeGroupSize",
       [=](Clients& c) {
         return Upload(
             c, header("negative-group", {WeightFormat::kU4b8, 64, 16, -32}));
       },
       INVALID_ARGUMENT, "group size -32 is not supported: use 32, 64, 128"},
      {"Upload_Hostile_UnknownFormat",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("format-77"), [](auto& m) {
                         m[0].mutable_header()->set_format(
                             static_cast<v1::WeightFormat>(77));
                       }));
       },
       INVALID_ARGUMENT, "weight format 77 is not supported"},
      {"Upload_Hostile_UnknownCodeLayout",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("layout-9"), [](auto& m) {
                         m[0].mutable_header()->set_code_layout(
                             static_cast<v1::CodeLayout>(9));
                       }));
       },
       INVALID_ARGUMENT, "code layout 9 is not supported"},
      {"Upload_Invalid_ColumnLayoutOfAFormatWithout",
       [](Clients& c) {
         return Upload(
             c, Edited(GoodUpload("u4b8-columns"), [](auto& m) {
               m[0].mutable_header()->set_code_layout(v1::CODE_LAYOUT_COLUMNS);
             }));
       },
       INVALID_ARGUMENT,
       "code_layout COLUMNS is for mxfp4 and nvfp4 weights, not u4b8"},
      {"Upload_Hostile_NameDotDotSlash",
       [](Clients& c) { return Upload(c, GoodUpload("../x")); },
       INVALID_ARGUMENT, "weight name \"../x\" must not start with '.'"},
      {"Upload_Hostile_NameEtcPasswd",
       [](Clients& c) { return Upload(c, GoodUpload("/etc/passwd")); },
       INVALID_ARGUMENT,
       "weight name \"/etc/passwd\" may only contain letters, digits, '.', "
       "'_' and '-'"},
      {"Upload_Hostile_NameWithNul",
       [](Clients& c) {
         return Upload(c, GoodUpload(std::string("nul\0name", 8)));
       },
       INVALID_ARGUMENT, "weight name \"nul\\x00name\" may only contain"},
      {"Upload_Hostile_Name100000Chars",
       [](Clients& c) {
         return Upload(c, GoodUpload(std::string(100'000, 'x')));
       },
       INVALID_ARGUMENT,
       "weight name has 100000 characters, at most 128 are allowed"},
      {"Upload_Hostile_NanScale",
       [=](Clients& c) { return Upload(c, with_scale(0x7e00)); },
       INVALID_ARGUMENT,
       "scale of column 1, group 1 is NaN (fp16 bits 0x7e00): scales must be "
       "finite"},
      {"Upload_Hostile_InfiniteScale",
       [=](Clients& c) { return Upload(c, with_scale(0xfc00)); },
       INVALID_ARGUMENT,
       "scale of column 1, group 1 is infinite (fp16 bits 0xfc00): scales "
       "must be finite"},
      {"Upload_Mismatched_Mxfp4GroupOtherThan32",
       [=](Clients& c) {
         return Upload(c,
                       header("mx-group", {WeightFormat::kMxfp4, 64, 16, 64}));
       },
       INVALID_ARGUMENT,
       "mxfp4 has one scale per 32 values of k: its group size must be 32, "
       "got 64"},
      {"Upload_Mismatched_ActivationOrderOfTheWrongLength",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("short-order"), [](auto& m) {
                         for (int32_t column :
                              RandomActivationOrder(kSpec.k - 1, kUploadSeed)) {
                           m[0].mutable_header()->add_activation_order(column);
                         }
                       }));
       },
       INVALID_ARGUMENT,
       absl::StrCat("activation_order has ", kSpec.k - 1,
                    " entries for K=", kSpec.k)},
      {"Upload_Hostile_ActivationOrderRepeatsAColumn",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("repeated-order"), [](auto& m) {
                         std::vector<int32_t> order =
                             RandomActivationOrder(kSpec.k, kUploadSeed);
                         order[5] = order[2];
                         for (int32_t column : order) {
                           m[0].mutable_header()->add_activation_order(column);
                         }
                       }));
       },
       INVALID_ARGUMENT,
       absl::StrCat("activation_order[5] = ",
                    RandomActivationOrder(kSpec.k, kUploadSeed)[2],
                    " appears twice (also at 2): it must be a permutation of "
                    "0..K-1")},
      {"Upload_Mismatched_GlobalScaleOnU4b8",
       [](Clients& c) {
         return Upload(c, Edited(GoodUpload("u4b8-global"), [](auto& m) {
                         m[0].mutable_header()->set_global_scale(2.0f);
                       }));
       },
       INVALID_ARGUMENT,
       "a global scale (2) is only for nvfp4, not u4b8: leave it at 1"},
      {"Upload_Hostile_Nvfp4NanGlobalScale",
       [=](Clients& c) {
         return Upload(c, header("nv-nan", {WeightFormat::kNvfp4, 64, 16, 16,
                                            std::nanf("")}));
       },
       INVALID_ARGUMENT, "nvfp4's global scale must be finite and positive"},
      {"Upload_Hostile_Nvfp4NegativeGlobalScale",
       [=](Clients& c) {
         return Upload(c, header("nv-negative",
                                 {WeightFormat::kNvfp4, 64, 16, 16, -0.5f}));
       },
       INVALID_ARGUMENT,
       "nvfp4's global scale must be finite and positive, got -0.5"},
      {"Upload_Hostile_Mxfp4NanScale",
       [=](Clients& c) {
         return Upload(c, with_scale(0xff, {WeightFormat::kMxfp4, 64, 16, 32}));
       },
       INVALID_ARGUMENT,
       "scale of column 1, group 1 is NaN (E8M0 bits 0x00ff): scales must be "
       "finite, one 8-bit code in the low byte of each 16-bit slot"},
      {"Upload_Hostile_Nvfp4ScaleWiderThan8Bits",
       [=](Clients& c) {
         return Upload(
             c, with_scale(0x0138, {WeightFormat::kNvfp4, 64, 16, 16, 0.5f}));
       },
       INVALID_ARGUMENT,
       "scale of column 1, group 1 is wider than 8 bits (E4M3 bits 0x0138)"},
      {"Upload_Hostile_ZeroPointAbove15",
       [](Clients& c) {
         QuantizedWeight weight = RandomQuantizedWeight(
             {WeightFormat::kU4, 64, 16, 32}, kUploadSeed);
         weight.zeros[3] = 16;
         return Upload(c, UploadMessages("bad-zero", weight));
       },
       INVALID_ARGUMENT, "zero point 16 at index 3 is out of range 0..15"},
  };
}

// GetWeight and DeleteWeight take only a name.
std::vector<BadInput> NameOnlyRows(
    const std::string& rpc,
    std::function<grpc::Status(Clients&, const std::string&)> call) {
  using grpc::StatusCode::NOT_FOUND;
  std::vector<BadInput> rows = {
      {rpc + "_Empty_Name", [=](Clients& c) { return call(c, ""); }, NOT_FOUND,
       kNoSuchNameCanExist},
      // Both requests hold just the name, so one size fits both.
      {rpc + "_Oversized_OneByteOverTheMessageLimit",
       [=](Clients& c) {
         return call(
             c, WithNameOneByteOverTheLimit(v1::GetWeightRequest(),
                                            &v1::GetWeightRequest::mutable_name)
                    .name());
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, kTooLarge},
      {rpc + "_Mismatched_NameInOtherCase",
       [=](Clients& c) { return call(c, "GOOD"); }, NOT_FOUND,
       "no weight named \"GOOD\""},
  };
  for (const HostileName& hostile : HostileNames()) {
    rows.push_back({absl::StrCat(rpc, "_Hostile_Name", hostile.case_name),
                    [=](Clients& c) { return call(c, hostile.name); },
                    NOT_FOUND, kNoSuchNameCanExist});
  }
  return rows;
}

// Matmul and MatmulStream take the same MatmulRequest; their messages differ
// in size, so each makes its own one over the limit.
std::vector<BadInput> MatmulRows(
    const std::string& rpc,
    std::function<grpc::Status(Clients&, const v1::MatmulRequest&)> call,
    std::function<grpc::Status(Clients&)> one_byte_over_the_limit) {
  using grpc::StatusCode::INVALID_ARGUMENT;
  using grpc::StatusCode::NOT_FOUND;
  // Runs GoodMatmul() with `edit` applied.
  const auto edited = [=](std::function<void(v1::MatmulRequest&)> edit) {
    return [=](Clients& c) { return call(c, Edited(GoodMatmul(), edit)); };
  };
  std::vector<BadInput> rows = {
      {rpc + "_Empty_DefaultRequest",
       [=](Clients& c) { return call(c, v1::MatmulRequest()); },
       INVALID_ARGUMENT,
       "dtype DTYPE_UNSPECIFIED is not supported: use DTYPE_F32, DTYPE_F16 or "
       "DTYPE_BF16"},
      {rpc + "_Empty_WeightName",
       edited([](auto& r) { r.clear_weight_name(); }), NOT_FOUND,
       kNoSuchNameCanExist},
      {rpc + "_Empty_A", edited([](auto& r) { r.clear_a(); }), INVALID_ARGUMENT,
       "A has 0 bytes but m=8 rows of k=64 f32 values need 8 x 256 bytes"},
      {rpc + "_Empty_M", edited([](auto& r) { r.clear_m(); }), INVALID_ARGUMENT,
       "m=0: A needs at least one row"},
      {rpc + "_Truncated_AOneByteShort",
       edited([](auto& r) { r.mutable_a()->pop_back(); }), INVALID_ARGUMENT,
       "A has 2047 bytes but m=8 rows of k=64 f32 values need 8 x 256 bytes"},
      {rpc + "_Truncated_HalfTheRows",
       edited([](auto& r) { r.mutable_a()->resize(4 * 256); }),
       INVALID_ARGUMENT, "A has 1024 bytes but m=8 rows"},
      {rpc + "_Oversized_OneByteOverTheMessageLimit", one_byte_over_the_limit,
       grpc::StatusCode::RESOURCE_EXHAUSTED, kTooLarge},
      {rpc + "_Oversized_MoreRowsThanMaxRequestRows", edited([](auto& r) {
         r.set_m(72);
         r.set_a(RandomABytes(72, kSpec.k, kGoodActivationsSeed));
       }),
       INVALID_ARGUMENT,
       "M=72 rows is more than this server takes per request (64, nibbled "
       "--max_request_rows); split A into smaller requests"},
      {rpc + "_Oversized_MTimesKOverflows64Bits",
       edited([](auto& r) { r.set_m(kOverflowingM); }), INVALID_ARGUMENT,
       "A has 2048 bytes but m=2305843009213693952 rows of k=64 f32 values "
       "need"},
      {rpc + "_Oversized_KAboveTheLimit",
       edited([](auto& r) { r.set_k(kAboveMaxDimension); }), INVALID_ARGUMENT,
       "k=1048584 does not match weight \"good\", which has k=64"},
      {rpc + "_Mismatched_K", edited([](auto& r) { r.set_k(32); }),
       INVALID_ARGUMENT, "k=32 does not match weight \"good\", which has k=64"},
      {rpc + "_Mismatched_DtypeF16WithF32Bytes",
       edited([](auto& r) { r.set_dtype(v1::DTYPE_F16); }), INVALID_ARGUMENT,
       "A has 2048 bytes but m=8 rows of k=64 f16 values need 8 x 128 bytes"},
      {rpc + "_Mismatched_DtypeBf16WithF32Bytes",
       edited([](auto& r) { r.set_dtype(v1::DTYPE_BF16); }), INVALID_ARGUMENT,
       "A has 2048 bytes but m=8 rows of k=64 bf16 values need 8 x 128 bytes"},
      {rpc + "_Mismatched_UnknownDtype",
       edited([](auto& r) { r.set_dtype(static_cast<v1::DType>(77)); }),
       INVALID_ARGUMENT, "dtype 77 is not supported"},
      {rpc + "_Hostile_UnknownActivationPrecision", edited([](auto& r) {
         r.set_activation_precision(static_cast<v1::ActivationPrecision>(77));
       }),
       INVALID_ARGUMENT, "activation_precision 77 is not supported"},
      {rpc + "_Mismatched_BytesOfMoreRows", edited([](auto& r) {
         r.set_a(RandomABytes(16, kSpec.k, kGoodActivationsSeed));
       }),
       INVALID_ARGUMENT, "A has 4096 bytes but m=8 rows"},
      {rpc + "_Hostile_NegativeM", edited([](auto& r) { r.set_m(-1); }),
       INVALID_ARGUMENT, "m=-1: A needs at least one row"},
      {rpc + "_Hostile_MostNegativeM",
       edited([](auto& r) { r.set_m(std::numeric_limits<int64_t>::min()); }),
       INVALID_ARGUMENT, "m=-9223372036854775808: A needs at least one row"},
      {rpc + "_Hostile_NegativeK", edited([](auto& r) { r.set_k(-64); }),
       INVALID_ARGUMENT, "k=-64 does not match weight \"good\""},
  };
  for (const HostileName& hostile : HostileNames()) {
    rows.push_back({absl::StrCat(rpc, "_Hostile_WeightName", hostile.case_name),
                    edited([=](auto& r) { r.set_weight_name(hostile.name); }),
                    NOT_FOUND, kNoSuchNameCanExist});
  }
  return rows;
}

std::vector<BadInput> InferRows() {
  using grpc::StatusCode::INVALID_ARGUMENT;
  using grpc::StatusCode::NOT_FOUND;
  // Runs GoodInfer() with `edit` applied.
  const auto edited =
      [](std::function<void(inference::ModelInferRequest&)> edit) {
        return [=](Clients& c) { return Infer(c, Edited(GoodInfer(), edit)); };
      };
  // Moves the raw FP32 bytes of A into contents.fp32_contents.
  const auto to_fp32_contents = [](inference::ModelInferRequest& request) {
    const std::string raw = request.raw_input_contents(0);
    request.clear_raw_input_contents();
    auto* values =
        request.mutable_inputs(0)->mutable_contents()->mutable_fp32_contents();
    values->Resize(raw.size() / sizeof(float), 0.0f);
    std::memcpy(values->mutable_data(), raw.data(), raw.size());
  };
  std::vector<BadInput> rows = {
      {"ModelInfer_Empty_DefaultRequest",
       [](Clients& c) { return Infer(c, inference::ModelInferRequest()); },
       NOT_FOUND, kNoSuchNameCanExist},
      {"ModelInfer_Empty_NoInputs", edited([](auto& r) { r.clear_inputs(); }),
       INVALID_ARGUMENT,
       "the request has 0 inputs but model \"good\" takes exactly one, \"a\" "
       "[M, 64]"},
      {"ModelInfer_Empty_NoData",
       edited([](auto& r) { r.clear_raw_input_contents(); }), INVALID_ARGUMENT,
       "input \"a\" has no data: send its M x K elements in "
       "raw_input_contents[0]"},
      {"ModelInfer_Empty_Datatype",
       edited([](auto& r) { r.mutable_inputs(0)->clear_datatype(); }),
       INVALID_ARGUMENT,
       "datatype \"\" is not supported: use FP32, FP16 or BF16"},
      {"ModelInfer_Empty_Shape",
       edited([](auto& r) { r.mutable_inputs(0)->clear_shape(); }),
       INVALID_ARGUMENT,
       "input \"a\" has shape []; it must be 2-D, [M, 64], or 1-D, [64]"},
      {"ModelInfer_Truncated_RawOneByteShort",
       edited([](auto& r) { r.mutable_raw_input_contents(0)->pop_back(); }),
       INVALID_ARGUMENT,
       "raw_input_contents[0] has 2047 bytes but input \"a\" FP32 [8, 64] "
       "needs 8 x 256"},
      {"ModelInfer_Truncated_Fp32ContentsOneValueShort", edited([=](auto& r) {
         to_fp32_contents(r);
         r.mutable_inputs(0)
             ->mutable_contents()
             ->mutable_fp32_contents()
             ->RemoveLast();
       }),
       INVALID_ARGUMENT,
       "contents.fp32_contents of input \"a\" has 511 values but shape [8, "
       "64] needs 8 x 64"},
      {"ModelInfer_Oversized_OneByteOverTheMessageLimit", edited([](auto& r) {
         std::string& raw = *r.mutable_raw_input_contents(0);
         GrowToOneByteOverTheLimit(r, raw, std::string(raw));
       }),
       grpc::StatusCode::RESOURCE_EXHAUSTED, kTooLarge},
      {"ModelInfer_Oversized_MoreRowsThanMaxRequestRows", edited([](auto& r) {
         r.mutable_inputs(0)->set_shape(0, 72);
         r.set_raw_input_contents(
             0, RandomABytes(72, kSpec.k, kGoodActivationsSeed));
       }),
       INVALID_ARGUMENT,
       "M=72 rows is more than this server takes per request (64, nibbled "
       "--max_request_rows)"},
      {"ModelInfer_Oversized_MTimesKOverflows64Bits", edited([](auto& r) {
         r.mutable_inputs(0)->set_shape(0, kOverflowingM);
       }),
       INVALID_ARGUMENT,
       "raw_input_contents[0] has 2048 bytes but input \"a\" FP32 "
       "[2305843009213693952, 64] needs"},
      {"ModelInfer_Oversized_Fp32ContentsMTimesKOverflows64Bits",
       edited([=](auto& r) {
         to_fp32_contents(r);
         r.mutable_inputs(0)->set_shape(0, kOverflowingM);
       }),
       INVALID_ARGUMENT,
       "contents.fp32_contents of input \"a\" has 512 values but shape "
       "[2305843009213693952, 64]"},
      {"ModelInfer_Oversized_KAboveTheLimit", edited([](auto& r) {
         r.mutable_inputs(0)->set_shape(1, kAboveMaxDimension);
       }),
       INVALID_ARGUMENT,
       "input \"a\" has K = 1048584 columns but model \"good\" takes K = 64"},
      {"ModelInfer_Mismatched_K", edited([](auto& r) {
         r.mutable_inputs(0)->set_shape(0, 16);
         r.mutable_inputs(0)->set_shape(1, 32);
       }),
       INVALID_ARGUMENT,
       "input \"a\" has K = 32 columns but model \"good\" takes K = 64: send "
       "shape [M, 64]"},
      {"ModelInfer_Mismatched_DatatypeFp16WithFp32Bytes",
       edited([](auto& r) { r.mutable_inputs(0)->set_datatype("FP16"); }),
       INVALID_ARGUMENT,
       "raw_input_contents[0] has 2048 bytes but input \"a\" FP16 [8, 64] "
       "needs 8 x 128"},
      {"ModelInfer_Mismatched_DatatypeFp64",
       edited([](auto& r) { r.mutable_inputs(0)->set_datatype("FP64"); }),
       INVALID_ARGUMENT,
       "datatype \"FP64\" is not supported: use FP32, FP16 or BF16"},
      {"ModelInfer_Mismatched_UnknownVersion",
       edited([](auto& r) { r.set_model_version("2"); }), NOT_FOUND,
       "model \"good\" has no version \"2\": its only version is \"1\""},
      {"ModelInfer_Mismatched_InputName",
       edited([](auto& r) { r.mutable_inputs(0)->set_name("input0"); }),
       INVALID_ARGUMENT,
       "input \"input0\" is unknown: model \"good\" takes one input named "
       "\"a\""},
      {"ModelInfer_Mismatched_TwoRawContents", edited([](auto& r) {
         r.add_raw_input_contents(r.raw_input_contents(0));
       }),
       INVALID_ARGUMENT,
       "raw_input_contents has 2 entries; send exactly one, for input \"a\""},
      {"ModelInfer_Mismatched_RawAndContents", edited([=](auto& r) {
         const std::string raw = r.raw_input_contents(0);
         to_fp32_contents(r);
         r.add_raw_input_contents(raw);
       }),
       INVALID_ARGUMENT,
       "input \"a\" has data both in raw_input_contents and in contents"},
      {"ModelInfer_Mismatched_Fp16InContents", edited([=](auto& r) {
         to_fp32_contents(r);
         r.mutable_inputs(0)->set_datatype("FP16");
       }),
       INVALID_ARGUMENT,
       "input \"a\" is FP16, which has no typed contents list: send it in "
       "raw_input_contents"},
      {"ModelInfer_Mismatched_UnknownOutput",
       edited([](auto& r) { r.add_outputs()->set_name("OUTPUT0"); }),
       INVALID_ARGUMENT,
       "requested output \"OUTPUT0\" is unknown: model \"good\" has one "
       "output"},
      {"ModelInfer_Hostile_NegativeDimensions",
       edited([](auto& r) { r.mutable_inputs(0)->set_shape(0, -8); }),
       INVALID_ARGUMENT,
       "input \"a\" has shape [-8, 64]; dimensions cannot be negative"},
  };
  for (const HostileName& hostile : HostileNames()) {
    rows.push_back(
        {absl::StrCat("ModelInfer_Hostile_ModelName", hostile.case_name),
         edited([=](auto& r) { r.set_model_name(hostile.name); }), NOT_FOUND,
         kNoSuchNameCanExist});
  }
  return rows;
}

std::vector<BadInput> ModelMetadataRows() {
  using grpc::StatusCode::NOT_FOUND;
  std::vector<BadInput> rows = {
      {"ModelMetadata_Empty_DefaultRequest",
       [](Clients& c) {
         return ModelMetadata(c, inference::ModelMetadataRequest());
       },
       NOT_FOUND, kNoSuchNameCanExist},
      {"ModelMetadata_Oversized_OneByteOverTheMessageLimit",
       [](Clients& c) {
         return ModelMetadata(
             c, WithNameOneByteOverTheLimit(
                    inference::ModelMetadataRequest(),
                    &inference::ModelMetadataRequest::mutable_name));
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, kTooLarge},
      {"ModelMetadata_Mismatched_UnknownVersion",
       [](Clients& c) {
         return ModelMetadata(c, MetadataRequestFor(kGood, "2"));
       },
       NOT_FOUND,
       "model \"good\" has no version \"2\": its only version is \"1\""},
  };
  for (const HostileName& hostile : HostileNames()) {
    rows.push_back(
        {absl::StrCat("ModelMetadata_Hostile_Name", hostile.case_name),
         [=](Clients& c) {
           return ModelMetadata(c, MetadataRequestFor(hostile.name, ""));
         },
         NOT_FOUND, kNoSuchNameCanExist});
  }
  return rows;
}

std::vector<BadInput> ModelReadyRows() {
  using grpc::StatusCode::OK;
  std::vector<BadInput> rows = {
      {"ModelReady_Empty_DefaultRequest",
       [](Clients& c) { return ModelReady(c, inference::ModelReadyRequest()); },
       OK, "not ready"},
      {"ModelReady_Oversized_OneByteOverTheMessageLimit",
       [](Clients& c) {
         return ModelReady(c, WithNameOneByteOverTheLimit(
                                  inference::ModelReadyRequest(),
                                  &inference::ModelReadyRequest::mutable_name));
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, kTooLarge},
      {"ModelReady_Mismatched_UnknownVersion",
       [](Clients& c) { return ModelReady(c, ReadyRequestFor(kGood, "2")); },
       OK, "not ready"},
  };
  for (const HostileName& hostile : HostileNames()) {
    rows.push_back({absl::StrCat("ModelReady_Hostile_Name", hostile.case_name),
                    [=](Clients& c) {
                      return ModelReady(c, ReadyRequestFor(hostile.name, ""));
                    },
                    OK, "not ready"});
  }
  return rows;
}

std::vector<BadInput> HealthRows() {
  using grpc::StatusCode::NOT_FOUND;
  std::vector<BadInput> rows = {
      {"HealthCheck_Empty_DefaultRequest",
       [](Clients& c) { return HealthCheck(c, HealthCheckRequest()); },
       grpc::StatusCode::OK, "SERVING"},
      {"HealthCheck_Oversized_OneByteOverTheMessageLimit",
       [](Clients& c) {
         return HealthCheck(c, WithNameOneByteOverTheLimit(
                                   HealthCheckRequest(),
                                   &HealthCheckRequest::mutable_service));
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, kTooLarge},
      {"HealthCheck_Mismatched_UnknownService",
       [](Clients& c) { return HealthCheck(c, "nibble.v2.NibbleService"); },
       NOT_FOUND, "service name unknown"},
  };
  for (const HostileName& hostile : HostileNames()) {
    rows.push_back(
        {absl::StrCat("HealthCheck_Hostile_Service", hostile.case_name),
         [=](Clients& c) { return HealthCheck(c, hostile.name); }, NOT_FOUND,
         "service name unknown"});
  }
  return rows;
}

grpc::Status ListWeights(Clients& clients,
                         const v1::ListWeightsRequest& request) {
  grpc::ClientContext context;
  v1::ListWeightsResponse response;
  return clients.nibble->ListWeights(&context, request, &response);
}

std::vector<BadInput> ListRows() {
  using grpc::StatusCode::INVALID_ARGUMENT;
  const auto page = [](int32_t size, const std::string& token) {
    v1::ListWeightsRequest request;
    request.set_page_size(size);
    request.set_page_token(token);
    return request;
  };
  std::vector<BadInput> rows = {
      {"ListWeights_Empty_DefaultRequest",
       [](Clients& c) { return ListWeights(c, v1::ListWeightsRequest()); },
       grpc::StatusCode::OK, ""},
      {"ListWeights_Oversized_PageSizeClamped",
       [=](Clients& c) { return ListWeights(c, page(1 << 30, "")); },
       grpc::StatusCode::OK, ""},
      {"ListWeights_Oversized_OneByteOverTheMessageLimit",
       [](Clients& c) {
         return ListWeights(c,
                            WithNameOneByteOverTheLimit(
                                v1::ListWeightsRequest(),
                                &v1::ListWeightsRequest::mutable_page_token));
       },
       grpc::StatusCode::RESOURCE_EXHAUSTED, kTooLarge},
      {"ListWeights_Hostile_NegativePageSize",
       [=](Clients& c) { return ListWeights(c, page(-5, "")); },
       INVALID_ARGUMENT, "page_size is -5"},
  };
  for (const HostileName& hostile : HostileNames()) {
    rows.push_back(
        {absl::StrCat("ListWeights_Hostile_PageToken", hostile.case_name),
         [=](Clients& c) { return ListWeights(c, page(0, hostile.name)); },
         INVALID_ARGUMENT, "page_token is not one that ListWeights returned"});
  }
  return rows;
}

std::vector<BadInput> AllRows() {
  std::vector<BadInput> rows;
  const auto append = [&rows](const std::vector<BadInput>& more) {
    rows.insert(rows.end(), more.begin(), more.end());
  };
  append(UploadRows());
  append(NameOnlyRows("GetWeight", GetWeight));
  append(ListRows());
  append(NameOnlyRows("DeleteWeight", [](Clients& c, const std::string& name) {
    return c.weights.Delete(name);
  }));
  append(MatmulRows("Matmul", Matmul, [](Clients& c) {
    v1::MatmulRequest request = GoodMatmul();
    GrowToOneByteOverTheLimit(request, *request.mutable_a(), request.a());
    return Matmul(c, request);
  }));
  append(MatmulRows(
      "MatmulStream",
      [](Clients& c, const v1::MatmulRequest& request) {
        return MatmulStream(c, StreamRequest(request));
      },
      [](Clients& c) {
        v1::MatmulStreamRequest request = StreamRequest(GoodMatmul());
        GrowToOneByteOverTheLimit(request,
                                  *request.mutable_request()->mutable_a(),
                                  request.request().a());
        return MatmulStream(c, request);
      }));
  append(InferRows());
  append(ModelMetadataRows());
  append(ModelReadyRows());
  append(HealthRows());
  return rows;
}

class BadInputMatrixTest : public ::testing::TestWithParam<BadInput> {
 protected:
  static void SetUpTestSuite() {
    // ctest runs each row in a process of its own, in parallel.
    log_path_ = new std::string(absl::StrCat(::testing::TempDir(),
                                             "/BadInputMatrixTest-", getpid(),
                                             "-nibbled.log"));
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::StartNibbledLoggingTo(
            NIBBLED_PATH, *log_path_,
            {absl::StrCat("--max_message_bytes=", kMaxMessageBytes),
             absl::StrCat("--max_request_rows=", kMaxRequestRows),
             absl::StrCat("--max_weight_bytes=", kMaxWeightBytes)});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
    const grpc::Status status =
        testing::WeightClient(server_->target()).Upload(kGood, GoodWeight());
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      EXPECT_EQ(server_->Stop(), 0) << "nibbled did not exit cleanly";
    }
    delete server_;
    server_ = nullptr;
    std::remove(log_path_->c_str());
    delete log_path_;
    log_path_ = nullptr;
  }

  void SetUp() override { ASSERT_NE(server_, nullptr); }

  // A client that did nothing wrong is still served, and served right.
  void ExpectStillServing() {
    ASSERT_TRUE(server_->Running()) << "nibbled died; it logged:\n"
                                    << testing::ReadFile(*log_path_);
    Clients other(server_->target());
    const v1::MatmulRequest request = GoodMatmul();
    grpc::ClientContext context;
    v1::MatmulResponse response;
    const grpc::Status status =
        other.nibble->Matmul(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.c().size(), kM * kSpec.n * sizeof(float));
    const testing::Activations a =
        RandomActivations(kM, kSpec.k, DType::kF32, kGoodActivationsSeed);
    EXPECT_LE(MaxRelativeError(OutputValues(response.c(), DType::kF32),
                               ReferenceMatmul(a.values, kM, GoodWeight())),
              client::ErrorBoundOf(response));
    EXPECT_EQ(HealthCheck(other, "").error_message(), "SERVING");
  }

  static testing::NibbledProcess* server_;
  static std::string* log_path_;
};

testing::NibbledProcess* BadInputMatrixTest::server_ = nullptr;
std::string* BadInputMatrixTest::log_path_ = nullptr;

TEST_P(BadInputMatrixTest, SaysWhatToFixAndServesOn) {
  const BadInput& row = GetParam();
  Clients clients(server_->target());
  const grpc::Status status = row.call(clients);
  EXPECT_EQ(status.error_code(), row.code) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr(row.message));
  ExpectStillServing();
}

INSTANTIATE_TEST_SUITE_P(Rows, BadInputMatrixTest,
                         ::testing::ValuesIn(AllRows()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace nibble
