#include "server/edge/matmul_stream.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "server/edge/matmul_rpc.h"

namespace nibble::server {
namespace {

// A bound on a MatmulStreamResponse's bytes besides its MatmulResponse: the
// id and the response's tag and length.
constexpr int64_t kReplyEnvelopeBytes = 32;

}  // namespace

absl::StatusOr<v1::MatmulRequest> NibbleStreamProtocol::Take(
    const WeightStore&, Request& request_bytes, Pending* pending) {
  v1::MatmulStreamRequest request;
  if (!grpc::SerializationTraits<v1::MatmulStreamRequest>::Deserialize(
           &request_bytes, &request)
           .ok()) {
    *pending = 0;
    return absl::InvalidArgumentError(
        "a stream message is not a nibble.v1.MatmulStreamRequest; send one "
        "per message");
  }
  *pending = request.id();
  if (!request.has_request()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream request ", request.id(),
                     " has no `request`; set it to the MatmulRequest to run"));
  }
  return std::move(*request.mutable_request());
}

NibbleStreamProtocol::Reply NibbleStreamProtocol::Answer(
    Pending pending, absl::StatusOr<v1::MatmulResponse> result) {
  if (result.ok()) {
    return MatmulStreamResponseBytes(pending, *std::move(result));
  }
  v1::MatmulStreamResponse reply;
  reply.set_id(pending);
  // absl::StatusCode and grpc::StatusCode share their values.
  reply.mutable_error()->set_code(static_cast<int>(result.status().code()));
  reply.mutable_error()->set_message(std::string(result.status().message()));
  const grpc::Slice bytes(reply.SerializeAsString());
  return grpc::ByteBuffer(&bytes, 1);
}

int64_t NibbleStreamProtocol::EnvelopeBytes(const Pending&) {
  return kReplyEnvelopeBytes;
}

template <typename Protocol>
BasicMatmulStreamReactor<Protocol>::BasicMatmulStreamReactor(
    const WeightStore* store, DeviceBatchers* batcher,
    grpc::CallbackServerContext* context, int64_t max_reply_bytes,
    ReplyBudget* reply_budget)
    : store_(store),
      batcher_(batcher),
      deadline_(absl::FromChrono(context->deadline())),
      max_reply_bytes_(max_reply_bytes),
      reply_budget_(reply_budget),
      connection_(context->peer()) {
  mu_.Lock();
  Drive();
}

template <typename Protocol>
void BasicMatmulStreamReactor<Protocol>::Complete(
    Pending pending, absl::StatusOr<v1::MatmulResponse> result,
    ReplyBudget::Hold hold) {
  Reply reply = Protocol::Answer(std::move(pending), std::move(result));
  mu_.Lock();
  --unanswered_;
  // A failed stream writes nothing more.
  if (!failure_.has_value()) {
    replies_.push_back({std::move(reply), std::move(hold)});
  }
  Drive();
}

template <typename Protocol>
void BasicMatmulStreamReactor<Protocol>::OnReadDone(bool ok) {
  mu_.Lock();
  reading_ = false;
  if (!ok) {
    half_closed_ = true;
    Drive();
    return;
  }
  if (failure_.has_value()) {  // nobody would receive the answer
    Drive();
    return;
  }
  Request request;
  request.Swap(&request_);
  ++unanswered_;  // keeps the reactor alive until Complete below
  // Lets the next read run while this request computes.
  Drive();
  Pending pending;
  absl::StatusOr<v1::MatmulRequest> matmul =
      Protocol::Take(*store_, request, &pending);
  if (!matmul.ok()) {
    Complete(std::move(pending), matmul.status(), nullptr);
    return;
  }
  const int64_t envelope_bytes = Protocol::EnvelopeBytes(pending);
  // Kept until answered: the batcher reads A from it in place.
  auto kept = std::make_shared<const v1::MatmulRequest>(*std::move(matmul));
  SubmitMatmulRpc(*store_, *batcher_, *kept,
                  {.deadline = deadline_,
                   .is_cancelled = [this] { return Failed(); },
                   .reply_limit = {.max_bytes = max_reply_bytes_,
                                   .envelope_bytes = envelope_bytes,
                                   .budget = reply_budget_},
                   .connection = connection_},
                  [this, pending = std::move(pending), kept](
                      absl::StatusOr<v1::MatmulResponse> result,
                      ReplyBudget::Hold hold) mutable {
                    Complete(std::move(pending), std::move(result),
                             std::move(hold));
                  });
}

