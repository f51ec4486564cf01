// The server side of one matmul stream call: nibble.v1 MatmulStream, or
// Triton's ModelStreamInfer (the Protocol, see NibbleStreamProtocol and
// KServeStreamProtocol). It reads requests, answers each with its result or
// its error, and ends the stream with OK once the client has half-closed and
// every request is answered. Replies go out in completion order, which need
// not be the order of the requests. Ids are echoed as they came: a client
// that reuses an id gets one reply per request carrying it, and must tell
// them apart itself.
//
// Example (in a callback service method):
//   return new nibble::server::MatmulStreamReactor(store, batcher, context);
//
// Each request read is submitted to the batcher, which answers it through
// Complete() from its own thread; requests of a stream may share batches with
// each other and with other calls. Once the stream has failed, requests still
// queued count as cancelled and never run.
//
// State machine (all fields guarded by mu_):
//   reading:   at most one StartRead in flight; the next one starts only
//              while fewer than kMaxOwedReplies replies are owed (requests
//              read but not yet answered, plus answers waiting to be
//              written), so a client that never reads cannot make the server
//              buffer without bound. The first read starts in the
//              constructor. OnReadDone(false) means half-closed.
//   writing:   answers queue in replies_; at most one StartWrite in flight,
//              the next one started when the previous completes.
//   finishing: Finish(OK) once half-closed with nothing owed and no write in
//              flight; Finish(CANCELLED) after OnCancel or a failed write as
//              soon as no write is in flight (a read still in flight then
//              fails). After that no operation starts, unwritten and late
//              answers are dropped, and Finish is never called again.
//   lifetime:  gRPC calls OnDone after Finish and every operation completed;
//              the reactor deletes itself once OnDone has run and every
//              request read has been answered through Complete().
// Only one thread at a time (the "driver", see Drive) starts gRPC
// operations, and never while holding mu_, so that a reaction gRPC runs
// inline from StartRead, StartWrite or Finish cannot deadlock on mu_.
#ifndef NIBBLE_SERVER_EDGE_MATMUL_STREAM_H_
#define NIBBLE_SERVER_EDGE_MATMUL_STREAM_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "inference/grpc_predict_v2.pb.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/batcher.h"
#include "server/core/device_batchers.h"
#include "server/core/reply_budget.h"
#include "server/core/weight_store.h"

namespace nibble::server {

// nibble.v1 MatmulStream: each request carries an id and a MatmulRequest, and
// each reply the id and a MatmulResponse or a RequestError. Both travel as raw
// bytes, so that a reply's C is sent without a copy
// (MatmulStreamResponseBytes).
struct NibbleStreamProtocol {
  using Request = grpc::ByteBuffer;  // a MatmulStreamRequest
  using Reply = grpc::ByteBuffer;    // a MatmulStreamResponse
  // What a request's reply needs from it, kept while it runs.
  using Pending = uint64_t;

  // The matmul `request` asks for, taken out of it, or why there is none;
  // `pending` is set either way (0 for bytes that are no
  // MatmulStreamRequest).
  static absl::StatusOr<v1::MatmulRequest> Take(const WeightStore& store,
                                                Request& request,
                                                Pending* pending);
  static Reply Answer(Pending pending,
                      absl::StatusOr<v1::MatmulResponse> result);
  // A bound on the reply's bytes besides its MatmulResponse.
  static int64_t EnvelopeBytes(const Pending& pending);
};

// Triton's ModelStreamInfer: each request is a KServe ModelInferRequest, and
// each reply its ModelInferResponse or an error message.
struct KServeStreamProtocol {
  using Request = inference::ModelInferRequest;
  using Reply = inference::ModelStreamInferResponse;
  // The request without its data: the reply echoes its name, id and
  // datatype.
  using Pending = inference::ModelInferRequest;

