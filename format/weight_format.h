// 4-bit weight formats: the one table of their facts, and their canonical
// (wire and file) layout.
//
// Every fact about a format lives in its row of kWeightFormatTable: its name,
// its nibble.v1 wire value and .nibble file code, what its codes mean, the
// type of its scales, its zero points, its group sizes, whether checkpoints
// store it by column and whether it has a global scale. Code elsewhere asks
// the table (Traits(format).scale_type, HasZeros(format), ...) instead of
// naming formats; switches that must stay (kernel instantiation) list every
// format with no default, and -Werror=switch catches a missing one.
//
// A quantized weight B [K, N] is three arrays:
//   qweight [K/8, N] uint32: the code of row k = 8i + j, column n, sits in
//                            bits 4j..4j+3 of word [i, n];
//   scales  [K/group, N] 16-bit slots: fp16 bits, or an 8-bit scale code
//                        (ScaleType kE8m0, kE4m3) in the low byte with the
//                        high byte zero;
//   zeros   [K/group, N] uint8, 0..15, only where ZeroPoint::kPerGroup.
// and optionally an activation order [K] (GPTQ act-order checkpoints, whose
// rows were regrouped at import): row r of B multiplies column
// activation_order[r] of A, so C = A' · dequant(B) with
// A'[:, r] = A[:, activation_order[r]].
// Each element dequantizes to code(q) * scale(s) * g, where code(q) is the
// FP4 E2M1 value or q - zero (zero 8 or the group's zero point), and g the
// weight's fp32 global scale where the format has one
// (WeightSpec::global_scale), 1 otherwise. The table's `math` column says it
// per format.
//
// Example:
//   nibble::WeightSpec spec{nibble::WeightFormat::kU4b8, 4096, 4096, 128};
//   if (absl::Status s = spec.Validate(); !s.ok()) return s;
//   nibble::QuantizedWeight w = nibble::RandomQuantizedWeight(spec, 42);
//   uint8_t q = w.Code(/*row=*/17, /*col=*/3);
//   if (nibble::Traits(spec.format).zero_point == nibble::ZeroPoint::kEight)
//     ...
#ifndef NIBBLE_FORMAT_WEIGHT_FORMAT_H_
#define NIBBLE_FORMAT_WEIGHT_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nibble {

enum class WeightFormat { kFp4, kU4b8, kU4, kMxfp4, kNvfp4 };

// What a 4-bit code stands for.
enum class CodeKind {
  kFp4,   // an FP4 E2M1 value: sign, 2 exponent bits, 1 mantissa bit
  kInt4,  // an unsigned integer 0..15, less the zero point
};

// How a group's scale is stored.
enum class ScaleType {
  kFp16,  // fp16 bits in the 16-bit slot
  kE8m0,  // an OCP E8M0 power of two (bias 127, 0xff NaN) in the low byte
  kE4m3,  // an FP8 E4M3 value (bias 7, 0x7f/0xff NaN) in the low byte
};

// What an INT4 code has subtracted before it is scaled.
enum class ZeroPoint {
  kNone,      // nothing (FP4 codes)
  kEight,     // 8, the symmetric INT4 of GPTQ
  kPerGroup,  // the group's own zero point, from the zeros array (AWQ)
};

struct WeightFormatTraits {
  WeightFormat format;
  // For people, flags, JSON and kernel names: "u4b8".
  absl::string_view name;
  // The nibble.v1.WeightFormat value.
  int wire_value;
  // The format's code in a .nibble file's header.
  uint32_t file_code;
  CodeKind code_kind;
  ScaleType scale_type;
  ZeroPoint zero_point;
  // The one group size the format allows; 0 when it takes 32, 64, 128 or K.
  int64_t fixed_group_size;
  // Whether its checkpoints store codes and 8-bit scales column by column
  // (fp4_columns.h), which uploads may carry as they are.
  bool column_layout;
  // Whether a weight carries one fp32 scale of its own (WeightSpec).
  bool global_scale;
  // What an element is, for help texts and docs.
  absl::string_view math;
  // Where such weights come from.
  absl::string_view origin;
};

// One row per format, in the enum's order.
inline constexpr WeightFormatTraits kWeightFormatTable[] = {
    {WeightFormat::kFp4, "fp4", 1, 0, CodeKind::kFp4, ScaleType::kFp16,
     ZeroPoint::kNone, 0, false, false, "fp4(q) * s", "FP4 E2M1 codes"},
    {WeightFormat::kU4b8, "u4b8", 2, 1, CodeKind::kInt4, ScaleType::kFp16,
     ZeroPoint::kEight, 0, false, false, "(q - 8) * s", "symmetric INT4, GPTQ"},
    {WeightFormat::kU4, "u4", 3, 2, CodeKind::kInt4, ScaleType::kFp16,
     ZeroPoint::kPerGroup, 0, false, false, "(q - z) * s",
     "asymmetric INT4, AWQ"},
    {WeightFormat::kMxfp4, "mxfp4", 4, 3, CodeKind::kFp4, ScaleType::kE8m0,
     ZeroPoint::kNone, 32, true, false, "fp4(q) * 2^(e - 127)",
     "OCP Microscaling MXFP4"},
    {WeightFormat::kNvfp4, "nvfp4", 5, 4, CodeKind::kFp4, ScaleType::kE4m3,
     ZeroPoint::kNone, 16, true, true, "fp4(q) * e4m3(s) * g", "NVIDIA NVFP4"},
};

