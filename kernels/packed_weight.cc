#include "kernels/packed_weight.h"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

// Writes one panel [rows][kPanelWidth] from `width` columns of `rows` values
// each, value (lane, row) from load(lane, row); the padding lanes are 0.
// Takes 16 rows of every lane at once: a 64-byte line of each code column.
template <typename T, typename Load>
void ColumnsToPanel(Load load, int64_t rows, int64_t width,
                    T* __restrict panel) {
  constexpr int64_t kWidth = PackedWeight::kPanelWidth;
  constexpr int64_t kRowsAtOnce = 16;
  for (int64_t first_row = 0; first_row < rows; first_row += kRowsAtOnce) {
    const int64_t end_row = std::min(rows, first_row + kRowsAtOnce);
    for (int64_t lane = 0; lane < kWidth; ++lane) {
      for (int64_t row = first_row; row < end_row; ++row) {
        panel[row * kWidth + lane] = lane < width ? load(lane, row) : T{0};
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

void PackedWeight::PackAllButCodes(const QuantizedWeight& weight) {
  const WeightSpec& spec = weight.spec;
  spec_ = spec;
  panels_ = (spec.n + kPanelWidth - 1) / kPanelWidth;
  const int64_t panel_columns = panels_ * kPanelWidth;
  scales_.resize(spec.groups() * panel_columns);
  if (spec.format == WeightFormat::kMxfp4 ||
      spec.format == WeightFormat::kNvfp4) {
    // A scale per 16 or 32 weights: converting each by arithmetic would take
    // longer than packing the codes.
    const std::array<uint16_t, 256> kernel_scales =
        KernelScaleTable(spec.format);
    ToPanels(
        weight.scales.data(), spec.groups(), spec.n,
        [&kernel_scales](uint16_t slot) { return kernel_scales[slot & 0xff]; },
        scales_.data());
  } else {
    ToPanels(
        weight.scales.data(), spec.groups(), spec.n,
        [](uint16_t slot) { return slot; }, scales_.data());
  }
  if (HasZeros(spec.format)) {
    zeros_.resize(spec.groups() * panel_columns);
    ToPanels(
        weight.zeros.data(), spec.groups(), spec.n,
        [](uint8_t zero) { return zero; }, zeros_.data());
  }
  activation_order_ = weight.activation_order;
}

absl::StatusOr<PackedWeight> PackedWeight::Pack(
    const QuantizedWeight& canonical) {
  if (absl::Status status = canonical.Validate(); !status.ok()) return status;
  const WeightSpec& spec = canonical.spec;
  PackedWeight packed;
  packed.PackAllButCodes(canonical);
  const int64_t words = spec.k / kCodesPerWord;
  packed.codes_.resize(words * packed.panels_ * kPanelWidth);
  ToPanels(
      canonical.qweight.data(), words, spec.n,
      [](uint32_t word) { return ReorderCodes(word); }, packed.codes_.data());
  return packed;
}

absl::StatusOr<PackedWeight> PackedWeight::PackWithCodes(
    PanelCodeWriter codes, const QuantizedWeight& rest) {
  if (absl::Status status = rest.ValidateAllButCodes(); !status.ok()) {
    return status;
  }
  if (!(codes.spec_ == rest.spec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the codes were packed for ", codes.spec_.DebugString(),
                     ", not ", rest.spec.DebugString()));
  }
  if (codes.received_ != rest.spec.qweight_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("qweight has ", codes.received_,
                     " bytes, the shape needs ", rest.spec.qweight_bytes()));
  }
  PackedWeight packed;
  packed.PackAllButCodes(rest);
  packed.codes_ = std::move(codes.codes_);
  return packed;
}

PanelCodeWriter::PanelCodeWriter(const WeightSpec& spec)
    : spec_(spec),
      panels_((spec.n + PackedWeight::kPanelWidth - 1) /
              PackedWeight::kPanelWidth) {
  codes_.resize(spec.k / kCodesPerWord * panels_ * PackedWeight::kPanelWidth);
}

void PanelCodeWriter::Append(absl::string_view bytes) {
  const auto row_bytes = static_cast<size_t>(spec_.n) * sizeof(uint32_t);
  received_ += static_cast<int64_t>(bytes.size());
  if (!partial_row_.empty()) {
    const size_t taken =
        std::min(bytes.size(), row_bytes - partial_row_.size());
    partial_row_.append(bytes.data(), taken);
    bytes.remove_prefix(taken);
    if (partial_row_.size() < row_bytes) return;
    PackRow(reinterpret_cast<const uint8_t*>(partial_row_.data()));
    partial_row_.clear();
  }
  for (; bytes.size() >= row_bytes; bytes.remove_prefix(row_bytes)) {
    PackRow(reinterpret_cast<const uint8_t*>(bytes.data()));
  }
  partial_row_.assign(bytes.data(), bytes.size());
}

void PanelCodeWriter::PackRow(const uint8_t* row) {
  constexpr int64_t kWidth = PackedWeight::kPanelWidth;
  const int64_t words = spec_.k / kCodesPerWord;
  for (int64_t panel = 0; panel < panels_; ++panel) {
    uint32_t* to = codes_.data() + (panel * words + rows_done_) * kWidth;
    const int64_t width = std::min(kWidth, spec_.n - panel * kWidth);
    for (int64_t lane = 0; lane < kWidth; ++lane) {
      uint32_t word = 0;
      if (lane < width) {
        std::memcpy(&word, row + (panel * kWidth + lane) * sizeof(uint32_t),
                    sizeof(word));
      }
      to[lane] = ReorderCodes(word);
    }
  }
  ++rows_done_;
}

absl::StatusOr<PackedWeight> PackedWeight::PackColumns(
    const WeightSpec& spec, const uint8_t* codes, const uint8_t* scale_codes) {
  if (spec.format != WeightFormat::kMxfp4 &&
      spec.format != WeightFormat::kNvfp4) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackColumns takes mxfp4 or nvfp4 weights, not ",
                     WeightFormatName(spec.format)));
  }
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  const int64_t groups = spec.groups();
  const auto is_nan = [&spec](uint8_t code) {
    return spec.format == WeightFormat::kMxfp4 ? code == kE8m0Nan
                                               : IsE4m3Nan(code);
  };
  // A branch-free scan first (it vectorizes), the search only on failure.
  bool any_nan = false;
  for (int64_t i = 0; i < groups * spec.n; ++i)
    any_nan |= is_nan(scale_codes[i]);
  if (any_nan) {
    const int64_t i =
        std::find_if(scale_codes, scale_codes + groups * spec.n, is_nan) -
        scale_codes;
    return absl::InvalidArgumentError(absl::StrFormat(
        "scale of column %d, group %d is NaN (%s code 0x%02x): scales must be "
        "finite",
        i / groups, i % groups,
        spec.format == WeightFormat::kMxfp4 ? "E8M0" : "E4M3", scale_codes[i]));
  }

  PackedWeight packed;
  packed.spec_ = spec;
  packed.panels_ = (spec.n + kPanelWidth - 1) / kPanelWidth;
  const int64_t words = spec.k / kCodesPerWord;
  packed.codes_.resize(words * packed.panels_ * kPanelWidth);
  packed.scales_.resize(groups * packed.panels_ * kPanelWidth);
  const std::array<uint16_t, 256> kernel_scales = KernelScaleTable(spec.format);
  for (int64_t panel = 0; panel < packed.panels_; ++panel) {
    const int64_t first_col = panel * kPanelWidth;
    const int64_t width = std::min(kPanelWidth, spec.n - first_col);
    const uint8_t* panel_codes = codes + first_col * words * 4;
    ColumnsToPanel(
        [&](int64_t lane, int64_t word) {
          uint32_t value;
          std::memcpy(&value, panel_codes + (lane * words + word) * 4,
                      sizeof(value));
          return ReorderCodes(value);
        },
        words, width, packed.codes_.data() + panel * words * kPanelWidth);
    const uint8_t* panel_scales = scale_codes + first_col * groups;
    ColumnsToPanel(
        [&](int64_t lane, int64_t group) {
          return kernel_scales[panel_scales[lane * groups + group]];
        },
        groups, width, packed.scales_.data() + panel * groups * kPanelWidth);
  }
  return packed;
}

}  // namespace nibble
