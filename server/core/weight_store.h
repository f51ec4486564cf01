// The weights nibbled holds resident, by name: each one packed once, at
// upload, into the layout its kernels read, and shared read-only with every
// request that uses it. On the CUDA backend (nibbled --backend) a weight that
// the GPU's kernels take lives in GPU memory alone; one they refuse is packed
// for the CPU's kernels, as on the CPU backend. A deleted weight stays alive
// until the last request
// using it finishes. Optional limits cap the bytes held resident plus those
// reserved by uploads in progress (nibbled --max_weight_bytes), and the
// number of weights held and arriving (--max_weights); a weight that would
// pass either is refused whole.
//
// Example:
//   nibble::server::WeightStore store({.max_resident_bytes = 1 << 30});
//   absl::StatusOr<nibble::server::WeightStore::Reservation> reservation =
//       store.Reserve("proj", nibble::server::PackedResidentBytes(
//                                      spec, /*has_activation_order=*/false));
//   ...  // receive the weight
//   absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
//       nibble::server::UploadToBackend(nibble::server::Backend::kCuda,
//                                       "proj", canonical);
//   absl::StatusOr<nibble::PackedWeight> packed =
//       nibble::server::PackForBackend(nibble::server::Backend::kCuda,
//                                      canonical);
//   ...  // answer !device.ok() or !packed.ok() with its status
//   absl::Status s = store.Insert("proj", std::move(packed),
//                                 *std::move(reservation), *std::move(device));
//   absl::StatusOr<std::shared_ptr<const nibble::server::ResidentWeight>> w =
//       store.Get("proj");
#ifndef NIBBLE_SERVER_CORE_WEIGHT_STORE_H_
#define NIBBLE_SERVER_CORE_WEIGHT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "format/weight_name.h"
#include "kernels/device_weight.h"
#include "kernels/packed_weight.h"

