#include "server/edge/kserve_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/edge/kserve_conversions.h"
#include "server/edge/matmul_rpc.h"
#include "server/edge/matmul_stream.h"
#include "server/edge/proto_conversions.h"
#include "server/edge/triton_conversions.h"

namespace nibble::server {
namespace {

// Set by server/CMakeLists.txt from the CMake project version.
constexpr char kServerVersion[] = NIBBLE_VERSION;
constexpr char kServerName[] = "nibble";
// Triton's names of the extensions nibbled serves: ModelConfig,
// RepositoryIndex with Load and Unload, ModelStatistics.
constexpr const char* kTritonExtensions[] = {"model_configuration",
                                             "model_repository", "statistics"};

grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A model repository RPC: authorized for `access`, and naming nibbled's one
// model repository, which has no name.
absl::Status CheckRepositoryCall(const TokenAuthenticator* auth,
                                 const grpc::CallbackServerContext& context,
                                 RpcAccess access,
                                 absl::string_view repository_name) {
  if (absl::Status status = Authorize(auth, context, access); !status.ok()) {
    return status;
  }
  if (repository_name.empty()) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat(
      "repository \"", repository_name,
      "\" is unknown: nibbled has one model repository, its resident "
      "weights; leave repository_name empty"));
}

// RepositoryIndex reads the store in pages of this many weights, as
// ListWeights does, so that no page holds the store long.
constexpr int64_t kIndexPageWeights = 1000;

}  // namespace

absl::StatusOr<v1::MatmulRequest> KServeStreamProtocol::Take(
    const WeightStore& store, Request& request, Pending* pending) {
  absl::StatusOr<v1::MatmulRequest> matmul;
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      FindKServeModel(store, request.model_name(), request.model_version());
  if (weight.ok()) {
    matmul = MatmulRequestFromKServe(request, (*weight)->packed.spec());
  } else {
    matmul = weight.status();
  }
  // The data is in the matmul now; the reply needs the rest.
  request.clear_raw_input_contents();
  for (auto& input : *request.mutable_inputs()) input.clear_contents();
  *pending = std::move(request);
  return matmul;
}

KServeStreamProtocol::Reply KServeStreamProtocol::Answer(
    Pending pending, absl::StatusOr<v1::MatmulResponse> result) {
  Reply reply;
  if (result.ok()) {
    FillKServeInferResponse(pending, *std::move(result),
                            reply.mutable_infer_response());
  } else {
    reply.set_error_message(std::string(result.status().message()));
    // So that the client can tell which request failed.
    reply.mutable_infer_response()->set_model_name(pending.model_name());
    reply.mutable_infer_response()->set_id(pending.id());
  }
  return reply;
}

int64_t KServeStreamProtocol::EnvelopeBytes(const Pending& pending) {
  // The reply's own tag and length around the ModelInferResponse.
  constexpr int64_t kStreamReplyBytes = 16;
  return KServeInferReplyEnvelopeBytes(pending) + kStreamReplyBytes;
}

KServeServiceImpl::KServeServiceImpl(const WeightStore* store,
                                     DeviceBatchers* batcher,
                                     ModelRepository repository,
                                     const TokenAuthenticator* auth,
                                     int64_t max_reply_bytes,
                                     ReplyBudget* reply_budget)
    : store_(store),
      batcher_(batcher),
      repository_(std::move(repository)),
      auth_(auth),
      max_reply_bytes_(max_reply_bytes),
      reply_budget_(reply_budget) {}

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
  response->set_ready(
      FindKServeModel(*store_, request->name(), request->version()).ok());
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
  for (const char* extension : kTritonExtensions) {
    response->add_extensions(extension);
  }
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
      FindKServeModel(*store_, request->name(), request->version());
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
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      FindKServeModel(*store_, request->model_name(), request->model_version());
  if (!weight.ok()) return FinishNow(context, weight.status());
  absl::StatusOr<v1::MatmulRequest> matmul =
      MatmulRequestFromKServe(*request, (*weight)->packed.spec());
  if (!matmul.ok()) return FinishNow(context, matmul.status());
  auto* reactor = new HeldReplyReactor();
  // Kept until answered: the batcher reads A from it in place.
  auto kept = std::make_shared<const v1::MatmulRequest>(*std::move(matmul));
  SubmitMatmulRpc(
      *store_, *batcher_, *kept,
      CallOf(context,
             {.max_bytes = max_reply_bytes_,
              .envelope_bytes = KServeInferReplyEnvelopeBytes(*request),
              .budget = reply_budget_}),
      [reactor, request, response, kept](
          absl::StatusOr<v1::MatmulResponse> result, ReplyBudget::Hold hold) {
        if (result.ok()) {
          FillKServeInferResponse(*request, *std::move(result), response);
        }
        reactor->Finish(ToGrpcStatus(result.status()), std::move(hold));
      });
  return reactor;
}

grpc::ServerBidiReactor<inference::ModelInferRequest,
                        inference::ModelStreamInferResponse>*
