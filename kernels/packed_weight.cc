#include "kernels/packed_weight.h"

#include <emmintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "base/transpose4x4.h"
#include "format/dequant.h"
#include "format/dtype.h"

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

// ReorderCodes of 4 words at once.
__m128i ReorderCodes4(__m128i words) {
  __m128i swap = _mm_and_si128(_mm_xor_si128(words, _mm_srli_epi32(words, 4)),
                               _mm_set1_epi32(0x00f000f0));
  words = _mm_xor_si128(words, _mm_xor_si128(swap, _mm_slli_epi32(swap, 4)));
  swap = _mm_and_si128(_mm_xor_si128(words, _mm_srli_epi32(words, 8)),
                       _mm_set1_epi32(0x0000ff00));
  return _mm_xor_si128(words, _mm_xor_si128(swap, _mm_slli_epi32(swap, 8)));
}

// Writes one panel of codes [words][kPanelWidth] from `width` columns of
// `words` words each ([width][words], the column layout), the padding lanes
// 0. Four columns by four words at a time in SSE2 registers: the four columns
// are read as four sequential streams, and the panel (K/2 * 16 bytes) stays
// in cache while its rows are written in four passes.
void ColumnCodesToPanel(const uint8_t* columns, int64_t words, int64_t width,
                        uint32_t* __restrict panel) {
  constexpr int64_t kWidth = PackedWeight::kPanelWidth;
  const int64_t vector_lanes = width / 4 * 4;
  const int64_t vector_words = words / 4 * 4;
  for (int64_t lane = 0; lane < vector_lanes; lane += 4) {
    for (int64_t word = 0; word < vector_words; word += 4) {
      __m128i by_word[4];
      LoadTransposedWords4x4(columns + (lane * words + word) * sizeof(uint32_t),
                             words * sizeof(uint32_t), by_word);
      for (int w = 0; w < 4; ++w) {
        _mm_storeu_si128(
            reinterpret_cast<__m128i*>(panel + (word + w) * kWidth + lane),
            ReorderCodes4(by_word[w]));
      }
    }
  }
  // The words left, one at a time.
  for (int64_t lane = 0; lane < kWidth; ++lane) {
    for (int64_t word = lane < vector_lanes ? vector_words : 0; word < words;
         ++word) {
      uint32_t value = 0;
      if (lane < width) {
        std::memcpy(&value, columns + (lane * words + word) * sizeof(uint32_t),
                    sizeof(value));
      }
      panel[word * kWidth + lane] = ReorderCodes(value);
    }
  }
}

// The scale slot as the kernels read it (see the header) for every 8-bit
// scale code of `format`.
std::array<uint16_t, 256> KernelScaleTable(WeightFormat format) {
  std::array<uint16_t, 256> table;
  for (int code = 0; code < 256; ++code) {
    const auto byte = static_cast<uint8_t>(code);
    table[code] =
        PackedScalesAreBf16(format)
            ? E8m0ToBf16(byte)
            : FloatToHalf(ScaleCodeToFloat(Traits(format).scale_type, byte));
  }
  return table;
}

// The index of the first NaN among `count` 8-bit scale codes of `format`; -1
// when there is none.
int64_t FirstNanScaleCode(WeightFormat format, const uint8_t* codes,
                          int64_t count) {
  const auto first_nan = [codes, count](auto is_nan) -> int64_t {
    return AnyBranchFree(absl::MakeConstSpan(codes, count), is_nan)
               ? std::find_if(codes, codes + count, is_nan) - codes
               : -1;
  };
  return Traits(format).scale_type == ScaleType::kE8m0
             ? first_nan([](uint8_t code) { return code == kE8m0Nan; })
             : first_nan([](uint8_t code) { return IsE4m3Nan(code); });
}

}  // namespace

absl::Status PackedWeight::CheckAllCodesArrived(const PanelCodeWriter& codes) {
  return codes.received_ == codes.spec_.qweight_bytes()
             ? absl::OkStatus()
             : absl::InvalidArgumentError(absl::StrCat(
                   "qweight has ", codes.received_, " bytes, the shape needs ",
                   codes.spec_.qweight_bytes()));
}

