// The CUDA weight layout, checked on the host: every code and scale lands
// where the kernels' fragments expect it, and every scale, times the layout's
// output scale, keeps its exact value.
#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "format/dequant.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_layout.h"

namespace nibble::cuda {
namespace {

// The B fragment of mma.m16n8k16 by the PTX ISA: lane l's register r holds
// rows 2t + h + 8r of column g, t = l % 4, g = l / 4, h the 16-bit half.
TEST(FragmentSlotTest, MatchesTheMmaBFragmentLayout) {
  for (int lane = 0; lane < 32; ++lane) {
    for (int code = 0; code < 8; ++code) {
      const int half = code / 4;
      const int b_register = code % 2;
      const int n8_tile = (code % 4) / 2;
      const int row = 2 * (lane % 4) + half + 8 * b_register;
      const int col = lane / 4 + 8 * n8_tile;
      const FragmentSlot slot = FragmentSlotOf(row, col);
      EXPECT_EQ(slot.lane, lane) << "row " << row << " col " << col;
      EXPECT_EQ(slot.code, code) << "row " << row << " col " << col;
    }
  }
}

TEST(FragmentSlotTest, EveryBlockPositionHasItsOwnSlot) {
  std::set<std::pair<int, int>> slots;
  for (int row = 0; row < 16; ++row) {
    for (int col = 0; col < 16; ++col) {
      const FragmentSlot slot = FragmentSlotOf(row, col);
      slots.insert({slot.lane, slot.code});
    }
  }
  EXPECT_EQ(slots.size(), 256u);
}

// The kernels read fp4 codes as their values times 2^-14, and the layout's
// scales carry the 2^14 (device_layout.h).
float ScaleTheKernelsRead(WeightFormat format, uint16_t slot) {
  return ScaleToFloat(format, slot) * (HasFp4Codes(format) ? kFp4Rebias : 1);
}

class DeviceLayoutTest : public ::testing::TestWithParam<WeightSpec> {};

TEST_P(DeviceLayoutTest, HoldsEveryCodeScaleAndZeroWhereTheKernelsRead) {
  const WeightSpec& spec = GetParam();
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " ", spec.DebugString()));
  const QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
  const DeviceLayout layout = MakeDeviceLayout(weight);

  ASSERT_EQ(layout.padded_n % kTileN, 0);
  ASSERT_GE(layout.padded_n, spec.n);
  ASSERT_EQ(layout.codes.size(), layout.padded_n * spec.k / 8);
  for (int64_t row = 0; row < spec.k; ++row) {
    for (int64_t col = 0; col < layout.padded_n; ++col) {
      const uint8_t want = col < spec.n ? weight.Code(row, col) : 0;
      ASSERT_EQ(CodeAt(layout, spec.k, row, col), want)
          << "row " << row << " col " << col;
    }
  }
  // Lane l of a warp reads pair (l / 4): columns l / 4 and l / 4 + 8 of its
  // 16-column block.
  const int64_t blocks = layout.padded_n / 16;
  for (int64_t group = 0; group < spec.groups(); ++group) {
    for (int64_t block = 0; block < blocks; ++block) {
      for (int g = 0; g < 8; ++g) {
        const int64_t pair = (group * blocks + block) * 8 + g;
        for (int half = 0; half < 2; ++half) {
          const int64_t col = block * 16 + g + 8 * half;
          const int64_t row = group * spec.group_size;
          const uint16_t scale = layout.scales[pair] >> (16 * half);
          if (col < spec.n) {
            EXPECT_EQ(HalfToFloat(scale) * layout.output_scale,
                      ScaleTheKernelsRead(spec.format, weight.Scale(row, col)) *
                          spec.global_scale)
                << "group " << group << " col " << col;
          } else {
            EXPECT_EQ(scale, 0) << "group " << group << " col " << col;
          }
          if (HasZeros(spec.format)) {
            const uint8_t zero = layout.zeros[pair] >> (8 * half);
            EXPECT_EQ(zero, col < spec.n ? weight.Zero(row, col) : 0)
                << "group " << group << " col " << col;
          }
        }
      }
    }
  }
  EXPECT_EQ(layout.zeros.empty(), !HasZeros(spec.format));
}

