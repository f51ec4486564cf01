#include "server/core/weight_store.h"

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/cuda/cuda_backend.h"

namespace nibble::server {
namespace {

absl::Status NotFound(absl::string_view name) {
  return NoSuchName("weight", name, "upload it first or check `nibble list`");
}

absl::Status AlreadyExists(absl::string_view name) {
  return absl::AlreadyExistsError(
      absl::StrCat("a weight named \"", name,
                   "\" already exists: delete it first or pick another name"));
}

absl::Status Loading() {
  return absl::UnavailableError(
      "nibbled is loading weights from --data_dir; retry shortly");
}

}  // namespace

absl::string_view BackendName(Backend backend) {
  switch (backend) {
    case Backend::kAuto:
      return "auto";
    case Backend::kCpu:
      return "cpu";
    case Backend::kCuda:
      return "cuda";
  }
  return "unknown";
}

absl::StatusOr<Backend> ParseBackend(absl::string_view name) {
  for (Backend backend : {Backend::kAuto, Backend::kCpu, Backend::kCuda}) {
    if (name == BackendName(backend)) return backend;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("backend \"", absl::CHexEscape(name),
                   "\" is not one of auto, cpu or cuda"));
}

absl::StatusOr<Backend> ResolveBackend(Backend requested, bool compiled_in,
                                       int gpus) {
  switch (requested) {
    case Backend::kAuto:
      return gpus > 0 ? Backend::kCuda : Backend::kCpu;
    case Backend::kCpu:
      return Backend::kCpu;
    case Backend::kCuda:
      break;
  }
  if (!compiled_in) {
    return absl::FailedPreconditionError(
        "--backend=cuda: this build has no CUDA backend (nvcc was not found "
        "when it was configured, or it was configured with "
        "-DNIBBLE_CUDA=OFF): rebuild with the CUDA toolkit, or use "
        "--backend=cpu");
  }
  if (gpus <= 0) {
    return absl::FailedPreconditionError(
        "--backend=cuda: no GPU is visible to nibbled (no NVIDIA driver or "
        "device, or CUDA_VISIBLE_DEVICES hides them): use --backend=cpu or "
        "--backend=auto");
  }
  return Backend::kCuda;
}

absl::StatusOr<std::vector<int>> ResolveGpus(const std::vector<int>& requested,
                                             int visible) {
  std::vector<int> gpus = requested;
  if (gpus.empty()) {
    for (int gpu = 0; gpu < visible; ++gpu) gpus.push_back(gpu);
  }
  const std::string there =
      visible == 1 ? std::string("this process sees GPU 0 only")
                   : absl::StrCat("this process sees GPUs 0 to ", visible - 1);
  for (size_t i = 0; i < gpus.size(); ++i) {
    if (gpus[i] < 0 || gpus[i] >= visible) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus names GPU ", gpus[i], ", but ",
                       visible == 0 ? "this process sees no GPU" : there,
                       " (device ordinals after CUDA_VISIBLE_DEVICES)"));
    }
    if (std::find(gpus.begin(), gpus.begin() + i, gpus[i]) !=
        gpus.begin() + i) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gpus names GPU ", gpus[i], " twice"));
    }
  }
  return gpus;
}

bool AcceleratorServesWhole(Backend backend, const WeightSpec& spec) {
  return backend == Backend::kCuda && cuda::SupportsSpec(spec);
}

namespace {

// `source` (a canonical weight or columns) copied as UploadToBackend says.
template <typename Source>
absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadSource(
    Backend backend, absl::string_view name, const Source& source, int gpu) {
  if (!AcceleratorServesWhole(backend, source.spec)) return nullptr;
  absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
      cuda::UploadWeight(source, gpu);
  if (!device.ok()) {
    return absl::Status(
        device.status().code(),
        absl::StrCat("weight \"", name, "\" could not be copied to GPU ", gpu,
                     ": ", device.status().message()));
  }
  return device;
}

}  // namespace

absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadToBackend(
    Backend backend, absl::string_view name, const QuantizedWeight& canonical,
    int gpu) {
  return UploadSource(backend, name, canonical, gpu);
}

absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadToBackend(
    Backend backend, absl::string_view name, const Fp4Columns& columns,
    int gpu) {
  return UploadSource(backend, name, columns, gpu);
}

absl::StatusOr<PackedWeight> PackForBackend(Backend backend,
                                            const QuantizedWeight& canonical) {
  return AcceleratorServesWhole(backend, canonical.spec)
             ? PackedWeight::WithoutPanels(canonical)
             : PackedWeight::Pack(canonical);
}

int64_t DeviceResidentBytes(Backend backend, const WeightSpec& spec) {
  return AcceleratorServesWhole(backend, spec) ? cuda::DeviceBytes(spec) : 0;
}

int64_t GpuBudgetBytes(int64_t requested, int64_t free_bytes) {
  if (requested > 0) return requested;
  if (requested < 0) return 0;
  return free_bytes >= 2 * kGpuMemoryMargin
             ? free_bytes - kGpuMemoryMargin
             : std::max<int64_t>(free_bytes / 2, 1);
}

int64_t PackedResidentBytes(const WeightSpec& spec, bool has_activation_order) {
  const int64_t panels =
      (spec.n + PackedWeight::kPanelWidth - 1) / PackedWeight::kPanelWidth;
  const int64_t code_bytes = spec.k / kCodesPerWord * sizeof(uint32_t);
  const int64_t scale_bytes = spec.groups() * sizeof(uint16_t);
  const int64_t zero_bytes = HasZeros(spec.format) ? spec.groups() : 0;
  const int64_t order_bytes =
      has_activation_order ? spec.k * int64_t{sizeof(int32_t)} : 0;
  return panels * PackedWeight::kPanelWidth *
             (code_bytes + scale_bytes + zero_bytes) +
         order_bytes;
}

absl::Status NoSuchName(absl::string_view what, absl::string_view name,
                        absl::string_view missing) {
  if (ValidateWeightName(name).ok()) {
    return absl::NotFoundError(
        absl::StrCat("no ", what, " named \"", name, "\": ", missing));
  }
  // Cut, so that the rule survives ToGrpcStatus' cut of long messages.
  constexpr size_t kShownCharacters = 64;
  return absl::NotFoundError(absl::StrCat(
      "no ", what, " named \"",
      absl::CHexEscape(name.substr(0, kShownCharacters)),
      name.size() > kShownCharacters ? "..." : "", "\" (", name.size(),
      " characters): ", what, " names are ", kWeightNameRule));
}

