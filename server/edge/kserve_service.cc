#include "server/edge/kserve_service.h"

#include <utility>

#include "server/edge/kserve_conversions.h"
#include "server/edge/matmul_rpc.h"
#include "server/edge/proto_conversions.h"

namespace nibble::server {
namespace {

// Set by server/CMakeLists.txt from the CMake project version.
constexpr char kServerVersion[] = NIBBLE_VERSION;
constexpr char kServerName[] = "nibble";

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

}  // namespace

KServeServiceImpl::KServeServiceImpl(const WeightStore* store,
                                     MatmulBatcher* batcher,
                                     const TokenAuthenticator* auth,
                                     int64_t max_reply_bytes,
                                     ReplyBudget* reply_budget)
    : store_(store),
      batcher_(batcher),
      auth_(auth),
      max_reply_bytes_(max_reply_bytes),
      reply_budget_(reply_budget) {}

absl::StatusOr<std::shared_ptr<const ResidentWeight>>
KServeServiceImpl::FindModel(absl::string_view model_name,
                             absl::string_view version) const {
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      store_->Get(model_name);
  if (absl::IsNotFound(weight.status())) return KServeModelNotFound(model_name);
  if (!weight.ok()) return weight.status();
  if (absl::Status status = CheckKServeModelVersion(model_name, version);
      !status.ok()) {
    return status;
  }
  return weight;
}

absl::StatusOr<v1::MatmulRequest> KServeServiceImpl::ToMatmulRequest(
    const inference::ModelInferRequest& request) const {
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      FindModel(request.model_name(), request.model_version());
  if (!weight.ok()) return weight.status();
  return MatmulRequestFromKServe(request, (*weight)->packed.spec());
}

grpc::ServerUnaryReactor* KServeServiceImpl::ServerLive(
    grpc::CallbackServerContext* context, const inference::ServerLiveRequest*,
    inference::ServerLiveResponse* response) {
  response->set_live(true);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeServiceImpl::ServerReady(
    grpc::CallbackServerContext* context, const inference::ServerReadyRequest*,
    inference::ServerReadyResponse* response) {
  response->set_ready(ready_.load());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelReady(
    grpc::CallbackServerContext* context,
    const inference::ModelReadyRequest* request,
    inference::ModelReadyResponse* response) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return FinishNow(context, status);
  }
  response->set_ready(FindModel(request->name(), request->version()).ok());
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeServiceImpl::ServerMetadata(
    grpc::CallbackServerContext* context,
    const inference::ServerMetadataRequest*,
    inference::ServerMetadataResponse* response) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return FinishNow(context, status);
  }
  response->set_name(kServerName);
  response->set_version(kServerVersion);
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelMetadata(
    grpc::CallbackServerContext* context,
    const inference::ModelMetadataRequest* request,
    inference::ModelMetadataResponse* response) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return FinishNow(context, status);
  }
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      FindModel(request->name(), request->version());
  if (weight.ok()) {
    FillKServeModelMetadata((*weight)->name, (*weight)->packed.spec(),
                            response);
  }
  return FinishNow(context, weight.status());
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelInfer(
    grpc::CallbackServerContext* context,
    const inference::ModelInferRequest* request,
    inference::ModelInferResponse* response) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return FinishNow(context, status);
  }
  absl::StatusOr<v1::MatmulRequest> matmul = ToMatmulRequest(*request);
  if (!matmul.ok()) return FinishNow(context, matmul.status());
  auto* reactor = new HeldReplyReactor();
  SubmitMatmulRpc(
      *store_, *batcher_, *std::move(matmul),
      CallOf(context,
             {.max_bytes = max_reply_bytes_,
              .envelope_bytes = KServeInferReplyEnvelopeBytes(*request),
              .budget = reply_budget_}),
      [reactor, request, response](absl::StatusOr<v1::MatmulResponse> result,
                                   ReplyBudget::Hold hold) {
        if (result.ok()) {
          FillKServeInferResponse(*request, *std::move(result), response);
        }
        reactor->Finish(ToGrpcStatus(result.status()), std::move(hold));
      });
  return reactor;
}

}  // namespace nibble::server
