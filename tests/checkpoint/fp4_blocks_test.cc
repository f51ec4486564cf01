// Tests the conversion of FP4 block layers (checkpoint/fp4_blocks.h): MXFP4
// written as gpt-oss stores it and NVFP4 as ModelOpt exports it
// (tests/checkpoint/producer_layers.h), from random codes and scales with
// fixed seeds and from extreme ones; the converted weight must dequantize
// exactly to the producer's. Every malformed layer is refused with a message
// that names the tensor, by DetectLayout (checkpoint/import.h) too where the
// shapes are at fault.
#include "checkpoint/fp4_blocks.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/import.h"
#include "checkpoint/safetensors.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/converter_test_util.h"
#include "tests/checkpoint/producer_layers.h"

namespace nibble::checkpoint {
namespace {

using ::nibble::checkpoint::testing::Bytes;
using ::nibble::checkpoint::testing::E4m3Value;
using ::nibble::checkpoint::testing::ExpectDequantizesTo;
using ::nibble::checkpoint::testing::ExpectError;
using ::nibble::checkpoint::testing::Find;
using ::nibble::checkpoint::testing::FindUnderscored;
using ::nibble::checkpoint::testing::Fp4ProducerWeight;
using ::nibble::checkpoint::testing::kPrefix;
using ::nibble::checkpoint::testing::MakeFile;
using ::nibble::checkpoint::testing::Mxfp4Tensors;
using ::nibble::checkpoint::testing::Name;
using ::nibble::checkpoint::testing::Nvfp4Tensors;
using ::nibble::checkpoint::testing::RandomFp4ProducerWeight;
using ::nibble::checkpoint::testing::Reshape;
using ::nibble::checkpoint::testing::Tensor;
using ::nibble::checkpoint::testing::ValidMxfp4;
using ::nibble::checkpoint::testing::ValidNvfp4;
using ::testing::AllOf;
using ::testing::HasSubstr;

struct Fp4Shape {
  int64_t n, k;
};
// Columns in 4- and 8-column transposes only (8, 24, 40), with a 3-column
// tail (19), and a tail alone (3); K = 512 gives whole 8-group transposes of
// the scales for both formats.
constexpr Fp4Shape kFp4Shapes[] = {
    {8, 64}, {24, 128}, {19, 160}, {3, 96}, {40, 512}};

TEST(ConvertMxfp4Test, CopiesCodesAndExponentsOfEveryExpert) {
  for (uint64_t seed = 30; seed <= 32; ++seed) {
    for (const Fp4Shape& shape : kFp4Shapes) {
      SCOPED_TRACE(absl::StrCat("seed=", seed, " n=", shape.n, " k=", shape.k));
      std::vector<Fp4ProducerWeight> experts;
      for (int e = 0; e < 3; ++e) {
        experts.push_back(
            RandomFp4ProducerWeight(seed * 10 + e, shape.n, shape.k, 32));
      }
      const SafetensorsFile file = MakeFile(Mxfp4Tensors(kPrefix, experts));
      EXPECT_EQ(DetectLayout(file, kPrefix).value(), CheckpointLayout::kMxfp4);
      EXPECT_THAT(Mxfp4ExpertDims(file, kPrefix).value(),
                  ::testing::ElementsAre(3));
      for (int e = 0; e < 3; ++e) {
        absl::StatusOr<QuantizedWeight> got =
            ConvertMxfp4Weight(file, kPrefix, e);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(got->spec,
                  (WeightSpec{WeightFormat::kMxfp4, shape.k, shape.n, 32}));
        ExpectDequantizesTo(*got, experts[e]);
      }
    }
  }
}

TEST(ConvertMxfp4Test, ReadsTheOriginalCheckpointsDottedNames) {
  constexpr uint64_t kSeed = 33;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const Fp4ProducerWeight w = RandomFp4ProducerWeight(kSeed, 16, 64, 32);
  const SafetensorsFile file =
      MakeFile(Mxfp4Tensors(kPrefix, {w}, ".", /*stacked=*/false));
  EXPECT_EQ(DetectLayout(file, kPrefix).value(), CheckpointLayout::kMxfp4);
  EXPECT_TRUE(Mxfp4ExpertDims(file, kPrefix).value().empty());
  absl::StatusOr<QuantizedWeight> got = ConvertMxfp4Weight(file, kPrefix);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectDequantizesTo(*got, w);
}

TEST(ConvertMxfp4Test, ExtremeExponents) {
  // E8M0 codes 0 (2^-127) and 250 (2^123; 6 * 2^127 would overflow the
  // fp32 that the reference dequantizes in), and every FP4 code.
  Fp4ProducerWeight w{1, 64, 32, {}, {0, 250}, 1.0f};
  for (int i = 0; i < 64; ++i) w.codes.push_back(i % 16);
  const SafetensorsFile file =
      MakeFile(Mxfp4Tensors(kPrefix, {w}, "_", /*stacked=*/false));
  absl::StatusOr<QuantizedWeight> got = ConvertMxfp4Weight(file, kPrefix);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectDequantizesTo(*got, w);
  EXPECT_EQ(ReferenceDequantize(*got)[7], 6 * std::ldexp(1.0, -127));
  EXPECT_EQ(ReferenceDequantize(*got)[32 + 15], -6 * std::ldexp(1.0, 123));
}

TEST(ConvertNvfp4Test, CopiesCodesScalesAndTheGlobalScale) {
  for (uint64_t seed = 40; seed <= 42; ++seed) {
    for (const Fp4Shape& shape : kFp4Shapes) {
      SCOPED_TRACE(absl::StrCat("seed=", seed, " n=", shape.n, " k=", shape.k));
      const Fp4ProducerWeight w =
          RandomFp4ProducerWeight(seed, shape.n, shape.k, 16);
      const SafetensorsFile file = MakeFile(Nvfp4Tensors(kPrefix, w));
      EXPECT_EQ(DetectLayout(file, kPrefix).value(), CheckpointLayout::kNvfp4);
      absl::StatusOr<QuantizedWeight> got = ConvertNvfp4Weight(file, kPrefix);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->spec, (WeightSpec{WeightFormat::kNvfp4, shape.k, shape.n,
                                       16, w.global_scale}));
      ExpectDequantizesTo(*got, w);
    }
  }
}

TEST(ConvertNvfp4Test, SubnormalAndLargestScales) {
  // E4M3 0x01 (2^-9), 0x07 (7 * 2^-9), 0x08 (2^-6) and 0x7e (448).
  Fp4ProducerWeight w{1, 64, 16, {}, {0x01, 0x07, 0x08, 0x7e}, 0.25f};
  for (int i = 0; i < 64; ++i) w.codes.push_back((i * 7) % 16);
  std::vector<Tensor> tensors = Nvfp4Tensors(kPrefix, w);
  Find(tensors, "weight_scale_2").shape = {1};  // some exports write [1]
  absl::StatusOr<QuantizedWeight> got =
      ConvertNvfp4Weight(MakeFile(tensors), kPrefix);
  ASSERT_TRUE(got.ok()) << got.status();
  ExpectDequantizesTo(*got, w);
  EXPECT_EQ(E4m3Value(0x7e), 448);
  EXPECT_EQ(E4m3Value(0x07), 7 * std::ldexp(1.0, -9));
}

// --- Errors.

// ConvertMxfp4Weight refuses, naming `tensor`, and so does DetectLayout
// when the mismatch is in the shapes (it reads no data).
void ExpectMxfp4Error(const std::vector<Tensor>& tensors,
                      absl::string_view tensor, absl::string_view detail,
                      bool detected_too = true) {
  const SafetensorsFile file = MakeFile(tensors);
  std::vector<absl::Status> statuses = {
      ConvertMxfp4Weight(file, kPrefix, 1).status()};
  if (detected_too) statuses.push_back(DetectLayout(file, kPrefix).status());
  for (const absl::Status& status : statuses) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_THAT(
        status.message(),
        AllOf(HasSubstr(absl::StrCat(kPrefix, tensor)), HasSubstr(detail)));
  }
}

