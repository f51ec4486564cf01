#include "client/request_sender.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/client_context.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/support/async_unary_call.h"
#include "grpcpp/support/client_callback.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nibble/v1/nibble.grpc.pb.h"

namespace nibble {
namespace client {
namespace {

// The ModelInfer parameter that carries the kernel nibbled ran.
constexpr char kKernelParameter[] = "kernel";

// Counts the unary calls in flight, so that Finish can wait for them.
class InFlight {
 public:
  void Add() {
    std::lock_guard<std::mutex> lock(mutex_);
    ++count_;
  }
  void Done() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--count_ == 0) drained_.notify_all();
  }
  void WaitUntilDrained() {
    std::unique_lock<std::mutex> lock(mutex_);
    drained_.wait(lock, [this] { return count_ == 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable drained_;
  int64_t count_ = 0;
};

// A unary RPC on the completion-queue API, whose replies a few threads of
// its own take off one queue: cheaper per call than the callback API, which
// hands each completion to another thread. `Traits` names the stub, the
// messages, how to start the call and how to read C out of the response.
template <typename Traits>
class UnarySender final : public RequestSender {
 public:
  UnarySender(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
              typename Traits::Request request, absl::Duration timeout)
      : request_(std::move(request)), timeout_(timeout) {
    for (const auto& channel : channels) {
      stubs_.push_back(Traits::Service::NewStub(channel));
    }
    // The sending thread takes one core; replies get the others.
    const int pollers = std::clamp<int>(
        static_cast<int>(std::thread::hardware_concurrency()) / 2, 1,
        static_cast<int>(channels.size()));
    for (int i = 0; i < pollers; ++i) pollers_.emplace_back([this] { Poll(); });
  }

  ~UnarySender() override {
    queue_.Shutdown();
    for (std::thread& poller : pollers_) poller.join();
  }

  void Send(size_t connection, ReplyCallback done) override {
    // Owned by the queue from here on; Poll deletes it.
    auto* call = new Call;
    call->done = std::move(done);
    call->context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
    in_flight_.Add();
    call->reader = Traits::Start(*stubs_[connection % stubs_.size()],
                                 &call->context, request_, &queue_);
    call->reader->Finish(&call->response, &call->status, call);
  }

  void Finish() override { in_flight_.WaitUntilDrained(); }

 private:
  struct Call {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientAsyncResponseReader<typename Traits::Response>>
        reader;
    typename Traits::Response response;
    grpc::Status status;
    ReplyCallback done;
  };

  void Poll() {
    void* tag = nullptr;
    bool ok = false;
    while (queue_.Next(&tag, &ok)) {
      auto* call = static_cast<Call*>(tag);
      Reply reply;
      reply.status = std::move(call->status);
      if (reply.status.ok()) Traits::Read(call->response, reply);
      ReplyCallback done = std::move(call->done);
      delete call;
      done(std::move(reply));
      in_flight_.Done();
    }
  }

  std::vector<std::unique_ptr<typename Traits::Service::Stub>> stubs_;
  const typename Traits::Request request_;
  const absl::Duration timeout_;
  grpc::CompletionQueue queue_;
  InFlight in_flight_;
  std::vector<std::thread> pollers_;
};

struct MatmulTraits {
  using Service = v1::NibbleService;
  using Request = v1::MatmulRequest;
  using Response = v1::MatmulResponse;
  static std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> Start(
      Service::Stub& stub, grpc::ClientContext* context, const Request& request,
      grpc::CompletionQueue* queue) {
    return stub.AsyncMatmul(context, request, queue);
  }
  static void Read(Response& response, Reply& reply) {
    reply.kernel = std::move(*response.mutable_kernel());
    reply.c = std::move(*response.mutable_c());
  }
};

struct ModelInferTraits {
  using Service = inference::GRPCInferenceService;
  using Request = inference::ModelInferRequest;
  using Response = inference::ModelInferResponse;
  static std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> Start(
      Service::Stub& stub, grpc::ClientContext* context, const Request& request,
      grpc::CompletionQueue* queue) {
    return stub.AsyncModelInfer(context, request, queue);
  }
  static void Read(Response& response, Reply& reply) {
    const auto kernel = response.parameters().find(kKernelParameter);
    if (kernel != response.parameters().end()) {
      reply.kernel = kernel->second.string_param();
    }
    if (response.raw_output_contents_size() == 1) {
      reply.c = std::move(*response.mutable_raw_output_contents(0));
    } else {
      reply.status =
          grpc::Status(grpc::StatusCode::INTERNAL,
                       absl::StrCat("the server answered ModelInfer with ",
                                    response.raw_output_contents_size(),
                                    " raw outputs, not 1"));
    }
  }
};

struct HealthCheckTraits {
  using Service = grpc::health::v1::Health;
  using Request = grpc::health::v1::HealthCheckRequest;
  using Response = grpc::health::v1::HealthCheckResponse;
  static std::unique_ptr<grpc::ClientAsyncResponseReader<Response>> Start(
      Service::Stub& stub, grpc::ClientContext* context, const Request& request,
      grpc::CompletionQueue* queue) {
    return stub.AsyncCheck(context, request, queue);
  }
  // A server that answers but does not serve is as good as down to a caller.
  static void Read(Response& response, Reply& reply) {
    if (response.status() == Response::SERVING) return;
    reply.status = grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        absl::StrCat("the server's health is ",
                     Response::ServingStatus_Name(response.status())));
  }
};

// The KServe v2 form of `request`: model = weight, one input "a" [M, K].
inference::ModelInferRequest ToModelInfer(const v1::MatmulRequest& request) {
  static constexpr struct {
    v1::DType dtype;
    const char* datatype;
  } kDatatypes[] = {{v1::DTYPE_F32, "FP32"},
                    {v1::DTYPE_F16, "FP16"},
                    {v1::DTYPE_BF16, "BF16"}};
  inference::ModelInferRequest infer;
  infer.set_model_name(request.weight_name());
  auto* input = infer.add_inputs();
  input->set_name("a");
  for (const auto& [dtype, datatype] : kDatatypes) {
    if (dtype == request.dtype()) input->set_datatype(datatype);
  }
  const int64_t element_bytes =
      DTypeSize(FromProto(request.dtype()).value_or(DType::kF32));
  input->add_shape(request.m());
  input->add_shape(static_cast<int64_t>(request.a().size()) /
                   (request.m() * element_bytes));
  infer.add_raw_input_contents(request.a());
  return infer;
}

// One MatmulStream: requests go out one write at a time in the order sent,
// and each reply finds its callback by id. gRPC may run a reaction inline in
// a Start* call, so none is called with `mutex_` held.
class StreamCall final
    : public grpc::ClientBidiReactor<v1::MatmulStreamRequest,
                                     v1::MatmulStreamResponse> {
 public:
  StreamCall(v1::NibbleService::Stub& stub, absl::Duration timeout) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    stub.async()->MatmulStream(&context_, this);
    // Sends come from outside reactions until Close.
    AddHold();
    StartRead(&incoming_);
    StartCall();
  }

  // False, leaving `done` alone, once the stream has ended.
  bool TrySend(const v1::MatmulRequest& request, ReplyCallback& done) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (ended_) return false;
    const uint64_t id = next_id_++;
    pending_.emplace(id, std::move(done));
    v1::MatmulStreamRequest& message = queued_.emplace_back();
    message.set_id(id);
    *message.mutable_request() = request;
    if (writing_) return true;
    writing_ = true;
    TakeNextWrite();
    lock.unlock();
    StartWrite(&writing_message_);
    return true;
  }