WeightStore::Reservation::Reservation(Reservation&& other) noexcept
    : store_(std::exchange(other.store_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_bytes_(std::exchange(other.device_bytes_, 0)),
      gpu_(std::exchange(other.gpu_, -1)) {}

WeightStore::Reservation& WeightStore::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    store_ = std::exchange(other.store_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_bytes_ = std::exchange(other.device_bytes_, 0);
    gpu_ = std::exchange(other.gpu_, -1);
  }
  return *this;
}

WeightStore::Reservation::~Reservation() { Release(); }

void WeightStore::Reservation::Release() {
  if (store_ == nullptr) return;
  absl::MutexLock lock(&store_->mutex_);
  store_->reserved_bytes_ -= bytes_;
  if (device_bytes_ > 0) {
    store_->KnownGpuLocked(gpu_).reserved_bytes -= device_bytes_;
  }
  --store_->reservations_;
  store_ = nullptr;
  bytes_ = 0;
  device_bytes_ = 0;
  gpu_ = -1;
}

WeightStore::WeightStore(Limits limits) : limits_(std::move(limits)) {
  for (const GpuBudget& gpu : limits_.gpus) {
    usage_.push_back({.gpu = gpu.gpu, .max_bytes = gpu.max_bytes});
  }
}

absl::StatusOr<WeightStore::Reservation> WeightStore::Reserve(
    absl::string_view name, int64_t bytes, int64_t device_bytes,
    std::optional<int> pinned) {
  absl::MutexLock lock(&mutex_);
  if (absl::Status status = CheckFitsLocked(name, bytes, Reservation());
      !status.ok()) {
    return status;
  }
  int gpu = -1;
  if (device_bytes > 0) {
    absl::StatusOr<int> placed = PlaceLocked(name, device_bytes, pinned);
    if (!placed.ok()) return placed.status();
    gpu = *placed;
    KnownGpuLocked(gpu).reserved_bytes += device_bytes;
  }
  reserved_bytes_ += bytes;
  ++reservations_;
  return Reservation(this, bytes, device_bytes, gpu);
}

absl::StatusOr<GpuUsage*> WeightStore::FindGpuLocked(absl::string_view name,
                                                     int gpu) {
  for (GpuUsage& usage : usage_) {
    if (usage.gpu == gpu) return &usage;
  }
  if (usage_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight \"", name,
        "\" needs GPU memory, but nibbled places no weights on a GPU (it runs "
        "--backend=cpu)"));
  }
  std::vector<int> gpus;
  for (const GpuUsage& usage : usage_) gpus.push_back(usage.gpu);
  return absl::InvalidArgumentError(absl::StrCat(
      "weight \"", name, "\" asks for GPU ", gpu,
      ", but nibbled places weights on GPU", gpus.size() == 1 ? " " : "s ",
      absl::StrJoin(gpus, ", "), " (--gpus): name one of those, or none"));
}

GpuUsage& WeightStore::KnownGpuLocked(int gpu) {
  return **FindGpuLocked("", gpu);
}

bool WeightStore::DeviceFitsLocked(const GpuUsage& gpu, int64_t device_bytes,
                                   const Reservation& own) const {
  if (gpu.max_bytes == 0) return true;
  const int64_t own_bytes =
      own.store_ == this && own.gpu_ == gpu.gpu ? own.device_bytes_ : 0;
  return device_bytes <=
         gpu.max_bytes - (gpu.resident_bytes + gpu.reserved_bytes - own_bytes);
}

absl::StatusOr<int> WeightStore::PlaceLocked(absl::string_view name,
                                             int64_t device_bytes,
                                             std::optional<int> pinned) {
  if (pinned.has_value()) {
    absl::StatusOr<GpuUsage*> gpu = FindGpuLocked(name, *pinned);
    if (!gpu.ok()) return gpu.status();
    if (!DeviceFitsLocked(**gpu, device_bytes, Reservation())) {
      return NoGpuRoomLocked(name, device_bytes, {*gpu});
    }
    return *pinned;
  }
  if (usage_.empty()) return FindGpuLocked(name, 0).status();
  // Room left: under the budget, or below no limit at all.
  const auto room = [](const GpuUsage& gpu) {
    const int64_t in_use = gpu.resident_bytes + gpu.reserved_bytes;
    return (gpu.max_bytes == 0 ? std::numeric_limits<int64_t>::max()
                               : gpu.max_bytes) -
           in_use;
  };
  const GpuUsage* best = nullptr;
  std::vector<const GpuUsage*> all;
  for (const GpuUsage& gpu : usage_) {
    all.push_back(&gpu);
    if (DeviceFitsLocked(gpu, device_bytes, Reservation()) &&
        (best == nullptr || room(gpu) > room(*best))) {
      best = &gpu;
    }
  }
  if (best == nullptr) return NoGpuRoomLocked(name, device_bytes, all);
  return best->gpu;
}

