// Tests the conversion of GPTQ, AWQ and float checkpoint tensors into nibble
// weights. The packed inputs are written the way AutoGPTQ and AutoAWQ pack
// them (tests/checkpoint/producer_layers.h), from random codes, zero points
// and scales, independently of the converter; the converted weight must
// dequantize to exactly the values the producer meant, and multiply like them
// against the float64 reference.
// Float weights are checked against the documented rounding rules, on random
// data and on hand-picked values. Every malformed layer is refused with a
// message that names the tensor.
#include "checkpoint/convert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "format/dequant.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/producer_layers.h"

namespace nibble::checkpoint {
namespace {

using ::nibble::checkpoint::testing::AwqTensors;
using ::nibble::checkpoint::testing::Bytes;
using ::nibble::checkpoint::testing::E4m3Value;
using ::nibble::checkpoint::testing::ExpectDequantizesTo;
using ::nibble::checkpoint::testing::FloatWeightTensor;
using ::nibble::checkpoint::testing::Fp4ProducerWeight;
using ::nibble::checkpoint::testing::GIdxTensor;
using ::nibble::checkpoint::testing::GptqTensors;
using ::nibble::checkpoint::testing::MakeFile;
using ::nibble::checkpoint::testing::Mxfp4Tensors;
using ::nibble::checkpoint::testing::Nvfp4Tensors;
using ::nibble::checkpoint::testing::ProducerWeight;
using ::nibble::checkpoint::testing::RandomFp4ProducerWeight;
using ::nibble::checkpoint::testing::RandomProducerWeight;
using ::nibble::checkpoint::testing::Tensor;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::string_view kPrefix = "model.layers.0.self_attn.q_proj";

std::string Name(absl::string_view suffix) {
  return absl::StrCat(kPrefix, ".", suffix);
}

Tensor& Find(std::vector<Tensor>& tensors, absl::string_view suffix) {
  for (Tensor& tensor : tensors) {
    if (tensor.name == Name(suffix)) return tensor;
  }
  ADD_FAILURE() << "no tensor " << suffix;
  return tensors.front();
}

// Checks that row r of `weight` dequantizes exactly to row order[r] of `want`
// (row r when `order` is empty), and that A' · weight == A · want with
// A'[:, r] = A[:, order[r]].
void ExpectEquivalent(const QuantizedWeight& weight, const ProducerWeight& want,
                      const std::vector<int32_t>& order, uint64_t seed) {
  ASSERT_TRUE(weight.Validate().ok()) << weight.Validate();
  ASSERT_EQ(weight.spec.k, want.k);
  ASSERT_EQ(weight.spec.n, want.n);
  const auto source_row = [&](int64_t r) {
    return order.empty() ? r : order[r];
  };
  const std::vector<double> b = ReferenceDequantize(weight);
  for (int64_t r = 0; r < want.k; ++r) {
    for (int64_t col = 0; col < want.n; ++col) {
      ASSERT_EQ(b[r * want.n + col], want.Dequantized(source_row(r), col))
          << "row " << r << " column " << col;
    }
  }

  constexpr int64_t kM = 3;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> a(kM * want.k);
  for (double& value : a) value = uniform(rng);
  std::vector<double> want_c(kM * want.n, 0.0);
  std::vector<double> permuted_a(kM * want.k);
  for (int64_t m = 0; m < kM; ++m) {
    for (int64_t row = 0; row < want.k; ++row) {
      for (int64_t col = 0; col < want.n; ++col) {
        want_c[m * want.n + col] +=
            a[m * want.k + row] * want.Dequantized(row, col);
      }
      permuted_a[m * want.k + row] = a[m * want.k + source_row(row)];
    }
  }
  EXPECT_LE(MaxRelativeError(ReferenceMatmul(permuted_a, kM, weight), want_c),
            1e-12);
}

struct Shape {
  int64_t k, n, group_size;
};
constexpr Shape kShapes[] = {{256, 64, 32}, {128, 16, 128}, {256, 24, 64}};

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

// --- MXFP4 and NVFP4.

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

// --- Float weights.

// A [N, K] PREFIX.weight of `dtype` holding `values` (rounded to the dtype).
SafetensorsFile FloatFile(SafetensorsDtype dtype, int64_t n, int64_t k,
                          const std::vector<float>& values) {
  return MakeFile({FloatWeightTensor(kPrefix, dtype, n, k, values)});
}

// The values a [N, K] weight holds once stored as `dtype`.
std::vector<float> Stored(SafetensorsDtype dtype, std::vector<float> values) {
  for (float& v : values) {
    if (dtype == SafetensorsDtype::kF16) v = HalfToFloat(FloatToHalf(v));
    if (dtype == SafetensorsDtype::kBF16) v = Bf16ToFloat(FloatToBf16(v));
  }
  return values;
}

TEST(QuantizeFloatTest, RandomWeightsRoundToTheNearestCode) {
  constexpr int64_t kN = 8;
  constexpr int64_t kK = 256;
  for (SafetensorsDtype dtype : {SafetensorsDtype::kF32, SafetensorsDtype::kF16,
                                 SafetensorsDtype::kBF16}) {
    for (WeightFormat format :
         {WeightFormat::kU4b8, WeightFormat::kU4, WeightFormat::kFp4}) {
      for (int64_t group_size : {int64_t{32}, int64_t{128}, kK}) {
        const uint64_t seed = 100 + group_size + static_cast<int>(format);
        SCOPED_TRACE(
            absl::StrCat("seed=", seed, " ", SafetensorsDtypeName(dtype), " ",
                         WeightFormatName(format), " group=", group_size));
        std::mt19937_64 rng(seed);
        std::normal_distribution<float> normal(0.0f, 1.0f);
        std::vector<float> values(kN * kK);
        for (int64_t i = 0; i < kN * kK; ++i) {
          // Magnitudes vary by row, and row 1 is all positive.
          values[i] = normal(rng) * std::ldexp(1.0f, (i / kK) * 2 - 6);
          if (i / kK == 1) values[i] = std::abs(values[i]);
        }
        // One zero group, which must dequantize to exact zeros.
        std::fill_n(values.begin() + 3 * kK, group_size, 0.0f);
        values = Stored(dtype, values);

        absl::StatusOr<QuantizedWeight> got = QuantizeFloatWeight(
            FloatFile(dtype, kN, kK, values), kPrefix, format, group_size);
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_TRUE(got->Validate().ok()) << got->Validate();
        EXPECT_EQ(got->spec, (WeightSpec{format, kK, kN, group_size}));
        const std::vector<double> b = ReferenceDequantize(*got);
        for (int64_t col = 0; col < kN; ++col) {
          for (int64_t row = 0; row < kK; ++row) {
            const double w = values[col * kK + row];
            const double dequantized = b[row * kN + col];
            const double s = HalfToFloat(got->Scale(row, col));
            if (format == WeightFormat::kFp4) {
              // No other code is nearer.
              for (uint8_t code = 0; code < 16; ++code) {
                ASSERT_LE(std::abs(dequantized - w),
                          std::abs(Fp4CodeToFloat(code) * s - w))
                    << "row " << row << " column " << col;
              }
            } else {
              ASSERT_LE(std::abs(dequantized - w), s / 2)
                  << "row " << row << " column " << col;
            }
          }
        }
        for (int64_t row = 0; row < group_size; ++row) {
          EXPECT_EQ(got->Scale(row, 3), 0);
          EXPECT_EQ(b[row * kN + 3], 0.0);
        }
      }
    }
  }
}

// Quantizes one column of K = 32 values into groups of 32 (16 for nvfp4).
QuantizedWeight QuantizeColumn(WeightFormat format, std::vector<float> values) {
  values.resize(32, 0.0f);
  const int64_t group_size =
      FixedGroupSize(format) != 0 ? FixedGroupSize(format) : 32;
  absl::StatusOr<QuantizedWeight> got =
      QuantizeFloatWeight(FloatFile(SafetensorsDtype::kF32, 1, 32, values),
                          kPrefix, format, group_size);
  EXPECT_TRUE(got.ok()) << got.status();
  return *std::move(got);
}

std::vector<int> Codes(const QuantizedWeight& weight, int count) {
  std::vector<int> codes;
  for (int row = 0; row < count; ++row) codes.push_back(weight.Code(row, 0));
  return codes;
}

// The E2M1 code nearest to x in units of the scale, by brute force: no
// other code may be nearer.
void ExpectNearestFp4(double dequantized, double w, double s) {
  for (uint8_t code = 0; code < 16; ++code) {
    ASSERT_LE(std::abs(dequantized - w),
              std::abs(Fp4CodeToFloat(code) * s - w));
  }
}

TEST(QuantizeFloatTest, Mxfp4AndNvfp4ScalesNeverClip) {
  constexpr int64_t kN = 8;
  constexpr int64_t kK = 256;
  for (WeightFormat format : {WeightFormat::kMxfp4, WeightFormat::kNvfp4}) {
    for (SafetensorsDtype dtype :
         {SafetensorsDtype::kF32, SafetensorsDtype::kBF16}) {
      const uint64_t seed = 200 + static_cast<int>(format);
      SCOPED_TRACE(absl::StrCat("seed=", seed, " ", SafetensorsDtypeName(dtype),
                                " ", WeightFormatName(format)));
      const int64_t group_size = FixedGroupSize(format);
      std::mt19937_64 rng(seed);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::vector<float> values(kN * kK);
      for (int64_t i = 0; i < kN * kK; ++i) {
        // Magnitudes vary by row over 2^-30 .. 2^5.
        values[i] = normal(rng) * std::ldexp(1.0f, (i / kK) * 5 - 30);
      }
      std::fill_n(values.begin() + 3 * kK, group_size, 0.0f);  // a zero group
      values = Stored(dtype, values);
      double amax = 0;
      for (float v : values) amax = std::max<double>(amax, std::abs(v));

      absl::StatusOr<QuantizedWeight> got = QuantizeFloatWeight(
          FloatFile(dtype, kN, kK, values), kPrefix, format, group_size);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(got->Validate().ok()) << got->Validate();
      const double g = got->spec.global_scale;
      if (format == WeightFormat::kNvfp4) {
        EXPECT_LE(amax, 6 * 448 * g);
        EXPECT_NEAR(g, amax / (6 * 448), g * 1e-6);
      } else {
        EXPECT_EQ(g, 1.0);
      }
      const std::vector<double> b = ReferenceDequantize(*got);
      for (int64_t col = 0; col < kN; ++col) {
        for (int64_t group = 0; group < kK / group_size; ++group) {
          const int64_t first_row = group * group_size;
          const uint8_t code = got->Scale(first_row, col);
          double absmax = 0;
          for (int64_t row = first_row; row < first_row + group_size; ++row) {
            absmax = std::max<double>(absmax, std::abs(values[col * kK + row]));
          }
          const double s = ScaleToFloat(format, code) * g;
          if (absmax == 0) {
            EXPECT_EQ(code, 0);
          } else if (format == WeightFormat::kMxfp4) {
            // The smallest power of two that holds absmax.
            EXPECT_LE(absmax, 6 * s);
            if (code > 0) {
              EXPECT_GT(absmax, 3 * s);
            }
          } else {
            // E4M3(absmax / 6 / g), or one step up where that would clip.
            const uint8_t rounded = FloatToE4m3(absmax / 6 / g);
            EXPECT_LE(absmax, 6 * s);
            EXPECT_TRUE(
                code == rounded ||
                (code == rounded + 1 && absmax > 6 * E4m3ToFloat(rounded) * g))
                << "column " << col << " group " << group;
          }
          for (int64_t row = first_row; row < first_row + group_size; ++row) {
            ExpectNearestFp4(b[row * kN + col], values[col * kK + row], s);
          }
        }
      }
    }
  }
}

TEST(QuantizeFloatTest, Mxfp4PicksTheSmallestPowerOfTwo) {
  // absmax 6 fits 2^0; 6.5 needs 2^1; 3 fits 2^-1 (3 / 0.5 = 6).
  EXPECT_EQ(QuantizeColumn(WeightFormat::kMxfp4, {6, -1}).Scale(0, 0), 127);
  EXPECT_EQ(QuantizeColumn(WeightFormat::kMxfp4, {-6.5f}).Scale(0, 0), 128);
  const QuantizedWeight got =
      QuantizeColumn(WeightFormat::kMxfp4, {3, 1, -0.3f});
  EXPECT_EQ(got.Scale(0, 0), 126);
  EXPECT_THAT(Codes(got, 3), ::testing::ElementsAre(7, 4, 9));
}

TEST(QuantizeFloatTest, Nvfp4TensorOfZeros) {
  const QuantizedWeight got = QuantizeColumn(WeightFormat::kNvfp4, {});
  EXPECT_EQ(got.spec.global_scale, 1.0f);
  EXPECT_EQ(got.Scale(0, 0), 0);
  EXPECT_EQ(got.Code(3, 0), 0);
}

TEST(QuantizeFloatTest, U4b8RoundsHalfToEven) {
  const QuantizedWeight got = QuantizeColumn(
      WeightFormat::kU4b8, {7, 2.5, 3.5, -2.5, -0.5, 0.5, 1.5, -7, 0});
  EXPECT_EQ(got.Scale(0, 0), FloatToHalf(1.0f));  // 7 / 7
  EXPECT_THAT(Codes(got, 9),
              ::testing::ElementsAre(15, 10, 12, 6, 8, 8, 10, 1, 8));
}

TEST(QuantizeFloatTest, U4UsesARangeThatHoldsZero) {
  QuantizedWeight got =
      QuantizeColumn(WeightFormat::kU4, {10, -5, 2.5, -2.5, 0.5, 0});
  EXPECT_EQ(got.Scale(0, 0), FloatToHalf(1.0f));  // (10 - -5) / 15
  EXPECT_EQ(got.Zero(0, 0), 5);
  EXPECT_THAT(Codes(got, 6), ::testing::ElementsAre(15, 0, 7, 3, 5, 5));

  // All positive: the range is [0, 4], so z = 0.
  got = QuantizeColumn(WeightFormat::kU4, std::vector<float>(32, 4.0f));
  EXPECT_EQ(got.Scale(0, 0), FloatToHalf(4.0f / 15));
  EXPECT_EQ(got.Zero(0, 0), 0);
  EXPECT_EQ(got.Code(0, 0), 15);
}

TEST(QuantizeFloatTest, ScaleStepsUpInsteadOfClamping) {
  // [-7.5, 7.5] / 15 = 1, but then 7.5 and -7.5 both round away from zero
  // (to 8 and -8) and would need 16 codes: s becomes 1 + 2^-10, z 7.
  QuantizedWeight got = QuantizeColumn(WeightFormat::kU4, {7.5, -7.5});
  EXPECT_EQ(got.Scale(0, 0), 0x3c01);
  EXPECT_EQ(got.Zero(0, 0), 7);
  EXPECT_THAT(Codes(got, 2), ::testing::ElementsAre(14, 0));

  // 7.7 * 2^-24 / 7 rounds down to the smallest subnormal fp16, 2^-24, with
  // which 7.7 would round to code 8: s becomes 2^-23.
  got = QuantizeColumn(WeightFormat::kU4b8, {7.7f * 0x1p-24f});
  EXPECT_EQ(got.Scale(0, 0), 0x0002);
  EXPECT_EQ(got.Code(0, 0), 12);

  // absmax / 7 underflows to fp16 zero: s becomes 2^-24.
  got = QuantizeColumn(WeightFormat::kU4b8, {1e-9f, -1e-9f});
  EXPECT_EQ(got.Scale(0, 0), 0x0001);
  EXPECT_THAT(Codes(got, 2), ::testing::ElementsAre(8, 8));

  // 6 (1 + 2^-12) / 6 rounds down to 1, with which it would exceed 6.
  got = QuantizeColumn(WeightFormat::kFp4, {6.0f * (1 + 0x1p-12f)});
  EXPECT_EQ(got.Scale(0, 0), 0x3c01);
  EXPECT_EQ(got.Code(0, 0), 7);
}

TEST(QuantizeFloatTest, Fp4RoundsToTheNearestValueTiesToEvenCode) {
  // E2M1 codes 0..7 are 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 is the sign.
  const QuantizedWeight got =
      QuantizeColumn(WeightFormat::kFp4,
                     {6, 5, 2.5, 0.25, -0.75, 3.5, -6, 0.3, 1.25, -0.1, 0});
  EXPECT_EQ(got.Scale(0, 0), FloatToHalf(1.0f));  // 6 / 6
  EXPECT_THAT(Codes(got, 11),
              ::testing::ElementsAre(7, 6, 4, 0, 10, 6, 15, 1, 2, 0, 0));
}

TEST(QuantizeFloatTest, ZeroGroupsGetScaleZeroAndTheCodeOfZero) {
  for (WeightFormat format :
       {WeightFormat::kU4b8, WeightFormat::kU4, WeightFormat::kFp4}) {
    SCOPED_TRACE(WeightFormatName(format));
    const QuantizedWeight got = QuantizeColumn(format, {});
    EXPECT_EQ(got.Scale(0, 0), 0);
    EXPECT_EQ(got.Code(5, 0), format == WeightFormat::kU4b8 ? 8 : 0);
    if (format == WeightFormat::kU4) {
      EXPECT_EQ(got.Zero(0, 0), 0);
    }
  }
}

// --- Errors.

void ExpectError(const absl::Status& status, absl::StatusCode code,
                 absl::string_view tensor, absl::string_view detail) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(Name(tensor)), HasSubstr(detail)));
}

