// MatmulStream against an in-process server through the generated stub: many
// requests on one stream checked against the float64 reference, failures that
// fail alone, an empty stream, a client that reads late, replies past the
// reply budget, and cancellation.
// Every test ends by shutting the server down, which is only quick when every
// stream was finished.
#include "server/edge/matmul_stream.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "server/core/reply_budget.h"
#include "server/edge/nibble_server.h"

namespace nibble {
namespace {

using ::nibble::client::ToProto;

using Stream =
    grpc::ClientReaderWriter<v1::MatmulStreamRequest, v1::MatmulStreamResponse>;

constexpr char kWeight[] = "stream-u4";
constexpr char kWideWeight[] = "stream-wide";
constexpr char kDeepWeight[] = "stream-deep";
constexpr uint64_t kWeightSeed = 7;
constexpr uint64_t kWideWeightSeed = 8;
constexpr uint64_t kDeepWeightSeed = 9;
// Ids far from 0 and sparse, so that an echo that drops the high bits or
// invents an id shows.
constexpr uint64_t kFirstId = uint64_t{1} << 40;
constexpr uint64_t kIdStride = 7919;

const WeightSpec kSpec{WeightFormat::kU4, 128, 48, 32};
// Replies of 32 KiB at m = 8 in f32, so that unread replies fill the
// transport's windows.
const WeightSpec kWideSpec{WeightFormat::kU4b8, 128, 1024, 64};
// Requests of up to 256 KiB that are cheap to compute.
const WeightSpec kDeepSpec{WeightFormat::kFp4, 8192, 16, 128};

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

uint64_t IdOf(int index) { return kFirstId + index * kIdStride; }

std::string Bytes(const void* data, size_t size) {
  return std::string(static_cast<const char*>(data), size);
}

// Activations in [-1, 1) in `dtype`, and the same values in double.
struct Activations {
  std::string bytes;
  std::vector<double> values;
};

Activations RandomActivations(int64_t m, int64_t k, DType dtype,
                              std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> floats(m * k);
  for (float& value : floats) value = uniform(rng);
  Activations a;
  a.bytes.resize(floats.size() * DTypeSize(dtype));
  ConvertFromFloat(dtype, floats.data(), floats.size(), a.bytes.data());
  // The values the server sees, after rounding to `dtype`.
  ConvertToFloat(dtype, a.bytes.data(), floats.size(), floats.data());
  a.values.assign(floats.begin(), floats.end());
  return a;
}

v1::MatmulStreamRequest StreamRequest(uint64_t id, const std::string& weight,
                                      int64_t m, DType dtype, std::string a) {
  v1::MatmulStreamRequest request;
  request.set_id(id);
  request.mutable_request()->set_weight_name(weight);
  request.mutable_request()->set_m(m);
  request.mutable_request()->set_dtype(ToProto(dtype));
  request.mutable_request()->set_a(std::move(a));
  return request;
}

// C as the server returned it, in double.
std::vector<double> Values(const std::string& bytes, DType dtype) {
  std::vector<float> floats(bytes.size() / DTypeSize(dtype));
  ConvertToFloat(dtype, bytes.data(), floats.size(), floats.data());
  return std::vector<double>(floats.begin(), floats.end());
}

// What the reply to one id must be.
struct Expected {
  grpc::StatusCode code = grpc::StatusCode::OK;
  DType dtype = DType::kF32;
  int64_t m = 0;
  int64_t n = 0;
  std::vector<double> c;  // the float64 reference, when code is OK
};

Expected Failure(grpc::StatusCode code) {
  Expected expected;
  expected.code = code;
  return expected;
}

// A valid request for `weight` with random m in 1..8, and its expectation.
std::pair<v1::MatmulStreamRequest, Expected> GoodRequest(
    uint64_t id, const std::string& name, const QuantizedWeight& weight,
    DType dtype, std::mt19937_64& rng) {
  const int64_t m = std::uniform_int_distribution<int64_t>(1, 8)(rng);
  Activations a = RandomActivations(m, weight.spec.k, dtype, rng);
  Expected expected{.code = grpc::StatusCode::OK,
                    .dtype = dtype,
                    .m = m,
                    .n = weight.spec.n,
                    .c = ReferenceMatmul(a.values, m, weight)};
  return {StreamRequest(id, name, m, dtype, std::move(a.bytes)),
          std::move(expected)};
}

// Every id in `expected` answered exactly once, as expected.
void CheckReplies(const std::vector<v1::MatmulStreamResponse>& replies,
                  const std::map<uint64_t, Expected>& expected) {
  EXPECT_EQ(replies.size(), expected.size());
  std::map<uint64_t, int> answers;
  for (const v1::MatmulStreamResponse& reply : replies) {
    SCOPED_TRACE(::testing::Message() << "id " << reply.id());
    if (++answers[reply.id()] > 1) {
      ADD_FAILURE() << "answered more than once";
      continue;
    }
    const auto it = expected.find(reply.id());
    if (it == expected.end()) {
      ADD_FAILURE() << "answers no request that was sent";
      continue;
    }
    const Expected& want = it->second;
    if (want.code != grpc::StatusCode::OK) {
      ASSERT_TRUE(reply.has_error())
          << "should have failed with code " << want.code;
      EXPECT_EQ(reply.error().code(), want.code) << reply.error().message();
      EXPECT_FALSE(reply.error().message().empty());
      continue;
    }
    ASSERT_TRUE(reply.has_response())
        << "failed: " << reply.error().code() << " " << reply.error().message();
    const v1::MatmulResponse& response = reply.response();
    EXPECT_EQ(response.m(), want.m);
    EXPECT_EQ(response.n(), want.n);
    EXPECT_EQ(response.dtype(), ToProto(want.dtype));
    ASSERT_EQ(response.c().size(), want.m * want.n * DTypeSize(want.dtype));
    EXPECT_LE(MaxRelativeError(Values(response.c(), want.dtype), want.c),
              client::ErrorBoundOf(response))
        << DTypeName(want.dtype) << " m=" << want.m << " kernel "
        << response.kernel();
  }
  for (const auto& [id, want] : expected) {
    EXPECT_EQ(answers[id], 1) << "id " << id << " was never answered";
  }
}

class MatmulStreamTest : public ::testing::Test {
 protected:
  virtual server::ServerOptions Options() const {
    server::ServerOptions options;
    options.listen = "127.0.0.1:0";
    options.threads = 2;
    return options;
  }

