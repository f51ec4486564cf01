// How nibble-load sends one request and hears back, whatever the API: unary
// Matmul, one of many requests on a MatmulStream, or a KServe v2 ModelInfer.
// All three send the same A and return C, so the load runs do not care which.
// Check sends a grpc.health.v1 health check instead, the cheapest unary call
// the server answers: what the RPC costs without the matmul.
//
// Example:
//   std::unique_ptr<nibble::client::RequestSender> sender =
//       nibble::client::MakeRequestSender(nibble::client::LoadApi::kMatmul,
//                                         channels, request, options);
//   sender->Send(/*connection=*/0, [](nibble::client::Reply reply) {
//     // On a gRPC thread: reply.status, reply.kernel, reply.c.
//   });
//   sender->Finish();  // After the last Send: waits for open streams.
#ifndef NIBBLE_CLIENT_REQUEST_SENDER_H_
#define NIBBLE_CLIENT_REQUEST_SENDER_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "grpcpp/channel.h"
#include "grpcpp/support/status.h"
#include "nibble/v1/nibble.pb.h"

namespace nibble {
namespace client {

enum class LoadApi { kMatmul, kMatmulStream, kModelInfer, kCheck };

// "Matmul", "MatmulStream", "ModelInfer" or "Check", in any case.
absl::StatusOr<LoadApi> ParseLoadApi(absl::string_view text);
absl::string_view LoadApiName(LoadApi api);

// The answer to one request.
struct Reply {
  grpc::Status status;
  // The kernel the server ran, when it says.
  std::string kernel;
  // C [M, N] in the request's dtype, when the status is OK; empty for Check.
  std::string c;
};

using ReplyCallback = std::function<void(Reply)>;

class RequestSender {
 public:
  virtual ~RequestSender() = default;

  // Sends the request over channel `connection` modulo their number without
  // waiting; `done` runs exactly once, on a gRPC thread, and may Send again.
  virtual void Send(size_t connection, ReplyCallback done) = 0;

  // Call after the last Send: ends the streams, if any, and waits until every
  // `done` has run.
  virtual void Finish() = 0;
};

struct SenderOptions {
  // The deadline of each unary request.
  absl::Duration timeout;
  // MatmulStream: the deadline of each stream, counted from its opening.
  absl::Duration stream_timeout;
};

// Sends `request` (its weight, M, dtype and A) through `api`; Check ignores it
// and asks for the health of the whole server (service ""). A Check answered
// with any status but SERVING counts as UNAVAILABLE.
std::unique_ptr<RequestSender> MakeRequestSender(
    LoadApi api, const std::vector<std::shared_ptr<grpc::Channel>>& channels,
    const v1::MatmulRequest& request, const SenderOptions& options);

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_REQUEST_SENDER_H_