  // Half-closes the stream once the queued requests are written.
  void Close() {
    std::unique_lock<std::mutex> lock(mutex_);
    closing_ = true;
    const bool half_close = !writing_;
    lock.unlock();
    if (half_close) StartWritesDone();
    RemoveHold();
  }

  // True once OnDone has answered every pending request; then the call may
  // be deleted.
  bool finished() {
    std::lock_guard<std::mutex> lock(mutex_);
    return finished_;
  }
  void WaitUntilFinished() {
    std::unique_lock<std::mutex> lock(mutex_);
    finished_changed_.wait(lock, [this] { return finished_; });
  }

  void OnWriteDone(bool ok) override {
    std::unique_lock<std::mutex> lock(mutex_);
    // A failed write means the stream is broken; OnDone answers the rest.
    if (!ok || queued_.empty()) {
      writing_ = false;
      const bool half_close = ok && closing_;
      lock.unlock();
      if (half_close) StartWritesDone();
      return;
    }
    TakeNextWrite();
    lock.unlock();
    StartWrite(&writing_message_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;  // The server ended the stream; OnDone follows.
    ReplyCallback done;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto pending = pending_.find(incoming_.id());
      if (pending != pending_.end()) {
        done = std::move(pending->second);
        pending_.erase(pending);
      }
    }
    Reply reply;
    if (incoming_.has_error()) {
      reply.status =
          grpc::Status(static_cast<grpc::StatusCode>(incoming_.error().code()),
                       incoming_.error().message());
    } else {
      reply.kernel = std::move(*incoming_.mutable_response()->mutable_kernel());
      reply.c = std::move(*incoming_.mutable_response()->mutable_c());
    }
    StartRead(&incoming_);
    // A reply to an id never sent, or sent twice, is the server's mistake;
    // the requests left unanswered get OnDone's error.
    if (done) done(std::move(reply));
  }

