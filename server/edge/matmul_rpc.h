// The asynchronous front of every matmul RPC: one nibble.v1.MatmulRequest is
// checked, its weight looked up in the store, and handed to the batcher; the
// answer comes back as a MatmulResponse. Matmul, MatmulStream and the KServe
// ModelInfer all go through it.
//
// Example:
//   auto* reactor = new nibble::server::HeldReplyReactor();
//   nibble::server::SubmitMatmulRpc(
//       store, batcher, *request,
//       nibble::server::CallOf(context, {.max_bytes = 64 << 20,
//                                        .budget = &reply_budget}),
//       [reactor, response](absl::StatusOr<v1::MatmulResponse> result,
//                           nibble::server::ReplyBudget::Hold hold) {...});
#ifndef NIBBLE_SERVER_EDGE_MATMUL_RPC_H_
#define NIBBLE_SERVER_EDGE_MATMUL_RPC_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/batcher.h"
#include "server/core/device_batchers.h"
#include "server/core/reply_budget.h"
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
  // Where the reply is held until it is sent (--max_held_reply_bytes); null
  // for no budget.
  ReplyBudget* budget = nullptr;
};

// What the batcher needs to know about the call a request came on, and how
// large its reply may be.
struct RpcCall {
  absl::Time deadline = absl::InfiniteFuture();
  // See MatmulWork::is_cancelled.
  std::function<bool()> is_cancelled;
  ReplyLimit reply_limit;
  // The client connection (ServerContext::peer), whose share of the reply
  // budget the reply counts against.
  std::string connection;
};

// The deadline, cancellation and connection of a unary callback call;
// `context` must stay alive until the call is finished.
RpcCall CallOf(grpc::CallbackServerContext* context, ReplyLimit reply_limit);

// Calls `done` exactly once: at once, inside this call, with NOT_FOUND for an
// unknown weight, INVALID_ARGUMENT for a bad dtype, activation precision or
// shape,
// RESOURCE_EXHAUSTED (naming the reply's size, the flag and the most rows that
// fit) for a reply past call.reply_limit.max_bytes, RESOURCE_EXHAUSTED from
// the reply budget, or the batcher's refusal; otherwise later from a batcher
// thread with the response. With the response comes its hold on the reply
// budget (null without a budget or with an error), which the caller keeps
// until the reply has been sent.
// `request` is read in place, A not copied: it must stay alive and unchanged
// until `done` has been called.
void SubmitMatmulRpc(
    const WeightStore& store, DeviceBatchers& batcher,
    const v1::MatmulRequest& request, RpcCall call,
    std::function<void(absl::StatusOr<v1::MatmulResponse>, ReplyBudget::Hold)>
        done);

// The wire bytes of `response`, for a call whose reply is a raw ByteBuffer:
// C is not copied but moved into the buffer's last slice, which frees it once
// gRPC is done sending. They parse as `response`.
grpc::ByteBuffer MatmulResponseBytes(v1::MatmulResponse response);
// The same for the MatmulStreamResponse of request `id` carrying `response`.
grpc::ByteBuffer MatmulStreamResponseBytes(uint64_t id,
                                           v1::MatmulResponse response);

// The reactor of a unary matmul call: it keeps the reply's hold on the reply
// budget until gRPC is done with the call, that is until the reply has been
// sent or the call has failed, and then deletes itself.
class HeldReplyReactor final : public grpc::ServerUnaryReactor {
 public:
  void Finish(grpc::Status status, ReplyBudget::Hold hold) {
    hold_ = std::move(hold);
    grpc::ServerUnaryReactor::Finish(std::move(status));
  }
  void OnDone() override { delete this; }

 private:
  // Set once, before Finish; released when OnDone deletes the reactor.
  ReplyBudget::Hold hold_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_MATMUL_RPC_H_
