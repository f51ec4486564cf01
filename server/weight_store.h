// The weights nibbled holds resident, by name: each one packed once, at
// upload, into the layout its kernels read, and shared read-only with every
// request that uses it. A deleted weight stays alive until the last request
// using it finishes. An optional budget (nibbled --max_weight_bytes) caps the
// bytes held resident plus those reserved by uploads in progress; a weight
// that would pass it is refused whole.
//
// Example:
//   nibble::server::WeightStore store(/*max_resident_bytes=*/1 << 30);
//   absl::StatusOr<nibble::server::WeightStore::Reservation> reservation =
//       store.Reserve("proj", nibble::server::PackedResidentBytes(spec));
//   ...  // receive the weight, pack it
//   absl::Status s =
//       store.Insert("proj", std::move(packed), *std::move(reservation));
//   absl::StatusOr<std::shared_ptr<const nibble::server::ResidentWeight>> w =
//       store.Get("proj");
#ifndef NIBBLE_SERVER_WEIGHT_STORE_H_
#define NIBBLE_SERVER_WEIGHT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
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

// The bytes PackedWeight::Pack would hold resident for a weight of `spec`
// (its resident_bytes()), known from the spec alone so that an upload can be
// refused before its data is sent. `spec` must pass Validate().
int64_t PackedResidentBytes(const WeightSpec& spec);

// OK for 1 to 128 characters from [A-Za-z0-9._-] not starting with '.', so a
// name is safe as a file name and in logs.
absl::Status ValidateWeightName(absl::string_view name);

class WeightStore {
 public:
  // Budget bytes held for a weight that is still arriving, so that
  // concurrent uploads cannot together buffer more than the budget: counted
  // against it like resident bytes until Insert turns them into the
  // weight's resident bytes, or until destroyed. Movable; the store must
  // outlive it.
  class Reservation {
   public:
    // Holds nothing.
    Reservation() = default;
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation();

    int64_t bytes() const { return bytes_; }

   private:
    friend class WeightStore;
    Reservation(WeightStore* store, int64_t bytes)
        : store_(store), bytes_(bytes) {}
    // Gives the bytes back to the store, if any.
    void Release();

    WeightStore* store_ = nullptr;
    int64_t bytes_ = 0;
  };

  // `max_resident_bytes` caps the sum of resident_bytes() over the weights
  // and of the bytes reserved; 0 for no cap.
  explicit WeightStore(int64_t max_resident_bytes = 0)
      : max_resident_bytes_(max_resident_bytes) {}

  // Reserves `bytes` for weight `name`; RESOURCE_EXHAUSTED, as CheckFits
  // answers, when they do not fit now.
  absl::StatusOr<Reservation> Reserve(absl::string_view name, int64_t bytes);

  // ALREADY_EXISTS when the name is taken; INVALID_ARGUMENT for a bad name;
  // RESOURCE_EXHAUSTED, as CheckFits answers, past the budget, where the
  // bytes of `reservation` (made by this store) count as free for this
  // weight. On success the reservation becomes the weight's resident bytes;
  // on failure it is released and the store is otherwise unchanged. Allowed
  // while loading.
  absl::Status Insert(std::string name, PackedWeight packed,
                      Reservation reservation);
  // Insert without a reservation, as the loader does.
  absl::Status Insert(std::string name, PackedWeight packed) {
    return Insert(std::move(name), std::move(packed), Reservation());
  }
  // NOT_FOUND, naming the weight, when there is none by that name.
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> Get(
      absl::string_view name) const;
  // OK when no weight has this name; ALREADY_EXISTS, as Insert would answer,
  // when one does. Lets an upload be refused before its data is sent.
  absl::Status CheckNameFree(absl::string_view name) const;
  // OK when a weight `name` of `bytes` resident bytes fits in the budget
  // now; RESOURCE_EXHAUSTED naming the weight, its size, the bytes resident
  // and reserved, and the budget when not.
  absl::Status CheckFits(absl::string_view name, int64_t bytes) const;
  absl::Status Remove(absl::string_view name);
  // Sorted by name.
  std::vector<std::shared_ptr<const ResidentWeight>> List() const;

  // Sum of resident_bytes() over the weights held.
  int64_t resident_bytes() const;
  // Sum of the bytes of the live reservations.
  int64_t reserved_bytes() const;
  int64_t max_resident_bytes() const { return max_resident_bytes_; }

  // While loading (nibbled reading --data_dir at start), Get, CheckNameFree
  // and Remove answer UNAVAILABLE, and so does CheckLoaded, so that no client
  // sees a half-loaded store; Insert still works, for the loader.
  void SetLoading(bool loading);
  // OK once loaded; UNAVAILABLE asking to retry while loading.
  absl::Status CheckLoaded() const;

 private:
  // As CheckFits, with `own_reserved` of the reserved bytes set aside for
  // this weight.
  absl::Status CheckFitsLocked(absl::string_view name, int64_t bytes,
                               int64_t own_reserved = 0) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_);

  const int64_t max_resident_bytes_;
  mutable absl::Mutex mutex_;
  std::map<std::string, std::shared_ptr<const ResidentWeight>, std::less<>>
      weights_ ABSL_GUARDED_BY(mutex_);
  int64_t resident_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t reserved_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  bool loading_ ABSL_GUARDED_BY(mutex_) = false;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_WEIGHT_STORE_H_