inline constexpr const WeightFormatTraits& Traits(WeightFormat format) {
  return kWeightFormatTable[static_cast<size_t>(format)];
}

inline constexpr size_t kWeightFormatCount = std::size(kWeightFormatTable);

// Every format, in the table's order.
inline constexpr auto kAllWeightFormats = [] {
  std::array<WeightFormat, kWeightFormatCount> formats{};
  for (size_t i = 0; i < kWeightFormatCount; ++i) {
    formats[i] = kWeightFormatTable[i].format;
  }
  return formats;
}();

static_assert(
    [] {
      for (size_t i = 0; i < kWeightFormatCount; ++i) {
        const WeightFormatTraits& row = kWeightFormatTable[i];
        if (static_cast<size_t>(row.format) != i) return false;
        if ((row.code_kind == CodeKind::kFp4) !=
            (row.zero_point == ZeroPoint::kNone)) {
          return false;
        }
        if (row.column_layout != (row.scale_type != ScaleType::kFp16)) {
          return false;
        }
      }
      return true;
    }(),
    "kWeightFormatTable: rows in the enum's order; FP4 codes and only they "
    "without zero points; the column layout exactly for 8-bit scales");

// "fp4", "u4b8", "u4", "mxfp4" or "nvfp4".
constexpr absl::string_view WeightFormatName(WeightFormat format) {
  return Traits(format).name;
}
absl::StatusOr<WeightFormat> ParseWeightFormat(absl::string_view name);
// The formats' names joined for help and error texts:
// "fp4, u4b8, u4, mxfp4 or nvfp4".
std::string WeightFormatNames(absl::string_view last_separator = " or ");
// The same for the formats where `has` holds, e.g. HasZeros: "u4".
std::string WeightFormatNamesWhere(bool (*has)(WeightFormat),
                                   absl::string_view last_separator = " or ");
// The formats whose group size is fixed, with it: "mxfp4:32, nvfp4:16".
std::string FixedGroupSizesText();
// The format of a nibble.v1.WeightFormat value; INVALID_ARGUMENT listing the
// valid ones (WEIGHT_FORMAT_<NAME>) for any other.
absl::StatusOr<WeightFormat> WeightFormatFromWire(int wire_value,
                                                  absl::string_view wire_name);
// The format of a .nibble file code; DATA_LOSS for any other.
absl::StatusOr<WeightFormat> WeightFormatFromFileCode(uint32_t code);

constexpr bool HasZeros(WeightFormat format) {
  return Traits(format).zero_point == ZeroPoint::kPerGroup;
}
// Whether codes are FP4 E2M1 values.
constexpr bool HasFp4Codes(WeightFormat format) {
  return Traits(format).code_kind == CodeKind::kFp4;
}
// Whether scales are 8-bit codes in the low byte of their slot.
constexpr bool HasEightBitScales(WeightFormat format) {
  return Traits(format).scale_type != ScaleType::kFp16;
}
constexpr bool HasGlobalScale(WeightFormat format) {
  return Traits(format).global_scale;
}
// The group size a format fixes; 0 when the group size is free.
constexpr int64_t FixedGroupSize(WeightFormat format) {
  return Traits(format).fixed_group_size;
}
// "fp16", "E8M0" or "E4M3".
absl::string_view ScaleTypeName(ScaleType type);

// Calls fn(std::integral_constant<WeightFormat, format>()), so that loops
// templated on the format are compiled once for each of kAllWeightFormats and
// picked at run time.
template <typename Fn>
inline void WithFormatConstant(WeightFormat format, Fn&& fn) {
  [&]<size_t... I>(std::index_sequence<I...>) {
    ((format == kAllWeightFormats[I]
          ? fn(std::integral_constant<WeightFormat, kAllWeightFormats[I]>())
          : void()),
     ...);
  }
  (std::make_index_sequence<kWeightFormatCount>());
}

// Rows per packed uint32 word.
inline constexpr int64_t kCodesPerWord = 8;
// Largest K and N accepted, so that every byte count fits comfortably.
inline constexpr int64_t kMaxDimension = int64_t{1} << 20;

struct WeightSpec {
  WeightFormat format = WeightFormat::kU4b8;
  int64_t k = 0;
  int64_t n = 0;
  int64_t group_size = 0;
  // The per-weight scale of a format with a global scale; 1 for the rest.
  float global_scale = 1.0f;

  // OK when K is a positive multiple of 8 and of the group size, N positive,
  // both at most kMaxDimension, and the group size is 32, 64, 128 or K (the
  // format's fixed one); the global scale is finite and positive where the
  // format has one and 1 otherwise.
  absl::Status Validate() const;

