// Tests the resident weight store: names, duplicates, lookups, deletion while
// a request still holds the weight.
#include "server/weight_store.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

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

}  // namespace
}  // namespace nibble::server