TEST(ConvertErrorTest, Mxfp4Mismatches) {
  {
    std::vector<Tensor> tensors = ValidMxfp4();
    tensors.pop_back();
    ExpectMxfp4Error(tensors, "_scales", "is missing");
  }
  {
    std::vector<Tensor> tensors = ValidMxfp4();
    FindUnderscored(tensors, "blocks").dtype = SafetensorsDtype::kI8;
    ExpectMxfp4Error(tensors, "_blocks", "has dtype I8, expected U8");
  }
  {
    std::vector<Tensor> tensors = ValidMxfp4();
    Reshape(FindUnderscored(tensors, "blocks"), {2, 4, 4, 8});
    ExpectMxfp4Error(tensors, "_blocks", "should be [..., N, K/32, 16]");
  }
  {
    std::vector<Tensor> tensors = ValidMxfp4();
    Reshape(FindUnderscored(tensors, "scales"), {2, 4, 3});
    ExpectMxfp4Error(tensors, "_scales", "should be [2, 4, 2]");
  }
  {
    // Expert 1, row 3, group 1 is 0xff, which E8M0 reserves for NaN.
    std::vector<Tensor> tensors = ValidMxfp4();
    FindUnderscored(tensors, "scales").bytes[8 + 3 * 2 + 1] = '\xff';
    ExpectMxfp4Error(tensors, "_scales[1, 3, 1]", "is NaN",
                     /*detected_too=*/false);
  }
  {
    const SafetensorsFile file = MakeFile(ValidMxfp4());
    const absl::Status status = ConvertMxfp4Weight(file, kPrefix, 2).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr("holds 2 weights"));
  }
}

