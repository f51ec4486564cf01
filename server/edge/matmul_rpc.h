// The asynchronous front of every matmul RPC: one nibble.v1.MatmulRequest is
// checked, its weight looked up in the store, and handed to the batcher; the
// answer comes back as a MatmulResponse. Matmul, MatmulStream and the KServe
// ModelInfer all go through it.
//
// Example:
//   nibble::server::SubmitMatmulRpc(
//       store, batcher, std::move(request),
//       nibble::server::CallOf(context, {.max_bytes = 64 << 20}),
//       [reactor, response](absl::StatusOr<v1::MatmulResponse> result) {...});
#ifndef NIBBLE_SERVER_EDGE_MATMUL_RPC_H_
#define NIBBLE_SERVER_EDGE_MATMUL_RPC_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/batcher.h"
#include "server/core/weight_store.h"

namespace nibble::server {

// How large the reply of a matmul call may be. It is checked before the
// matmul runs, so that no C is computed that gRPC would then refuse to send.
struct ReplyLimit {
  // Most bytes of the reply message (nibbled --max_message_bytes); 0 for no
  // limit.
  int64_t max_bytes = 0;
  // A bound on what the reply carries besides the MatmulResponse: a stream
  // reply's id, KServe's echoed id and model name.
  int64_t envelope_bytes = 0;
};

// What the batcher needs to know about the call a request came on, and how
// large its reply may be.
struct RpcCall {
  absl::Time deadline = absl::InfiniteFuture();
  // See MatmulWork::is_cancelled.
  std::function<bool()> is_cancelled;
  ReplyLimit reply_limit;
};

// The deadline and cancellation of a unary callback call; `context` must stay
// alive until the call is finished.
RpcCall CallOf(grpc::CallbackServerContext* context, ReplyLimit reply_limit);

// Calls `done` exactly once: at once, inside this call, with NOT_FOUND for an
// unknown weight, INVALID_ARGUMENT for a bad dtype or shape,
// RESOURCE_EXHAUSTED (naming the reply's size, the flag and the most rows that
// fit) for a reply past call.reply_limit, or the batcher's refusal; otherwise
// later from a batcher thread with the response.
void SubmitMatmulRpc(
    const WeightStore& store, MatmulBatcher& batcher, v1::MatmulRequest request,
    RpcCall call, std::function<void(absl::StatusOr<v1::MatmulResponse>)> done);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_MATMUL_RPC_H_
