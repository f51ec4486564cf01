#include "server/edge/nibble_service.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "format/weight_name.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/packed_weight.h"
#include "server/core/upload_assembler.h"
#include "server/edge/matmul_rpc.h"
#include "server/edge/matmul_stream.h"
#include "server/edge/proto_conversions.h"
#include "server/operations/log.h"

namespace nibble::server {
namespace {

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
// and what it will hold resident once packed. On the CPU backend an upload
// in the canonical layout packs its codes as they arrive (and with data_dir
// writes them to its file as they arrive), so it never holds more than its
// reservation. Elsewhere (the CUDA backend, columns with data_dir) two
// layouts coexist at the end, while columns are transposed or the weight is
// packed and written, so memory stays below twice the budget however many
// uploads run; reserving their sum instead would refuse a weight that fits
// the budget once packed.
int64_t UploadReservationBytes(const WeightSpec& spec,
                               bool has_activation_order) {
  const int64_t order_bytes =
      has_activation_order ? spec.k * int64_t{sizeof(int32_t)} : 0;
  return std::max(spec.canonical_bytes() + order_bytes,
                  PackedResidentBytes(spec, has_activation_order));
}

// The store's reservation for weight `name` of `spec` on `backend`, GPU
// memory included, on GPU `pinned` when given (WeightHeader.gpu); refusals
// are logged for the operator.
absl::StatusOr<WeightStore::Reservation> ReserveBudget(
    WeightStore& store, Backend backend, absl::string_view name,
    const WeightSpec& spec, bool has_activation_order,
    std::optional<int> pinned = std::nullopt) {
  const int64_t bytes = UploadReservationBytes(spec, has_activation_order);
  const int64_t device_bytes = DeviceResidentBytes(backend, spec);
  if (pinned.has_value() && device_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight \"", name, "\" asks for GPU ", *pinned, ", but ",
        backend == Backend::kCuda
            ? absl::StrCat("the GPU's kernels need K to be a multiple of ",
                           cuda::kKMultiple, " (it is ", spec.k,
                           "), so the CPU serves it")
            : "nibbled runs --backend=cpu",
        ": leave the header's gpu unset"));
  }
  absl::StatusOr<WeightStore::Reservation> reservation =
      store.Reserve(name, bytes, device_bytes, pinned);
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
                {"gpu_bytes", device_bytes},
                {"error", reservation.status().message()}});
  }
  return reservation;
}

// `status`, data_dir's failure to write weight `name`, saying so.
absl::Status NotStored(absl::string_view name, const absl::Status& status) {
  return absl::Status(
      status.code(),
      absl::StrCat("weight \"", name, "\" was not stored: ", status.message()));
}

}  // namespace