KServeServiceImpl::ModelStreamInfer(grpc::CallbackServerContext* context) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return new RefusedStream<KServeStreamProtocol>(ToGrpcStatus(status));
  }
  if (absl::Status status = store_->CheckLoaded(); !status.ok()) {
    return new RefusedStream<KServeStreamProtocol>(ToGrpcStatus(status));
  }
  return new ModelStreamInferReactor(store_, batcher_, context,
                                     max_reply_bytes_, reply_budget_);
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelConfig(
    grpc::CallbackServerContext* context,
    const inference::ModelConfigRequest* request,
    inference::ModelConfigResponse* response) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return FinishNow(context, status);
  }
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      FindKServeModel(*store_, request->name(), request->version());
  if (weight.ok()) {
    FillTritonModelConfig((*weight)->name, (*weight)->packed.spec(),
                          batcher_->OptionsFor(**weight),
                          response->mutable_config());
  }
  return FinishNow(context, weight.status());
}

grpc::ServerUnaryReactor* KServeServiceImpl::ModelStatistics(
    grpc::CallbackServerContext* context,
    const inference::ModelStatisticsRequest* request,
    inference::ModelStatisticsResponse* response) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return FinishNow(context, status);
  }
  std::vector<std::shared_ptr<const ResidentWeight>> weights;
  if (request->name().empty()) {
    if (absl::Status status = store_->CheckLoaded(); !status.ok()) {
      return FinishNow(context, status);
    }
    if (absl::Status status =
            CheckKServeModelVersion("every model", request->version());
        !status.ok()) {
      return FinishNow(context, status);
    }
    weights = store_->List();
  } else {
    absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
        FindKServeModel(*store_, request->name(), request->version());
    if (!weight.ok()) return FinishNow(context, weight.status());
    weights.push_back(*std::move(weight));
  }
  const BatcherStats stats = batcher_->Stats();
  for (const auto& weight : weights) {
    const auto counts = stats.run_by_weight.find(weight->name);
    FillTritonModelStatistics(weight->name,
                              counts == stats.run_by_weight.end()
                                  ? WeightMatmulCounts{}
                                  : counts->second,
                              response->add_model_stats());
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeServiceImpl::RepositoryIndex(
    grpc::CallbackServerContext* context,
    const inference::RepositoryIndexRequest* request,
    inference::RepositoryIndexResponse* response) {
  if (absl::Status status = CheckRepositoryCall(
          auth_, *context, RpcAccess::kReadsOnly, request->repository_name());
      !status.ok()) {
    return FinishNow(context, status);
  }
  if (absl::Status status = store_->CheckLoaded(); !status.ok()) {
    return FinishNow(context, status);
  }
  // Every resident weight is ready, so `ready` leaves none out.
  std::string after;
  for (bool more = true; more;) {
    WeightStore::Page page = store_->List(after, kIndexPageWeights);
    for (const auto& weight : page.weights) {
      inference::RepositoryIndexResponse::ModelIndex* model =
          response->add_models();
      model->set_name(weight->name);
      model->set_version(kKServeModelVersion);
      model->set_state(kTritonReadyState);
    }
    more = page.more;
    if (more) after = page.weights.back()->name;
  }
  return FinishNow(context, absl::OkStatus());
}

grpc::ServerUnaryReactor* KServeServiceImpl::RepositoryModelLoad(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelLoadRequest* request,
    inference::RepositoryModelLoadResponse*) {
  if (absl::Status status =
          CheckRepositoryCall(auth_, *context, RpcAccess::kChangesWeights,
                              request->repository_name());
      !status.ok()) {
    return FinishNow(context, status);
  }
  if (!request->parameters().empty()) {
    return FinishNow(
        context,
        absl::InvalidArgumentError(absl::StrCat(
            "RepositoryModelLoad of \"", request->model_name(),
            "\" has parameters (such as \"",
            request->parameters().begin()->first,
            "\"), which nibbled does not take: a model is a weight, uploaded "
            "with nibble.v1 UploadWeight or loaded from --data_dir; send no "
            "parameters")));
  }
  if (absl::Status status = store_->CheckLoaded(); !status.ok()) {
    return FinishNow(context, status);
  }
  if (store_->Get(request->model_name()).ok()) {
    return FinishNow(context, absl::OkStatus());  // already loaded
  }
  return FinishNow(context, repository_.load(request->model_name()));
}

grpc::ServerUnaryReactor* KServeServiceImpl::RepositoryModelUnload(
    grpc::CallbackServerContext* context,
    const inference::RepositoryModelUnloadRequest* request,
    inference::RepositoryModelUnloadResponse*) {
  if (absl::Status status =
          CheckRepositoryCall(auth_, *context, RpcAccess::kChangesWeights,
                              request->repository_name());
      !status.ok()) {
    return FinishNow(context, status);
  }
  if (absl::Status status =
          FindKServeModel(*store_, request->model_name(), "").status();
      !status.ok()) {
    return FinishNow(context, status);
  }
  return FinishNow(context, repository_.unload(request->model_name()));
}

}  // namespace nibble::server
