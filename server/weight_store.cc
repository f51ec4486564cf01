#include "server/weight_store.h"

#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace nibble::server {
namespace {

constexpr size_t kMaxNameLength = 128;

bool IsNameCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

absl::Status NotFound(absl::string_view name) {
  return absl::NotFoundError(
      absl::StrCat("no weight named \"", name,
                   "\": upload it first or check `nibble list`"));
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

int64_t PackedResidentBytes(const WeightSpec& spec) {
  const int64_t panels =
      (spec.n + PackedWeight::kPanelWidth - 1) / PackedWeight::kPanelWidth;
  const int64_t code_bytes = spec.k / kCodesPerWord * sizeof(uint32_t);
  const int64_t scale_bytes = spec.groups() * sizeof(uint16_t);
  const int64_t zero_bytes = HasZeros(spec.format) ? spec.groups() : 0;
  return panels * PackedWeight::kPanelWidth *
         (code_bytes + scale_bytes + zero_bytes);
}

absl::Status ValidateWeightName(absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError("weight name is empty");
  }
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight name has ", name.size(), " characters, at most ",
                     kMaxNameLength, " are allowed"));
  }
  if (name.front() == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("weight name \"", name, "\" must not start with '.'"));
  }
  for (char c : name) {
    if (!IsNameCharacter(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight name \"", absl::CHexEscape(name),
          "\" may only contain letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

absl::Status WeightStore::Insert(std::string name, PackedWeight packed) {
  if (absl::Status status = ValidateWeightName(name); !status.ok()) {
    return status;
  }
  const int64_t bytes = packed.resident_bytes();
  auto weight = std::make_shared<const ResidentWeight>(
      ResidentWeight{name, std::move(packed)});
  absl::MutexLock lock(&mutex_);
  if (weights_.contains(name)) return AlreadyExists(name);
  if (absl::Status status = CheckFitsLocked(name, bytes); !status.ok()) {
    return status;
  }
  weights_.emplace(std::move(name), std::move(weight));
  resident_bytes_ += bytes;
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
  return CheckFitsLocked(name, bytes);
}

absl::Status WeightStore::CheckFitsLocked(absl::string_view name,
                                          int64_t bytes) const {
  if (max_resident_bytes_ == 0 ||
      bytes <= max_resident_bytes_ - resident_bytes_) {
    return absl::OkStatus();
  }
  return absl::ResourceExhaustedError(absl::StrCat(
      "weight \"", name, "\" needs ", bytes, " bytes resident but ",
      resident_bytes_, " of the ", max_resident_bytes_,
      " bytes allowed by --max_weight_bytes are in use: delete a weight or "
      "raise --max_weight_bytes"));
}

absl::Status WeightStore::Remove(absl::string_view name) {
  absl::MutexLock lock(&mutex_);
  if (loading_) return Loading();
  auto it = weights_.find(name);
  if (it == weights_.end()) return NotFound(name);
  resident_bytes_ -= it->second->packed.resident_bytes();
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

int64_t WeightStore::resident_bytes() const {
  absl::MutexLock lock(&mutex_);
  return resident_bytes_;
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
