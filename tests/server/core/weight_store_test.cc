// Tests the resident weight store: names, duplicates, lookups, deletion while
// a request still holds the weight, the resident-bytes budget with the
// reservations of uploads in progress, the GPUs' budgets and the placement
// of device copies on them, and loading.
#include "server/core/weight_store.h"

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/device_weight.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

PackedWeight SmallWeight(uint64_t seed) {
  return *PackedWeight::Pack(
      RandomQuantizedWeight({WeightFormat::kU4b8, 32, 8, 32}, seed));
}

TEST(ValidateWeightNameTest, AcceptsSafeNames) {
  for (const char* name : {"a", "layer.0.q_proj", "W-1_x", "x.y.z"}) {
    EXPECT_TRUE(ValidateWeightName(name).ok()) << name;
  }
  EXPECT_TRUE(ValidateWeightName(std::string(128, 'a')).ok());
}

TEST(ValidateWeightNameTest, RefusesUnsafeNames) {
  EXPECT_THAT(ValidateWeightName("").message(), HasSubstr("empty"));
  EXPECT_THAT(ValidateWeightName(std::string(129, 'a')).message(),
              HasSubstr("at most 128"));
  EXPECT_THAT(ValidateWeightName(".hidden").message(),
              HasSubstr("must not start with '.'"));
  for (const char* name : {"a/b", "..", "a b", "a\\b", "naïve"}) {
    EXPECT_EQ(ValidateWeightName(name).code(),
              absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_EQ(ValidateWeightName(std::string("a\0b", 3)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(WeightStoreTest, InsertGetListRemove) {
  WeightStore store;
  ASSERT_TRUE(store.Insert("b", SmallWeight(1)).ok());
  ASSERT_TRUE(store.Insert("a", SmallWeight(2)).ok());
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> a = store.Get("a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ((*a)->name, "a");
  EXPECT_EQ((*a)->packed.spec().k, 32);
  const auto listed = store.List();
  ASSERT_EQ(listed.size(), 2u);
  EXPECT_EQ(listed[0]->name, "a");
  EXPECT_EQ(listed[1]->name, "b");
  ASSERT_TRUE(store.Remove("a").ok());
  EXPECT_TRUE(store.CheckNameFree("a").ok());
  EXPECT_EQ(store.CheckNameFree("b").code(), absl::StatusCode::kAlreadyExists);
}

TEST(WeightStoreTest, PagesListEveryWeightOnceInOrder) {
  WeightStore store;
  const std::vector<std::string> names = {"a", "b.1", "b.2", "c", "d-0", "e"};
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_TRUE(store.Insert(names[i], SmallWeight(i)).ok());
  }
  std::vector<std::string> listed;
  std::string after;
  int pages = 0;
  while (true) {
    WeightStore::Page page = store.List(after, /*limit=*/4);
    ++pages;
    for (const auto& weight : page.weights) listed.push_back(weight->name);
    if (!page.more) break;
    after = listed.back();
    // A page token names a weight that may be deleted before the next call.
    ASSERT_TRUE(store.Remove(after).ok());
  }
  EXPECT_EQ(listed, names);
  EXPECT_EQ(pages, 2);
  // A full last page says nothing more follows.
  EXPECT_FALSE(store.List("b.2", 2).more);
  EXPECT_EQ(store.List("b.2", 2).weights.size(), 2u);
  EXPECT_TRUE(store.List("z", 10).weights.empty());
}

TEST(WeightStoreTest, DuplicateNameIsRefusedAndKeepsTheFirst) {
  WeightStore store;
  ASSERT_TRUE(store.Insert("w", SmallWeight(1)).ok());
  const uint32_t first_word = (*store.Get("w"))->packed.panel_codes(0)[0];
  absl::Status status = store.Insert("w", SmallWeight(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(status.message(), HasSubstr("\"w\" already exists"));
  EXPECT_EQ((*store.Get("w"))->packed.panel_codes(0)[0], first_word);
}

TEST(WeightStoreTest, UnknownNameIsNotFound) {
  WeightStore store;
  EXPECT_EQ(store.Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store.Remove("nope").message(), HasSubstr("no weight named"));
}

TEST(WeightStoreTest, RemovedWeightOutlivesItsUsers) {
  WeightStore store;
  ASSERT_TRUE(store.Insert("w", SmallWeight(1)).ok());
  std::shared_ptr<const ResidentWeight> in_use = *store.Get("w");
  ASSERT_TRUE(store.Remove("w").ok());
  EXPECT_EQ(in_use->name, "w");
  EXPECT_EQ(in_use->packed.spec().n, 8);
}

TEST(PackedResidentBytesTest, MatchesWhatPackingHolds) {
  // N below, at and past a panel boundary; every group size; every format.
  for (WeightFormat format :
       {WeightFormat::kFp4, WeightFormat::kU4b8, WeightFormat::kU4}) {
    for (const auto& [k, n, group] :
         {std::tuple(32, 8, 32), std::tuple(64, 16, 32),
          std::tuple(128, 17, 64), std::tuple(256, 40, 128),
          std::tuple(96, 33, 96)}) {
      const WeightSpec spec{format, k, n, group};
      QuantizedWeight weight = RandomQuantizedWeight(spec, 7);
      absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(weight);
      ASSERT_TRUE(packed.ok()) << spec.DebugString();
      EXPECT_EQ(PackedResidentBytes(spec, /*has_activation_order=*/false),
                packed->resident_bytes())
          << spec.DebugString();
      weight.activation_order = RandomActivationOrder(k, 7);
      packed = PackedWeight::Pack(weight);
      ASSERT_TRUE(packed.ok()) << spec.DebugString();
      EXPECT_EQ(PackedResidentBytes(spec, /*has_activation_order=*/true),
                packed->resident_bytes())
          << spec.DebugString() << " with an activation order";
    }
  }
}

TEST(WeightStoreBudgetTest, CountsResidentBytesThroughInsertAndRemove) {
  WeightStore store;
  EXPECT_EQ(store.resident_bytes(), 0);
  PackedWeight a = SmallWeight(1);
  const int64_t bytes = a.resident_bytes();
  ASSERT_TRUE(store.Insert("a", std::move(a)).ok());
  ASSERT_TRUE(store.Insert("b", SmallWeight(2)).ok());
  EXPECT_EQ(store.resident_bytes(), 2 * bytes);
  ASSERT_TRUE(store.Remove("a").ok());
  EXPECT_EQ(store.resident_bytes(), bytes);
  // A refused duplicate adds nothing.
  EXPECT_FALSE(store.Insert("b", SmallWeight(3)).ok());
  EXPECT_EQ(store.resident_bytes(), bytes);
}

TEST(WeightStoreBudgetTest, WeightPastTheBudgetIsRefusedAndChangesNothing) {
  const int64_t bytes = SmallWeight(1).resident_bytes();
  WeightStore store({.max_resident_bytes = 2 * bytes + bytes / 2});
  ASSERT_TRUE(store.Insert("a", SmallWeight(1)).ok());
  ASSERT_TRUE(store.Insert("b", SmallWeight(2)).ok());
  EXPECT_TRUE(store.CheckFits("c", bytes / 2).ok());
  EXPECT_EQ(store.CheckFits("c", bytes).code(),
            absl::StatusCode::kResourceExhausted);

  absl::Status status = store.Insert("c", SmallWeight(3));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(),
              HasSubstr("\"c\" needs " + std::to_string(bytes) + " bytes"));
  EXPECT_THAT(status.message(),
              HasSubstr(std::to_string(2 * bytes) + " of the " +
                        std::to_string(store.max_resident_bytes())));
  EXPECT_THAT(status.message(), HasSubstr("--max_weight_bytes"));
  EXPECT_EQ(store.Get("c").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.resident_bytes(), 2 * bytes);
  EXPECT_EQ(store.List().size(), 2u);

  ASSERT_TRUE(store.Remove("a").ok());
  EXPECT_TRUE(store.Insert("c", SmallWeight(3)).ok());
}

// A device copy of `bytes` on GPU `gpu` that counts its destructions in
// `*freed`, so that tests see what the store keeps of a refused weight.
class FakeDeviceWeight final : public nibble::DeviceWeight {
 public:
  FakeDeviceWeight(int64_t bytes, int* freed, int gpu = 0)
      : bytes_(bytes), freed_(freed), gpu_(gpu) {}
  ~FakeDeviceWeight() override { ++*freed_; }
  const WeightSpec& spec() const override { return spec_; }
  int64_t device_bytes() const override { return bytes_; }
  int device() const override { return gpu_; }

 private:
  WeightSpec spec_;
  int64_t bytes_;
  int* freed_;
  int gpu_;
};

// Each GPU's resident and reserved bytes, in the store's order.
std::vector<std::pair<int64_t, int64_t>> Held(const WeightStore& store) {
  std::vector<std::pair<int64_t, int64_t>> held;
  for (const GpuUsage& gpu : store.gpu_usage()) {
    held.emplace_back(gpu.resident_bytes, gpu.reserved_bytes);
  }
  return held;
}

TEST(WeightStoreGpuBudgetTest, DeviceCopyPastTheBudgetIsRefusedAndFreed) {
  int freed = 0;
  WeightStore store({.gpus = {{.gpu = 0, .max_bytes = 1000}}});
  ASSERT_EQ(store.gpu_usage().size(), 1u);
  EXPECT_EQ(store.gpu_usage()[0].max_bytes, 1000);
  ASSERT_TRUE(store
                  .Insert("a", SmallWeight(1),
                          std::make_unique<FakeDeviceWeight>(600, &freed))
                  .ok());
  absl::StatusOr<WeightStore::Reservation> reservation =
      store.Reserve("b", SmallWeight(2).resident_bytes());
  ASSERT_TRUE(reservation.ok());
  EXPECT_EQ(reservation->gpu(), -1);
  const absl::Status status =
      store.Insert("b", SmallWeight(2), *std::move(reservation),
                   std::make_unique<FakeDeviceWeight>(401, &freed));
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(), HasSubstr("\"b\" needs 401 bytes of GPU"));
  EXPECT_THAT(status.message(), HasSubstr("GPU 0: 600 of 1000 bytes in use"));
  EXPECT_THAT(status.message(), HasSubstr("--max_gpu_bytes"));
  // Nothing of it is kept: not the weight, its device copy nor its budget.
  EXPECT_EQ(freed, 1);
  EXPECT_EQ(store.Get("b").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store.device_bytes(), 600);
  EXPECT_EQ(store.reserved_bytes(), 0);

  EXPECT_TRUE(store
                  .Insert("c", SmallWeight(3),
                          std::make_unique<FakeDeviceWeight>(400, &freed))
                  .ok());
  EXPECT_EQ(store.device_bytes(), 1000);
  ASSERT_TRUE(store.Remove("a").ok());
  EXPECT_EQ(freed, 2);
  EXPECT_EQ(store.device_bytes(), 400);
}

TEST(WeightStoreGpuBudgetTest, UploadsReserveGpuBytesBeforeTheirData) {
  int freed = 0;
  WeightStore store({.gpus = {{.gpu = 0, .max_bytes = 1000}}});
  ASSERT_TRUE(store
                  .Insert("a", SmallWeight(1),
                          std::make_unique<FakeDeviceWeight>(300, &freed))
                  .ok());
  absl::StatusOr<WeightStore::Reservation> b = store.Reserve("b", 1, 500);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->device_bytes(), 500);
  EXPECT_EQ(b->gpu(), 0);
  // 300 resident and 500 reserved leave 200.
  const absl::Status refused = store.Reserve("c", 1, 201).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("\"c\" needs 201 bytes of GPU"));
  EXPECT_THAT(refused.message(), HasSubstr("GPU 0: 800 of 1000 bytes in use"));
  EXPECT_THAT(refused.message(), HasSubstr("500 of them reserved by uploads"));
  EXPECT_THAT(refused.message(), HasSubstr("--max_gpu_bytes"));
  EXPECT_TRUE(store.Reserve("c", 1, 200).ok());
  // b's own reservation counts as free for b; its copy turns it into
  // resident GPU bytes.
  ASSERT_TRUE(store
                  .Insert("b", SmallWeight(2), *std::move(b),
                          std::make_unique<FakeDeviceWeight>(500, &freed))
                  .ok());
  EXPECT_EQ(store.device_bytes(), 800);
  // Released when destroyed unused: 200 left, then none.
  {
    absl::StatusOr<WeightStore::Reservation> d = store.Reserve("d", 1, 200);
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_FALSE(store.Reserve("e", 1, 1).ok());
  }
  EXPECT_TRUE(store.Reserve("e", 1, 200).ok());
  EXPECT_EQ(freed, 0);
}

TEST(WeightStoreGpuBudgetTest, NoBudgetTakesAnyDeviceCopy) {
  int freed = 0;
  WeightStore store({.gpus = {{.gpu = 0}}});
  EXPECT_TRUE(
      store
          .Insert("a", SmallWeight(1),
                  std::make_unique<FakeDeviceWeight>(int64_t{1} << 50, &freed))
          .ok());
  EXPECT_EQ(freed, 0);
}

TEST(WeightStoreGpuBudgetTest, DeviceBytesWithoutGpusAreRefused) {
  int freed = 0;
  WeightStore store;
  EXPECT_EQ(store.Reserve("a", 1, 100).status().code(),
            absl::StatusCode::kInvalidArgument);
  const absl::Status status = store.Insert(
      "a", SmallWeight(1), std::make_unique<FakeDeviceWeight>(100, &freed));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("places no weights on a GPU"));
  EXPECT_EQ(freed, 1);
  // Weights without a device copy need no GPU.
  EXPECT_TRUE(store.Insert("b", SmallWeight(2)).ok());
}

TEST(WeightStorePlacementTest, EachWeightGoesWhereTheMostRoomIsLeft) {
  WeightStore store(
      {.gpus = {{.gpu = 0, .max_bytes = 1000}, {.gpu = 1, .max_bytes = 1500}}});
  // Room 1000 and 1500: GPU 1; then 1000 and 900: GPU 0; then 400 and 900.
  absl::StatusOr<WeightStore::Reservation> a = store.Reserve("a", 1, 600);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->gpu(), 1);
  absl::StatusOr<WeightStore::Reservation> b = store.Reserve("b", 1, 600);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->gpu(), 0);
  absl::StatusOr<WeightStore::Reservation> c = store.Reserve("c", 1, 500);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->gpu(), 1);
  EXPECT_EQ(Held(store),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 600}, {0, 1100}}));
  // 400 left on each: a tie goes to the first of --gpus.
  absl::StatusOr<WeightStore::Reservation> d = store.Reserve("d", 1, 100);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->gpu(), 0);

  const absl::Status refused = store.Reserve("e", 1, 401).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("more than any GPU has free"));
  EXPECT_THAT(refused.message(), HasSubstr("GPU 0: 700 of 1000 bytes in use"));
  EXPECT_THAT(refused.message(), HasSubstr("GPU 1: 1100 of 1500 bytes in use"));
  // A reservation given back frees its own GPU's bytes.
  *b = WeightStore::Reservation();
  EXPECT_EQ(Held(store),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 100}, {0, 1100}}));
  absl::StatusOr<WeightStore::Reservation> e = store.Reserve("e", 1, 401);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->gpu(), 0);
}