namespace nibble::server {

struct ResidentWeight {
  std::string name;
  // Without panels when `device` serves every matmul (PackForBackend).
  PackedWeight packed;
  // The copy in the backend's memory (see UploadToBackend); null on the CPU
  // backend and for shapes the accelerator's kernels refuse.
  std::shared_ptr<const nibble::DeviceWeight> device;
};

// Where nibbled runs matmuls and keeps weights (nibbled --backend).
enum class Backend {
  kAuto,  // kCuda when a GPU is present, else kCpu
  kCpu,
  kCuda,  // the CUDA kernels, with the CPU's for the shapes they refuse
};

// "auto", "cpu" or "cuda".
absl::string_view BackendName(Backend backend);
// The backend named as BackendName names it; INVALID_ARGUMENT listing the
// choices for any other name.
absl::StatusOr<Backend> ParseBackend(absl::string_view name);
// `requested` for a program whose CUDA backend is `compiled_in` and sees
// `gpus` GPUs: kAuto becomes kCuda when there is a GPU, else kCpu;
// FAILED_PRECONDITION saying what is missing for kCuda without a GPU.
absl::StatusOr<Backend> ResolveBackend(Backend requested, bool compiled_in,
                                       int gpus);

// Whether every matmul with a weight of `spec` runs on the accelerator of
// `backend` (resolved): on the CUDA backend, for the shapes its kernels take.
bool AcceleratorServesWhole(Backend backend, const WeightSpec& spec);

// The copy of `canonical` that the kernels of `backend` (resolved) read from
// the accelerator's memory, where AcceleratorServesWhole; null elsewhere. On
// failure nibble::cuda::UploadWeight's status, naming the weight, e.g.
// RESOURCE_EXHAUSTED when GPU memory is short.
absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadToBackend(
    Backend backend, absl::string_view name, const QuantizedWeight& canonical);
// The same for a weight in its checkpoints' column layout (HasColumnLayout),
// which the GPU arranges without a transpose on the host.
absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadToBackend(
    Backend backend, absl::string_view name, const Fp4Columns& columns);

// `canonical` packed for the CPU kernels, or without panels
// (PackedWeight::WithoutPanels) where AcceleratorServesWhole, since no CPU
// kernel would read them there. Fails as PackedWeight::Pack does.
absl::StatusOr<PackedWeight> PackForBackend(Backend backend,
                                            const QuantizedWeight& canonical);

// The bytes of accelerator memory UploadToBackend's copy of a weight of
// `spec` takes on `backend` (resolved), known before its data; 0 where
// !AcceleratorServesWhole.
int64_t DeviceResidentBytes(Backend backend, const WeightSpec& spec);

// The bytes PackedWeight::Pack would hold resident for a weight of `spec`
// (its resident_bytes()), with or without an activation order (4 bytes per
// row of K), known before the weight's data so that an upload can be refused
// before its data is sent. `spec` must pass Validate().
int64_t PackedResidentBytes(const WeightSpec& spec, bool has_activation_order);

// GPU memory left free by the default GPU budget: the backend's staging and
// the kernels' workspaces grow there after the weights are in.
inline constexpr int64_t kGpuMemoryMargin = int64_t{2} << 30;

// The GPU budget (WeightStore::Limits::max_device_bytes) for nibbled
// --max_gpu_bytes=`requested` on a GPU with `free_bytes` free at start:
// `requested` when positive, 0 (none) for -1, and for 0 the free memory
// less kGpuMemoryMargin, or half of it on a GPU with less than twice that.
int64_t GpuBudgetBytes(int64_t requested, int64_t free_bytes);

// NOT_FOUND for a lookup of `name` that found nothing: `missing` says what
// to do about it. A name that fails ValidateWeightName is escaped and cut,
// and the message gives the naming rule instead, since no upload could
// create it. `what` is "weight" or "model".
absl::Status NoSuchName(absl::string_view what, absl::string_view name,
                        absl::string_view missing);

// The functions an import at start (checkpoint_loader.h) stores weights
// through: declared here and filled by NibbleServer with the upload path's
// own, so that the core needs nothing of the edge.
//
// Stores a weight under a name as an upload would (NibbleServiceImpl::Store),
// for a checkpoint import; the bytes the stored weight holds resident, which
// on the GPU are not those of its panels.
using StoreWeightFunction = absl::FunctionRef<absl::StatusOr<int64_t>(
    const QuantizedWeight&, absl::string_view)>;
// Stores a weight's panels, packed from a checkpoint's codes without a
// canonical weight (NibbleServiceImpl::StorePacked); the same bytes.
using StorePackedWeightFunction =
    absl::FunctionRef<absl::StatusOr<int64_t>(PackedWeight, absl::string_view)>;

// Stores a weight in its checkpoints' column layout (HasColumnLayout)
// (NibbleServiceImpl::StoreColumns); the same bytes.
using StoreColumnsFunction = absl::FunctionRef<absl::StatusOr<int64_t>(
    const Fp4Columns&, absl::string_view)>;

// How ServerOptions::initial_weights stores weights. `packed` is set where
// the server keeps no canonical weights (the CPU backend without data_dir),
// `columns` where it does, for formats with a column layout as checkpoints
// store them, which StoreColumns copies to the GPU as they are where it can.
// All are thread-safe: an import stores layers two at a time.
struct InitialWeightStore {
  StoreWeightFunction canonical;
  std::optional<StorePackedWeightFunction> packed = std::nullopt;
  std::optional<StoreColumnsFunction> columns = std::nullopt;
};

class WeightStore {
 public:
  // 0 stands for no limit.
  struct Limits {
    // Caps the sum of resident_bytes() over the weights and of the bytes
    // reserved.
    int64_t max_resident_bytes = 0;
    // Caps the weights held plus the live reservations.
    int64_t max_weights = 0;
    // Caps the sum of the device copies' device_bytes() (nibbled
    // --max_gpu_bytes).
    int64_t max_device_bytes = 0;
  };

  // Budget bytes, GPU budget bytes, and a place among the weights, held for
  // a weight that is still arriving, so that concurrent uploads cannot
  // together buffer more than the budget nor copy more than the GPU's to the
  // GPU: counted against the limits like a resident weight until Insert
  // turns them into the weight's, or until destroyed. Movable; the store
  // must outlive it.
  class Reservation {
   public:
    // Holds nothing.
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();

    int64_t bytes() const { return bytes_; }
    int64_t device_bytes() const { return device_bytes_; }

   private:
    friend class WeightStore;
    Reservation(WeightStore* store, int64_t bytes, int64_t device_bytes)
        : store_(store), bytes_(bytes), device_bytes_(device_bytes) {}
    // Gives the bytes back to the store, if any.
    void Release();