  int64_t groups() const { return k / group_size; }
  int64_t qweight_bytes() const { return k / kCodesPerWord * n * 4; }
  int64_t scales_bytes() const { return groups() * n * 2; }
  int64_t zeros_bytes() const { return HasZeros(format) ? groups() * n : 0; }
  int64_t canonical_bytes() const {
    return qweight_bytes() + scales_bytes() + zeros_bytes();
  }
  // e.g. "u4b8 k=4096 n=4096 group=128", or with " global_scale=0.002" for
  // a format that has one.
  std::string DebugString() const;

  friend bool operator==(const WeightSpec&, const WeightSpec&) = default;
};

// A weight in the canonical layout, host byte order (little-endian on x86).
struct QuantizedWeight {
  WeightSpec spec;
  std::vector<uint32_t> qweight;  // [K/8, N]
  std::vector<uint16_t> scales;   // [K/group, N] fp16 bits
  std::vector<uint8_t> zeros;     // [K/group, N]; empty unless kU4
  // Empty for none (the identity); otherwise a permutation of 0..K-1: row r
  // of the weight multiplies column activation_order[r] of the activations.
  std::vector<int32_t> activation_order;

  uint8_t Code(int64_t row, int64_t col) const {
    const uint32_t word = qweight[(row / kCodesPerWord) * spec.n + col];
    return (word >> (4 * (row % kCodesPerWord))) & 0xfu;
  }
  void SetCode(int64_t row, int64_t col, uint8_t code);
  // The scale slot's bits (see the layout above).
  uint16_t Scale(int64_t row, int64_t col) const {
    return scales[(row / spec.group_size) * spec.n + col];
  }
  uint8_t Zero(int64_t row, int64_t col) const {
    return zeros[(row / spec.group_size) * spec.n + col];
  }

  // OK when the arrays have the sizes the spec implies, every scale is finite
  // (neither NaN nor infinite; an 8-bit scale's high byte is zero), every
  // zero point is at most 15, and the activation order passes
  // ValidateActivationOrder.
  absl::Status Validate() const;
  // Validate() without qweight, for a weight whose codes went straight into
  // panels as they arrived (PanelCodeWriter) and are not held here.
  absl::Status ValidateAllButCodes() const;
};

// How an upload lays out a weight's codes and scales: the canonical layout
// above, or for formats with Traits::column_layout the column layout their
// checkpoints store (fp4_columns.h).
enum class CodeLayout { kCanonical, kColumns };

// Whether weights of `format` may come in CodeLayout::kColumns.
constexpr bool HasColumnLayout(WeightFormat format) {
  return Traits(format).column_layout;
}
// OK where HasColumnLayout; otherwise INVALID_ARGUMENT saying that `what`
// (e.g. "the column layout") is for the formats that have it, not `format`.
absl::Status CheckColumnLayout(WeightFormat format, absl::string_view what);

// Bytes of a weight's scales in `layout`: 16-bit slots in the canonical
// layout, one 8-bit code each in the column layout.
int64_t ScalesBytes(const WeightSpec& spec, CodeLayout layout);

// A weight's tensors as bytes in memory it does not own: what an upload
// sends, from a QuantizedWeight or straight from a checkpoint's file.
struct WeightBytes {
  WeightSpec spec;
  CodeLayout layout = CodeLayout::kCanonical;
  absl::string_view qweight;
  absl::string_view scales;
  absl::string_view zeros;
  absl::Span<const int32_t> activation_order;

  // OK when the layout suits the format and every tensor has the bytes the
  // spec and the layout call for; INVALID_ARGUMENT saying which does not.
  // Values are not looked at.
  absl::Status CheckSizes() const;
};

// The tensors of `weight`, which must outlive the result.
WeightBytes BytesOf(const QuantizedWeight& weight);

// Whether `is_bad` holds for some value, by a loop without branches that
// compilers vectorize (a bool accumulator keeps GCC from it), for scans of
// every scale of a weight; callers look for the first bad value only when
// there is one.
template <typename T, typename IsBad>
bool AnyBranchFree(absl::Span<const T> values, IsBad is_bad) {
  uint8_t found = 0;
  for (const T& value : values) found |= is_bad(value) ? 1 : 0;
  return found != 0;
}

// OK when `order` is empty or a permutation of 0..k-1; INVALID_ARGUMENT
// saying which entry is wrong otherwise, e.g. "activation_order[5] = 7
// appears twice (also at 2): it must be a permutation of 0..K-1".
absl::Status ValidateActivationOrder(absl::Span<const int32_t> order,
                                     int64_t k);

// A random permutation of 0..k-1 (for tests and benchmarks).
std::vector<int32_t> RandomActivationOrder(int64_t k, uint64_t seed);

// Random codes, zero points and positive scales in [2^-8, 2^-4) (with a
// global scale, the product of the scale and spec.global_scale), so that
// products of random activations and weights stay well inside fp16 range.
QuantizedWeight RandomQuantizedWeight(const WeightSpec& spec, uint64_t seed);

}  // namespace nibble

#endif  // NIBBLE_FORMAT_WEIGHT_FORMAT_H_