std::vector<Tensor> ValidGptq(bool with_g_idx = false) {
  const ProducerWeight w = RandomProducerWeight(20, 128, 16, 32, 1, 15);
  std::vector<Tensor> tensors =
      GptqTensors(kPrefix, w, GptqZeroConvention::kV1);
  if (with_g_idx) tensors.push_back(GIdxTensor(kPrefix, w));
  return tensors;
}

// Sets a tensor's shape, resizing its bytes to match.
void Reshape(Tensor& tensor, std::vector<int64_t> shape) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  tensor.shape = std::move(shape);
  tensor.bytes.resize(elements * SafetensorsDtypeBytes(tensor.dtype), '\x11');
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

TEST(ConvertErrorTest, FloatWeightMismatches) {
  const std::vector<float> values(4 * 64, 1.0f);
  {
    SafetensorsFile file = MakeFile(
        {{Name("weight"), SafetensorsDtype::kI32, {4, 64}, Bytes(values)}});
    ExpectError(
        QuantizeFloatWeight(file, kPrefix, WeightFormat::kU4, 32).status(),
        absl::StatusCode::kInvalidArgument, "weight",
        "has dtype I32, expected F16 or BF16 or F32");
    ExpectError(DetectLayout(file, kPrefix).status(),
                absl::StatusCode::kInvalidArgument, "weight", "has dtype I32");
  }
  {
    SafetensorsFile file = MakeFile(
        {{Name("weight"), SafetensorsDtype::kF32, {4, 8, 8}, Bytes(values)}});
    ExpectError(DetectLayout(file, kPrefix).status(),
                absl::StatusCode::kInvalidArgument, "weight",
                "expected 2 dimensions");
  }
  {
    // K = 48 is no multiple of the group size 32.
    SafetensorsFile file =
        FloatFile(SafetensorsDtype::kF32, 4, 48, std::vector<float>(192, 1));
    ExpectError(
        QuantizeFloatWeight(file, kPrefix, WeightFormat::kU4, 32).status(),
        absl::StatusCode::kInvalidArgument, "weight",
        "not a multiple of the group size 32");
  }
  {
    std::vector<float> with_nan = values;
    with_nan[64 + 5] = std::nanf("");
    ExpectError(
        QuantizeFloatWeight(FloatFile(SafetensorsDtype::kF32, 4, 64, with_nan),
                            kPrefix, WeightFormat::kU4b8, 32)
            .status(),
        absl::StatusCode::kInvalidArgument, "weight[1, 5]",
        "only finite weights");
  }
  {
    std::vector<float> huge = values;
    huge[100] = 1e6f;
    ExpectError(
        QuantizeFloatWeight(FloatFile(SafetensorsDtype::kF32, 4, 64, huge),
                            kPrefix, WeightFormat::kU4b8, 32)
            .status(),
        absl::StatusCode::kInvalidArgument, "weight", "beyond fp16's largest");
  }
}

