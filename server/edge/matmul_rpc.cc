#include "server/edge/matmul_rpc.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "format/dtype.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/wire_format_lite.h"
#include "server/core/matmul_runner.h"
#include "server/edge/proto_conversions.h"

namespace nibble::server {
namespace {

// A bound on a MatmulResponse's bytes besides C's: the tags and lengths of its
// six fields, and a kernel name, which is far shorter.
constexpr int64_t kMatmulResponseFieldBytes = 256;

// A bound on the bytes of the reply carrying C [m, n] of `dtype`, with the
// envelope of `limit`; in double, since m may be anything the client sent.
double ReplyBytes(const ReplyLimit& limit, int64_t m, int64_t n, DType dtype) {
  return static_cast<double>(m) * n * DTypeSize(dtype) + limit.envelope_bytes +
         kMatmulResponseFieldBytes;
}

// OK when the reply carrying C [m, n] of `dtype` fits `limit`; m and n are
// positive.
absl::Status CheckReplyFits(const ReplyLimit& limit, int64_t m, int64_t n,
                            DType dtype) {
  if (limit.max_bytes <= 0) return absl::OkStatus();
  const int64_t row_bytes = n * static_cast<int64_t>(DTypeSize(dtype));
  const int64_t room =
      limit.max_bytes - limit.envelope_bytes - kMatmulResponseFieldBytes;
  const int64_t max_rows = room > 0 ? room / row_bytes : 0;
  if (m <= max_rows) return absl::OkStatus();
  const double reply_bytes = ReplyBytes(limit, m, n, dtype);
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the reply would be about %.0f bytes (C is %d x %d %s), more than "
      "nibbled --max_message_bytes=%d allows; send at most %d rows of A per "
      "request, or raise --max_message_bytes",
      reply_bytes, m, n, DTypeName(dtype), limit.max_bytes, max_rows));
}

// Appends the tag of length-delimited field `field` and `length` to `out`.
void AppendTagAndLength(int field, size_t length, std::string* out) {
  google::protobuf::io::StringOutputStream stream(out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.WriteTag(google::protobuf::internal::WireFormatLite::MakeTag(
      field,
      google::protobuf::internal::WireFormatLite::WIRETYPE_LENGTH_DELIMITED));
  coded.WriteVarint64(length);
}

// C of `response`, moved out of it to the heap; owned by the caller.
std::string* TakeC(v1::MatmulResponse& response) {
  auto* c = new std::string(std::move(*response.mutable_c()));
  response.clear_c();
  return c;
}

// The wire bytes of `response` (its C taken out) up to `c_bytes` of C: its
// other fields, then C's tag and length; a parser takes fields in any order.
std::string HeadBeforeC(const v1::MatmulResponse& response, size_t c_bytes) {
  std::string head = response.SerializeAsString();
  AppendTagAndLength(v1::MatmulResponse::kCFieldNumber, c_bytes, &head);
  return head;
}

// `head` (copied) and then `c`'s own memory, which the buffer takes and frees
// once gRPC is done with it.
grpc::ByteBuffer BytesEndingInC(const std::string& head, std::string* c) {
  const grpc::Slice slices[] = {
      grpc::Slice(head),
      grpc::Slice(
          c->data(), c->size(),
          [](void* owner) { delete static_cast<std::string*>(owner); }, c)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace

RpcCall CallOf(grpc::CallbackServerContext* context, ReplyLimit reply_limit) {
  return {.deadline = absl::FromChrono(context->deadline()),
          .is_cancelled = [context] { return context->IsCancelled(); },
          .reply_limit = reply_limit,
          .connection = context->peer()};
}

void SubmitMatmulRpc(
    const WeightStore& store, DeviceBatchers& batcher,
    const v1::MatmulRequest& request, RpcCall call,
    std::function<void(absl::StatusOr<v1::MatmulResponse>, ReplyBudget::Hold)>
        done) {
  absl::StatusOr<DType> dtype = FromProto(request.dtype());
  if (!dtype.ok()) return done(dtype.status(), nullptr);
  absl::StatusOr<std::optional<ActivationPrecision>> precision =
      FromProto(request.activation_precision());
  if (!precision.ok()) return done(precision.status(), nullptr);
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      store.Get(request.weight_name());
  if (!weight.ok()) return done(weight.status(), nullptr);
  const WeightSpec& spec = (*weight)->packed.spec();
  // The request's own faults come first: they are what the client must fix.
  if (absl::Status status =
          CheckMatmulShape(spec, (*weight)->name, request.m(), request.k(),
                           *dtype, request.a().size());
      !status.ok()) {
    return done(status, nullptr);
  }
  const int64_t n = spec.n;
  if (absl::Status status =
          CheckReplyFits(call.reply_limit, request.m(), n, *dtype);
      !status.ok()) {
    return done(status, nullptr);
  }
  ReplyBudget::Hold hold;
  if (call.reply_limit.budget != nullptr) {
    absl::StatusOr<ReplyBudget::Hold> held = call.reply_limit.budget->TryHold(
        std::move(call.connection),
        static_cast<int64_t>(
            ReplyBytes(call.reply_limit, request.m(), n, *dtype)));
    if (!held.ok()) return done(held.status(), nullptr);
    hold = *std::move(held);
  }
  batcher.Submit(
      {.weight = *std::move(weight),
       .dtype = *dtype,
       .m = request.m(),
       .k = request.k(),
       .a = request.a(),
       .activation_precision = *precision,
       .deadline = call.deadline,
       .is_cancelled = std::move(call.is_cancelled),
       .done = [done = std::move(done), m = request.m(), n,
                proto_dtype = request.dtype(),
                hold = std::move(hold)](absl::StatusOr<MatmulResult> result) {
         if (!result.ok()) return done(result.status(), nullptr);
         v1::MatmulResponse response;
         response.set_c(std::move(result->c));
         response.set_m(m);
         response.set_n(n);
         response.set_dtype(proto_dtype);
         response.set_kernel(std::move(result->kernel));
         response.set_compute_time_ns(result->compute_time_ns);
         response.set_activation_precision(
             ToProto(result->activation_precision));
         done(std::move(response), hold);
       }});
}

grpc::ByteBuffer MatmulResponseBytes(v1::MatmulResponse response) {
  std::string* c = TakeC(response);
  return BytesEndingInC(HeadBeforeC(response, c->size()), c);
}

grpc::ByteBuffer MatmulStreamResponseBytes(uint64_t id,
                                           v1::MatmulResponse response) {
  std::string* c = TakeC(response);
  const std::string response_head = HeadBeforeC(response, c->size());
  v1::MatmulStreamResponse envelope;
  envelope.set_id(id);
  std::string head = envelope.SerializeAsString();
  AppendTagAndLength(v1::MatmulStreamResponse::kResponseFieldNumber,
                     response_head.size() + c->size(), &head);
  head += response_head;
  return BytesEndingInC(head, c);
}

}  // namespace nibble::server
