// Tests the quantization of float layers (checkpoint/float_quantizer.h)
// against the documented rounding rules, on random data with fixed seeds and
// on hand-picked values; against a reference that divides in float64, with
// the ISA capped to scalar (NIBBLE_ISA) and as detected, which must give the
// same weight; and the refusal of malformed layers, with a message that
// names the tensor.
#include "checkpoint/float_quantizer.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/import.h"
#include "checkpoint/safetensors.h"
#include "format/dequant.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "tests/checkpoint/converter_test_util.h"
#include "tests/checkpoint/producer_layers.h"

namespace nibble::checkpoint {
namespace {

using ::nibble::checkpoint::testing::Bytes;
using ::nibble::checkpoint::testing::ExpectError;
using ::nibble::checkpoint::testing::FloatFile;
using ::nibble::checkpoint::testing::kPrefix;
using ::nibble::checkpoint::testing::MakeFile;
using ::nibble::checkpoint::testing::Name;
using ::testing::HasSubstr;

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

// Sets NIBBLE_ISA, which caps cpu::DetectIsa() and so the quantizer's loops,
// for the scope (unsets it for nullptr, leaving the CPU's own ISA), and
// restores it after, as tests/kernels/cpu_kernels_test.cc does.
class ScopedNibbleIsa {
 public:
  explicit ScopedNibbleIsa(const char* isa) {
    if (const char* original = std::getenv("NIBBLE_ISA")) saved_ = original;
    EXPECT_EQ(isa != nullptr ? setenv("NIBBLE_ISA", isa, /*overwrite=*/1)
                             : unsetenv("NIBBLE_ISA"),
              0);
  }
  ~ScopedNibbleIsa() {
    EXPECT_EQ(saved_.has_value()
                  ? setenv("NIBBLE_ISA", saved_->c_str(), /*overwrite=*/1)
                  : unsetenv("NIBBLE_ISA"),
              0);
  }

 private:
  std::optional<std::string> saved_;
};

// The scalar loops (NIBBLE_ISA=scalar) and those of the detected ISA (AVX2
// where the CPU has it) give the same weight, and every code is the one that
// dividing in double gives.
TEST(QuantizeFloatTest, ScalarAndDetectedIsaAgreeWithDoubleDivision) {
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
      absl::StatusOr<QuantizedWeight> baseline;
      {
        const ScopedNibbleIsa scalar("scalar");
        baseline = QuantizeFloatWeight(file, kPrefix, format, group_size);
      }
      const ScopedNibbleIsa detected(nullptr);
      SCOPED_TRACE(
          absl::StrCat("detected ISA ", cpu::IsaName(cpu::DetectIsa())));
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

// The scalar loops and those of the detected ISA refuse non-finite values
// with the same error.
TEST(QuantizeFloatTest, ScalarAndDetectedIsaRefuseNonFiniteValuesAlike) {
  for (SafetensorsDtype dtype :
       {SafetensorsDtype::kF32, SafetensorsDtype::kBF16}) {
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      -std::numeric_limits<float>::infinity()}) {
      SCOPED_TRACE(absl::StrCat(SafetensorsDtypeName(dtype), " ", bad));
      std::vector<float> values(4 * 64, 0.5f);
      values[2 * 64 + 37] = bad;
      values[3 * 64 + 2] = std::numeric_limits<float>::infinity();
      const SafetensorsFile file = FloatFile(dtype, 4, 64, values);
      absl::Status baseline;
      {
        const ScopedNibbleIsa scalar("scalar");
        baseline =
            QuantizeFloatWeight(file, kPrefix, WeightFormat::kU4, 32).status();
      }
      const ScopedNibbleIsa detected(nullptr);
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

}  // namespace
}  // namespace nibble::checkpoint