  void SetUp() override {
    const server::ServerOptions options = Options();
    absl::StatusOr<std::unique_ptr<server::NibbleServer>> server =
        server::NibbleServer::Start(options, cpu::CpuKernels());
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = Connect(grpc::ChannelArguments());
    ASSERT_NO_FATAL_FAILURE(Upload(kWeight, weight_));
    ASSERT_NO_FATAL_FAILURE(Upload(kWideWeight, wide_weight_));
    ASSERT_NO_FATAL_FAILURE(Upload(kDeepWeight, deep_weight_));
  }

  void TearDown() override {
    stub_.reset();
    if (server_ == nullptr) return;
    // Shutdown waits for every call's OnDone, which needs its Finish.
    const absl::Time start = absl::Now();
    server_->Shutdown(absl::Seconds(20));
    EXPECT_LT(absl::Now() - start, absl::Seconds(10))
        << "a call was still open at shutdown";
  }

  std::unique_ptr<v1::NibbleService::Stub> Connect(
      grpc::ChannelArguments arguments) {
    arguments.SetMaxReceiveMessageSize(64 << 20);
    return v1::NibbleService::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", server_->port()),
        grpc::InsecureChannelCredentials(), arguments));
  }

  void Upload(const std::string& name, const QuantizedWeight& weight) {
    grpc::ClientContext context;
    v1::WeightInfo info;
    auto writer = stub_->UploadWeight(&context, &info);
    v1::UploadWeightRequest header;
    header.mutable_header()->set_name(name);
    header.mutable_header()->set_format(ToProto(weight.spec.format));
    header.mutable_header()->set_k(weight.spec.k);
    header.mutable_header()->set_n(weight.spec.n);
    header.mutable_header()->set_group_size(weight.spec.group_size);
    ASSERT_TRUE(writer->Write(header));
    const std::pair<v1::WeightTensor, std::string> tensors[] = {
        {v1::WEIGHT_TENSOR_QWEIGHT,
         Bytes(weight.qweight.data(),
               weight.qweight.size() * sizeof(uint32_t))},
        {v1::WEIGHT_TENSOR_SCALES,
         Bytes(weight.scales.data(), weight.scales.size() * sizeof(uint16_t))},
        {v1::WEIGHT_TENSOR_ZEROS,
         Bytes(weight.zeros.data(), weight.zeros.size())}};
    for (const auto& [tensor, bytes] : tensors) {
      if (bytes.empty()) continue;
      v1::UploadWeightRequest chunk;
      chunk.mutable_chunk()->set_tensor(tensor);
      chunk.mutable_chunk()->set_offset(0);
      chunk.mutable_chunk()->set_data(bytes);
      ASSERT_TRUE(writer->Write(chunk));
    }
    ASSERT_TRUE(writer->WritesDone());
    const grpc::Status status = writer->Finish();
    ASSERT_TRUE(status.ok()) << status.error_message();
  }