// The code of w in units of s, as the header's rules say, dividing in double.
int ReferenceCode(WeightFormat format, double w, double s, int zero) {
  const double q = w / s;
  if (!HasFp4Codes(format)) return static_cast<int>(std::nearbyint(q)) + zero;
  // Midpoints between E2M1 magnitudes; one counts when |q| equals it if the
  // code above it is even.
  constexpr double kMidpoints[] = {0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5};
  int code = 0;
  for (int c = 1; c <= 7; ++c) {
    const double mid = kMidpoints[c - 1];
    code += std::abs(q) > mid || (std::abs(q) == mid && c % 2 == 0);
  }
  return code | (q < 0 && code != 0 ? 8 : 0);
}

// Values that make quantization hard, for a [N, K] weight of `format` with
// groups of `group_size`: each group's extreme pins its scale s to a random
// value (fp16 or a power of two), and the others lie on, or one float step
// either side of, the midpoints between codes; with zero groups, denormals,
// groups whose rounded scale must step up, and random normals.
std::vector<float> HardValues(WeightFormat format, int64_t n, int64_t k,
                              int64_t group_size, std::mt19937_64& rng) {
  std::vector<float> values(n * k);
  std::uniform_int_distribution<int> exponent(-20, 10);
  std::uniform_int_distribution<int> mantissa(0, 1023);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const bool fp4 = HasFp4Codes(format);
  // Midpoints between neighbouring codes, in units of the scale.
  const std::vector<double> midpoints =
      fp4 ? std::vector<double>{0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5}
          : std::vector<double>{0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5};
  std::uniform_int_distribution<size_t> pick(0, midpoints.size() - 1);
  for (int64_t first = 0; first < n * k; first += group_size) {
    float* group = values.data() + first;
    const int64_t kind = (first / group_size) % 6;
    const double s = std::ldexp(
        format == WeightFormat::kMxfp4 ? 1.0 : 1.0 + mantissa(rng) / 1024.0,
        exponent(rng));
    for (int64_t i = 0; i < group_size; ++i) {
      const float step = (i % 3 == 0) ? 0.0f
                         : (i % 3 == 1)
                             ? std::numeric_limits<float>::infinity()
                             : -std::numeric_limits<float>::infinity();
      const float midpoint =
          static_cast<float>((rng() % 2 ? -1 : 1) * midpoints[pick(rng)] * s);
      switch (kind) {
        case 0:  // midpoints, the largest code pinning s
        case 1:
          group[i] = step == 0 ? midpoint : std::nextafter(midpoint, step);
          break;
        case 2:  // denormals
          group[i] = normal(rng) * std::numeric_limits<float>::denorm_min() *
                     static_cast<float>(1 + rng() % 1000);
          break;
        case 3:  // zeros, and negative zeros
          group[i] = i % 2 ? -0.0f : 0.0f;
          break;
        case 4:  // extremes half a code beyond the largest: s steps up
          group[i] = static_cast<float>((i % 2 ? -7.5 : 7.5) * s);
          break;
        default:
          group[i] = normal(rng) * static_cast<float>(s);
      }
    }
    if (kind < 2) {
      group[0] = static_cast<float>((fp4 ? 6 : 7) * s);
      if (format == WeightFormat::kU4) group[1] = static_cast<float>(-8 * s);
    }
  }
  return values;
}