TEST(WeightStorePlacementTest, DeviceCopiesCountOnTheirOwnGpu) {
  int freed = 0;
  WeightStore store(
      {.gpus = {{.gpu = 2, .max_bytes = 1000}, {.gpu = 5, .max_bytes = 1000}}});
  absl::StatusOr<WeightStore::Reservation> a = store.Reserve("a", 1, 300);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->gpu(), 2);
  ASSERT_TRUE(store
                  .Insert("a", SmallWeight(1), *std::move(a),
                          std::make_unique<FakeDeviceWeight>(300, &freed, 2))
                  .ok());
  ASSERT_TRUE(store
                  .Insert("b", SmallWeight(2),
                          std::make_unique<FakeDeviceWeight>(700, &freed, 5))
                  .ok());
  EXPECT_EQ(Held(store),
            (std::vector<std::pair<int64_t, int64_t>>{{300, 0}, {700, 0}}));
  EXPECT_EQ(store.device_bytes(), 1000);
  // A copy on a GPU the store does not place on is refused and freed.
  const absl::Status elsewhere = store.Insert(
      "c", SmallWeight(3), std::make_unique<FakeDeviceWeight>(1, &freed, 3));
  EXPECT_EQ(elsewhere.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(elsewhere.message(), HasSubstr("GPUs 2, 5"));
  EXPECT_EQ(freed, 1);
  ASSERT_TRUE(store.Remove("b").ok());
  EXPECT_EQ(Held(store),
            (std::vector<std::pair<int64_t, int64_t>>{{300, 0}, {0, 0}}));
}