absl::Status WeightStore::NoGpuRoomLocked(
    absl::string_view name, int64_t device_bytes,
    absl::Span<const GpuUsage* const> gpus) const {
  const GpuUsage* largest = gpus.front();
  for (const GpuUsage* gpu : gpus) {
    if (gpu->max_bytes > largest->max_bytes) largest = gpu;
  }
  const bool one = gpus.size() == 1;
  if (device_bytes > largest->max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "weight \"", name, "\" needs ", device_bytes,
        " bytes of GPU memory, more than ",
        one ? absl::StrCat("GPU ", largest->gpu, " may hold (")
            : absl::StrCat("any one GPU may hold (the most is GPU ",
                           largest->gpu, "'s "),
        largest->max_bytes,
        " bytes by --max_gpu_bytes); nibbled keeps a weight whole on one GPU: "
        "upload it as smaller weights (e.g. split by columns) or raise "
        "--max_gpu_bytes"));
  }
  std::vector<std::string> held;
  for (const GpuUsage* gpu : gpus) {
    held.push_back(absl::StrCat(
        "GPU ", gpu->gpu, ": ", gpu->resident_bytes + gpu->reserved_bytes,
        " of ", gpu->max_bytes, " bytes in use, ", gpu->reserved_bytes,
        " of them reserved by uploads in progress"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "weight \"", name, "\" needs ", device_bytes,
      " bytes of GPU memory, more than ", one ? "is free" : "any GPU has free",
      " under --max_gpu_bytes (", absl::StrJoin(held, "; "),
      "): delete a weight, retry once uploads finish, or raise "
      "--max_gpu_bytes"));
}

absl::Status WeightStore::Insert(std::string name, PackedWeight packed,
                                 Reservation reservation,
                                 std::unique_ptr<nibble::DeviceWeight> device) {
  if (absl::Status status = ValidateWeightName(name); !status.ok()) {
    return status;
  }
  const int64_t bytes = packed.resident_bytes();
  const int64_t device_bytes = device != nullptr ? device->device_bytes() : 0;
  const int gpu = device != nullptr ? device->device() : -1;
  auto weight = std::make_shared<const ResidentWeight>(
      ResidentWeight{name, std::move(packed), std::move(device)});
  absl::MutexLock lock(&mutex_);
  // On the failures below `reservation` is released when this returns,
  // after the lock, and the device copy is freed with `weight`: nothing of a
  // refused weight stays on the GPU.
  if (weights_.contains(name)) return AlreadyExists(name);
  if (absl::Status status = CheckFitsLocked(name, bytes, reservation);
      !status.ok()) {
    return status;
  }
  GpuUsage* usage = nullptr;
  if (device_bytes > 0) {
    absl::StatusOr<GpuUsage*> found = FindGpuLocked(name, gpu);
    if (!found.ok()) return found.status();
    usage = *found;
    if (!DeviceFitsLocked(*usage, device_bytes, reservation)) {
      return NoGpuRoomLocked(name, device_bytes, {usage});
    }
  }
  weights_.emplace(std::move(name), std::move(weight));
  // The reservation turns into the weight's under the same lock, so the
  // weight is never counted twice nor not at all.
  if (reservation.store_ == this) {
    reserved_bytes_ -= reservation.bytes_;
    if (reservation.device_bytes_ > 0) {
      KnownGpuLocked(reservation.gpu_).reserved_bytes -=
          reservation.device_bytes_;
    }
    --reservations_;
  }
  reservation.store_ = nullptr;
  reservation.bytes_ = 0;
  reservation.device_bytes_ = 0;
  reservation.gpu_ = -1;
  resident_bytes_ += bytes;
  if (usage != nullptr) usage->resident_bytes += device_bytes;
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>> WeightStore::Get(
    absl::string_view name) const {
  absl::MutexLock lock(&mutex_);
  if (loading_) return Loading();
  auto it = weights_.find(name);
  if (it == weights_.end()) return NotFound(name);
  return it->second;
}

absl::Status WeightStore::CheckNameFree(absl::string_view name) const {
  absl::MutexLock lock(&mutex_);
  if (loading_) return Loading();
  if (weights_.find(name) != weights_.end()) return AlreadyExists(name);
  return absl::OkStatus();
}

absl::Status WeightStore::CheckFits(absl::string_view name,
                                    int64_t bytes) const {
  absl::MutexLock lock(&mutex_);
  return CheckFitsLocked(name, bytes, Reservation());
}

absl::Status WeightStore::CheckFitsLocked(absl::string_view name, int64_t bytes,
                                          const Reservation& own) const {
  const bool own_counted = own.store_ == this;
  const int64_t others_reservations = reservations_ - (own_counted ? 1 : 0);
  const int64_t others_weights =
      static_cast<int64_t>(weights_.size()) + others_reservations;
  if (limits_.max_weights != 0 && others_weights >= limits_.max_weights) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "weight \"", name, "\" would pass the ", limits_.max_weights,
        " weights allowed by --max_weights (", weights_.size(), " resident, ",
        others_reservations,
        " uploads in progress): delete a weight or raise --max_weights"));
  }
  const int64_t others_reserved =
      reserved_bytes_ - (own_counted ? own.bytes_ : 0);
  const int64_t in_use = resident_bytes_ + others_reserved;
  const int64_t max_bytes = limits_.max_resident_bytes;
  if (max_bytes == 0 || bytes <= max_bytes - in_use) {
    return absl::OkStatus();
  }
  if (others_reserved == 0) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "weight \"", name, "\" needs ", bytes, " bytes resident but ",
        resident_bytes_, " of the ", max_bytes,
        " bytes allowed by --max_weight_bytes are in use: delete a weight or "
        "raise --max_weight_bytes"));
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "weight \"", name, "\" needs ", bytes, " bytes resident but ", in_use,
      " of the ", max_bytes,
      " bytes allowed by --max_weight_bytes are in use (", resident_bytes_,
      " resident, ", others_reserved,
      " reserved by uploads in progress): retry once they finish, delete a "
      "weight or raise --max_weight_bytes"));
}

