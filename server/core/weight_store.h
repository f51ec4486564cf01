// The weights nibbled holds resident, by name: each one packed once, at
// upload, into the layout its kernels read, and shared read-only with every
// request that uses it. On the CUDA backend (nibbled --backend) a weight that
// the GPU's kernels take lives in the memory of one GPU alone, placed by the
// store (nibbled --gpus); one they refuse is packed for the CPU's kernels, as
// on the CPU backend. A deleted weight stays alive until the last request
// using it finishes. Optional limits cap the bytes held resident plus those
// reserved by uploads in progress (nibbled --max_weight_bytes), the number
// of weights held and arriving (--max_weights), and the bytes of each GPU
// (--max_gpu_bytes); a weight that would pass any is refused whole.
//
// Example:
//   nibble::server::WeightStore store(
//       {.max_resident_bytes = 1 << 30, .gpus = {{.gpu = 0}, {.gpu = 1}}});
//   absl::StatusOr<nibble::server::WeightStore::Reservation> reservation =
//       store.Reserve("proj",
//                     nibble::server::PackedResidentBytes(
//                         spec, /*has_activation_order=*/false),
//                     nibble::server::DeviceResidentBytes(backend, spec));
//   ...  // receive the weight
//   absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
//       nibble::server::UploadToBackend(nibble::server::Backend::kCuda,
//                                       "proj", canonical, reservation->gpu());
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
#include "absl/types/span.h"
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

// The GPUs nibbled places weights on (--gpus): `requested` (device
// ordinals, in the order given) on a host where this process sees `visible`
// GPUs, or all of them for an empty list. INVALID_ARGUMENT naming the GPUs
// there are for an ordinal out of range or given twice.
absl::StatusOr<std::vector<int>> ResolveGpus(const std::vector<int>& requested,
                                             int visible);

// Whether every matmul with a weight of `spec` runs on the accelerator of
// `backend` (resolved): on the CUDA backend, for the shapes its kernels take.
bool AcceleratorServesWhole(Backend backend, const WeightSpec& spec);

// The copy of `canonical` on GPU `gpu` (the store's placement,
// Reservation::gpu) that the kernels of `backend` (resolved) read, where
// AcceleratorServesWhole; null elsewhere. On failure
// nibble::cuda::UploadWeight's status, naming the weight, e.g.
// RESOURCE_EXHAUSTED when GPU memory is short.
absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadToBackend(
    Backend backend, absl::string_view name, const QuantizedWeight& canonical,
    int gpu);
// The same for a weight in its checkpoints' column layout (HasColumnLayout),
// which the GPU arranges without a transpose on the host.
absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadToBackend(
    Backend backend, absl::string_view name, const Fp4Columns& columns,
    int gpu);

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

// A GPU's budget (GpuBudget::max_bytes) for nibbled
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

// A GPU the store places device copies on (nibbled --gpus) and the most
// bytes of them it may hold (--max_gpu_bytes as GpuBudgetBytes resolves it
// for that GPU); 0 for no limit.
struct GpuBudget {
  int gpu = 0;  // CUDA device ordinal (DeviceWeight::device)
  int64_t max_bytes = 0;
};

