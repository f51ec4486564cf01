// The asynchronous front of every matmul RPC: one nibble.v1.MatmulRequest is
// checked, its weight looked up in the store, and handed to the batcher; the
// answer comes back as a MatmulResponse. Matmul, MatmulStream and the KServe
// ModelInfer all go through it.
//
// Example:
//   nibble::server::SubmitMatmulRpc(
//       store, batcher, std::move(request),
//       nibble::server::CallOf(context),
//       [reactor, response](absl::StatusOr<v1::MatmulResponse> result) {...});
#ifndef NIBBLE_SERVER_EDGE_MATMUL_RPC_H_
#define NIBBLE_SERVER_EDGE_MATMUL_RPC_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/batcher.h"
#include "server/core/weight_store.h"

namespace nibble::server {

// What the batcher needs to know about the call a request came on.
struct RpcCall {
  absl::Time deadline = absl::InfiniteFuture();
  // See MatmulWork::is_cancelled.
  std::function<bool()> is_cancelled;
};

// The deadline and cancellation of a unary callback call; `context` must stay
// alive until the call is finished.
RpcCall CallOf(grpc::CallbackServerContext* context);

// Calls `done` exactly once: at once, inside this call, with NOT_FOUND for an
// unknown weight, INVALID_ARGUMENT for a bad dtype or shape, or the batcher's
// refusal; otherwise later from a batcher thread with the response.
void SubmitMatmulRpc(
    const WeightStore& store, MatmulBatcher& batcher, v1::MatmulRequest request,
    RpcCall call, std::function<void(absl::StatusOr<v1::MatmulResponse>)> done);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_MATMUL_RPC_H_