// The order device_layout.h gives, [N/256][K/64][16][lane][4], written out
// here rather than through CodeAt: a thread block's share of 64 rows of K
// is one piece, and the kernels' loads and tensor copies assume it.
TEST(DeviceLayoutOrderTest, KeepsASpansBlocksTogetherForEach64RowsOfK) {
  const WeightSpec spec{WeightFormat::kU4b8, 256, 600, 128};
  const uint64_t seed = std::random_device{}();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
  const DeviceLayout layout = MakeDeviceLayout(weight);
  const int64_t k_steps = spec.k / kTileK;
  for (int64_t row = 0; row < spec.k; ++row) {
    for (int64_t col = 0; col < spec.n; ++col) {
      const FragmentSlot slot = FragmentSlotOf(row % 16, col % 16);
      const int64_t word =
          (((col / kTileN * k_steps + row / kTileK) * kSpanBlocks +
            col / 16 % kSpanBlocks) *
               32 +
           slot.lane) *
              4 +
          row % kTileK / 16;
      ASSERT_EQ((layout.codes[word] >> (4 * slot.code)) & 0xfu,
                weight.Code(row, col))
          << "row " << row << " col " << col;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, DeviceLayoutTest,
    ::testing::Values(WeightSpec{WeightFormat::kU4b8, 64, 16, 32},
                      WeightSpec{WeightFormat::kU4, 128, 200, 64},
                      WeightSpec{WeightFormat::kFp4, 256, 130, 128},
                      WeightSpec{WeightFormat::kU4, 192, 8, 192},
                      WeightSpec{WeightFormat::kFp4, 512, 256, 32},
                      WeightSpec{WeightFormat::kMxfp4, 128, 300, 32},
                      WeightSpec{WeightFormat::kNvfp4, 192, 72, 16, 0.0123f},
                      WeightSpec{WeightFormat::kNvfp4, 64, 256, 16, 3.5f}));

// E8M0 codes from `first` to `last`, and the power of two the layout should
// move out of them into its output scale.
struct Mxfp4ScaleRange {
  int first;
  int last;
  int shift;
};

class Mxfp4ScaleShiftTest : public ::testing::TestWithParam<Mxfp4ScaleRange> {};

// fp4 codes as the kernels read them (0.5 to 6 times 2^-14) times every
// fp16 scale must be exact fp16 values: scales in [2^-9, 2^15].
TEST_P(Mxfp4ScaleShiftTest, KeepsEveryFp4ProductExactInHalf) {
  const Mxfp4ScaleRange& range = GetParam();
  const WeightSpec spec{WeightFormat::kMxfp4, 256, 40, 32};
  constexpr uint64_t kSeed = 20261122;
  SCOPED_TRACE(absl::StrCat("codes ", range.first, "..", range.last));
  QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
  std::mt19937_64 rng(kSeed);
  std::uniform_int_distribution<int> code(range.first, range.last);
  for (uint16_t& scale : weight.scales)
    scale = static_cast<uint16_t>(code(rng));
  weight.scales[0] = static_cast<uint16_t>(range.first);
  weight.scales[1] = static_cast<uint16_t>(range.last);
  const DeviceLayout layout = MakeDeviceLayout(weight);

  EXPECT_EQ(layout.output_scale, std::ldexp(1.0f, range.shift));
  const int64_t blocks = layout.padded_n / 16;
  for (int64_t group = 0; group < spec.groups(); ++group) {
    for (int64_t col = 0; col < spec.n; ++col) {
      const int64_t pair = (group * blocks + col / 16) * 8 + col % 8;
      const uint16_t bits = layout.scales[pair] >> (col % 16 >= 8 ? 16 : 0);
      const float scale = HalfToFloat(bits);
      const int64_t row = group * spec.group_size;
      EXPECT_EQ(scale * layout.output_scale,
                ScaleTheKernelsRead(spec.format, weight.Scale(row, col)))
          << "group " << group << " col " << col;
      EXPECT_GE(scale, 0x1p-9f) << "group " << group << " col " << col;
      EXPECT_LE(scale, 0x1p15f) << "group " << group << " col " << col;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ranges, Mxfp4ScaleShiftTest,
    ::testing::Values(Mxfp4ScaleRange{119, 122, -6},  // RandomQuantizedWeight's
                      Mxfp4ScaleRange{98, 122, -6},   // 2^-29 .. 2^-5
                      Mxfp4ScaleRange{0, 20, -108},   // 2^-127 ..
                      Mxfp4ScaleRange{230, 254, 126}  // .. 2^127
                      ));

// Scales more than 2^24 apart cannot all be exact: the largest stay so.
TEST(Mxfp4ScaleShiftTest, KeepsTheLargestExactWhenTheyDoNotAllFit) {
  QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kMxfp4, 64, 16, 32}, 7);
  for (uint16_t& scale : weight.scales) scale = 127;
  weight.scales[0] = 60;   // 2^-67, flushed
  weight.scales[1] = 160;  // 2^33
  const DeviceLayout layout = MakeDeviceLayout(weight);
  EXPECT_EQ(layout.output_scale, 0x1p32f);
  EXPECT_EQ(HalfToFloat(static_cast<uint16_t>(layout.scales[1])), 0x1p15f);
  EXPECT_EQ(HalfToFloat(static_cast<uint16_t>(layout.scales[0])), 0.0f);
}

// fp16 scales of fp4 codes take the same move: the largest lands in
// [2^15, 2^16), whatever its size, and every scale stays exact.
TEST(Fp4HalfScaleTest, MovesTheLargestBelowHalfsLargestValue) {
  for (const float largest : {0x1.8p-17f, 0x1.4p-3f, 5.0f, 60000.0f}) {
    SCOPED_TRACE(absl::StrCat("largest scale ", largest));
    QuantizedWeight weight =
        RandomQuantizedWeight({WeightFormat::kFp4, 64, 16, 32}, 11);
    for (uint16_t& scale : weight.scales) {
      scale = FloatToHalf(largest * 0x1p-6f);
    }
    weight.scales[3] = FloatToHalf(-largest);
    const DeviceLayout layout = MakeDeviceLayout(weight);
    const float stored = HalfToFloat(static_cast<uint16_t>(layout.scales[3]));
    EXPECT_GE(-stored, 0x1p15f);
    EXPECT_LT(-stored, 0x1p16f);
    EXPECT_EQ(stored * layout.output_scale, -largest * kFp4Rebias);
    EXPECT_EQ(HalfToFloat(static_cast<uint16_t>(layout.scales[0])) *
                  layout.output_scale,
              largest * 0x1p-6f * kFp4Rebias);
  }
}

}  // namespace
}  // namespace nibble::cuda