TEST(WeightStorePlacementTest, APinnedGpuIsTakenOrRefused) {
  WeightStore store(
      {.gpus = {{.gpu = 0, .max_bytes = 1000}, {.gpu = 1, .max_bytes = 500}}});
  absl::StatusOr<WeightStore::Reservation> a = store.Reserve("a", 1, 300, 1);
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->gpu(), 1);
  const absl::Status full = store.Reserve("b", 1, 201, 1).status();
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("more than is free"));
  EXPECT_THAT(full.message(), HasSubstr("GPU 1: 300 of 500"));
  EXPECT_THAT(full.message(), Not(HasSubstr("GPU 0")));
  const absl::Status absent = store.Reserve("b", 1, 10, 7).status();
  EXPECT_EQ(absent.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(absent.message(), HasSubstr("asks for GPU 7"));
  EXPECT_THAT(absent.message(), HasSubstr("GPUs 0, 1 (--gpus)"));
  EXPECT_EQ(Held(store),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 300}}));
}

TEST(WeightStorePlacementTest, AWeightLargerThanAnyGpuSaysSo) {
  WeightStore store(
      {.gpus = {{.gpu = 0, .max_bytes = 1000}, {.gpu = 1, .max_bytes = 1500}}});
  const absl::Status status = store.Reserve("huge", 1, 1501).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(status.message(),
              HasSubstr("more than any one GPU may hold (the most is GPU 1's "
                        "1500 bytes"));
  EXPECT_THAT(status.message(), HasSubstr("whole on one GPU"));
  EXPECT_EQ(Held(store),
            (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {0, 0}}));
}

