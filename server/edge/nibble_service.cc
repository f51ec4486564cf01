#include "server/edge/nibble_service.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "kernels/packed_weight.h"
#include "server/core/upload_assembler.h"
#include "server/edge/matmul_rpc.h"
#include "server/edge/matmul_stream.h"
#include "server/edge/proto_conversions.h"
#include "server/operations/log.h"

namespace nibble::server {
namespace {

// Ends a MatmulStream at once, for a call refused before it starts.
class RefusedStream final
    : public grpc::ServerBidiReactor<v1::MatmulStreamRequest,
                                     v1::MatmulStreamResponse> {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

// `device` as it is; a refusal is logged for the operator first.
absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> Logged(
    absl::string_view name, Backend backend,
    absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device) {
  if (!device.ok()) {
    LogWarning("upload refused: not copied to the backend",
               {{"name", name},
                {"backend", BackendName(backend)},
                {"error", device.status().message()}});
  }
  return device;
}

// What an upload of `spec` is reserved in --max_weight_bytes: the larger of
// what it buffers (the canonical tensors and activation order, which
// UploadAssembler holds without slack; columns take no more)
// and what it will hold resident once packed. Two layouts coexist only at the
// end, while columns are transposed or the weight is packed and written, so
// memory stays below twice the budget however many uploads run; reserving
// their sum instead would refuse a weight that fits the budget once packed.
int64_t UploadReservationBytes(const WeightSpec& spec,
                               bool has_activation_order) {
  const int64_t order_bytes =
      has_activation_order ? spec.k * int64_t{sizeof(int32_t)} : 0;
  return std::max(spec.canonical_bytes() + order_bytes,
                  PackedResidentBytes(spec, has_activation_order));
}

// The store's reservation for weight `name` of `spec` on `backend`, GPU
// memory included; refusals are logged for the operator.
absl::StatusOr<WeightStore::Reservation> ReserveBudget(
    WeightStore& store, Backend backend, absl::string_view name,
    const WeightSpec& spec, bool has_activation_order) {
  const int64_t bytes = UploadReservationBytes(spec, has_activation_order);
  absl::StatusOr<WeightStore::Reservation> reservation =
      store.Reserve(name, bytes, DeviceResidentBytes(backend, spec));
  if (!reservation.ok()) {
    LogWarning("upload refused: over a limit",
               {{"name", name},
                {"format", WeightFormatName(spec.format)},
                {"k", spec.k},
                {"n", spec.n},
                {"bytes", bytes},
                {"resident_bytes", store.resident_bytes()},
                {"reserved_bytes", store.reserved_bytes()},
                {"max_weight_bytes", store.max_resident_bytes()},
                {"max_weights", store.max_weights()},
                {"max_gpu_bytes", store.max_device_bytes()},
                {"error", reservation.status().message()}});
  }
  return reservation;
}

}  // namespace

NibbleServiceImpl::NibbleServiceImpl(WeightStore* store, MatmulBatcher* batcher,
                                     const WeightDirectory* data_dir,
                                     const TokenAuthenticator* auth,
                                     Backend backend, int64_t max_reply_bytes,
                                     ReplyBudget* reply_budget,
                                     UploadLimits upload_limits)
    : store_(store),
      batcher_(batcher),
      data_dir_(data_dir),
      auth_(auth),
      backend_(backend),
      max_reply_bytes_(max_reply_bytes),
      reply_budget_(reply_budget),
      upload_watchdog_(upload_limits.idle),
      uploads_per_connection_(upload_limits.max_per_connection) {}

absl::Status NibbleServiceImpl::Upload(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::UploadWeightRequest>* reader,
    v1::WeightInfo* response) {
  // Before anything is read or reserved, so that one connection cannot take
  // every thread with uploads it never finishes.
  std::optional<PerKeyLimit::Slot> slot =
      uploads_per_connection_.TryAcquire(context->peer());
  if (!slot.has_value()) {
    LogWarning("upload refused: too many on one connection",
               {{"peer", context->peer()},
                {"max_uploads_per_connection",
                 uploads_per_connection_.max_per_key()}});
    return absl::ResourceExhaustedError(absl::StrCat(
        "this connection already has ", uploads_per_connection_.max_per_key(),
        " uploads in progress, the most nibbled takes "
        "(--max_uploads_per_connection); finish one first, or upload over "
        "another connection"));
  }
  UploadAssembler upload(/*pack_codes=*/!KeepsCanonicalWeights());
  // Held from the header on and released on every early return, so that
  // uploads in progress never buffer more than the budget together.
  WeightStore::Reservation reservation;
  // A stalled client would otherwise hold this thread and the reservation
  // for as long as its connection lives.
  IdleWatchdog::Watch watch =
      upload_watchdog_.Start([context] { context->TryCancel(); });
  v1::UploadWeightRequest request;
  while (reader->Read(&request)) {
    watch.Touch();
    if (request.has_header()) {
      absl::StatusOr<WeightSpec> spec = FromProto(request.header());
      if (!spec.ok()) return spec.status();
      absl::StatusOr<std::vector<int32_t>> activation_order =
          ActivationOrderFromProto(request.header());
      if (!activation_order.ok()) return activation_order.status();
      absl::StatusOr<CodeLayout> layout =
          FromProto(request.header().code_layout());
      if (!layout.ok()) return layout.status();
      const bool has_activation_order = !activation_order->empty();
      if (absl::Status status =
              upload.OnHeader(request.header().name(), *spec,
                              *std::move(activation_order), *layout);
          !status.ok()) {
        return status;
      }
      // Refused before any data is sent, so that a weight past the budget
      // never occupies memory here; the name is checked again at the commit.
      if (absl::Status status = store_->CheckNameFree(upload.name());
          !status.ok()) {
        return status;
      }
      absl::StatusOr<WeightStore::Reservation> reserved = ReserveBudget(
          *store_, backend_, upload.name(), *spec, has_activation_order);
      if (!reserved.ok()) return reserved.status();
      reservation = *std::move(reserved);
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
  if (watch.expired()) {
    const absl::Duration idle = upload_watchdog_.idle_limit();
    LogWarning("upload cancelled: idle",
               {{"name", upload.name()},
                {"upload_idle_seconds", absl::ToDoubleSeconds(idle)},
                {"peer", context->peer()}});
    return absl::DeadlineExceededError(absl::StrCat(
        "upload cancelled: no message arrived for ", absl::FormatDuration(idle),
        " (nibbled --upload_idle_seconds); nothing was stored"));
  }
  if (context->IsCancelled()) {
    return absl::CancelledError(
        "upload cancelled by the client; nothing was stored");
  }
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> stored;
  if (!KeepsCanonicalWeights()) {
    absl::StatusOr<PackedWeight> packed = upload.FinishPacked();
    if (!packed.ok()) return packed.status();
    stored = Insert(upload.name(), *std::move(packed), nullptr, nullptr,
                    std::move(reservation));
  } else if (upload.layout() == CodeLayout::kColumns &&
             TakesColumnsWhole(upload.spec())) {
    absl::StatusOr<Fp4Columns> columns = upload.FinishColumns();
    if (!columns.ok()) return columns.status();
    stored = CommitColumns(upload.name(), *columns, upload.activation_order(),
                           std::move(reservation));
  } else {
    absl::StatusOr<QuantizedWeight> weight = upload.Finish();
    if (!weight.ok()) return weight.status();
    stored = Commit(upload.name(), *weight, std::move(reservation));
  }
  if (!stored.ok()) return stored.status();
  FillWeightInfo(**stored, response);
  const WeightSpec& spec = (*stored)->packed.spec();
  LogInfo("weight uploaded", {{"name", upload.name()},
                              {"format", WeightFormatName(spec.format)},
                              {"k", spec.k},
                              {"n", spec.n},
                              {"group", spec.group_size},
                              {"bytes", response->resident_bytes()},
                              {"resident_bytes", store_->resident_bytes()},
                              {"device_bytes", store_->device_bytes()}});
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>> NibbleServiceImpl::Store(
    const QuantizedWeight& weight, absl::string_view name) {
  absl::StatusOr<WeightStore::Reservation> reservation = ReserveBudget(
      *store_, backend_, name, weight.spec, !weight.activation_order.empty());
  if (!reservation.ok()) return reservation.status();
  return Commit(std::string(name), weight, *std::move(reservation));
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>>
NibbleServiceImpl::StorePacked(PackedWeight packed, absl::string_view name) {
  if (KeepsCanonicalWeights()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weight \"", name,
        "\" was not stored: a weight packed without its canonical layout "
        "cannot be copied to the GPU or written to data_dir"));
  }
  absl::StatusOr<WeightStore::Reservation> reservation =
      ReserveBudget(*store_, backend_, name, packed.spec(),
                    !packed.activation_order().empty());
  if (!reservation.ok()) return reservation.status();
  return Insert(std::string(name), std::move(packed), nullptr, nullptr,
                *std::move(reservation));
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>>
NibbleServiceImpl::StoreColumns(const Fp4Columns& columns,
                                absl::string_view name) {
  if (!TakesColumnsWhole(columns.spec)) {
    return Store(CanonicalFromColumns(columns), name);
  }
  absl::StatusOr<WeightStore::Reservation> reservation = ReserveBudget(
      *store_, backend_, name, columns.spec, /*has_activation_order=*/false);
  if (!reservation.ok()) return reservation.status();
  return CommitColumns(std::string(name), columns, {}, *std::move(reservation));
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>> NibbleServiceImpl::Commit(
    const std::string& name, const QuantizedWeight& weight,
    WeightStore::Reservation reservation) {
  absl::StatusOr<PackedWeight> packed = PackForBackend(backend_, weight);
  if (!packed.ok()) return packed.status();
  // Before the commit, so that a weight the GPU cannot take leaves no file
  // behind, and a slow copy delays no other upload.
  absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
      Logged(name, backend_, UploadToBackend(backend_, name, weight));
  if (!device.ok()) return device.status();
  return Insert(name, *std::move(packed), *std::move(device), &weight,
                std::move(reservation));
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>>
NibbleServiceImpl::CommitColumns(const std::string& name,
                                 const Fp4Columns& columns,
                                 std::vector<int32_t> activation_order,
                                 WeightStore::Reservation reservation) {
  absl::StatusOr<PackedWeight> packed =
      PackedWeight::WithoutPanels(columns.spec, std::move(activation_order));
  if (!packed.ok()) return packed.status();
  absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
      Logged(name, backend_, UploadToBackend(backend_, name, columns));
  if (!device.ok()) return device.status();
  return Insert(name, *std::move(packed), *std::move(device), nullptr,
                std::move(reservation));
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>> NibbleServiceImpl::Insert(
    const std::string& name, PackedWeight packed,
    std::unique_ptr<nibble::DeviceWeight> device,
    const QuantizedWeight* canonical, WeightStore::Reservation reservation) {
  absl::MutexLock lock(&commit_mutex_);
  // The budget needs no second check: the reservation covers the packed
  // weight, and Insert turns it into resident bytes.
  if (absl::Status status = store_->CheckNameFree(name); !status.ok()) {
    return status;
  }
  // A weight without its canonical layout (StorePacked, an upload that
  // packed its codes or one copied to the GPU as it arrived) only comes
  // where there is no data_dir.
  if (data_dir_ != nullptr && canonical != nullptr) {
    if (absl::Status status = data_dir_->Save(name, *canonical); !status.ok()) {
      return absl::Status(
          status.code(), absl::StrCat("weight \"", name,
                                      "\" was not stored: ", status.message()));
    }
  }
  if (absl::Status status = store_->Insert(
          name, std::move(packed), std::move(reservation), std::move(device));
      !status.ok()) {
    if (data_dir_ != nullptr) data_dir_->Remove(name).IgnoreError();
    return status;
  }
  return store_->Get(name);
}

grpc::Status NibbleServiceImpl::UploadWeight(
    grpc::ServerContext* context,
    grpc::ServerReader<v1::UploadWeightRequest>* reader,
    v1::WeightInfo* response) {
  if (absl::Status status =
          Authorize(auth_, *context, RpcAccess::kChangesWeights);
      !status.ok()) {
    return ToGrpcStatus(status);
  }
  return ToGrpcStatus(Upload(context, reader, response));
}

grpc::Status NibbleServiceImpl::GetWeight(grpc::ServerContext* context,
                                          const v1::GetWeightRequest* request,
                                          v1::WeightInfo* response) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return ToGrpcStatus(status);
  }
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      store_->Get(request->name());
  if (!weight.ok()) return ToGrpcStatus(weight.status());
  FillWeightInfo(**weight, response);
  return grpc::Status::OK;
}

grpc::Status NibbleServiceImpl::ListWeights(
    grpc::ServerContext* context, const v1::ListWeightsRequest* request,
    v1::ListWeightsResponse* response) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return ToGrpcStatus(status);
  }
  if (absl::Status status = store_->CheckLoaded(); !status.ok()) {
    return ToGrpcStatus(status);
  }
  absl::StatusOr<ListPageRequest> page = ListPageFromProto(*request);
  if (!page.ok()) return ToGrpcStatus(page.status());
  WeightStore::Page weights = store_->List(page->after, page->size);
  for (const auto& weight : weights.weights) {
    FillWeightInfo(*weight, response->add_weights());
  }
  if (weights.more) {
    response->set_next_page_token(weights.weights.back()->name);
  }
  return grpc::Status::OK;
}

grpc::Status NibbleServiceImpl::DeleteWeight(
    grpc::ServerContext* context, const v1::DeleteWeightRequest* request,
    v1::DeleteWeightResponse*) {
  if (absl::Status status =
          Authorize(auth_, *context, RpcAccess::kChangesWeights);
      !status.ok()) {
    return ToGrpcStatus(status);
  }
  absl::MutexLock lock(&commit_mutex_);
  // The file goes first, so that when it cannot be deleted the weight is
  // still both served and on disk.
  if (data_dir_ != nullptr) {
    if (absl::Status status = store_->Get(request->name()).status();
        !status.ok()) {
      return ToGrpcStatus(status);
    }
    if (absl::Status status = data_dir_->Remove(request->name());
        !status.ok()) {
      return ToGrpcStatus(
          absl::Status(status.code(),
                       absl::StrCat("weight \"", request->name(),
                                    "\" was not deleted: ", status.message())));
    }
  }
  if (absl::Status status = store_->Remove(request->name()); !status.ok()) {
    return ToGrpcStatus(status);
  }
  batcher_->ForgetWeight(request->name());
  LogInfo("weight deleted", {{"name", request->name()},
                             {"resident_bytes", store_->resident_bytes()}});
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* NibbleServiceImpl::Matmul(
    grpc::CallbackServerContext* context, const v1::MatmulRequest* request,
    v1::MatmulResponse* response) {
  auto* reactor = new HeldReplyReactor();
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    reactor->Finish(ToGrpcStatus(status), nullptr);
    return reactor;
  }
  SubmitMatmulRpc(
      *store_, *batcher_, *request,
      CallOf(context, {.max_bytes = max_reply_bytes_, .budget = reply_budget_}),
      [reactor, response](absl::StatusOr<v1::MatmulResponse> result,
                          ReplyBudget::Hold hold) {
        if (result.ok()) *response = *std::move(result);
        reactor->Finish(ToGrpcStatus(result.status()), std::move(hold));
      });
  return reactor;
}

grpc::ServerBidiReactor<v1::MatmulStreamRequest, v1::MatmulStreamResponse>*
NibbleServiceImpl::MatmulStream(grpc::CallbackServerContext* context) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return new RefusedStream(ToGrpcStatus(status));
  }
  if (absl::Status status = store_->CheckLoaded(); !status.ok()) {
    return new RefusedStream(ToGrpcStatus(status));
  }
  return new MatmulStreamReactor(store_, batcher_, context, max_reply_bytes_,
                                 reply_budget_);
}

}  // namespace nibble::server