// The baseline and AVX2 loops give the same weight, and every code is the
// one that dividing in double gives.
TEST(QuantizeFloatTest, Avx2AndBaselineAgreeWithDoubleDivision) {
  constexpr int64_t kN = 40;  // two blocks of 16 columns and a partial one
  constexpr int64_t kK = 128;
  for (WeightFormat format :
       {WeightFormat::kU4b8, WeightFormat::kU4, WeightFormat::kFp4,
        WeightFormat::kMxfp4, WeightFormat::kNvfp4}) {
    for (SafetensorsDtype dtype :
         {SafetensorsDtype::kF32, SafetensorsDtype::kF16,
          SafetensorsDtype::kBF16}) {
      const uint64_t seed = 300 + static_cast<int>(format);
      SCOPED_TRACE(absl::StrCat("seed=", seed, " ", SafetensorsDtypeName(dtype),
                                " ", WeightFormatName(format)));
      const int64_t group_size =
          FixedGroupSize(format) != 0 ? FixedGroupSize(format) : 32;
      std::mt19937_64 rng(seed);
      const std::vector<float> values =
          Stored(dtype, HardValues(format, kN, kK, group_size, rng));
      const SafetensorsFile file = FloatFile(dtype, kN, kK, values);
      AllowFloatQuantizationAvx2ForTesting(false);
      absl::StatusOr<QuantizedWeight> baseline =
          QuantizeFloatWeight(file, kPrefix, format, group_size);
      AllowFloatQuantizationAvx2ForTesting(true);
      absl::StatusOr<QuantizedWeight> got =
          QuantizeFloatWeight(file, kPrefix, format, group_size);
      ASSERT_TRUE(baseline.ok()) << baseline.status();
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(got->spec, baseline->spec);
      EXPECT_EQ(got->qweight, baseline->qweight);
      EXPECT_EQ(got->scales, baseline->scales);
      EXPECT_EQ(got->zeros, baseline->zeros);
      for (int64_t col = 0; col < kN; ++col) {
        for (int64_t row = 0; row < kK; ++row) {
          const double s = ScaleToFloat(format, got->Scale(row, col)) *
                           double{got->spec.global_scale};
          const int zero = format == WeightFormat::kU4     ? got->Zero(row, col)
                           : format == WeightFormat::kU4b8 ? 8
                                                           : 0;
          const int expected =
              s == 0 ? zero
                     : ReferenceCode(format, values[col * kK + row], s, zero);
          ASSERT_EQ(got->Code(row, col), expected)
              << "row " << row << " column " << col << " value "
              << values[col * kK + row] << " scale " << s;
        }
      }
    }
  }
}