TEST(WeightStorePlacementTest, WithoutBudgetsTheLeastHeldGpuTakesTheWeight) {
  WeightStore store({.gpus = {{.gpu = 0}, {.gpu = 1}, {.gpu = 2}}});
  std::vector<int> placed;
  std::vector<WeightStore::Reservation> held;
  for (int64_t bytes : {500, 300, 100, 50}) {
    absl::StatusOr<WeightStore::Reservation> reservation =
        store.Reserve(absl::StrCat("w", bytes), 1, bytes);
    ASSERT_TRUE(reservation.ok()) << reservation.status();
    placed.push_back(reservation->gpu());
    held.push_back(*std::move(reservation));
  }
  EXPECT_EQ(placed, (std::vector<int>{0, 1, 2, 2}));
}

// Issue 30's rule: placement fills every GPU before it refuses, so a refused
// weight fits on none of them.
TEST(WeightStorePlacementTest, FillsEveryGpuBeforeRefusing) {
  constexpr uint64_t kSeed = 30;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937_64 rng(kSeed);
  for (int round = 0; round < 20; ++round) {
    std::vector<GpuBudget> budgets;
    const int gpus = 1 + static_cast<int>(rng() % 4);
    for (int gpu = 0; gpu < gpus; ++gpu) {
      budgets.push_back(
          {.gpu = gpu, .max_bytes = 1000 + static_cast<int64_t>(rng() % 9000)});
    }
    WeightStore store({.gpus = budgets});
    std::vector<WeightStore::Reservation> held;
    for (int i = 0;; ++i) {
      const int64_t bytes = 1 + static_cast<int64_t>(rng() % 2000);
      absl::StatusOr<WeightStore::Reservation> reservation =
          store.Reserve(absl::StrCat("w", i), 0, bytes);
      if (reservation.ok()) {
        held.push_back(*std::move(reservation));
        continue;
      }
      ASSERT_EQ(reservation.status().code(),
                absl::StatusCode::kResourceExhausted);
      for (const GpuUsage& gpu : store.gpu_usage()) {
        EXPECT_GT(bytes, gpu.max_bytes - gpu.reserved_bytes)
            << "round " << round << ": " << bytes << " bytes fit GPU "
            << gpu.gpu << " but were refused";
      }
      break;
    }
  }
}