NibbleServiceImpl::NibbleServiceImpl(WeightStore* store,
                                     DeviceBatchers* batcher,
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

// Reads an upload's messages one at a time, each handled as it arrives, so
// that a client that stalls holds no thread, only this object. Everything it
// holds (the assembler's bytes, the reservation, data_dir's temporary file,
// its place in the per-connection count) is given back before the call's
// status goes out.
class NibbleServiceImpl::UploadReactor final
    : public grpc::ServerReadReactor<v1::UploadWeightRequest> {
 public:
  UploadReactor(NibbleServiceImpl* service,
                grpc::CallbackServerContext* context, v1::WeightInfo* response)
      : service_(service), context_(context), response_(response) {
    if (absl::Status status =
            Authorize(service_->auth_, *context, RpcAccess::kChangesWeights);
        !status.ok()) {
      End(status);
      return;
    }
    // Before anything is read or reserved, so that one connection cannot
    // fill the budget with uploads it never finishes.
    std::optional<PerKeyLimit::Slot> slot =
        service_->uploads_per_connection_.TryAcquire(context->peer());
    if (!slot.has_value()) {
      const int max_per_key = service_->uploads_per_connection_.max_per_key();
      LogWarning("upload refused: too many on one connection",
                 {{"peer", context->peer()},
                  {"max_uploads_per_connection", max_per_key}});
      End(absl::ResourceExhaustedError(absl::StrCat(
          "this connection already has ", max_per_key,
          " uploads in progress, the most nibbled takes "
          "(--max_uploads_per_connection); finish one first, or upload over "
          "another connection")));
      return;
    }
    // A stalled client would otherwise hold the reservation for as long as
    // its connection lives.
    state_ = std::make_unique<State>(
        State{.slot = *std::move(slot),
              .upload = UploadAssembler(service_->UploadPacking()),
              .watch = service_->upload_watchdog_.Start(
                  [context] { context->TryCancel(); })});
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      state_->watch.Touch();
      if (absl::Status status = OnMessage(); !status.ok()) {
        End(status);
        return;
      }
      StartRead(&request_);
      return;
    }
    // The client is done sending, or the call was cancelled.
    if (state_->watch.expired()) {
      const absl::Duration idle = service_->upload_watchdog_.idle_limit();
      LogWarning("upload cancelled: idle",
                 {{"name", state_->upload.name()},
                  {"upload_idle_seconds", absl::ToDoubleSeconds(idle)},
                  {"peer", context_->peer()}});
      End(absl::DeadlineExceededError(absl::StrCat(
          "upload cancelled: no message arrived for ",
          absl::FormatDuration(idle),
          " (nibbled --upload_idle_seconds); nothing was stored")));
      return;
    }
    if (context_->IsCancelled()) {
      End(absl::CancelledError(
          "upload cancelled by the client; nothing was stored"));
      return;
    }
    // Packing, copying to the GPU and syncing the file can take seconds: a
    // thread of its own, so that no gRPC thread waits for them.
    std::thread([this] { End(Commit()); }).detach();
  }

  void OnDone() override { delete this; }

 private:
  struct State {
    PerKeyLimit::Slot slot;
    UploadAssembler upload;
    IdleWatchdog::Watch watch;
    // Held from the header on, so that uploads in progress never buffer
    // more than the budget together.
    WeightStore::Reservation reservation = {};
    // data_dir's file of an upload that packs its codes: written as they
    // arrive in the canonical layout, which the file holds, and from the
    // panels at the commit in the column layout.
    std::optional<WeightDirectory::PendingSave> file = std::nullopt;
  };

  // Gives back what the upload holds and ends the call with `status`.
  void End(const absl::Status& status) {
    state_.reset();
    Finish(ToGrpcStatus(status));
  }

  absl::Status OnMessage() {
    if (request_.has_header()) return OnHeader(request_.header());
    if (!request_.has_chunk()) {
      return absl::InvalidArgumentError(
          "upload message has neither a header nor a chunk");
    }
    const v1::WeightChunk& chunk = request_.chunk();
    absl::StatusOr<WeightTensorKind> tensor = TensorFromProto(chunk.tensor());
    if (!tensor.ok()) return tensor.status();
    if (absl::Status status =
            state_->upload.OnChunk(*tensor, chunk.offset(), chunk.data());
        !status.ok()) {
      return status;
    }
    if (!state_->file.has_value() ||
        state_->upload.layout() != CodeLayout::kCanonical) {
      return absl::OkStatus();
    }
    if (absl::Status status = state_->file->Append(chunk.data());
        !status.ok()) {
      return NotStored(state_->upload.name(), status);
    }
    return absl::OkStatus();
  }

  absl::Status OnHeader(const v1::WeightHeader& header) {
    absl::StatusOr<WeightSpec> spec = FromProto(header);
    if (!spec.ok()) return spec.status();
    absl::StatusOr<std::vector<int32_t>> activation_order =
        ActivationOrderFromProto(header);
    if (!activation_order.ok()) return activation_order.status();
    absl::StatusOr<CodeLayout> layout = FromProto(header.code_layout());
    if (!layout.ok()) return layout.status();
    UploadAssembler& upload = state_->upload;
    if (absl::Status status = upload.OnHeader(
            header.name(), *spec, *std::move(activation_order), *layout);
        !status.ok()) {
      return status;
    }
    // Refused before any data is sent, so that a weight past the budget
    // never occupies memory here; the name is checked again at the commit.
    WeightStore& store = *service_->store_;
    if (absl::Status status = store.CheckNameFree(upload.name());
        !status.ok()) {
      return status;
    }
    absl::StatusOr<WeightStore::Reservation> reserved = ReserveBudget(
        store, service_->backend_, upload.name(), *spec,
        !upload.activation_order().empty(),
        header.has_gpu() ? std::make_optional(header.gpu()) : std::nullopt);
    if (!reserved.ok()) return reserved.status();
    state_->reservation = *std::move(reserved);
    const WeightDirectory* data_dir = service_->data_dir_;
    if (data_dir == nullptr || !upload.packs_codes()) return absl::OkStatus();
    absl::StatusOr<WeightDirectory::PendingSave> file =
        data_dir->StartSave(upload.name(), *spec, upload.activation_order());
    if (!file.ok()) return NotStored(upload.name(), file.status());
    state_->file = *std::move(file);
    return absl::OkStatus();
  }

  // The upload, every message read, stored; fills the response.
  absl::Status Commit() {
    UploadAssembler& upload = state_->upload;
    absl::StatusOr<std::shared_ptr<const ResidentWeight>> stored;
    if (upload.packs_codes()) {
      absl::StatusOr<PackedWeight> packed = upload.FinishPacked();
      if (!packed.ok()) return packed.status();
      if (state_->file.has_value() && upload.layout() == CodeLayout::kColumns) {
        if (absl::Status status = upload.WriteCanonicalTensors(
                *packed,
                [&file = *state_->file](absl::string_view bytes) {
                  return file.Append(bytes);
                });
            !status.ok()) {
          return NotStored(upload.name(), status);
        }
      }
      stored = service_->Insert(upload.name(), *std::move(packed), nullptr,
                                std::move(state_->file),
                                std::move(state_->reservation));
    } else if (upload.layout() == CodeLayout::kColumns &&
               service_->TakesColumnsWhole(upload.spec())) {
      absl::StatusOr<Fp4Columns> columns = upload.FinishColumns();
      if (!columns.ok()) return columns.status();
      stored = service_->CommitColumns(upload.name(), *columns,
                                       upload.activation_order(),
                                       std::move(state_->reservation));
    } else {
      absl::StatusOr<QuantizedWeight> weight = upload.Finish();
      if (!weight.ok()) return weight.status();
      stored = service_->Commit(upload.name(), *weight,
                                std::move(state_->reservation));
    }
    if (!stored.ok()) return stored.status();
    FillWeightInfo(**stored, response_);
    const WeightSpec& spec = (*stored)->packed.spec();
    const WeightStore& store = *service_->store_;
    LogInfo("weight uploaded", {{"name", upload.name()},
                                {"format", WeightFormatName(spec.format)},
                                {"k", spec.k},
                                {"n", spec.n},
                                {"group", spec.group_size},
                                {"bytes", response_->resident_bytes()},
                                {"resident_bytes", store.resident_bytes()},
                                {"device_bytes", store.device_bytes()}});
    return absl::OkStatus();
  }

  NibbleServiceImpl* const service_;
  grpc::CallbackServerContext* const context_;
  v1::WeightInfo* const response_;
  v1::UploadWeightRequest request_;
  // Null once the call has ended.
  std::unique_ptr<State> state_;
};

