// Tests NibbleServiceImpl::StorePacked, which only a server that keeps no
// canonical weights may use (nibbled --import on the CPU backend without
// --data_dir), and StoreColumns where no GPU takes the columns; the RPCs are
// tested through a real server in tests/integration.
#include "server/edge/nibble_service.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/packed_weight.h"
#include "server/core/weight_store.h"
#include "server/storage/weight_directory.h"
#include "tests/format/column_layout.h"
#include "tests/integration/test_files.h"
#include "tests/kernels/same_panels.h"

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

// Without a GPU to take them, columns are stored as their canonical weight:
// packed on the CPU, and written to data_dir where there is one.
TEST(StoreColumnsTest, StoresTheCanonicalWeightWhereNoGpuTakesTheColumns) {
  const WeightDirectory data_dir(
      nibble::testing::FreshDirectory("store_columns"));
  ASSERT_TRUE(data_dir.Prepare().ok());
  for (const WeightDirectory* directory :
       {static_cast<const WeightDirectory*>(nullptr), &data_dir}) {
    SCOPED_TRACE(directory == nullptr ? "no data_dir" : "data_dir");
    for (const WeightSpec& spec :
         {WeightSpec{WeightFormat::kMxfp4, 128, 40, 32},
          WeightSpec{WeightFormat::kNvfp4, 256, 24, 16, 0.25f}}) {
      SCOPED_TRACE(WeightFormatName(spec.format));
      const QuantizedWeight weight = RandomQuantizedWeight(spec, /*seed=*/5);
      const nibble::testing::ColumnLayout columns =
          nibble::testing::ToColumns(weight);
      WeightStore store;
      NibbleServiceImpl service(&store, /*batcher=*/nullptr, directory);
      absl::StatusOr<std::shared_ptr<const ResidentWeight>> stored =
          service.StoreColumns(columns.View(spec), "layer0");
      ASSERT_TRUE(stored.ok()) << stored.status();
      absl::StatusOr<PackedWeight> want = PackedWeight::Pack(weight);
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_TRUE(nibble::testing::SamePanels((*stored)->packed, *want));
      EXPECT_EQ(
          service.StoreColumns(columns.View(spec), "layer0").status().code(),
          absl::StatusCode::kAlreadyExists);
      if (directory != nullptr) {
        std::vector<QuantizedWeight> saved;
        ASSERT_TRUE(directory
                        ->LoadAll([&](WeightFileReader& file) {
                          absl::StatusOr<QuantizedWeight> weight =
                              file.ReadWhole();
                          if (weight.ok()) saved.push_back(*std::move(weight));
                          return weight.status();
                        })
                        .ok());
        ASSERT_EQ(saved.size(), 1u);
        EXPECT_EQ(saved[0].qweight, weight.qweight);
        EXPECT_EQ(saved[0].scales, weight.scales);
        ASSERT_TRUE(directory->Remove("layer0").ok());
      }
    }
  }
}

}  // namespace
}  // namespace nibble::server
