// The weights nibbled holds resident, by name: each one packed once, at
// upload, into the layout its kernels read, and shared read-only with every
// request that uses it. A deleted weight stays alive until the last request
// using it finishes.
//
// Example:
//   nibble::server::WeightStore store;
//   absl::Status s = store.Insert("proj", std::move(packed));
//   absl::StatusOr<std::shared_ptr<const nibble::server::ResidentWeight>> w =
//       store.Get("proj");
#ifndef NIBBLE_SERVER_WEIGHT_STORE_H_
#define NIBBLE_SERVER_WEIGHT_STORE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "kernels/packed_weight.h"

namespace nibble::server {

struct ResidentWeight {
  std::string name;
  PackedWeight packed;
};

// OK for 1 to 128 characters from [A-Za-z0-9._-] not starting with '.', so a
// name is safe as a file name and in logs.
absl::Status ValidateWeightName(absl::string_view name);

class WeightStore {
 public:
  // ALREADY_EXISTS when the name is taken; INVALID_ARGUMENT for a bad name.
  absl::Status Insert(std::string name, PackedWeight packed);
  // NOT_FOUND, naming the weight, when there is none by that name.
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> Get(
      absl::string_view name) const;
  // OK when no weight has this name; ALREADY_EXISTS, as Insert would answer,
  // when one does. Lets an upload be refused before its data is sent.
  absl::Status CheckNameFree(absl::string_view name) const;
  absl::Status Remove(absl::string_view name);
  // Sorted by name.
  std::vector<std::shared_ptr<const ResidentWeight>> List() const;

 private:
  mutable absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<const ResidentWeight>, std::less<>>
      weights_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_WEIGHT_STORE_H_
