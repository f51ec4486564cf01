// The gRPC face of nibble.v1.NibbleService: it decodes requests, hands them to
// the weight store and the matmul batcher, and turns their absl::Status into
// gRPC status at the edge. Its only state is a lock that keeps the weight
// store and the data directory (nibbled --data_dir) in step: an upload is on
// disk before it is acknowledged. UploadWeight, Matmul and MatmulStream use
// the callback API: an upload's messages are handled as they arrive, so a
// stalled upload holds no thread, and a matmul is queued on the batcher and
// answered from its thread, so gRPC's threads never wait for a kernel.
//
// Example:
//   nibble::server::NibbleServiceImpl service(&store, &batcher);
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&service);
#ifndef NIBBLE_SERVER_EDGE_NIBBLE_SERVICE_H_
#define NIBBLE_SERVER_EDGE_NIBBLE_SERVICE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "format/fp4_columns.h"
#include "grpcpp/grpcpp.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "server/core/batcher.h"
#include "server/core/device_batchers.h"
#include "server/core/idle_watchdog.h"
#include "server/core/per_key_limit.h"
#include "server/core/reply_budget.h"
#include "server/core/upload_assembler.h"
#include "server/core/weight_store.h"
#include "server/operations/auth.h"
#include "server/storage/weight_directory.h"

