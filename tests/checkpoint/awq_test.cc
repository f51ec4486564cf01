// Tests the conversion of AWQ layers (checkpoint/awq.h). The packed inputs
// are written the way AutoAWQ packs them (tests/checkpoint/producer_layers.h),
// from random codes, zero points and scales with fixed seeds, independently
// of the converter; the converted weight must dequantize to exactly the
// values the producer meant, and multiply like them against the float64
// reference. Malformed layers are refused with a message that names the
// tensor.
#include "checkpoint/awq.h"

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/import.h"
#include "checkpoint/safetensors.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/converter_test_util.h"
#include "tests/checkpoint/producer_layers.h"

namespace nibble::checkpoint {
namespace {

using ::nibble::checkpoint::testing::AwqTensors;
using ::nibble::checkpoint::testing::Bytes;
using ::nibble::checkpoint::testing::ExpectEquivalent;
using ::nibble::checkpoint::testing::ExpectError;
using ::nibble::checkpoint::testing::Find;
using ::nibble::checkpoint::testing::kPrefix;
using ::nibble::checkpoint::testing::kShapes;
using ::nibble::checkpoint::testing::MakeFile;
using ::nibble::checkpoint::testing::Name;
using ::nibble::checkpoint::testing::ProducerWeight;
using ::nibble::checkpoint::testing::RandomProducerWeight;
using ::nibble::checkpoint::testing::Reshape;
using ::nibble::checkpoint::testing::Shape;
using ::nibble::checkpoint::testing::Tensor;

TEST(ConvertAwqTest, RepacksInterleavedCodesAndZeros) {
  for (uint64_t seed = 12; seed <= 14; ++seed) {
    for (const Shape& shape : kShapes) {
      SCOPED_TRACE(absl::StrCat("seed=", seed, " k=", shape.k, " n=", shape.n,
                                " group=", shape.group_size));
      const ProducerWeight w =
          RandomProducerWeight(seed, shape.k, shape.n, shape.group_size, 0, 15);
      const SafetensorsFile file = MakeFile(AwqTensors(kPrefix, w));
      EXPECT_EQ(DetectLayout(file, kPrefix).value(), CheckpointLayout::kAwq);
      absl::StatusOr<QuantizedWeight> got = ConvertAwqWeight(file, kPrefix);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->spec, (WeightSpec{WeightFormat::kU4, shape.k, shape.n,
                                       shape.group_size}));
      ExpectEquivalent(*got, w, {}, seed);
    }
  }
}

TEST(ConvertAwqTest, NibbleOrderOfOneWord) {
  // Columns 0..7 hold codes 1..8 and zero points 8..1. AWQ_ORDER puts
  // columns 0, 2, 4, 6, 1, 3, 5, 7 in nibbles 0..7.
  constexpr int64_t kK = 32;
  const std::vector<uint32_t> qweight(kK, 0x86427531u);
  const std::vector<uint32_t> qzeros = {0x13572468u};
  const std::vector<uint16_t> scales(8, FloatToHalf(1.0f));
  const SafetensorsFile file = MakeFile({
      {Name("qweight"), SafetensorsDtype::kU32, {kK, 1}, Bytes(qweight)},
      {Name("qzeros"), SafetensorsDtype::kU32, {1, 1}, Bytes(qzeros)},
      {Name("scales"), SafetensorsDtype::kF16, {1, 8}, Bytes(scales)},
  });
  absl::StatusOr<QuantizedWeight> got = ConvertAwqWeight(file, kPrefix);
  ASSERT_TRUE(got.ok()) << got.status();
  for (int64_t col = 0; col < 8; ++col) {
    EXPECT_EQ(got->Code(kK - 1, col), col + 1) << col;
    EXPECT_EQ(got->Zero(0, col), 8 - col) << col;
  }
}

TEST(ConvertErrorTest, AwqShapeMismatches) {
  const ProducerWeight w = RandomProducerWeight(21, 128, 16, 32, 0, 15);
  {
    std::vector<Tensor> tensors = AwqTensors(kPrefix, w);
    Reshape(Find(tensors, "qzeros"), {4, 1});
    const SafetensorsFile file = MakeFile(tensors);
    ExpectError(ConvertAwqWeight(file, kPrefix).status(),
                absl::StatusCode::kInvalidArgument, "qzeros",
                "should be [4, 2]");
    ExpectError(DetectLayout(file, kPrefix).status(),
                absl::StatusCode::kInvalidArgument, "qzeros",
                "should be [4, 2]");
  }
  {
    std::vector<Tensor> tensors = AwqTensors(kPrefix, w);
    Reshape(Find(tensors, "qweight"), {128, 3});
    const SafetensorsFile file = MakeFile(tensors);
    ExpectError(ConvertAwqWeight(file, kPrefix).status(),
                absl::StatusCode::kInvalidArgument, "qweight",
                "should be [128, 2]");
    ExpectError(DetectLayout(file, kPrefix).status(),
                absl::StatusCode::kInvalidArgument, "qweight",
                "fits neither GPTQ nor AWQ");
  }
}

}  // namespace
}  // namespace nibble::checkpoint