TEST(ResolveGpusTest, AllByDefaultOrTheOnesNamed) {
  EXPECT_EQ(*ResolveGpus({}, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(*ResolveGpus({2, 0}, 3), (std::vector<int>{2, 0}));
  const absl::Status past = ResolveGpus({0, 2}, 2).status();
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.message(), HasSubstr("GPU 2"));
  EXPECT_THAT(past.message(), HasSubstr("GPUs 0 to 1"));
  EXPECT_THAT(ResolveGpus({1}, 1).status().message(),
              HasSubstr("sees GPU 0 only"));
  EXPECT_THAT(ResolveGpus({0}, 0).status().message(), HasSubstr("sees no GPU"));
  EXPECT_THAT(ResolveGpus({1, 0, 1}, 2).status().message(),
              HasSubstr("GPU 1 twice"));
}

TEST(GpuBudgetBytesTest, FlagOrFreeMemoryLessTheMargin) {
  constexpr int64_t kGiB = int64_t{1} << 30;
  EXPECT_EQ(GpuBudgetBytes(12345, 80 * kGiB), 12345);
  EXPECT_EQ(GpuBudgetBytes(-1, 80 * kGiB), 0);
  EXPECT_EQ(GpuBudgetBytes(0, 80 * kGiB), 80 * kGiB - kGpuMemoryMargin);
  EXPECT_EQ(GpuBudgetBytes(0, 2 * kGpuMemoryMargin), kGpuMemoryMargin);
  // A small GPU keeps half.
  EXPECT_EQ(GpuBudgetBytes(0, kGpuMemoryMargin), kGpuMemoryMargin / 2);
  // Never 0, which would mean no limit.
  EXPECT_EQ(GpuBudgetBytes(0, 0), 1);
}

TEST(WeightStoreBudgetTest, ZeroBudgetMeansNoLimit) {
  WeightStore store;
  EXPECT_EQ(store.max_resident_bytes(), 0);
  EXPECT_TRUE(store.CheckFits("huge", int64_t{1} << 50).ok());
  absl::StatusOr<WeightStore::Reservation> reservation =
      store.Reserve("huge", int64_t{1} << 50);
  ASSERT_TRUE(reservation.ok());
  EXPECT_EQ(store.reserved_bytes(), int64_t{1} << 50);
}

TEST(WeightStoreReservationTest, ReservationBlocksOthersUntilDestroyed) {
  const int64_t bytes = SmallWeight(1).resident_bytes();
  WeightStore store({.max_resident_bytes = bytes + bytes / 2});
  {
    absl::StatusOr<WeightStore::Reservation> first = store.Reserve("a", bytes);
    ASSERT_TRUE(first.ok()) << first.status();
    EXPECT_EQ(first->bytes(), bytes);
    EXPECT_EQ(store.reserved_bytes(), bytes);
    EXPECT_EQ(store.resident_bytes(), 0);

    absl::StatusOr<WeightStore::Reservation> second = store.Reserve("b", bytes);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(
        second.status().message(),
        HasSubstr(std::to_string(bytes) + " reserved by uploads in progress"));
    EXPECT_EQ(store.CheckFits("b", bytes).code(),
              absl::StatusCode::kResourceExhausted);
    // A weight inserted without a reservation is refused as well.
    EXPECT_EQ(store.Insert("b", SmallWeight(2)).code(),
              absl::StatusCode::kResourceExhausted);

    // Moving keeps one reservation, released once.
    WeightStore::Reservation moved = *std::move(first);
    EXPECT_EQ(moved.bytes(), bytes);
    EXPECT_EQ(store.reserved_bytes(), bytes);
  }
  EXPECT_EQ(store.reserved_bytes(), 0);
  EXPECT_TRUE(store.Reserve("b", bytes).ok());
  EXPECT_EQ(store.reserved_bytes(), 0);
}

TEST(WeightStoreReservationTest, AssigningOverAReservationReleasesIt) {
  const int64_t bytes = SmallWeight(1).resident_bytes();
  WeightStore store({.max_resident_bytes = 2 * bytes});
  absl::StatusOr<WeightStore::Reservation> a = store.Reserve("a", bytes);
  absl::StatusOr<WeightStore::Reservation> b = store.Reserve("b", bytes);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(b.ok());
  *a = *std::move(b);
  EXPECT_EQ(store.reserved_bytes(), bytes);
}

TEST(WeightStoreReservationTest, InsertTurnsTheReservationIntoResidentBytes) {
  const int64_t bytes = SmallWeight(1).resident_bytes();
  // Room for exactly one weight: counting it both reserved and resident
  // would refuse it.
  WeightStore store({.max_resident_bytes = bytes});
  absl::StatusOr<WeightStore::Reservation> reservation =
      store.Reserve("a", bytes);
  ASSERT_TRUE(reservation.ok());
  ASSERT_TRUE(store.Insert("a", SmallWeight(1), *std::move(reservation)).ok());
  EXPECT_EQ(store.resident_bytes(), bytes);
  EXPECT_EQ(store.reserved_bytes(), 0);
  EXPECT_EQ(store.Reserve("b", 1).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.Remove("a").ok());
  EXPECT_EQ(store.resident_bytes(), 0);
  EXPECT_EQ(store.reserved_bytes(), 0);
}

TEST(WeightStoreReservationTest, RefusedInsertReleasesTheReservation) {
  const int64_t bytes = SmallWeight(1).resident_bytes();
  WeightStore store({.max_resident_bytes = 3 * bytes});
  ASSERT_TRUE(store.Insert("a", SmallWeight(1)).ok());
  absl::StatusOr<WeightStore::Reservation> duplicate =
      store.Reserve("a", bytes);
  ASSERT_TRUE(duplicate.ok());
  EXPECT_EQ(store.Insert("a", SmallWeight(2), *std::move(duplicate)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store.reserved_bytes(), 0);
  EXPECT_EQ(store.resident_bytes(), bytes);

  // A reservation smaller than the weight covers only its own bytes.
  absl::StatusOr<WeightStore::Reservation> small = store.Reserve("b", 1);
  ASSERT_TRUE(small.ok());
  absl::StatusOr<WeightStore::Reservation> other =
      store.Reserve("c", bytes + bytes / 2);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(store.Insert("b", SmallWeight(3), *std::move(small)).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(store.reserved_bytes(), bytes + bytes / 2);
  EXPECT_EQ(store.resident_bytes(), bytes);
}

TEST(WeightStoreCountTest, WeightsAndUploadsInProgressCountAgainstTheLimit) {
  WeightStore store({.max_weights = 2});
  ASSERT_TRUE(store.Insert("a", SmallWeight(1)).ok());
  absl::StatusOr<WeightStore::Reservation> b = store.Reserve("b", 1);
  ASSERT_TRUE(b.ok()) << b.status();

  absl::StatusOr<WeightStore::Reservation> c = store.Reserve("c", 1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(c.status().message(),
              HasSubstr("\"c\" would pass the 2 weights allowed by "
                        "--max_weights (1 resident, 1 uploads in progress)"));
  EXPECT_EQ(store.Insert("c", SmallWeight(3)).code(),
            absl::StatusCode::kResourceExhausted);
  // The reservation holds b's place: b itself fits.
  ASSERT_TRUE(store.Insert("b", SmallWeight(2), *std::move(b)).ok());
  EXPECT_EQ(store.List().size(), 2u);

  ASSERT_TRUE(store.Remove("a").ok());
  EXPECT_TRUE(store.Reserve("c", 1).ok());
  // A refused insert gives its place back.
  absl::StatusOr<WeightStore::Reservation> again = store.Reserve("b", 1);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(store.Insert("b", SmallWeight(4), *std::move(again)).code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(store.Insert("d", SmallWeight(5)).ok());
}

TEST(WeightStoreLoadingTest, ClientsWaitWhileTheLoaderInserts) {
  WeightStore store;
  store.SetLoading(true);
  ASSERT_TRUE(store.Insert("w", SmallWeight(1)).ok());
  for (const absl::Status& status :
       {store.CheckLoaded(), store.Get("w").status(), store.CheckNameFree("x"),
        store.Remove("w")}) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(status.message(), HasSubstr("loading weights from --data_dir"));
  }
  store.SetLoading(false);
  EXPECT_TRUE(store.CheckLoaded().ok());
  EXPECT_TRUE(store.Get("w").ok());
}

}  // namespace
}  // namespace nibble::server