template <typename Protocol>
void BasicMatmulStreamReactor<Protocol>::OnWriteDone(bool ok) {
  mu_.Lock();
  writing_ = false;
  hold_in_flight_.reset();
  if (!ok) {
    Fail(grpc::Status(grpc::StatusCode::CANCELLED,
                      "a reply could not be written; the client is gone"));
  }
  Drive();
}

template <typename Protocol>
void BasicMatmulStreamReactor<Protocol>::OnCancel() {
  mu_.Lock();
  Fail(grpc::Status(grpc::StatusCode::CANCELLED,
                    "the stream was cancelled; unanswered requests were "
                    "dropped"));
  Drive();
}

template <typename Protocol>
void BasicMatmulStreamReactor<Protocol>::OnDone() {
  mu_.Lock();
  done_ = true;
  // Otherwise the driver or the last Complete deletes it.
  const bool delete_now = !driving_ && unanswered_ == 0;
  mu_.Unlock();
  if (delete_now) delete this;
}

template <typename Protocol>
bool BasicMatmulStreamReactor<Protocol>::Failed() const {
  absl::MutexLock lock(&mu_);
  return failure_.has_value();
}

template <typename Protocol>
void BasicMatmulStreamReactor<Protocol>::Fail(grpc::Status status) {
  if (failure_.has_value()) return;
  failure_ = std::move(status);
  replies_.clear();
}

template <typename Protocol>
typename BasicMatmulStreamReactor<Protocol>::Operation
BasicMatmulStreamReactor<Protocol>::NextOperation() {
  if (finished_) return Operation::kNone;
  if (failure_.has_value()) {
    // gRPC must not be holding a reply we are about to destroy; the write in
    // flight fails fast and its OnWriteDone comes back here.
    if (writing_) return Operation::kNone;
    finished_ = true;
    return Operation::kFinish;
  }
  if (!writing_ && !replies_.empty()) {
    reply_in_flight_ = std::move(replies_.front().reply);
    hold_in_flight_ = std::move(replies_.front().hold);
    replies_.pop_front();
    writing_ = true;
    return Operation::kWrite;
  }
  const int64_t owed = unanswered_ + static_cast<int64_t>(replies_.size());
  if (!reading_ && !half_closed_ && owed < kMaxOwedReplies) {
    reading_ = true;
    return Operation::kRead;
  }
  if (half_closed_ && !writing_ && owed == 0) {
    finished_ = true;
    return Operation::kFinish;
  }
  return Operation::kNone;
}

template <typename Protocol>
void BasicMatmulStreamReactor<Protocol>::Drive() {
  if (driving_) {
    mu_.Unlock();
    return;
  }
  driving_ = true;
  for (Operation operation = NextOperation(); operation != Operation::kNone;
       operation = NextOperation()) {
    const grpc::Status final_status = operation == Operation::kFinish
                                          ? failure_.value_or(grpc::Status::OK)
                                          : grpc::Status::OK;
    mu_.Unlock();
    switch (operation) {
      case Operation::kRead:
        this->StartRead(&request_);
        break;
      case Operation::kWrite:
        this->StartWrite(&reply_in_flight_);
        break;
      case Operation::kFinish:
        this->Finish(final_status);
        break;
      case Operation::kNone:
        break;
    }
    mu_.Lock();
  }
  driving_ = false;
  const bool delete_now = done_ && unanswered_ == 0;
  mu_.Unlock();
  if (delete_now) delete this;
}

template class BasicMatmulStreamReactor<NibbleStreamProtocol>;
template class BasicMatmulStreamReactor<KServeStreamProtocol>;

}  // namespace nibble::server
