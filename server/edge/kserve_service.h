// The Open Inference Protocol (KServe v2) face of nibbled, so that generic
// inference clients can call it: every resident weight is served as a model
// (see kserve_conversions.h for the tensor mapping), and ModelInfer runs the
// same matmul as nibble.v1 Matmul, through the same batcher. Every method
// uses the callback API and none blocks: ModelInfer is answered from the
// batcher's thread, the others on the thread that received them.
//
// Example:
//   nibble::server::KServeServiceImpl kserve(&store, &batcher);
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&kserve);
#ifndef NIBBLE_SERVER_EDGE_KSERVE_SERVICE_H_
#define NIBBLE_SERVER_EDGE_KSERVE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/batcher.h"
#include "server/core/reply_budget.h"
#include "server/core/weight_store.h"
#include "server/operations/auth.h"

namespace nibble::server {

class KServeServiceImpl final
    : public inference::GRPCInferenceService::CallbackService {
 public:
  // Both must outlive the service.
  // `auth` (--auth_token_file) may be null. Unless it is for writes only
  // (--auth_writes_only), every RPC but ServerLive and ServerReady needs a
  // token; those stay open like health.
  // A ModelInfer whose reply would pass `max_reply_bytes`
  // (--max_message_bytes; 0 for no limit), or `reply_budget` (may be null),
  // is refused before it runs.
  KServeServiceImpl(const WeightStore* store, MatmulBatcher* batcher,
                    const TokenAuthenticator* auth = nullptr,
                    int64_t max_reply_bytes = 0,
                    ReplyBudget* reply_budget = nullptr);

  // What ServerReady answers: false while nibbled loads --data_dir and
  // while it drains, so that orchestrators route no new work to it.
  void SetReady(bool ready) { ready_.store(ready); }

  grpc::ServerUnaryReactor* ServerLive(
      grpc::CallbackServerContext* context,
      const inference::ServerLiveRequest* request,
      inference::ServerLiveResponse* response) override;
  grpc::ServerUnaryReactor* ServerReady(
      grpc::CallbackServerContext* context,
      const inference::ServerReadyRequest* request,
      inference::ServerReadyResponse* response) override;
  // ready=false with status OK for an unknown model or version, as Triton
  // answers: the question is answered, the model just is not ready.
  grpc::ServerUnaryReactor* ModelReady(
      grpc::CallbackServerContext* context,
      const inference::ModelReadyRequest* request,
      inference::ModelReadyResponse* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(
      grpc::CallbackServerContext* context,
      const inference::ServerMetadataRequest* request,
      inference::ServerMetadataResponse* response) override;
  // NOT_FOUND for an unknown model or version.
  grpc::ServerUnaryReactor* ModelMetadata(
      grpc::CallbackServerContext* context,
      const inference::ModelMetadataRequest* request,
      inference::ModelMetadataResponse* response) override;
  // NOT_FOUND for an unknown model or version, INVALID_ARGUMENT for a bad
  // input.
  grpc::ServerUnaryReactor* ModelInfer(
      grpc::CallbackServerContext* context,
      const inference::ModelInferRequest* request,
      inference::ModelInferResponse* response) override;

 private:
  // The resident weight serving `model_name` at `version`.
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> FindModel(
      absl::string_view model_name, absl::string_view version) const;
  // The nibble.v1 request that `request` asks for.
  absl::StatusOr<v1::MatmulRequest> ToMatmulRequest(
      const inference::ModelInferRequest& request) const;

  const WeightStore* store_;
  MatmulBatcher* batcher_;
  const TokenAuthenticator* auth_;
  const int64_t max_reply_bytes_;
  ReplyBudget* const reply_budget_;
  std::atomic<bool> ready_{true};
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_KSERVE_SERVICE_H_