  void OnDone(const grpc::Status& status) override {
    absl::flat_hash_map<uint64_t, ReplyCallback> unanswered;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ended_ = true;
      unanswered = std::move(pending_);
      pending_.clear();
    }
    const grpc::Status error =
        status.ok() ? grpc::Status(grpc::StatusCode::INTERNAL,
                                   "the server ended the MatmulStream without "
                                   "answering every request")
                    : status;
    for (auto& [id, done] : unanswered) {
      Reply reply;
      reply.status = error;
      done(std::move(reply));
    }
    std::lock_guard<std::mutex> lock(mutex_);
    finished_ = true;
    finished_changed_.notify_all();
  }

 private:
  // Requires mutex_ and a non-empty queue.
  void TakeNextWrite() {
    writing_message_ = std::move(queued_.front());
    queued_.pop_front();
  }

  grpc::ClientContext context_;
  v1::MatmulStreamResponse incoming_;
  // Only the writer (writing_ set) touches it.
  v1::MatmulStreamRequest writing_message_;
  std::mutex mutex_;
  std::condition_variable finished_changed_;
  uint64_t next_id_ = 0;
  absl::flat_hash_map<uint64_t, ReplyCallback> pending_;
  std::deque<v1::MatmulStreamRequest> queued_;
  bool writing_ = false;
  bool closing_ = false;
  bool ended_ = false;
  bool finished_ = false;
};

// One MatmulStream per connection. A stream the server ended is replaced by a
// new one at the next send, as a long-lived frontend would reconnect.
class StreamSender final : public RequestSender {
 public:
  StreamSender(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
               v1::MatmulRequest request, absl::Duration stream_timeout)
      : request_(std::move(request)), stream_timeout_(stream_timeout) {
    for (const auto& channel : channels) {
      auto& connection =
          connections_.emplace_back(std::make_unique<Connection>());
      connection->stub = v1::NibbleService::NewStub(channel);
      connection->stream =
          std::make_unique<StreamCall>(*connection->stub, stream_timeout_);
    }
  }

  void Send(size_t index, ReplyCallback done) override {
    Connection& connection = *connections_[index % connections_.size()];
    std::lock_guard<std::mutex> lock(connection.mutex);
    while (!connection.stream->TrySend(request_, done)) {
      connection.stream->Close();
      connection.ended.push_back(std::move(connection.stream));
      std::erase_if(connection.ended,
                    [](const auto& stream) { return stream->finished(); });
      connection.stream =
          std::make_unique<StreamCall>(*connection.stub, stream_timeout_);
    }
  }

  void Finish() override {
    for (auto& connection : connections_) {
      std::lock_guard<std::mutex> lock(connection->mutex);
      connection->stream->Close();
      connection->ended.push_back(std::move(connection->stream));
      for (auto& stream : connection->ended) stream->WaitUntilFinished();
      connection->ended.clear();
    }
  }

 private:
  struct Connection {
    std::unique_ptr<v1::NibbleService::Stub> stub;
    std::mutex mutex;
    std::unique_ptr<StreamCall> stream;
    // Closed streams whose OnDone may not have finished yet.
    std::vector<std::unique_ptr<StreamCall>> ended;
  };

  const v1::MatmulRequest request_;
  const absl::Duration stream_timeout_;
  std::vector<std::unique_ptr<Connection>> connections_;
};

}  // namespace

absl::StatusOr<LoadApi> ParseLoadApi(absl::string_view text) {
  for (LoadApi api : {LoadApi::kMatmul, LoadApi::kMatmulStream,
                      LoadApi::kModelInfer, LoadApi::kCheck}) {
    if (absl::EqualsIgnoreCase(text, LoadApiName(api))) return api;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown API \"", text,
                   "\": use Matmul, MatmulStream, ModelInfer (KServe v2) or "
                   "Check (grpc.health.v1)"));
}

absl::string_view LoadApiName(LoadApi api) {
  switch (api) {
    case LoadApi::kMatmul:
      return "Matmul";
    case LoadApi::kMatmulStream:
      return "MatmulStream";
    case LoadApi::kModelInfer:
      return "ModelInfer";
    case LoadApi::kCheck:
      return "Check";
  }
  return "unknown";
}

std::unique_ptr<RequestSender> MakeRequestSender(
    LoadApi api, const std::vector<std::shared_ptr<grpc::Channel>>& channels,
    const v1::MatmulRequest& request, const SenderOptions& options) {
  switch (api) {
    case LoadApi::kMatmul:
      return std::make_unique<UnarySender<MatmulTraits>>(channels, request,
                                                         options.timeout);
    case LoadApi::kMatmulStream:
      return std::make_unique<StreamSender>(channels, request,
                                            options.stream_timeout);
    case LoadApi::kModelInfer:
      return std::make_unique<UnarySender<ModelInferTraits>>(
          channels, ToModelInfer(request), options.timeout);
    case LoadApi::kCheck:
      return std::make_unique<UnarySender<HealthCheckTraits>>(
          channels, grpc::health::v1::HealthCheckRequest(), options.timeout);
  }
  return nullptr;
}

}  // namespace client
}  // namespace nibble
