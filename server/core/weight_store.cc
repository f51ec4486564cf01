#include "server/core/weight_store.h"

#include <algorithm>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
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

bool AcceleratorServesWhole(Backend backend, const WeightSpec& spec) {
  return backend == Backend::kCuda && cuda::SupportsSpec(spec);
}

namespace {

// `source` (a canonical weight or columns) copied as UploadToBackend says.
template <typename Source>
absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadSource(
    Backend backend, absl::string_view name, const Source& source) {
  if (!AcceleratorServesWhole(backend, source.spec)) return nullptr;
  absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
      cuda::UploadWeight(source);
  if (!device.ok()) {
    return absl::Status(
        device.status().code(),
        absl::StrCat("weight \"", name, "\" could not be copied to the GPU: ",
                     device.status().message()));
  }
  return device;
}

}  // namespace

absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadToBackend(
    Backend backend, absl::string_view name, const QuantizedWeight& canonical) {
  return UploadSource(backend, name, canonical);
}

absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> UploadToBackend(
    Backend backend, absl::string_view name, const Fp4Columns& columns) {
  return UploadSource(backend, name, columns);
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
      device_bytes_(std::exchange(other.device_bytes_, 0)) {}

WeightStore::Reservation& WeightStore::Reservation::operator=(
    Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    store_ = std::exchange(other.store_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_bytes_ = std::exchange(other.device_bytes_, 0);
  }
  return *this;
}

WeightStore::Reservation::~Reservation() { Release(); }

void WeightStore::Reservation::Release() {
  if (store_ == nullptr) return;
  absl::MutexLock lock(&store_->mutex_);
  store_->reserved_bytes_ -= bytes_;
  store_->reserved_device_bytes_ -= device_bytes_;
  --store_->reservations_;
  store_ = nullptr;
  bytes_ = 0;
  device_bytes_ = 0;
}

absl::StatusOr<WeightStore::Reservation> WeightStore::Reserve(
    absl::string_view name, int64_t bytes, int64_t device_bytes) {
  absl::MutexLock lock(&mutex_);
  if (absl::Status status = CheckFitsLocked(name, bytes, Reservation());
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          CheckDeviceFitsLocked(name, device_bytes, Reservation());
      !status.ok()) {
    return status;
  }
  reserved_bytes_ += bytes;
  reserved_device_bytes_ += device_bytes;
  ++reservations_;
  return Reservation(this, bytes, device_bytes);
}

absl::Status WeightStore::Insert(std::string name, PackedWeight packed,
                                 Reservation reservation,
                                 std::unique_ptr<nibble::DeviceWeight> device) {
  if (absl::Status status = ValidateWeightName(name); !status.ok()) {
    return status;
  }
  const int64_t bytes = packed.resident_bytes();
  const int64_t device_bytes = device != nullptr ? device->device_bytes() : 0;
  auto weight = std::make_shared<const ResidentWeight>(
      ResidentWeight{name, std::move(packed), std::move(device)});
  absl::MutexLock lock(&mutex_);
  // On the failures below `reservation` is released when this returns,
  // after the lock.
  if (weights_.contains(name)) return AlreadyExists(name);
  if (absl::Status status = CheckFitsLocked(name, bytes, reservation);
      !status.ok()) {
    return status;
  }
  // The device copy is freed with `weight` when this returns: nothing of a
  // refused weight stays on the GPU.
  if (absl::Status status =
          CheckDeviceFitsLocked(name, device_bytes, reservation);
      !status.ok()) {
    return status;
  }
  weights_.emplace(std::move(name), std::move(weight));
  // The reservation turns into the weight's under the same lock, so the
  // weight is never counted twice nor not at all.
  if (reservation.store_ == this) {
    reserved_bytes_ -= reservation.bytes_;
    reserved_device_bytes_ -= reservation.device_bytes_;
    --reservations_;
  }
  reservation.store_ = nullptr;
  reservation.bytes_ = 0;
  reservation.device_bytes_ = 0;
  resident_bytes_ += bytes;
  device_bytes_ += device_bytes;
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

absl::Status WeightStore::CheckDeviceFitsLocked(absl::string_view name,
                                                int64_t device_bytes,
                                                const Reservation& own) const {
  const int64_t max_bytes = limits_.max_device_bytes;
  const int64_t others_reserved =
      reserved_device_bytes_ - (own.store_ == this ? own.device_bytes_ : 0);
  const int64_t in_use = device_bytes_ + others_reserved;
  if (max_bytes == 0 || device_bytes <= max_bytes - in_use) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "weight \"", name, "\" needs ", device_bytes, " bytes of GPU memory but ",
      in_use, " of the ", max_bytes,
      " bytes allowed by --max_gpu_bytes are in use (", device_bytes_,
      " by resident weights, ", others_reserved,
      " reserved by uploads in progress): delete a weight, retry once "
      "uploads finish, or raise --max_gpu_bytes"));
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
  if (it->second->device != nullptr) {
    device_bytes_ -= it->second->device->device_bytes();
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
  return device_bytes_;
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