CodePacking NibbleServiceImpl::UploadPacking() const {
  return backend_ == Backend::kCpu ? CodePacking::kAll : CodePacking::kNone;
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
  return Insert(std::string(name), std::move(packed), nullptr, std::nullopt,
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
      Logged(name, backend_,
             UploadToBackend(backend_, name, weight, reservation.gpu()));
  if (!device.ok()) return device.status();
  // Written before the commit's lock, so that a slow disk delays no other
  // upload; only the rename waits for it.
  std::optional<WeightDirectory::PendingSave> file;
  if (data_dir_ != nullptr) {
    absl::StatusOr<WeightDirectory::PendingSave> started =
        data_dir_->StartSave(name, weight);
    if (!started.ok()) return NotStored(name, started.status());
    file = *std::move(started);
  }
  return Insert(name, *std::move(packed), *std::move(device), std::move(file),
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
      Logged(name, backend_,
             UploadToBackend(backend_, name, columns, reservation.gpu()));
  if (!device.ok()) return device.status();
  return Insert(name, *std::move(packed), *std::move(device), std::nullopt,
                std::move(reservation));
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>> NibbleServiceImpl::Insert(
    const std::string& name, PackedWeight packed,
    std::unique_ptr<nibble::DeviceWeight> device,
    std::optional<WeightDirectory::PendingSave> file,
    WeightStore::Reservation reservation) {
  absl::MutexLock lock(&commit_mutex_);
  // The budget needs no second check: the reservation covers the packed
  // weight, and Insert turns it into resident bytes.
  if (absl::Status status = store_->CheckNameFree(name); !status.ok()) {
    return status;
  }
  // Without a file only where there is no data_dir (StorePacked, an upload
  // copied to the GPU as it arrived).
  if (file.has_value()) {
    if (absl::Status status = file->Commit(); !status.ok()) {
      return NotStored(name, status);
    }
  }
  if (absl::Status status = store_->Insert(
          name, std::move(packed), std::move(reservation), std::move(device));
      !status.ok()) {
    if (file.has_value()) data_dir_->Remove(name).IgnoreError();
    return status;
  }
  return store_->Get(name);
}

grpc::ServerReadReactor<v1::UploadWeightRequest>*
NibbleServiceImpl::UploadWeight(grpc::CallbackServerContext* context,
                                v1::WeightInfo* response) {
  return new UploadReactor(this, context, response);
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
  return ToGrpcStatus(Delete(request->name()));
}

absl::Status NibbleServiceImpl::Delete(absl::string_view name) {
  absl::MutexLock lock(&commit_mutex_);
  // The file goes first, so that when it cannot be deleted the weight is
  // still both served and on disk.
  if (data_dir_ != nullptr) {
    if (absl::Status status = store_->Get(name).status(); !status.ok()) {
      return status;
    }
    if (absl::Status status = data_dir_->Remove(name); !status.ok()) {
      return absl::Status(
          status.code(), absl::StrCat("weight \"", name, "\" was not deleted: ",
                                      status.message()));
    }
  }
  if (absl::Status status = store_->Remove(name); !status.ok()) {
    return status;
  }
  batcher_->ForgetWeight(name);
  LogInfo("weight deleted",
          {{"name", name}, {"resident_bytes", store_->resident_bytes()}});
  return absl::OkStatus();
}

absl::Status NibbleServiceImpl::StoreFile(WeightFileReader& file) {
  // From the header alone: a weight past the budget is refused before its
  // data is read.
  const WeightSpec& spec = file.header().spec;
  absl::StatusOr<WeightStore::Reservation> reservation = store_->Reserve(
      file.name(),
      PackedResidentBytes(spec, file.header().has_activation_order),
      DeviceResidentBytes(backend_, spec));
  if (!reservation.ok()) return reservation.status();
  if (!AcceleratorServesWhole(backend_, spec)) {
    // Packed as it is read, as an upload is packed as it arrives, so that
    // the canonical weight is never held whole.
    UploadAssembler weight(CodePacking::kAll);
    if (absl::Status status =
            weight.OnHeader(file.name(), spec, file.activation_order());
        !status.ok()) {
      return status;
    }
    if (absl::Status status =
            file.ReadTensors([&weight](absl::string_view bytes) {
              return weight.OnTensorBytes(bytes);
            });
        !status.ok()) {
      return status;
    }
    absl::StatusOr<PackedWeight> packed = weight.FinishPacked();
    if (!packed.ok()) return packed.status();
    return store_->Insert(file.name(), *std::move(packed),
                          *std::move(reservation));
  }
  absl::StatusOr<QuantizedWeight> canonical = file.ReadWhole();
  if (!canonical.ok()) return canonical.status();
  absl::StatusOr<PackedWeight> packed = PackForBackend(backend_, *canonical);
  if (!packed.ok()) return packed.status();
  absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
      UploadToBackend(backend_, file.name(), *canonical, reservation->gpu());
  if (!device.ok()) return device.status();
  return store_->Insert(file.name(), *std::move(packed),
                        *std::move(reservation), *std::move(device));
}

absl::Status NibbleServiceImpl::LoadFromDataDir(absl::string_view name) {
  if (data_dir_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "weight \"", name,
        "\" is not resident and nibbled has no --data_dir to load it from: "
        "upload it with nibble.v1 UploadWeight (`nibble upload`), or start "
        "nibbled with --data_dir"));
  }
  if (absl::Status status = ValidateWeightName(name); !status.ok()) {
    return status;
  }
  // Held like an upload's commit, so that a delete of the same name cannot
  // remove the file while its weight goes in.
  absl::MutexLock lock(&commit_mutex_);
  const std::string path = data_dir_->FilePath(name);
  absl::StatusOr<WeightFileReader> file = WeightFileReader::Open(path);
  if (absl::IsNotFound(file.status())) {
    return absl::NotFoundError(absl::StrCat(
        "weight \"", name, "\" has no file in --data_dir (", path,
        "): upload it with nibble.v1 UploadWeight, which keeps it there"));
  }
  if (!file.ok()) return file.status();
  if (file->name() != name) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " holds weight \"", file->name(), "\", not \"", name,
                     "\"; rename the file after the weight in it"));
  }
  if (absl::Status status = StoreFile(*file); !status.ok()) return status;
  LogInfo("weight loaded from data_dir",
          {{"name", name}, {"resident_bytes", store_->resident_bytes()}});
  return absl::OkStatus();
}

