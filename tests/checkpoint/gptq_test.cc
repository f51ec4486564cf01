// Tests the conversion of GPTQ layers (checkpoint/gptq.h). The packed inputs
// are written the way AutoGPTQ and GPTQModel pack them
// (tests/checkpoint/producer_layers.h), from random codes, zero points and
// scales with fixed seeds, independently of the converter; the converted
// weight must dequantize to exactly the values the producer meant, and
// multiply like them against the float64 reference. Every malformed layer is
// refused with a message that names the tensor, by DetectLayout and
// CheckLayer (checkpoint/import.h) as by the converter.
#include "checkpoint/gptq.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/import.h"
#include "checkpoint/safetensors.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/converter_test_util.h"
#include "tests/checkpoint/producer_layers.h"

namespace nibble::checkpoint {
namespace {

using ::nibble::checkpoint::testing::ExpectEquivalent;
using ::nibble::checkpoint::testing::ExpectError;
using ::nibble::checkpoint::testing::Find;
using ::nibble::checkpoint::testing::GIdxTensor;
using ::nibble::checkpoint::testing::GptqTensors;
using ::nibble::checkpoint::testing::kPrefix;
using ::nibble::checkpoint::testing::kShapes;
using ::nibble::checkpoint::testing::MakeFile;
using ::nibble::checkpoint::testing::ProducerWeight;
using ::nibble::checkpoint::testing::RandomProducerWeight;
using ::nibble::checkpoint::testing::Reshape;
using ::nibble::checkpoint::testing::Shape;
using ::nibble::checkpoint::testing::Tensor;

TEST(ConvertGptqTest, V1ZeroPointsAreStoredMinusOne) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    for (const Shape& shape : kShapes) {
      SCOPED_TRACE(absl::StrCat("seed=", seed, " k=", shape.k, " n=", shape.n,
                                " group=", shape.group_size));
      const ProducerWeight w =
          RandomProducerWeight(seed, shape.k, shape.n, shape.group_size, 1, 15);
      const SafetensorsFile file =
          MakeFile(GptqTensors(kPrefix, w, GptqZeroConvention::kV1));
      EXPECT_EQ(DetectLayout(file, kPrefix).value(), CheckpointLayout::kGptq);
      absl::StatusOr<GptqWeight> got = ConvertGptqWeight(file, kPrefix);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->weight.spec, (WeightSpec{WeightFormat::kU4, shape.k,
                                              shape.n, shape.group_size}));
      EXPECT_TRUE(got->activation_order.empty());
      ExpectEquivalent(got->weight, w, {}, seed);
    }
  }
}

TEST(ConvertGptqTest, V2ZeroPointsAreStoredAsTheyAre) {
  for (uint64_t seed = 4; seed <= 6; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed=", seed));
    const ProducerWeight w = RandomProducerWeight(seed, 256, 32, 64, 0, 15);
    const SafetensorsFile file =
        MakeFile(GptqTensors(kPrefix, w, GptqZeroConvention::kV2));
    absl::StatusOr<GptqWeight> got =
        ConvertGptqWeight(file, kPrefix, GptqZeroConvention::kV2);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->weight.spec.format, WeightFormat::kU4);
    ExpectEquivalent(got->weight, w, {}, seed);
  }
}

TEST(ConvertGptqTest, ZeroPointsOfEightGiveU4b8) {
  for (GptqZeroConvention convention :
       {GptqZeroConvention::kV1, GptqZeroConvention::kV2}) {
    constexpr uint64_t kSeed = 7;
    SCOPED_TRACE(absl::StrCat("seed=", kSeed, " v",
                              convention == GptqZeroConvention::kV1 ? 1 : 2));
    const ProducerWeight w = RandomProducerWeight(kSeed, 128, 16, 32, 8, 8);
    const SafetensorsFile file = MakeFile(GptqTensors(kPrefix, w, convention));
    absl::StatusOr<GptqWeight> got =
        ConvertGptqWeight(file, kPrefix, convention);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_EQ(got->weight.spec.format, WeightFormat::kU4b8);
    EXPECT_TRUE(got->weight.zeros.empty());
    ExpectEquivalent(got->weight, w, {}, kSeed);
  }
}

TEST(ConvertGptqTest, TrivialGIdxKeepsTheRows) {
  constexpr uint64_t kSeed = 8;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const ProducerWeight w = RandomProducerWeight(kSeed, 256, 16, 64, 1, 15);
  std::vector<Tensor> tensors =
      GptqTensors(kPrefix, w, GptqZeroConvention::kV1);
  tensors.push_back(GIdxTensor(kPrefix, w));
  absl::StatusOr<GptqWeight> got =
      ConvertGptqWeight(MakeFile(tensors), kPrefix);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(got->activation_order.empty());
  ExpectEquivalent(got->weight, w, {}, kSeed);
}

TEST(ConvertGptqTest, ActOrderMakesGroupsContiguousAndPermutesActivations) {
  for (uint64_t seed = 9; seed <= 11; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed=", seed));
    ProducerWeight w = RandomProducerWeight(seed, 256, 24, 32, 1, 15);
    // As AutoGPTQ with desc_act: the rows, in a random order, fill the
    // groups one after the other.
    std::vector<int64_t> rows(w.k);
    std::iota(rows.begin(), rows.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(rows.begin(), rows.end(), rng);
    for (int64_t i = 0; i < w.k; ++i) w.group_of_row[rows[i]] = i / 32;
    std::vector<Tensor> tensors =
        GptqTensors(kPrefix, w, GptqZeroConvention::kV1);
    tensors.push_back(GIdxTensor(kPrefix, w));
    const SafetensorsFile file = MakeFile(tensors);
    EXPECT_EQ(DetectLayout(file, kPrefix).value(), CheckpointLayout::kGptq);

    absl::StatusOr<GptqWeight> got = ConvertGptqWeight(file, kPrefix);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->activation_order.size(), static_cast<size_t>(w.k));
    for (int64_t r = 0; r < w.k; ++r) {
      EXPECT_EQ(w.group_of_row[got->activation_order[r]], r / 32) << r;
    }
    std::vector<int32_t> sorted = got->activation_order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int32_t> identity(w.k);
    std::iota(identity.begin(), identity.end(), 0);
    EXPECT_EQ(sorted, identity);
    ExpectEquivalent(got->weight, w, got->activation_order, seed);
  }
}