  // Sends `requests` from a writer thread and half-closes; reads every reply
  // after `read_delay`, and counts in `written_before_reading` the requests
  // the client could send by then. The stream's final status.
  grpc::Status RunStream(v1::NibbleService::Stub& stub,
                         const std::vector<v1::MatmulStreamRequest>& requests,
                         std::vector<v1::MatmulStreamResponse>* replies,
                         absl::Duration read_delay = absl::ZeroDuration(),
                         int* written_before_reading = nullptr) {
    grpc::ClientContext context;
    // A deadlock fails the test instead of hanging it.
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(60));
    std::unique_ptr<Stream> stream = stub.MatmulStream(&context);
    std::atomic<int> written = 0;
    std::thread writer([&] {
      for (const v1::MatmulStreamRequest& request : requests) {
        if (!stream->Write(request)) return;  // the stream has ended
        ++written;
      }
      stream->WritesDone();
    });
    absl::SleepFor(read_delay);
    if (written_before_reading != nullptr) *written_before_reading = written;
    v1::MatmulStreamResponse reply;
    while (stream->Read(&reply)) replies->push_back(reply);
    writer.join();
    return stream->Finish();
  }

  const QuantizedWeight weight_ = RandomQuantizedWeight(kSpec, kWeightSeed);
  const QuantizedWeight wide_weight_ =
      RandomQuantizedWeight(kWideSpec, kWideWeightSeed);
  const QuantizedWeight deep_weight_ =
      RandomQuantizedWeight(kDeepSpec, kDeepWeightSeed);
  std::unique_ptr<server::NibbleServer> server_;
  std::unique_ptr<v1::NibbleService::Stub> stub_;
};

TEST_F(MatmulStreamTest, AnswersEveryRequestWithTheReferenceResult) {
  const uint64_t seed = 101;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<v1::MatmulStreamRequest> requests;
  std::map<uint64_t, Expected> expected;
  for (int i = 0; i < 200; ++i) {
    auto [request, want] =
        GoodRequest(IdOf(i), kWeight, weight_, kDTypes[i % 3], rng);
    requests.push_back(std::move(request));
    expected[IdOf(i)] = std::move(want);
  }
  std::vector<v1::MatmulStreamResponse> replies;
  const grpc::Status status = RunStream(*stub_, requests, &replies);
  EXPECT_TRUE(status.ok()) << status.error_code() << " "
                           << status.error_message();
  CheckReplies(replies, expected);
}

TEST_F(MatmulStreamTest, FailedRequestsFailAloneAndTheStreamGoesOn) {
  const uint64_t seed = 202;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<v1::MatmulStreamRequest> requests;
  std::map<uint64_t, Expected> expected;
  for (int i = 0; i < 120; ++i) {
    const uint64_t id = IdOf(i);
    const DType dtype = kDTypes[i % 3];
    auto [request, want] = GoodRequest(id, kWeight, weight_, dtype, rng);
    switch (i % 6) {
      case 1:
        request.mutable_request()->set_weight_name("no-such-weight");
        want = Failure(grpc::StatusCode::NOT_FOUND);
        break;
      case 3:  // one byte short of m rows
        request.mutable_request()->mutable_a()->pop_back();
        want = Failure(grpc::StatusCode::INVALID_ARGUMENT);
        break;
      case 4:
        request.mutable_request()->set_k(kSpec.k + 8);
        want = Failure(grpc::StatusCode::INVALID_ARGUMENT);
        break;
      case 5:
        request.clear_request();
        want = Failure(grpc::StatusCode::INVALID_ARGUMENT);
        break;
    }
    requests.push_back(std::move(request));
    expected[id] = std::move(want);
  }
  std::vector<v1::MatmulStreamResponse> replies;
  const grpc::Status status = RunStream(*stub_, requests, &replies);
  EXPECT_TRUE(status.ok()) << status.error_code() << " "
                           << status.error_message();
  CheckReplies(replies, expected);
}

TEST_F(MatmulStreamTest, EmptyStreamFinishesOk) {
  std::vector<v1::MatmulStreamResponse> replies;
  const grpc::Status status = RunStream(*stub_, {}, &replies);
  EXPECT_TRUE(status.ok()) << status.error_code() << " "
                           << status.error_message();
  EXPECT_TRUE(replies.empty());
}

