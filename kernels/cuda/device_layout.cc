#include "kernels/cuda/device_layout.h"

#include <algorithm>
#include <cmath>

#include "format/dequant.h"
#include "format/dtype.h"

namespace nibble::cuda {
namespace {

constexpr int64_t kBlock = 16;  // rows and columns of one fragment block

// Index of the word holding B row `row` of column block `col_block` for
// `lane`: the row's 16-row block within its 64-row step picks the word.
int64_t WordIndex(int64_t k, int64_t row, int64_t col_block, int lane) {
  return CodeWordIndex(k / kTileK, col_block, row / kTileK, lane,
                       static_cast<int>(row % kTileK / kBlock));
}

FragmentSlot SlotOf(int64_t row, int64_t col) {
  return FragmentSlotOf(static_cast<int>(row % kBlock),
                        static_cast<int>(col % kBlock));
}

int64_t PairIndex(int64_t padded_n, int64_t group, int64_t col) {
  return (group * (padded_n / kBlock) + col / kBlock) * 8 + col % 8;
}

// The largest magnitude among a weight's scales, found by their bits: fp16's
// and E4M3's magnitudes order like their bits without the sign, E8M0's like
// its codes.
float LargestScale(const QuantizedWeight& canonical) {
  const ScaleType type = Traits(canonical.spec.format).scale_type;
  const uint16_t magnitude = type == ScaleType::kFp16   ? 0x7fff
                             : type == ScaleType::kE4m3 ? 0x7f
                                                        : 0xff;
  // Values, not iterators, so that the loop vectorizes: it runs on every
  // upload.
  uint16_t largest = 0;
  for (const uint16_t slot : canonical.scales) {
    largest = std::max<uint16_t>(largest, slot & magnitude);
  }
  return ScaleToFloat(canonical.spec.format, largest);
}

}  // namespace

FragmentSlot FragmentSlotOf(int row, int col) {
  const int t = (row % 8) / 2;
  const int g = col % 8;
  const int low_or_high = row % 2;  // codes i and i + 4
  const int b_register = row / 8;   // b0 or b1 of the n8 tile
  const int n8_tile = col / 8;
  return {g * 4 + t, low_or_high * 4 + n8_tile * 2 + b_register};
}

ScaleConversion MakeScaleConversion(const QuantizedWeight& canonical) {
  const WeightSpec& spec = canonical.spec;
  ScaleConversion conversion;
  conversion.output_scale = spec.global_scale;
  // What the scales are multiplied by (see the header).
  float factor = 1.0f;
  if (HasFp4Codes(spec.format)) {
    const float largest = LargestScale(canonical);
    const int shift = largest > 0.0f ? std::ilogb(largest) - 1 : 0;
    factor = std::ldexp(kFp4Rebias, -shift);
    conversion.output_scale = std::ldexp(spec.global_scale, shift);
  }
  const ScaleType type = Traits(spec.format).scale_type;
  switch (type) {
    case ScaleType::kFp16:
      conversion.half_factor = factor;
      break;
    case ScaleType::kE8m0:
    case ScaleType::kE4m3:
      conversion.by_table = true;
      for (int code = 0; code < 256; ++code) {
        conversion.half_of_code[code] = FloatToHalf(
            ScaleCodeToFloat(type, static_cast<uint8_t>(code)) * factor);
      }
      break;
  }
  return conversion;
}

uint16_t ConvertHalfScale(const ScaleConversion& conversion, uint16_t scale) {
  return FloatToHalf(HalfToFloat(scale) * conversion.half_factor);
}

int64_t PaddedN(int64_t n) { return (n + kTileN - 1) / kTileN * kTileN; }

DeviceLayout MakeDeviceLayout(const QuantizedWeight& canonical) {
  const WeightSpec& spec = canonical.spec;
  DeviceLayout layout;
  layout.padded_n = PaddedN(spec.n);
  layout.codes.assign(layout.padded_n * spec.k / kCodesPerWord, 0);
  for (int64_t row = 0; row < spec.k; ++row) {
    for (int64_t col = 0; col < spec.n; ++col) {
      const FragmentSlot slot = SlotOf(row, col);
      layout.codes[WordIndex(spec.k, row, col / kBlock, slot.lane)] |=
          uint32_t{canonical.Code(row, col)} << (4 * slot.code);
    }
  }
  const ScaleConversion conversion = MakeScaleConversion(canonical);
  layout.output_scale = conversion.output_scale;
  const int64_t pairs = spec.groups() * layout.padded_n / 2;
  layout.scales.assign(pairs, 0);
  if (HasZeros(spec.format)) layout.zeros.assign(pairs, 0);
  for (int64_t group = 0; group < spec.groups(); ++group) {
    for (int64_t col = 0; col < spec.n; ++col) {
      const int shift = col % kBlock >= 8 ? 16 : 0;
      const int64_t row = group * spec.group_size;
      const uint16_t slot = canonical.Scale(row, col);
      const uint16_t half = conversion.by_table
                                ? conversion.half_of_code[slot]
                                : ConvertHalfScale(conversion, slot);
      layout.scales[PairIndex(layout.padded_n, group, col)] |= uint32_t{half}
                                                               << shift;
      if (!layout.zeros.empty()) {
        layout.zeros[PairIndex(layout.padded_n, group, col)] |=
            static_cast<uint16_t>(canonical.Zero(row, col) << (shift / 2));
      }
    }
  }
  return layout;
}

uint8_t CodeAt(const DeviceLayout& layout, int64_t k, int64_t row,
               int64_t col) {
  const FragmentSlot slot = SlotOf(row, col);
  const uint32_t word =
      layout.codes[WordIndex(k, row, col / kBlock, slot.lane)];
  return (word >> (4 * slot.code)) & 0xfu;
}

}  // namespace nibble::cuda