// --- Errors.

std::vector<Tensor> ValidGptq(bool with_g_idx = false) {
  const ProducerWeight w = RandomProducerWeight(20, 128, 16, 32, 1, 15);
  std::vector<Tensor> tensors =
      GptqTensors(kPrefix, w, GptqZeroConvention::kV1);
  if (with_g_idx) tensors.push_back(GIdxTensor(kPrefix, w));
  return tensors;
}

absl::Status GptqError(const std::vector<Tensor>& tensors) {
  const SafetensorsFile file = MakeFile(tensors);
  const absl::Status detected = DetectLayout(file, kPrefix).status();
  const absl::Status converted = ConvertGptqWeight(file, kPrefix).status();
  // Detection checks the same shapes, so it fails the same way, except that
  // it does not read data (g_idx values, zero points, scales).
  if (!detected.ok()) {
    EXPECT_EQ(detected, converted);
  }
  // Checking refuses exactly what converting refuses.
  EXPECT_EQ(CheckLayer(file, kPrefix, CheckpointLayout::kGptq,
                       WeightFormat::kU4b8, 128)
                .status(),
            converted);
  return converted;
}

TEST(ConvertErrorTest, GptqScalesDoNotDivideK) {
  std::vector<Tensor> tensors = ValidGptq();
  Reshape(Find(tensors, "scales"), {3, 16});
  Reshape(Find(tensors, "qzeros"), {3, 2});
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument, "scales",
              "implies K=128");
}

TEST(ConvertErrorTest, GptqQzerosWrongShape) {
  std::vector<Tensor> tensors = ValidGptq();
  Reshape(Find(tensors, "qzeros"), {4, 3});
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument, "qzeros",
              "should be [4, 2]");
}

TEST(ConvertErrorTest, GptqWrongDtypes) {
  for (absl::string_view suffix : {"qweight", "qzeros", "scales", "g_idx"}) {
    SCOPED_TRACE(suffix);
    std::vector<Tensor> tensors = ValidGptq(/*with_g_idx=*/true);
    Tensor& tensor = Find(tensors, suffix);
    tensor.dtype =
        suffix == "scales" ? SafetensorsDtype::kF32 : SafetensorsDtype::kF16;
    Reshape(tensor, tensor.shape);
    ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument, suffix,
                "has dtype");
  }
}

TEST(ConvertErrorTest, GptqGIdxWrongLength) {
  std::vector<Tensor> tensors = ValidGptq(/*with_g_idx=*/true);
  Reshape(Find(tensors, "g_idx"), {127});
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument, "g_idx",
              "should be [128]");
}

TEST(ConvertErrorTest, GptqGIdxOutOfRange) {
  std::vector<Tensor> tensors = ValidGptq(/*with_g_idx=*/true);
  const int32_t four = 4;
  std::memcpy(Find(tensors, "g_idx").bytes.data() + 4 * 9, &four, 4);
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument,
              "g_idx[9]", "outside the 4 groups");
}

TEST(ConvertErrorTest, GptqGIdxGroupsOfUnequalSize) {
  std::vector<Tensor> tensors = ValidGptq(/*with_g_idx=*/true);
  const int32_t one = 1;
  std::memcpy(Find(tensors, "g_idx").bytes.data(), &one, 4);
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument, "g_idx",
              "puts 31 rows in group 0");
}

TEST(ConvertErrorTest, GptqOtherBitWidthsAreUnimplemented) {
  std::vector<Tensor> tensors = ValidGptq();
  // 8-bit: qweight [K/4, N], qzeros [groups, N/4].
  Reshape(Find(tensors, "qweight"), {32, 16});
  Reshape(Find(tensors, "qzeros"), {4, 4});
  ExpectError(GptqError(tensors), absl::StatusCode::kUnimplemented, "qzeros",
              "8 bits each");
}

TEST(ConvertErrorTest, GptqV1ZeroPointSixteen) {
  std::vector<Tensor> tensors = ValidGptq();
  Find(tensors, "qzeros").bytes[5] = '\xf0';  // group 0, column 11
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument, "qzeros",
              "column 11, group 0");
}

TEST(ConvertErrorTest, NonFiniteScale) {
  std::vector<Tensor> tensors = ValidGptq();
  const uint16_t nan = 0x7e00;
  std::memcpy(Find(tensors, "scales").bytes.data() + 2 * 17, &nan, 2);
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument,
              "scales[1, 1]", "NaN");
}

TEST(ConvertErrorTest, UnsupportedGroupSize) {
  std::vector<Tensor> tensors = ValidGptq();
  Reshape(Find(tensors, "scales"), {8, 16});
  Reshape(Find(tensors, "qzeros"), {8, 2});
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument, "scales",
              "group size 16 is not supported");
}

TEST(ConvertErrorTest, MissingScales) {
  std::vector<Tensor> tensors = ValidGptq();
  tensors.erase(tensors.begin() + 2);
  ExpectError(GptqError(tensors), absl::StatusCode::kInvalidArgument, "scales",
              "is missing");
}

}  // namespace
}  // namespace nibble::checkpoint
