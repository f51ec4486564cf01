// The layout the CPU kernels read, made once from the canonical layout when a
// weight is uploaded. Columns are grouped into panels of kPanelWidth, and each
// panel is contiguous, so a kernel streams one panel front to back:
//   codes  [panels][K/8][kPanelWidth] uint32, the canonical words with their
//          codes reordered (CodeShift)
//   scales [panels][K/group][kPanelWidth] fp16 bits, or bf16 bits for E8M0
//          scales (whose range fp16 lacks, PackedScalesAreBf16); E4M3
//          scales become fp16 exactly, and a global scale is left for the
//          kernels to apply
//   zeros  [panels][K/group][kPanelWidth] uint8 (formats with HasZeros only)
// Columns past N in the last panel have code 0 and scale 0, so they add 0.
// A weight with an activation order keeps it beside the panels: the kernels
// read A already gathered by it (GatherActivationColumns).
//
// Example:
//   absl::StatusOr<nibble::PackedWeight> packed =
//       nibble::PackedWeight::Pack(canonical);
//   const uint32_t* words = packed->panel_codes(p);  // row block i at i * 16
#ifndef NIBBLE_KERNELS_PACKED_WEIGHT_H_
#define NIBBLE_KERNELS_PACKED_WEIGHT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/bulk_allocator.h"
#include "format/dtype.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"

namespace nibble {

class PanelCodeWriter;

// Whether a format's packed scales are bf16 bits rather than fp16.
constexpr bool PackedScalesAreBf16(WeightFormat format) {
  return Traits(format).scale_type == ScaleType::kE8m0;
}

class PackedWeight {
 public:
  static constexpr int64_t kPanelWidth = 16;

  // Bit offset of code j (row k = 8 * word + j) in a packed word. Even codes
  // fill the low 16 bits and odd codes the high 16 bits, so one 16-bit shift
  // by 4 * i brings codes 2i and 2i + 1 to the bottom of the two halves: the
  // (k, k + 1) pairs that bf16 tiles take side by side.
  static constexpr int CodeShift(int j) { return (j % 2) * 16 + (j / 2) * 4; }

  // The value of a packed scale, without a global scale.
  static float ScaleValue(WeightFormat format, uint16_t bits) {
    return PackedScalesAreBf16(format) ? Bf16ToFloat(bits) : HalfToFloat(bits);
  }

  // Fails when `canonical` does not pass QuantizedWeight::Validate().
  static absl::StatusOr<PackedWeight> Pack(const QuantizedWeight& canonical);

  // Pack for a weight whose codes `codes` packed as they arrived, and whose
  // other arrays `rest` holds (its qweight is ignored). Fails as Pack does,
  // and when not every byte of the codes arrived.
  static absl::StatusOr<PackedWeight> PackWithCodes(
      PanelCodeWriter codes, const QuantizedWeight& rest);

  // PackWithCodes for a weight (HasColumnLayout) whose 8-bit scale codes come
  // in the column layout (fp4_columns.h), [N][K/group], which go straight
  // into panels. Fails on a NaN scale code, an activation order that is not
  // a permutation of 0..K-1 (empty for none), and when not every byte of the
  // codes arrived.
  static absl::StatusOr<PackedWeight> PackWithColumnScales(
      PanelCodeWriter codes, const uint8_t* scale_codes,
      std::vector<int32_t> activation_order = {});

  // Packs a weight (HasColumnLayout) straight from the column layout its
  // checkpoints store, without a canonical weight, whose transpose would cost
  // as much as packing. Fails as PackWithColumnScales does.
  static absl::StatusOr<PackedWeight> PackColumns(const Fp4Columns& columns);

