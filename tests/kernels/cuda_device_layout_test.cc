// The CUDA weight layout, checked on the host: every code and scale lands
// where the kernels' fragments expect it.
#include <cstdint>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_layout.h"
#include "kernels/weight_format.h"

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
          EXPECT_EQ(scale, col < spec.n ? weight.Scale(row, col) : 0)
              << "group " << group << " col " << col;
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

INSTANTIATE_TEST_SUITE_P(
    Shapes, DeviceLayoutTest,
    ::testing::Values(WeightSpec{WeightFormat::kU4b8, 64, 16, 32},
                      WeightSpec{WeightFormat::kU4, 128, 200, 64},
                      WeightSpec{WeightFormat::kFp4, 256, 130, 128},
                      WeightSpec{WeightFormat::kU4, 192, 8, 192},
                      WeightSpec{WeightFormat::kFp4, 512, 256, 32}));

}  // namespace
}  // namespace nibble::cuda
