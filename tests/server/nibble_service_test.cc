// Tests NibbleServiceImpl::StorePacked, which only a server that keeps no
// canonical weights may use (nibbled --import on the CPU backend without
// --data_dir); the RPCs are tested through a real server in
// tests/integration.
#include "server/nibble_service.h"

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/packed_weight.h"
#include "kernels/weight_format.h"
#include "server/weight_directory.h"
#include "server/weight_store.h"
#include "tests/integration/test_files.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

PackedWeight RandomPanels(uint64_t seed) {
  const WeightSpec spec{WeightFormat::kNvfp4, 128, 40, 16, 0.5f};
  absl::StatusOr<PackedWeight> packed =
      PackedWeight::Pack(RandomQuantizedWeight(spec, seed));
  EXPECT_TRUE(packed.ok()) << packed.status();
  return *std::move(packed);
}

TEST(StorePackedTest, StoresWithinTheBudgetOnTheCpuWithoutDataDir) {
  WeightStore store;
  NibbleServiceImpl service(&store, /*batcher=*/nullptr);
  const PackedWeight panels = RandomPanels(/*seed=*/3);
  const int64_t bytes = panels.resident_bytes();
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> stored =
      service.StorePacked(panels, "layer0");
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ((*stored)->name, "layer0");
  EXPECT_EQ(store.resident_bytes(), bytes);
  EXPECT_EQ(service.StorePacked(panels, "layer0").status().code(),
            absl::StatusCode::kAlreadyExists);

  WeightStore small({.max_resident_bytes = bytes - 1});
  NibbleServiceImpl limited(&small, /*batcher=*/nullptr);
  EXPECT_EQ(limited.StorePacked(panels, "layer0").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(StorePackedTest, RefusesWhereACanonicalWeightIsNeeded) {
  const WeightDirectory data_dir(
      nibble::testing::FreshDirectory("store_packed"));
  WeightStore store;
  NibbleServiceImpl with_data_dir(&store, /*batcher=*/nullptr, &data_dir);
  NibbleServiceImpl on_gpu(&store, /*batcher=*/nullptr, /*data_dir=*/nullptr,
                           /*auth=*/nullptr, Backend::kCuda);
  for (NibbleServiceImpl* service : {&with_data_dir, &on_gpu}) {
    const absl::Status status =
        service->StorePacked(RandomPanels(/*seed=*/4), "layer0").status();
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(status.message(),
                HasSubstr("weight \"layer0\" was not stored: a weight packed "
                          "without its canonical layout"));
  }
  EXPECT_EQ(store.resident_bytes(), 0);
}

}  // namespace
}  // namespace nibble::server
