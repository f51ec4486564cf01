// The Open Inference Protocol (KServe v2) face of nibbled, with Triton's
// extensions of it, so that generic inference clients can call it: every
// resident weight is served as a model (see kserve_conversions.h for the
// tensor mapping, triton_conversions.h for the configuration and
// statistics), and ModelInfer and ModelStreamInfer run the same matmul as
// nibble.v1 Matmul and MatmulStream, through the same batcher. Every method
// uses the callback API: ModelInfer is answered from the batcher's thread,
// the others on the thread that received them.
//
// Example:
//   nibble::server::KServeServiceImpl kserve(&store, &batcher, repository);
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&kserve);
#ifndef NIBBLE_SERVER_EDGE_KSERVE_SERVICE_H_
#define NIBBLE_SERVER_EDGE_KSERVE_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/batcher.h"
#include "server/core/device_batchers.h"
#include "server/core/reply_budget.h"
#include "server/core/weight_store.h"
#include "server/operations/auth.h"

namespace nibble::server {

// How Triton's repository RPCs change the store.
struct ModelRepository {
  // RepositoryModelLoad of a model that is not resident: stores the weight
  // of that name from --data_dir, or says why it cannot.
  std::function<absl::Status(absl::string_view name)> load;
  // RepositoryModelUnload: deletes the weight as nibble.v1 DeleteWeight
  // does, file and all.
  std::function<absl::Status(absl::string_view name)> unload;
};

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
  KServeServiceImpl(const WeightStore* store, DeviceBatchers* batcher,
                    ModelRepository repository,
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

  // Triton's extensions. Unknown models and versions are NOT_FOUND; the
  // repository's name must be empty, as nibbled has one.
  // Each request of the stream is answered in it, with its error when it
  // fails, and the stream goes on.
  grpc::ServerBidiReactor<inference::ModelInferRequest,
                          inference::ModelStreamInferResponse>*
  ModelStreamInfer(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* ModelConfig(
      grpc::CallbackServerContext* context,
      const inference::ModelConfigRequest* request,
      inference::ModelConfigResponse* response) override;
  // Every model for an empty name.
  grpc::ServerUnaryReactor* ModelStatistics(
      grpc::CallbackServerContext* context,
      const inference::ModelStatisticsRequest* request,
      inference::ModelStatisticsResponse* response) override;
  // Every resident weight, READY.
  grpc::ServerUnaryReactor* RepositoryIndex(
      grpc::CallbackServerContext* context,
      const inference::RepositoryIndexRequest* request,
      inference::RepositoryIndexResponse* response) override;
  // OK at once for a resident model; ModelRepository::load otherwise.
  // Parameters (a configuration or files to load from) are refused.
  grpc::ServerUnaryReactor* RepositoryModelLoad(
      grpc::CallbackServerContext* context,
      const inference::RepositoryModelLoadRequest* request,
      inference::RepositoryModelLoadResponse* response) override;
  grpc::ServerUnaryReactor* RepositoryModelUnload(
      grpc::CallbackServerContext* context,
      const inference::RepositoryModelUnloadRequest* request,
      inference::RepositoryModelUnloadResponse* response) override;

 private:
  const WeightStore* store_;
  DeviceBatchers* batcher_;
  const ModelRepository repository_;
  const TokenAuthenticator* auth_;
  const int64_t max_reply_bytes_;
  ReplyBudget* const reply_budget_;
  std::atomic<bool> ready_{true};
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_KSERVE_SERVICE_H_