void PackedWeight::PackAllButCodes(const QuantizedWeight& weight) {
  const WeightSpec& spec = weight.spec;
  spec_ = spec;
  panels_ = (spec.n + kPanelWidth - 1) / kPanelWidth;
  const int64_t panel_columns = panels_ * kPanelWidth;
  scales_.resize(spec.groups() * panel_columns);
  if (HasEightBitScales(spec.format)) {
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

absl::StatusOr<PackedWeight> PackedWeight::WithoutPanels(
    const QuantizedWeight& canonical) {
  if (absl::Status status = canonical.Validate(); !status.ok()) return status;
  return WithoutPanels(canonical.spec, canonical.activation_order);
}

absl::StatusOr<PackedWeight> PackedWeight::WithoutPanels(
    const WeightSpec& spec, std::vector<int32_t> activation_order) {
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  if (absl::Status status = ValidateActivationOrder(activation_order, spec.k);
      !status.ok()) {
    return status;
  }
  PackedWeight weight;
  weight.spec_ = spec;
  weight.activation_order_ = std::move(activation_order);
  return weight;
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
  if (absl::Status status = CheckAllCodesArrived(codes); !status.ok()) {
    return status;
  }
  PackedWeight packed;
  packed.PackAllButCodes(rest);
  packed.codes_ = std::move(codes.codes_);
  return packed;
}

absl::StatusOr<PackedWeight> PackedWeight::PackWithColumnScales(
    PanelCodeWriter codes, const uint8_t* scale_codes,
    std::vector<int32_t> activation_order) {
  const WeightSpec& spec = codes.spec_;
  if (absl::Status status =
          CheckColumnLayout(spec.format, "scales in the column layout");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckAllCodesArrived(codes); !status.ok()) {
    return status;
  }
  if (absl::Status status = ValidateActivationOrder(activation_order, spec.k);
      !status.ok()) {
    return status;
  }
  const int64_t groups = spec.groups();
  if (const int64_t i =
          FirstNanScaleCode(spec.format, scale_codes, groups * spec.n);
      i >= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "scale of column %d, group %d is NaN (%s code 0x%02x): scales must be "
        "finite",
        i / groups, i % groups, ScaleTypeName(Traits(spec.format).scale_type),
        scale_codes[i]));
  }
  PackedWeight packed;
  packed.spec_ = spec;
  packed.panels_ = codes.panels_;
  packed.scales_.resize(groups * packed.panels_ * kPanelWidth);
  const std::array<uint16_t, 256> kernel_scales = KernelScaleTable(spec.format);
  for (int64_t panel = 0; panel < packed.panels_; ++panel) {
    const uint8_t* panel_scales = scale_codes + panel * kPanelWidth * groups;
    ColumnsToPanel(
        [&](int64_t lane, int64_t group) {
          return kernel_scales[panel_scales[lane * groups + group]];
        },
        groups, std::min(kPanelWidth, spec.n - panel * kPanelWidth),
        packed.scales_.data() + panel * groups * kPanelWidth);
  }
  packed.codes_ = std::move(codes.codes_);
  packed.activation_order_ = std::move(activation_order);
  return packed;
}

PanelCodeWriter::PanelCodeWriter(const WeightSpec& spec, CodeLayout layout)
    : spec_(spec),
      layout_(layout),
      panels_((spec.n + PackedWeight::kPanelWidth - 1) /
              PackedWeight::kPanelWidth) {
  codes_.resize(spec.k / kCodesPerWord * panels_ * PackedWeight::kPanelWidth);
}

int64_t PanelCodeWriter::units() const {
  return layout_ == CodeLayout::kCanonical ? spec_.k / kCodesPerWord : panels_;
}

int64_t PanelCodeWriter::UnitBytes() const {
  if (layout_ == CodeLayout::kCanonical) return spec_.n * sizeof(uint32_t);
  const int64_t width =
      std::min(PackedWeight::kPanelWidth,
               spec_.n - units_done_ * PackedWeight::kPanelWidth);
  return width * (spec_.k / 2);
}

void PanelCodeWriter::Append(absl::string_view bytes) {
  received_ += static_cast<int64_t>(bytes.size());
  while (!bytes.empty() && units_done_ < units()) {
    const auto unit_bytes = static_cast<size_t>(UnitBytes());
    if (partial_unit_.empty() && bytes.size() >= unit_bytes) {
      PackUnit(reinterpret_cast<const uint8_t*>(bytes.data()));
      bytes.remove_prefix(unit_bytes);
      continue;
    }
    const size_t taken =
        std::min(bytes.size(), unit_bytes - partial_unit_.size());
    partial_unit_.append(bytes.data(), taken);
    bytes.remove_prefix(taken);
    if (partial_unit_.size() == unit_bytes) {
      PackUnit(reinterpret_cast<const uint8_t*>(partial_unit_.data()));
      partial_unit_.clear();
    }
  }
}

void PanelCodeWriter::PackUnit(const uint8_t* unit) {
  constexpr int64_t kWidth = PackedWeight::kPanelWidth;
  const int64_t words = spec_.k / kCodesPerWord;
  if (layout_ == CodeLayout::kColumns) {
    const int64_t panel = units_done_++;
    ColumnCodesToPanel(unit, words, std::min(kWidth, spec_.n - panel * kWidth),
                       codes_.data() + panel * words * kWidth);
    return;
  }
  const int64_t row = units_done_++;
  // A whole panel's 16 words are 64 contiguous bytes of the row.
  const int64_t whole_panels = spec_.n / kWidth;
  for (int64_t panel = 0; panel < whole_panels; ++panel) {
    const auto* from = reinterpret_cast<const __m128i*>(
        unit + panel * kWidth * sizeof(uint32_t));
    auto* to = reinterpret_cast<__m128i*>(codes_.data() +
                                          (panel * words + row) * kWidth);
    for (int i = 0; i < 4; ++i) {
      _mm_storeu_si128(to + i, ReorderCodes4(_mm_loadu_si128(from + i)));
    }
  }
  for (int64_t panel = whole_panels; panel < panels_; ++panel) {
    uint32_t* to = codes_.data() + (panel * words + row) * kWidth;
    const int64_t width = spec_.n - panel * kWidth;
    for (int64_t lane = 0; lane < kWidth; ++lane) {
      uint32_t word = 0;
      if (lane < width) {
        std::memcpy(&word, unit + (panel * kWidth + lane) * sizeof(uint32_t),
                    sizeof(word));
      }
      to[lane] = ReorderCodes(word);
    }
  }
}

absl::StatusOr<PackedWeight> PackedWeight::PackColumns(
    const Fp4Columns& columns) {
  const WeightSpec& spec = columns.spec;
  if (absl::Status status = CheckColumnLayout(spec.format, "PackColumns");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  PanelCodeWriter codes(spec, CodeLayout::kColumns);
  codes.Append(absl::string_view(reinterpret_cast<const char*>(columns.codes),
                                 columns.code_bytes()));
  return PackWithColumnScales(std::move(codes), columns.scale_codes);
}

}  // namespace nibble