// Both loops refuse non-finite values with the same error.
TEST(QuantizeFloatTest, Avx2AndBaselineRefuseNonFiniteValuesAlike) {
  for (SafetensorsDtype dtype :
       {SafetensorsDtype::kF32, SafetensorsDtype::kBF16}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      -std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(absl::StrCat(SafetensorsDtypeName(dtype), " ", bad));
      std::vector<float> values(4 * 64, 0.5f);
      values[2 * 64 + 37] = bad;
      values[3 * 64 + 2] = std::numeric_limits<float>::infinity();
      const SafetensorsFile file = FloatFile(dtype, 4, 64, values);
      AllowFloatQuantizationAvx2ForTesting(false);
      const absl::Status baseline =
          QuantizeFloatWeight(file, kPrefix, WeightFormat::kU4, 32).status();
      AllowFloatQuantizationAvx2ForTesting(true);
      const absl::Status got =
          QuantizeFloatWeight(file, kPrefix, WeightFormat::kU4, 32).status();
      EXPECT_EQ(got, baseline);
      EXPECT_EQ(CheckLayer(file, kPrefix, CheckpointLayout::kFloat,
                           WeightFormat::kU4, 32)
                    .status(),
                got);
      ExpectError(got, absl::StatusCode::kInvalidArgument, "weight[2, 37]",
                  absl::StrCat("is ", bad, ": only finite weights"));
    }
  }
}