absl::Status WeightStore::Remove(absl::string_view name) {
  absl::MutexLock lock(&mutex_);
  if (loading_) return Loading();
  auto it = weights_.find(name);
  if (it == weights_.end()) return NotFound(name);
  resident_bytes_ -= it->second->packed.resident_bytes();
  if (const nibble::DeviceWeight* device = it->second->device.get();
      device != nullptr && device->device_bytes() > 0) {
    KnownGpuLocked(device->device()).resident_bytes -= device->device_bytes();
  }
  weights_.erase(it);
  return absl::OkStatus();
}

std::vector<std::shared_ptr<const ResidentWeight>> WeightStore::List() const {
  absl::MutexLock lock(&mutex_);
  std::vector<std::shared_ptr<const ResidentWeight>> weights;
  weights.reserve(weights_.size());
  for (const auto& [name, weight] : weights_) weights.push_back(weight);
  return weights;
}

WeightStore::Page WeightStore::List(absl::string_view after,
                                    int64_t limit) const {
  absl::MutexLock lock(&mutex_);
  Page page;
  auto it = after.empty() ? weights_.begin() : weights_.upper_bound(after);
  for (; it != weights_.end(); ++it) {
    if (static_cast<int64_t>(page.weights.size()) == limit) {
      page.more = true;
      break;
    }
    page.weights.push_back(it->second);
  }
  return page;
}

int64_t WeightStore::resident_bytes() const {
  absl::MutexLock lock(&mutex_);
  return resident_bytes_;
}

int64_t WeightStore::device_bytes() const {
  absl::MutexLock lock(&mutex_);
  int64_t bytes = 0;
  for (const GpuUsage& gpu : usage_) bytes += gpu.resident_bytes;
  return bytes;
}

std::vector<GpuUsage> WeightStore::gpu_usage() const {
  absl::MutexLock lock(&mutex_);
  return usage_;
}

int64_t WeightStore::reserved_bytes() const {
  absl::MutexLock lock(&mutex_);
  return reserved_bytes_;
}

void WeightStore::SetLoading(bool loading) {
  absl::MutexLock lock(&mutex_);
  loading_ = loading;
}

absl::Status WeightStore::CheckLoaded() const {
  absl::MutexLock lock(&mutex_);
  return loading_ ? Loading() : absl::OkStatus();
}

}  // namespace nibble::server
