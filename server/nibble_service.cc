#include "server/nibble_service.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/packed_weight.h"
#include "server/matmul_rpc.h"
#include "server/matmul_stream.h"
#include "server/proto_conversions.h"
#include "server/upload_assembler.h"

namespace nibble::server {

NibbleServiceImpl::NibbleServiceImpl(WeightStore* store,
                                     const MatmulRunner* runner)
    : store_(store), runner_(runner) {}

absl::Status NibbleServiceImpl::Upload(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::UploadWeightRequest>* reader,
    v1::WeightInfo* response) {
  UploadAssembler upload;
  v1::UploadWeightRequest request;
  while (reader->Read(&request)) {
    if (request.has_header()) {
      absl::StatusOr<WeightSpec> spec = FromProto(request.header());
      if (!spec.ok()) return spec.status();
      if (absl::Status status = upload.OnHeader(request.header().name(), *spec);
          !status.ok()) {
        return status;
      }
      // Refused before any data is sent; Insert checks again at the end.
      if (absl::Status status = store_->CheckNameFree(upload.name());
          !status.ok()) {
        return status;
      }
    } else if (request.has_chunk()) {
      absl::StatusOr<WeightTensorKind> tensor =
          TensorFromProto(request.chunk().tensor());
      if (!tensor.ok()) return tensor.status();
      if (absl::Status status = upload.OnChunk(
              *tensor, request.chunk().offset(), request.chunk().data());
          !status.ok()) {
        return status;
      }
    } else {
      return absl::InvalidArgumentError(
          "upload message has neither a header nor a chunk");
    }
  }
  if (context->IsCancelled()) {
    return absl::CancelledError(
        "upload cancelled by the client; nothing was stored");
  }
  absl::StatusOr<QuantizedWeight> weight = upload.Finish();
  if (!weight.ok()) return weight.status();
  absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(*weight);
  if (!packed.ok()) return packed.status();
  const std::string name = upload.name();
  if (absl::Status status = store_->Insert(name, *std::move(packed));
      !status.ok()) {
    return status;
  }
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> stored =
      store_->Get(name);
  if (!stored.ok()) return stored.status();
  FillWeightInfo(**stored, response);
  return absl::OkStatus();
}

grpc::Status NibbleServiceImpl::UploadWeight(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::UploadWeightRequest>* reader,
    v1::WeightInfo* response) {
  return ToGrpcStatus(Upload(context, reader, response));
}

grpc::Status NibbleServiceImpl::GetWeight(grpc::ServerContext*,
                                          const v1::GetWeightRequest* request,
                                          v1::WeightInfo* response) {
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      store_->Get(request->name());
  if (!weight.ok()) return ToGrpcStatus(weight.status());
  FillWeightInfo(**weight, response);
  return grpc::Status::OK;
}

grpc::Status NibbleServiceImpl::ListWeights(grpc::ServerContext*,
                                            const v1::ListWeightsRequest*,
                                            v1::ListWeightsResponse* response) {
  for (const auto& weight : store_->List()) {
    FillWeightInfo(*weight, response->add_weights());
  }
  return grpc::Status::OK;
}

grpc::Status NibbleServiceImpl::DeleteWeight(
    grpc::ServerContext*, const v1::DeleteWeightRequest* request,
    v1::DeleteWeightResponse*) {
  return ToGrpcStatus(store_->Remove(request->name()));
}

grpc::ServerUnaryReactor* NibbleServiceImpl::Matmul(
    grpc::CallbackServerContext* context, const v1::MatmulRequest* request,
    v1::MatmulResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::StatusOr<v1::MatmulResponse> result =
      RunMatmulRpc(*store_, *runner_, *request);
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerBidiReactor<v1::MatmulStreamRequest, v1::MatmulStreamResponse>*
NibbleServiceImpl::MatmulStream(grpc::CallbackServerContext*) {
  return new MatmulStreamReactor(store_, runner_);
}

}  // namespace nibble::server
