#include "kernels/packed_weight.h"

#include <algorithm>
#include <array>
#include <cstdint>

#include "kernels/dequant.h"
#include "kernels/dtype.h"

namespace nibble {
namespace {

// Writes a [rows, n] row-major array as [panels][rows][kPanelWidth], each
// value through `convert`, in one pass; the padding columns of the last
// panel are 0 (not convert(0): E8M0 code 0 would become 2^-127). Goes
// through the rows a few at a time, every panel for each few, so that both
// arrays are walked in long runs.
template <typename T, typename Convert>
void ToPanels(const T* __restrict src, int64_t rows, int64_t n, Convert convert,
              T* __restrict dst) {
  constexpr int64_t kWidth = PackedWeight::kPanelWidth;
  constexpr int64_t kRowsAtOnce = 16;
  for (int64_t first_row = 0; first_row < rows; first_row += kRowsAtOnce) {
    const int64_t end_row = std::min(rows, first_row + kRowsAtOnce);
    for (int64_t first_col = 0; first_col < n; first_col += kWidth) {
      const int64_t width = std::min(kWidth, n - first_col);
      T* to = dst + (first_col / kWidth * rows + first_row) * kWidth;
      for (int64_t row = first_row; row < end_row; ++row, to += kWidth) {
        const T* from = src + row * n + first_col;
        if (width == kWidth) {
          for (int64_t col = 0; col < kWidth; ++col)
            to[col] = convert(from[col]);
        } else {
          for (int64_t col = 0; col < width; ++col)
            to[col] = convert(from[col]);
          std::fill(to + width, to + kWidth, T{0});
        }
      }
    }
  }
}

// Moves code j of a canonical word (bits 4j..4j+3) to CodeShift(j): even
// codes to the low half, odd ones to the high half, by two swaps (nibbles
// 1 and 2 of each half, then bytes 1 and 2).
uint32_t ReorderCodes(uint32_t word) {
  uint32_t swap = (word ^ (word >> 4)) & 0x00f000f0u;
  word ^= swap ^ (swap << 4);
  swap = (word ^ (word >> 8)) & 0x0000ff00u;
  return word ^ swap ^ (swap << 8);
}

// The scale slot as the kernels read it (see the header) for every 8-bit
// scale code of kMxfp4 or kNvfp4.
std::array<uint16_t, 256> KernelScaleTable(WeightFormat format) {
  std::array<uint16_t, 256> table;
  for (int code = 0; code < 256; ++code) {
    const auto byte = static_cast<uint8_t>(code);
    table[code] = format == WeightFormat::kMxfp4
                      ? E8m0ToBf16(byte)
                      : FloatToHalf(E4m3ToFloat(byte));
  }
  return table;
}

}  // namespace

absl::StatusOr<PackedWeight> PackedWeight::Pack(
    const QuantizedWeight& canonical) {
  if (absl::Status status = canonical.Validate(); !status.ok()) return status;
  const WeightSpec& spec = canonical.spec;
  PackedWeight packed;
  packed.spec_ = spec;
  packed.panels_ = (spec.n + kPanelWidth - 1) / kPanelWidth;
  const int64_t words = spec.k / kCodesPerWord;
  const int64_t panel_columns = packed.panels_ * kPanelWidth;
  packed.codes_.resize(words * panel_columns);
  ToPanels(
      canonical.qweight.data(), words, spec.n,
      [](uint32_t word) { return ReorderCodes(word); }, packed.codes_.data());
  packed.scales_.resize(spec.groups() * panel_columns);
  if (spec.format == WeightFormat::kMxfp4 ||
      spec.format == WeightFormat::kNvfp4) {
    // A scale per 16 or 32 weights: converting each by arithmetic would take
    // longer than packing the codes.
    const std::array<uint16_t, 256> kernel_scales =
        KernelScaleTable(spec.format);
    ToPanels(
        canonical.scales.data(), spec.groups(), spec.n,
        [&kernel_scales](uint16_t slot) { return kernel_scales[slot & 0xff]; },
        packed.scales_.data());
  } else {
    ToPanels(
        canonical.scales.data(), spec.groups(), spec.n,
        [](uint16_t slot) { return slot; }, packed.scales_.data());
  }
  if (HasZeros(spec.format)) {
    packed.zeros_.resize(spec.groups() * panel_columns);
    ToPanels(
        canonical.zeros.data(), spec.groups(), spec.n,
        [](uint8_t zero) { return zero; }, packed.zeros_.data());
  }
  packed.activation_order_ = canonical.activation_order;
  return packed;
}

}  // namespace nibble