// CheckLayer skips the scales of groups too small to overflow fp16; around
// that bound and around fp16's largest it still refuses exactly what
// quantizing refuses.
TEST(CheckLayerTest, RefusesTheFp16ScaleOverflowsQuantizingRefuses) {
  for (WeightFormat format :
       {WeightFormat::kU4b8, WeightFormat::kU4, WeightFormat::kFp4}) {
    const double divisor = format == WeightFormat::kU4     ? 15
                           : format == WeightFormat::kU4b8 ? 7
                                                           : 6;
    for (double ideal_scale :
         {0x1p15, 0x1p15 * (1 + 0x1p-20), 65504.0, 65504.0 * (1 + 0x1p-12),
          65504.0 * (1 + 0x1p-11), 65520.0, 1e6}) {
      SCOPED_TRACE(
          absl::StrCat(WeightFormatName(format), " ideal scale=", ideal_scale));
      std::vector<float> values(2 * 32, 0.25f);
      values[32 + 5] = static_cast<float>(ideal_scale * divisor);
      const SafetensorsFile file =
          FloatFile(SafetensorsDtype::kF32, 2, 32, values);
      const absl::Status quantized =
          QuantizeFloatWeight(file, kPrefix, format, 32).status();
      EXPECT_EQ(CheckLayer(file, kPrefix, CheckpointLayout::kFloat, format, 32)
                    .status(),
                quantized);
      if (ideal_scale >= 65520) {
        EXPECT_THAT(quantized.message(), HasSubstr("beyond fp16's largest"));
      }
    }
  }
}