    WeightStore* store_ = nullptr;
    int64_t bytes_ = 0;
    int64_t device_bytes_ = 0;
  };

  WeightStore() : WeightStore(Limits()) {}
  explicit WeightStore(Limits limits) : limits_(limits) {}

  // Reserves `bytes`, `device_bytes` of the GPU budget (DeviceResidentBytes)
  // and a place for weight `name`; RESOURCE_EXHAUSTED, as CheckFits answers
  // or naming --max_gpu_bytes, when they do not fit now.
  absl::StatusOr<Reservation> Reserve(absl::string_view name, int64_t bytes,
                                      int64_t device_bytes = 0);

  // ALREADY_EXISTS when the name is taken; INVALID_ARGUMENT for a bad name;
  // RESOURCE_EXHAUSTED, as CheckFits answers, past a limit, where what
  // `reservation` (made by this store) holds counts as free for this
  // weight, or when `device` would pass max_device_bytes, where what the
  // reservation holds of it counts as free likewise. On success the
  // reservation becomes the weight's resident bytes; on failure it is released
  // and the store is otherwise unchanged. Allowed while loading. `device` is
  // the weight's copy from UploadToBackend, null for none; the store keeps it
  // for as long as the weight.
  absl::Status Insert(std::string name, PackedWeight packed,
                      Reservation reservation,
                      std::unique_ptr<nibble::DeviceWeight> device = nullptr);
  // Insert without a reservation, as the loader does.
  absl::Status Insert(std::string name, PackedWeight packed,
                      std::unique_ptr<nibble::DeviceWeight> device = nullptr) {
    return Insert(std::move(name), std::move(packed), Reservation(),
                  std::move(device));
  }
  // NOT_FOUND, naming the weight, when there is none by that name.
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> Get(
      absl::string_view name) const;
  // OK when no weight has this name; ALREADY_EXISTS, as Insert would answer,
  // when one does. Lets an upload be refused before its data is sent.
  absl::Status CheckNameFree(absl::string_view name) const;
  // OK when a weight `name` of `bytes` resident bytes fits in the limits
  // now; RESOURCE_EXHAUSTED naming the weight, the limit it passes, what is
  // resident and reserved, and the flag that sets the limit when not.
  absl::Status CheckFits(absl::string_view name, int64_t bytes) const;
  absl::Status Remove(absl::string_view name);
  // Sorted by name.
  std::vector<std::shared_ptr<const ResidentWeight>> List() const;
  // Up to `limit` weights, sorted by name, of those named after `after`
  // (all for an empty one), and whether more follow.
  struct Page {
    std::vector<std::shared_ptr<const ResidentWeight>> weights;
    bool more = false;
  };
  Page List(absl::string_view after, int64_t limit) const;

  // Sum of resident_bytes() over the weights held.
  int64_t resident_bytes() const;
  // Sum of the device copies' device_bytes(): accelerator memory held.
  int64_t device_bytes() const;
  // Sum of the bytes of the live reservations.
  int64_t reserved_bytes() const;
  int64_t max_resident_bytes() const { return limits_.max_resident_bytes; }
  int64_t max_weights() const { return limits_.max_weights; }
  int64_t max_device_bytes() const { return limits_.max_device_bytes; }

  // While loading (nibbled reading --data_dir at start), Get, CheckNameFree
  // and Remove answer UNAVAILABLE, and so does CheckLoaded, so that no client
  // sees a half-loaded store; Insert still works, for the loader.
  void SetLoading(bool loading);
  // OK once loaded; UNAVAILABLE asking to retry while loading.
  absl::Status CheckLoaded() const;

 private:
  // As CheckFits, with what `own` holds (when made by this store) set aside
  // for this weight.
  // max_device_bytes for `device_bytes` more, with what `own` holds of it
  // set aside likewise.
  absl::Status CheckDeviceFitsLocked(absl::string_view name,
                                     int64_t device_bytes,
                                     const Reservation& own) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  absl::Status CheckFitsLocked(absl::string_view name, int64_t bytes,
                               const Reservation& own) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Limits limits_;
  mutable absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<const ResidentWeight>, std::less<>>
      weights_ ABSL_GUARDED_BY(mutex_);
  int64_t resident_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t device_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t reserved_device_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t reservations_ ABSL_GUARDED_BY(mutex_) = 0;
  bool loading_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_WEIGHT_STORE_H_