namespace nibble::server {

// What uploads may hold (nibbled --upload_idle_seconds,
// --max_uploads_per_connection).
struct UploadLimits {
  // An upload that receives no message for this long is cancelled, and its
  // reservation released.
  absl::Duration idle = absl::InfiniteDuration();
  // Most uploads in progress on one client connection; 0 for no limit.
  int max_per_connection = 0;
};

class NibbleServiceImpl final
    : public v1::NibbleService::WithCallbackMethod_UploadWeight<
          v1::NibbleService::WithRawCallbackMethod_Matmul<
              v1::NibbleService::WithRawCallbackMethod_MatmulStream<
                  v1::NibbleService::Service>>> {
 public:
  // All must outlive the service. Without `data_dir` weights live only in
  // memory.
  // `data_dir` (--data_dir) and `auth` (--auth_token_file) may be null.
  // Uploads are copied to the memory of `backend` (resolved; see
  // UploadToBackend). A matmul whose reply would pass `max_reply_bytes`
  // (--max_message_bytes; 0 for no limit), or `reply_budget` (may be null),
  // is refused before it runs.
  NibbleServiceImpl(WeightStore* store, DeviceBatchers* batcher,
                    const WeightDirectory* data_dir = nullptr,
                    const TokenAuthenticator* auth = nullptr,
                    Backend backend = Backend::kCpu,
                    int64_t max_reply_bytes = 0,
                    ReplyBudget* reply_budget = nullptr,
                    UploadLimits upload_limits = {});

  // Puts `weight` in the store as `name` the way an upload does (nibbled
  // --import): within --max_weight_bytes and --max_weights, copied to the
  // backend, written to data_dir before it is served. ALREADY_EXISTS when
  // the name is taken; the store's, the backend's or data_dir's error
  // otherwise, with nothing kept.
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> Store(
      const QuantizedWeight& weight, absl::string_view name);
  // The same for a weight packed without a canonical weight, which only a
  // service that keeps none can take (FAILED_PRECONDITION otherwise).
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> StorePacked(
      PackedWeight packed, absl::string_view name);
  // The same for a weight in its checkpoints' column layout (HasColumnLayout):
  // copied to the GPU as it is where TakesColumnsWhole, else made canonical
  // and stored as Store does.
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> StoreColumns(
      const Fp4Columns& columns, absl::string_view name);
  // Puts the weight of `file`, a file of data_dir, in the store as it is,
  // within --max_weight_bytes (checked from the header before the tensors
  // are read) and --max_weights, copied to the backend; the file is not
  // written again. The store's, the file's or the backend's error otherwise.
  absl::Status StoreFile(WeightFileReader& file);
  // StoreFile for the file of weight `name` in data_dir (Triton's
  // RepositoryModelLoad): FAILED_PRECONDITION without a data_dir or when the
  // file holds a weight of another name, NOT_FOUND when it has no file of
  // that name, ALREADY_EXISTS when the weight is resident.
  absl::Status LoadFromDataDir(absl::string_view name);
  // Deletes weight `name` from the store and from data_dir: NOT_FOUND when
  // it is not resident; UNAVAILABLE, with the weight still served, when its
  // file cannot be deleted.
  absl::Status Delete(absl::string_view name);

  // Whether stored weights need their canonical layout: to copy to the GPU
  // or to write to data_dir.
  bool KeepsCanonicalWeights() const {
    return backend_ != Backend::kCpu || data_dir_ != nullptr;
  }

  grpc::ServerReadReactor<v1::UploadWeightRequest>* UploadWeight(
      grpc::CallbackServerContext* context, v1::WeightInfo* response) override;
  grpc::Status GetWeight(grpc::ServerContext* context,
                         const v1::GetWeightRequest* request,
                         v1::WeightInfo* response) override;
  grpc::Status ListWeights(grpc::ServerContext* context,
                           const v1::ListWeightsRequest* request,
                           v1::ListWeightsResponse* response) override;
  grpc::Status DeleteWeight(grpc::ServerContext* context,
                            const v1::DeleteWeightRequest* request,
                            v1::DeleteWeightResponse* response) override;
  // Raw bytes in and out, so that the reply's C is sent without a copy
  // (MatmulResponseBytes); the wire messages are MatmulRequest and
  // MatmulResponse.
  grpc::ServerUnaryReactor* Matmul(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request_bytes,
                                   grpc::ByteBuffer* response_bytes) override;
  // Raw bytes too (NibbleStreamProtocol).
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* MatmulStream(
      grpc::CallbackServerContext* context) override;

 private:
  // One UploadWeight call (nibble_service.cc).
  class UploadReactor;

  // Which uploads pack their codes as they arrive: all on the CPU backend
  // (with data_dir, written to their file too), none where stored weights go
  // to the GPU.
  CodePacking UploadPacking() const;
  // Whether a weight of `spec` in the column layout goes to the accelerator
  // as it is: it serves the weight whole, and no data_dir needs the
  // canonical layout.
  bool TakesColumnsWhole(const WeightSpec& spec) const {
    return data_dir_ == nullptr && AcceleratorServesWhole(backend_, spec);
  }
  // The last step of Upload and Store: packs `weight` for the backend,
  // copies it there and inserts it (Insert).
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> Commit(
      const std::string& name, const QuantizedWeight& weight,
      WeightStore::Reservation reservation);
  // Commit for a weight in the column layout that goes to the GPU as it
  // arrived (TakesColumnsWhole).
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> CommitColumns(
      const std::string& name, const Fp4Columns& columns,
      std::vector<int32_t> activation_order,
      WeightStore::Reservation reservation);
  // Commits `file`, the weight's in data_dir (where there is one), and
  // inserts `packed` and `device` within `reservation`.
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> Insert(
      const std::string& name, PackedWeight packed,
      std::unique_ptr<nibble::DeviceWeight> device,
      std::optional<WeightDirectory::PendingSave> file,
      WeightStore::Reservation reservation);

  WeightStore* store_;
  DeviceBatchers* batcher_;
  const WeightDirectory* data_dir_;
  const TokenAuthenticator* auth_;
  const Backend backend_;
  const int64_t max_reply_bytes_;
  ReplyBudget* const reply_budget_;
  // Cancels uploads idle for longer than UploadLimits::idle.
  IdleWatchdog upload_watchdog_;
  // Uploads in progress by connection (ServerContext::peer).
  PerKeyLimit uploads_per_connection_;
  // Held from an upload's last name check until its weight is in the store,
  // and while a weight is deleted, so that two uploads of one name cannot
  // both write its file and a file never outlives its weight. A slow disk
  // delays other uploads and deletes, never matmuls.
  absl::Mutex commit_mutex_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_NIBBLE_SERVICE_H_
