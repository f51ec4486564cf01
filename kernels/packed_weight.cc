#include "kernels/packed_weight.h"

#include "kernels/dequant.h"
#include "kernels/dtype.h"

namespace nibble {
namespace {

// Copies a [rows, n] row-major array into [panels][rows][kPanelWidth],
// leaving the padding columns of the last panel value-initialized (zero).
template <typename T>
std::vector<T> ToPanels(const std::vector<T>& src, int64_t rows, int64_t n,
                        int64_t panels) {
  constexpr int64_t kWidth = PackedWeight::kPanelWidth;
  std::vector<T> dst(panels * rows * kWidth);
  for (int64_t panel = 0; panel < panels; ++panel) {
    const int64_t first_col = panel * kWidth;
    const int64_t width = std::min(kWidth, n - first_col);
    for (int64_t row = 0; row < rows; ++row) {
      const T* from = &src[row * n + first_col];
      T* to = &dst[(panel * rows + row) * kWidth];
      std::copy(from, from + width, to);
    }
  }
  return dst;
}

// Moves code j of a canonical word (bits 4j..4j+3) to CodeShift(j).
uint32_t ReorderCodes(uint32_t word) {
  uint32_t packed = 0;
  for (int j = 0; j < kCodesPerWord; ++j) {
    packed |= ((word >> (4 * j)) & 0xfu) << PackedWeight::CodeShift(j);
  }
  return packed;
}

// The scale slot as the kernels read it (see the header).
uint16_t KernelScale(WeightFormat format, uint16_t slot) {
  switch (format) {
    case WeightFormat::kMxfp4:
      return E8m0ToBf16(static_cast<uint8_t>(slot));
    case WeightFormat::kNvfp4:
      return FloatToHalf(E4m3ToFloat(static_cast<uint8_t>(slot)));
    default:
      return slot;
  }
}

}  // namespace

absl::StatusOr<PackedWeight> PackedWeight::Pack(
    const QuantizedWeight& canonical) {
  if (absl::Status status = canonical.Validate(); !status.ok()) return status;
  const WeightSpec& spec = canonical.spec;
  PackedWeight packed;
  packed.spec_ = spec;
  packed.panels_ = (spec.n + kPanelWidth - 1) / kPanelWidth;
  packed.codes_ = ToPanels(canonical.qweight, spec.k / kCodesPerWord, spec.n,
                           packed.panels_);
  for (uint32_t& word : packed.codes_) word = ReorderCodes(word);
  // Converted before padding, so that the padding stays scale 0 (E8M0 code 0
  // would become 2^-127).
  std::vector<uint16_t> kernel_scales = canonical.scales;
  for (uint16_t& scale : kernel_scales) scale = KernelScale(spec.format, scale);
  packed.scales_ =
      ToPanels(kernel_scales, spec.groups(), spec.n, packed.panels_);
  if (HasZeros(spec.format)) {
    packed.zeros_ =
        ToPanels(canonical.zeros, spec.groups(), spec.n, packed.panels_);
  }
  return packed;
}

}  // namespace nibble