  // The spec and activation order of `canonical` without panels, for a
  // weight whose every matmul runs on an accelerator: the CPU kernels refuse
  // it (GemmProblem::cpu_panels), and it holds only its activation order
  // resident. Fails as Pack does.
  static absl::StatusOr<PackedWeight> WithoutPanels(
      const QuantizedWeight& canonical);
  // The same for a weight of `spec` whose arrays the accelerator took in
  // another layout. Fails on an invalid spec and an activation order that is
  // not a permutation of 0..K-1 (empty for none).
  static absl::StatusOr<PackedWeight> WithoutPanels(
      const WeightSpec& spec, std::vector<int32_t> activation_order);

  const WeightSpec& spec() const { return spec_; }
  int64_t panels() const { return panels_; }
  // False for WithoutPanels.
  bool has_panels() const { return !codes_.empty(); }
  const uint32_t* panel_codes(int64_t panel) const {
    return codes_.data() + panel * (spec_.k / kCodesPerWord) * kPanelWidth;
  }
  const uint16_t* panel_scales(int64_t panel) const {
    return scales_.data() + panel * spec_.groups() * kPanelWidth;
  }
  // nullptr unless the format has zero points.
  const uint8_t* panel_zeros(int64_t panel) const {
    return zeros_.empty()
               ? nullptr
               : zeros_.data() + panel * spec_.groups() * kPanelWidth;
  }
  // Empty for none; otherwise the permutation of K that A's columns are
  // gathered by before every matmul (QuantizedWeight::activation_order).
  absl::Span<const int32_t> activation_order() const {
    return activation_order_;
  }
  int64_t resident_bytes() const {
    return codes_.size() * sizeof(uint32_t) +
           scales_.size() * sizeof(uint16_t) + zeros_.size() +
           activation_order_.size() * sizeof(int32_t);
  }

 private:
  PackedWeight() = default;
  // OK when `codes` received every byte of the weight's codes.
  static absl::Status CheckAllCodesArrived(const PanelCodeWriter& codes);
  // Sets the spec and packs the scales, zero points and activation order of
  // `weight`, whose codes the caller packs.
  void PackAllButCodes(const QuantizedWeight& weight);

  WeightSpec spec_;
  int64_t panels_ = 0;
  std::vector<uint32_t, BulkAllocator<uint32_t>> codes_;
  std::vector<uint16_t, BulkAllocator<uint16_t>> scales_;
  std::vector<uint8_t, BulkAllocator<uint8_t>> zeros_;
  std::vector<int32_t> activation_order_;
};

// Packs a weight's codes as they arrive, in pieces of any size in order (an
// upload), straight into panels, so that the whole codes are never held in
// another layout: each complete row of canonical words, or each complete
// panel's columns in CodeLayout::kColumns, goes to its panels at once.
//
// Example:
//   nibble::PanelCodeWriter codes(spec, nibble::CodeLayout::kCanonical);
//   codes.Append(first_bytes);
//   codes.Append(more_bytes);  // ... every byte of qweight, in order
//   absl::StatusOr<nibble::PackedWeight> packed =
//       nibble::PackedWeight::PackWithCodes(std::move(codes), scales_only);
class PanelCodeWriter {
 public:
  // Allocates the panels: a weight's whole codes. kColumns only for
  // formats with HasColumnLayout.
  PanelCodeWriter(const WeightSpec& spec, CodeLayout layout);

  // The next bytes of the codes; at most qweight_bytes() in all (bytes past
  // that are counted but not packed, so that PackWithCodes refuses them).
  void Append(absl::string_view bytes);
  int64_t received_bytes() const { return received_; }

 private:
  friend class PackedWeight;
  // A unit is a row of words (kCanonical) or a panel's columns (kColumns).
  int64_t units() const;
  int64_t UnitBytes() const;
  void PackUnit(const uint8_t* unit);

  WeightSpec spec_;
  CodeLayout layout_;
  int64_t panels_ = 0;
  std::vector<uint32_t, BulkAllocator<uint32_t>> codes_;
  // The start of a unit that a piece ended in.
  std::string partial_unit_;
  int64_t units_done_ = 0;
  int64_t received_ = 0;
};

}  // namespace nibble

#endif  // NIBBLE_KERNELS_PACKED_WEIGHT_H_