  static absl::StatusOr<v1::MatmulRequest> Take(const WeightStore& store,
                                                Request& request,
                                                Pending* pending);
  static Reply Answer(Pending pending,
                      absl::StatusOr<v1::MatmulResponse> result);
  static int64_t EnvelopeBytes(const Pending& pending);
};

// Ends a stream at once, for a call refused before it starts.
template <typename Protocol>
class RefusedStream final
    : public grpc::ServerBidiReactor<typename Protocol::Request,
                                     typename Protocol::Reply> {
 public:
  explicit RefusedStream(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

template <typename Protocol>
class BasicMatmulStreamReactor final
    : public grpc::ServerBidiReactor<typename Protocol::Request,
                                     typename Protocol::Reply> {
 public:
  using Request = typename Protocol::Request;
  using Reply = typename Protocol::Reply;
  using Pending = typename Protocol::Pending;

  // Replies owed before reading pauses.
  static constexpr int64_t kMaxOwedReplies = 64;

  // Starts reading. `store`, `batcher` and `reply_budget` (may be null) must
  // outlive the reactor; requests get the call's deadline, and those whose
  // reply would pass `max_reply_bytes` (--max_message_bytes; 0 for no limit)
  // or the reply budget are answered with an error before they run.
  BasicMatmulStreamReactor(const WeightStore* store, DeviceBatchers* batcher,
                           grpc::CallbackServerContext* context,
                           int64_t max_reply_bytes = 0,
                           ReplyBudget* reply_budget = nullptr);

  // Answers the request `pending` came from, read earlier; exactly once per
  // request read. `hold` (may be null) is kept until the answer has been
  // written. Thread-safe; the reactor may be deleted before it returns.
  void Complete(Pending pending, absl::StatusOr<v1::MatmulResponse> result,
                ReplyBudget::Hold hold) ABSL_LOCKS_EXCLUDED(mu_);

  void OnReadDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_);
  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_);
  void OnDone() override ABSL_LOCKS_EXCLUDED(mu_);

 private:
  enum class Operation { kNone, kRead, kWrite, kFinish };

  ~BasicMatmulStreamReactor() override = default;

  // Called with mu_ held after a state change; returns with it released.
  // Starts every operation the state now calls for, unless another thread is
  // already driving (it will see the change), and deletes the reactor when
  // its life is over.
  void Drive() ABSL_UNLOCK_FUNCTION(mu_);
  // The next operation to start, with the state updated as if it had been.
  Operation NextOperation() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stops the stream with `status` unless it is already stopping.
  void Fail(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether nobody would receive answers any more. Asked by the batcher
  // instead of the context, which may be gone before the last Complete.
  bool Failed() const ABSL_LOCKS_EXCLUDED(mu_);

  const WeightStore* const store_;
  DeviceBatchers* const batcher_;
  const absl::Time deadline_;
  const int64_t max_reply_bytes_;
  ReplyBudget* const reply_budget_;
  // The client connection, whose share of the reply budget replies count
  // against.
  const std::string connection_;

  // An answer waiting to be written, with its hold on the reply budget.
  struct QueuedReply {
    Reply reply;
    ReplyBudget::Hold hold;
  };

  mutable absl::Mutex mu_;
  // Filled by the read in flight; only touched by gRPC while reading_.
  Request request_;
  // The reply being written; must stay unchanged while writing_.
  Reply reply_in_flight_;
  // reply_in_flight_'s hold, released once its write is done.
  ReplyBudget::Hold hold_in_flight_ ABSL_GUARDED_BY(mu_);
  std::deque<QueuedReply> replies_ ABSL_GUARDED_BY(mu_);
  // Requests read whose Complete() has not been called yet.
  int64_t unanswered_ ABSL_GUARDED_BY(mu_) = 0;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool half_closed_ ABSL_GUARDED_BY(mu_) = false;
  // Set when the stream was cancelled or a write failed; the status to
  // finish with instead of OK.
  std::optional<grpc::Status> failure_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool driving_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

using MatmulStreamReactor = BasicMatmulStreamReactor<NibbleStreamProtocol>;
using ModelStreamInferReactor = BasicMatmulStreamReactor<KServeStreamProtocol>;

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_MATMUL_STREAM_H_