TEST_F(MatmulStreamTest, ClientThatReadsLateStillGetsEveryReply) {
  const uint64_t seed = 303;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  // First more large replies than the server queues, which fill the
  // transport while the client does not read, so that the server stops
  // reading; then more large requests than the transport buffers, so that
  // the client's writes wait too, until it starts reading.
  const int wide = 2 * server::MatmulStreamReactor::kMaxOwedReplies;
  const int count = wide + 200;
  std::vector<v1::MatmulStreamRequest> requests;
  std::map<uint64_t, Expected> expected;
  for (int i = 0; i < count; ++i) {
    auto [request, want] = i < wide
                               ? GoodRequest(IdOf(i), kWideWeight, wide_weight_,
                                             kDTypes[i % 3], rng)
                               : GoodRequest(IdOf(i), kDeepWeight, deep_weight_,
                                             kDTypes[i % 3], rng);
    requests.push_back(std::move(request));
    expected[IdOf(i)] = std::move(want);
  }
  // Without BDP probing the client's receive window stays at its initial
  // 64 KiB, as for a client that reads slowly.
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  const std::unique_ptr<v1::NibbleService::Stub> slow_reader =
      Connect(arguments);
  std::vector<v1::MatmulStreamResponse> replies;
  int written_before_reading = 0;
  const grpc::Status status =
      RunStream(*slow_reader, requests, &replies,
                /*read_delay=*/absl::Seconds(1), &written_before_reading);
  EXPECT_TRUE(status.ok()) << status.error_code() << " "
                           << status.error_message();
  EXPECT_LT(written_before_reading, count)
      << "the server read every request while no reply could be written";
  CheckReplies(replies, expected);
}

// A server whose reply budget lets one connection hold 64 KiB of replies: two
// of kWideSpec's largest.
class MatmulStreamReplyBudgetTest : public MatmulStreamTest {
 protected:
  static constexpr int64_t kConnectionShareBytes = 64 << 10;

  server::ServerOptions Options() const override {
    server::ServerOptions options = MatmulStreamTest::Options();
    options.max_held_reply_bytes =
        kConnectionShareBytes * server::ReplyBudget::kConnectionShares;
    return options;
  }
};

// Replies the client does not read are held in the reply budget: past the
// connection's share, requests are refused with RESOURCE_EXHAUSTED, each
// alone, while the others are answered right once the client reads; then
// nothing is held any more.
TEST_F(MatmulStreamReplyBudgetTest, RepliesPastTheShareAreRefusedAlone) {
  const uint64_t seed = 404;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<v1::MatmulStreamRequest> requests;
  std::map<uint64_t, Expected> expected;
  for (int i = 0; i < 2 * server::MatmulStreamReactor::kMaxOwedReplies; ++i) {
    auto [request, want] =
        GoodRequest(IdOf(i), kWideWeight, wide_weight_, kDTypes[i % 3], rng);
    requests.push_back(std::move(request));
    expected[IdOf(i)] = std::move(want);
  }
  grpc::ChannelArguments arguments;
  arguments.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);  // a 64 KiB window
  const std::unique_ptr<v1::NibbleService::Stub> slow_reader =
      Connect(arguments);
  std::vector<v1::MatmulStreamResponse> replies;
  const grpc::Status status = RunStream(*slow_reader, requests, &replies,
                                        /*read_delay=*/absl::Seconds(1));
  EXPECT_TRUE(status.ok()) << status.error_code() << " "
                           << status.error_message();
  int refused = 0;
  std::vector<v1::MatmulStreamResponse> answered;
  std::map<uint64_t, Expected> answered_expected;
  for (const v1::MatmulStreamResponse& reply : replies) {
    if (reply.has_error()) {
      EXPECT_EQ(reply.error().code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      EXPECT_THAT(reply.error().message(),
                  ::testing::HasSubstr("--max_held_reply_bytes"));
      ++refused;
      continue;
    }
    answered.push_back(reply);
    answered_expected[reply.id()] = expected[reply.id()];
  }
  EXPECT_GT(refused, 0) << "every reply was held while the client did not "
                           "read";
  EXPECT_GT(answered.size(), 0);
  EXPECT_EQ(answered.size() + refused, requests.size());
  CheckReplies(answered, answered_expected);
  EXPECT_THAT(server_->RenderMetrics(),
              ::testing::HasSubstr("\nnibble_held_reply_bytes 0\n"));
}