void ExpectNvfp4Error(const std::vector<Tensor>& tensors,
                      absl::string_view tensor, absl::string_view detail) {
  const SafetensorsFile file = MakeFile(tensors);
  ExpectError(ConvertNvfp4Weight(file, kPrefix).status(),
              absl::StatusCode::kInvalidArgument, tensor, detail);
  // Detection reads the global scale but not the scales.
  if (!absl::StrContains(tensor, "[")) {
    ExpectError(DetectLayout(file, kPrefix).status(),
                absl::StatusCode::kInvalidArgument, tensor, detail);
  }
}

TEST(ConvertErrorTest, Nvfp4Mismatches) {
  for (absl::string_view missing : {"weight_scale", "weight_scale_2"}) {
    std::vector<Tensor> tensors = ValidNvfp4();
    std::erase_if(tensors,
                  [&](const Tensor& t) { return t.name == Name(missing); });
    ExpectNvfp4Error(tensors, missing, "is missing");
  }
  {
    std::vector<Tensor> tensors = ValidNvfp4();
    Tensor& scale = Find(tensors, "weight_scale");
    scale.dtype = SafetensorsDtype::kF16;
    Reshape(scale, scale.shape);
    ExpectNvfp4Error(tensors, "weight_scale",
                     "has dtype F16, expected F8_E4M3");
  }
  {
    std::vector<Tensor> tensors = ValidNvfp4();
    Reshape(Find(tensors, "weight_scale"), {4, 2});
    ExpectNvfp4Error(tensors, "weight_scale", "should be [4, 4]");
  }
  {
    // 12 bytes a row: K = 24 codes, not a multiple of 16.
    std::vector<Tensor> tensors = ValidNvfp4();
    Reshape(Find(tensors, "weight"), {4, 12});
    ExpectNvfp4Error(tensors, "weight", "K=24 codes per row, not a multiple");
  }
  {
    std::vector<Tensor> tensors = ValidNvfp4();
    Find(tensors, "weight_scale").bytes[2 * 4 + 3] = '\x7f';
    ExpectNvfp4Error(tensors, "weight_scale[2, 3]", "is NaN");
  }
  for (float global_scale : {0.0f, -1.0f, std::nanf("")}) {
    std::vector<Tensor> tensors = ValidNvfp4();
    Find(tensors, "weight_scale_2").bytes = Bytes(std::vector{global_scale});
    ExpectNvfp4Error(tensors, "weight_scale_2", "must be finite and positive");
  }
  {
    std::vector<Tensor> tensors = ValidNvfp4();
    Reshape(Find(tensors, "weight_scale_2"), {2});
    ExpectNvfp4Error(tensors, "weight_scale_2", "single fp32 value");
  }
}

}  // namespace
}  // namespace nibble::checkpoint