// What one GPU of the store holds now.
struct GpuUsage {
  int gpu = 0;
  int64_t resident_bytes = 0;  // device copies of resident weights
  int64_t reserved_bytes = 0;  // reserved by uploads in progress
  int64_t max_bytes = 0;       // 0 for no limit
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
    // Where device copies go, each GPU's copies' device_bytes() capped by
    // its budget; empty where weights have none (the CPU backend).
    std::vector<GpuBudget> gpus = {};
  };

  // Budget bytes, GPU budget bytes on the GPU chosen for the weight, and a
  // place among the weights, held for a weight that is still arriving, so
  // that concurrent uploads cannot together buffer more than the budget nor
  // copy more than a GPU's budget to it: counted against the limits like a
  // resident weight until Insert turns them into the weight's, or until
  // destroyed. Movable; the store must outlive it.
  class Reservation {
   public:
    // Holds nothing.
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();

    int64_t bytes() const { return bytes_; }
    int64_t device_bytes() const { return device_bytes_; }
    // The GPU the weight's device copy goes to (UploadToBackend's `gpu`);
    // -1 for a weight without one.
    int gpu() const { return gpu_; }

   private:
    friend class WeightStore;
    Reservation(WeightStore* store, int64_t bytes, int64_t device_bytes,
                int gpu)
        : store_(store),
          bytes_(bytes),
          device_bytes_(device_bytes),
          gpu_(gpu) {}
    // Gives the bytes back to the store, if any.
    void Release();

    WeightStore* store_ = nullptr;
    int64_t bytes_ = 0;
    int64_t device_bytes_ = 0;
    int gpu_ = -1;
  };

  WeightStore() : WeightStore(Limits()) {}
  explicit WeightStore(Limits limits);

  // Reserves `bytes`, `device_bytes` (DeviceResidentBytes) of a GPU's budget
  // and a place for weight `name`; RESOURCE_EXHAUSTED, as CheckFits answers
  // or naming --max_gpu_bytes, when they do not fit now. The GPU is
  // `pinned` when given, else the one with the most room left in its
  // budget (with no budgets, the one holding the fewest bytes), the first of
  // Limits::gpus on a tie; none for 0 device bytes. INVALID_ARGUMENT for a
  // pinned GPU not in Limits::gpus, or device bytes with no GPUs.
  absl::StatusOr<Reservation> Reserve(absl::string_view name, int64_t bytes,
                                      int64_t device_bytes = 0,
                                      std::optional<int> pinned = std::nullopt);

  // ALREADY_EXISTS when the name is taken; INVALID_ARGUMENT for a bad name
  // or a device copy on a GPU not in Limits::gpus; RESOURCE_EXHAUSTED, as
  // CheckFits answers, past a limit, where what `reservation` (made by this
  // store) holds counts as free for this weight, or when `device` would pass
  // its GPU's budget, where what the reservation holds of it there counts as
  // free likewise. On success the reservation becomes the weight's resident
  // bytes; on failure it is released and the store is otherwise unchanged.
  // Allowed while loading. `device` is the weight's copy from
  // UploadToBackend, null for none; the store keeps it for as long as the
  // weight.
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
  // Sum of the device copies' device_bytes(): accelerator memory held, on
  // all GPUs.
  int64_t device_bytes() const;
  // Sum of the bytes of the live reservations.
  int64_t reserved_bytes() const;
  // Each GPU of Limits::gpus, in that order.
  std::vector<GpuUsage> gpu_usage() const;
  int64_t max_resident_bytes() const { return limits_.max_resident_bytes; }
  int64_t max_weights() const { return limits_.max_weights; }

  // While loading (nibbled reading --data_dir at start), Get, CheckNameFree
  // and Remove answer UNAVAILABLE, and so does CheckLoaded, so that no client
  // sees a half-loaded store; Insert still works, for the loader.
  void SetLoading(bool loading);
  // OK once loaded; UNAVAILABLE asking to retry while loading.
  absl::Status CheckLoaded() const;

 private:
  // The entry of usage_ for GPU `gpu`; INVALID_ARGUMENT naming weight
  // `name` and the store's GPUs when it has none.
  absl::StatusOr<GpuUsage*> FindGpuLocked(absl::string_view name, int gpu)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The entry of usage_ for a GPU known to be one of the store's: that of a
  // reservation or of a resident weight.
  GpuUsage& KnownGpuLocked(int gpu) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // The GPU Reserve places a copy of `device_bytes` on, or its refusal.
  absl::StatusOr<int> PlaceLocked(absl::string_view name, int64_t device_bytes,
                                  std::optional<int> pinned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // Whether `device_bytes` more fit `gpu`'s budget, with what `own` holds
  // there (when made by this store) set aside for this weight.
  bool DeviceFitsLocked(const GpuUsage& gpu, int64_t device_bytes,
                        const Reservation& own) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // RESOURCE_EXHAUSTED for weight `name`, whose `device_bytes` fit none of
  // `gpus` now, saying what each holds.
  absl::Status NoGpuRoomLocked(absl::string_view name, int64_t device_bytes,
                               absl::Span<const GpuUsage* const> gpus) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);
  // As CheckFits, with what `own` holds (when made by this store) set aside
  // for this weight.
  absl::Status CheckFitsLocked(absl::string_view name, int64_t bytes,
                               const Reservation& own) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const Limits limits_;
  mutable absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<const ResidentWeight>, std::less<>>
      weights_ ABSL_GUARDED_BY(mutex_);
  int64_t resident_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  // One per GPU of limits_.gpus, in that order.
  std::vector<GpuUsage> usage_ ABSL_GUARDED_BY(mutex_);
  int64_t reservations_ ABSL_GUARDED_BY(mutex_) = 0;
  bool loading_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_WEIGHT_STORE_H_