TEST_F(MatmulStreamTest, ConcurrentStreamsAreIndependent) {
  constexpr int kStreams = 4;
  std::vector<std::thread> clients;
  for (int s = 0; s < kStreams; ++s) {
    clients.emplace_back([this, s] {
      const uint64_t seed = 400 + s;
      SCOPED_TRACE(::testing::Message() << "seed " << seed);
      std::mt19937_64 rng(seed);
      std::vector<v1::MatmulStreamRequest> requests;
      std::map<uint64_t, Expected> expected;
      // The same ids on every stream: ids only need to be unique per stream.
      for (int i = 0; i < 60; ++i) {
        auto [request, want] =
            GoodRequest(IdOf(i), kWeight, weight_, kDTypes[(i + s) % 3], rng);
        requests.push_back(std::move(request));
        expected[IdOf(i)] = std::move(want);
      }
      std::vector<v1::MatmulStreamResponse> replies;
      const grpc::Status status = RunStream(*stub_, requests, &replies);
      EXPECT_TRUE(status.ok())
          << status.error_code() << " " << status.error_message();
      CheckReplies(replies, expected);
    });
  }
  for (std::thread& client : clients) client.join();
}

TEST_F(MatmulStreamTest, CancelledStreamLeavesTheServerServing) {
  const uint64_t seed = 505;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<v1::MatmulStreamRequest> requests;
  for (int i = 0; i < 300; ++i) {
    requests.push_back(
        GoodRequest(IdOf(i), kWideWeight, wide_weight_, DType::kF32, rng)
            .first);
  }
  {
    grpc::ClientContext context;
    std::unique_ptr<Stream> stream = stub_->MatmulStream(&context);
    std::atomic<int> written = 0;
    std::thread writer([&] {
      for (const v1::MatmulStreamRequest& request : requests) {
        if (!stream->Write(request)) return;
        ++written;
      }
    });
    v1::MatmulStreamResponse reply;
    EXPECT_TRUE(stream->Read(&reply)) << "the server answered nothing";
    // Leaves replies unread and requests unanswered on the server.
    absl::SleepFor(absl::Milliseconds(200));
    context.TryCancel();
    writer.join();
    while (stream->Read(&reply)) {
    }
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
    EXPECT_GT(written.load(), 0);
  }
  // The same channel and server go on serving streams and unary calls.
  std::vector<v1::MatmulStreamRequest> after;
  std::map<uint64_t, Expected> expected;
  for (int i = 0; i < 30; ++i) {
    auto [request, want] =
        GoodRequest(IdOf(i), kWeight, weight_, kDTypes[i % 3], rng);
    after.push_back(std::move(request));
    expected[IdOf(i)] = std::move(want);
  }
  std::vector<v1::MatmulStreamResponse> replies;
  const grpc::Status status = RunStream(*stub_, after, &replies);
  EXPECT_TRUE(status.ok()) << status.error_code() << " "
                           << status.error_message();
  CheckReplies(replies, expected);

  grpc::ClientContext context;
  v1::MatmulResponse response;
  const grpc::Status unary =
      stub_->Matmul(&context, after.front().request(), &response);
  ASSERT_TRUE(unary.ok()) << unary.error_message();
  const Expected& want = expected[after.front().id()];
  ASSERT_EQ(response.c().size(), want.m * want.n * DTypeSize(want.dtype));
  EXPECT_LE(MaxRelativeError(Values(response.c(), want.dtype), want.c),
            client::ErrorBoundOf(response));
}

// A message that does not parse as a MatmulStreamRequest is one failed
// request, answered under id 0 like any other error reply.
TEST(NibbleStreamProtocolTest, BytesThatAreNoRequestGetAnErrorReply) {
  // Field 1 (id) as a varint that never ends.
  const std::string garbage = "\x08\xff\xff\xff";
  const grpc::Slice slice(garbage);
  grpc::ByteBuffer bytes(&slice, 1);
  server::WeightStore store;
  uint64_t pending = 99;
  const absl::StatusOr<v1::MatmulRequest> taken =
      server::NibbleStreamProtocol::Take(store, bytes, &pending);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(pending, 0u);

  grpc::ByteBuffer reply_bytes =
      server::NibbleStreamProtocol::Answer(pending, taken.status());
  v1::MatmulStreamResponse reply;
  ASSERT_TRUE(grpc::SerializationTraits<v1::MatmulStreamResponse>::Deserialize(
                  &reply_bytes, &reply)
                  .ok());
  EXPECT_EQ(reply.id(), 0u);
  ASSERT_TRUE(reply.has_error());
  EXPECT_EQ(reply.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(reply.error().message(), taken.status().message());
}

}  // namespace
}  // namespace nibble
