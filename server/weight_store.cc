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

}  // namespace

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
  auto weight = std::make_shared<const ResidentWeight>(
      ResidentWeight{name, std::move(packed)});
  absl::MutexLock lock(&mutex_);
  if (weights_.contains(name)) return AlreadyExists(name);
  weights_.emplace(std::move(name), std::move(weight));
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>> WeightStore::Get(
    absl::string_view name) const {
  absl::MutexLock lock(&mutex_);
  auto it = weights_.find(name);
  if (it == weights_.end()) return NotFound(name);
  return it->second;
}

absl::Status WeightStore::CheckNameFree(absl::string_view name) const {
  absl::MutexLock lock(&mutex_);
  if (weights_.find(name) != weights_.end()) return AlreadyExists(name);
  return absl::OkStatus();
}

absl::Status WeightStore::Remove(absl::string_view name) {
  absl::MutexLock lock(&mutex_);
  auto it = weights_.find(name);
  if (it == weights_.end()) return NotFound(name);
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

}  // namespace nibble::server