std::vector<Tensor> ValidMxfp4() {
  return Mxfp4Tensors(kPrefix, {RandomFp4ProducerWeight(50, 4, 64, 32),
                                RandomFp4ProducerWeight(51, 4, 64, 32)});
}

// The tensor named PREFIX_SUFFIX (the MXFP4 convention).
Tensor& FindUnderscored(std::vector<Tensor>& tensors,
                        absl::string_view suffix) {
  for (Tensor& tensor : tensors) {
    if (tensor.name == absl::StrCat(kPrefix, "_", suffix)) return tensor;
  }
  ADD_FAILURE() << "no tensor _" << suffix;
  return tensors.front();
}

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

std::vector<Tensor> ValidNvfp4() {
  return Nvfp4Tensors(kPrefix, RandomFp4ProducerWeight(52, 4, 64, 16));
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

// CheckLayer gives the spec that converting gives, and refuses what it
// refuses, for every layout.
TEST(CheckLayerTest, AgreesWithTheConverters) {
  constexpr uint64_t kSeed = 60;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const auto check = [](const SafetensorsFile& file, CheckpointLayout layout,
                        WeightFormat format = WeightFormat::kU4b8,
                        int64_t group_size = 32, int64_t expert = 0) {
    return CheckLayer(file, kPrefix, layout, format, group_size, expert);
  };
  {
    const SafetensorsFile file = MakeFile(
        AwqTensors(kPrefix, RandomProducerWeight(kSeed, 128, 16, 32, 0, 15)));
    EXPECT_EQ(check(file, CheckpointLayout::kAwq)->spec,
              ConvertAwqWeight(file, kPrefix)->spec);
  }
  {
    const SafetensorsFile file = MakeFile(ValidMxfp4());
    EXPECT_EQ(
        check(file, CheckpointLayout::kMxfp4, WeightFormat::kU4b8, 32, 1)->spec,
        ConvertMxfp4Weight(file, kPrefix, 1)->spec);
    std::vector<Tensor> tensors = ValidMxfp4();
    FindUnderscored(tensors, "scales").bytes[8] = '\xff';
    const SafetensorsFile bad = MakeFile(tensors);
    EXPECT_EQ(check(bad, CheckpointLayout::kMxfp4, WeightFormat::kU4b8, 32, 1)
                  .status(),
              ConvertMxfp4Weight(bad, kPrefix, 1).status());
    EXPECT_TRUE(check(bad, CheckpointLayout::kMxfp4).ok());  // expert 0 is fine
  }
  {
    const SafetensorsFile file = MakeFile(ValidNvfp4());
    EXPECT_EQ(check(file, CheckpointLayout::kNvfp4)->spec,
              ConvertNvfp4Weight(file, kPrefix)->spec);
  }
  std::vector<float> values(4 * 64);
  std::mt19937_64 rng(kSeed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : values) v = normal(rng);
  for (WeightFormat format : kAllWeightFormats) {
    SCOPED_TRACE(WeightFormatName(format));
    const int64_t group_size =
        FixedGroupSize(format) != 0 ? FixedGroupSize(format) : 32;
    const SafetensorsFile file =
        FloatFile(SafetensorsDtype::kBF16, 4, 64, values);
    EXPECT_EQ(check(file, CheckpointLayout::kFloat, format, group_size)->spec,
              QuantizeFloatWeight(file, kPrefix, format, group_size)->spec);
  }
  for (float bad : {std::nanf(""), 1e6f}) {
    std::vector<float> with_bad = values;
    with_bad[100] = bad;
    const SafetensorsFile file =
        FloatFile(SafetensorsDtype::kF32, 4, 64, with_bad);
    const absl::Status status =
        check(file, CheckpointLayout::kFloat, WeightFormat::kU4b8, 32).status();
    EXPECT_FALSE(status.ok());
    EXPECT_EQ(
        status,
        QuantizeFloatWeight(file, kPrefix, WeightFormat::kU4b8, 32).status());
  }
}

TEST(ConvertErrorTest, NoLayerUnderThePrefix) {
  const SafetensorsFile file =
      FloatFile(SafetensorsDtype::kF32, 1, 32, std::vector<float>(32, 1));
  const absl::Status status =
      DetectLayout(file, "model.layers.1.mlp.down_proj").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("model.layers.1.mlp.down_proj.qweight"),
                    HasSubstr("model.layers.1.mlp.down_proj_blocks"),
                    HasSubstr("model.layers.1.mlp.down_proj.weight"),
                    HasSubstr("test.safetensors")));
  EXPECT_EQ(DetectLayout(file, kPrefix).value(), CheckpointLayout::kFloat);
}

}  // namespace
}  // namespace nibble::checkpoint