grpc::ServerUnaryReactor* NibbleServiceImpl::Matmul(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request_bytes,
    grpc::ByteBuffer* response_bytes) {
  auto* reactor = new HeldReplyReactor();
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    reactor->Finish(ToGrpcStatus(status), nullptr);
    return reactor;
  }
  // Kept until answered: the batcher reads A from it in place. Parsed as
  // gRPC parses a MatmulRequest, from a copy that shares the received slices.
  auto request = std::make_shared<v1::MatmulRequest>();
  grpc::ByteBuffer received(*request_bytes);
  if (grpc::Status parsed =
          grpc::SerializationTraits<v1::MatmulRequest>::Deserialize(
              &received, request.get());
      !parsed.ok()) {
    reactor->Finish(parsed, nullptr);
    return reactor;
  }
  SubmitMatmulRpc(
      *store_, *batcher_, *request,
      CallOf(context, {.max_bytes = max_reply_bytes_, .budget = reply_budget_}),
      [reactor, response_bytes, request](
          absl::StatusOr<v1::MatmulResponse> result, ReplyBudget::Hold hold) {
        if (result.ok()) {
          MatmulResponseBytes(*std::move(result)).Swap(response_bytes);
        }
        reactor->Finish(ToGrpcStatus(result.status()), std::move(hold));
      });
  return reactor;
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>*
NibbleServiceImpl::MatmulStream(grpc::CallbackServerContext* context) {
  if (absl::Status status = Authorize(auth_, *context, RpcAccess::kReadsOnly);
      !status.ok()) {
    return new RefusedStream<NibbleStreamProtocol>(ToGrpcStatus(status));
  }
  if (absl::Status status = store_->CheckLoaded(); !status.ok()) {
    return new RefusedStream<NibbleStreamProtocol>(ToGrpcStatus(status));
  }
  return new MatmulStreamReactor(store_, batcher_, context, max_reply_bytes_,
                                 reply_budget_);
}

}  // namespace nibble::server
