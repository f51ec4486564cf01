// 4-bit weight formats and their canonical (wire and file) layout.
//
// A quantized weight B [K, N] is three arrays:
//   qweight [K/8, N] uint32: the code of row k = 8i + j, column n, sits in
//                            bits 4j..4j+3 of word [i, n];
//   scales  [K/group, N] 16-bit slots: fp16 bits, except the 8-bit scales of
//                        kMxfp4 (E8M0) and kNvfp4 (FP8 E4M3), which sit in
//                        the low byte with the high byte zero;
//   zeros   [K/group, N] uint8, 0..15, only for kU4.
// and optionally an activation order [K] (GPTQ act-order checkpoints, whose
// rows were regrouped at import): row r of B multiplies column
// activation_order[r] of A, so C = A' · dequant(B) with
// A'[:, r] = A[:, activation_order[r]].
// Each element dequantizes to
//   kFp4:   w = fp4(q) * s          (FP4 E2M1)
//   kU4b8:  w = (q - 8) * s         (symmetric INT4, GPTQ style)
//   kU4:    w = (q - z) * s         (asymmetric INT4, AWQ style)
//   kMxfp4: w = fp4(q) * 2^(e - 127), group 32 (OCP Microscaling MXFP4)
//   kNvfp4: w = fp4(q) * e4m3(s) * g, group 16, with one fp32 global scale g
//                                     per weight (WeightSpec::global_scale)
//
// Example:
//   nibble::WeightSpec spec{nibble::WeightFormat::kU4b8, 4096, 4096, 128};
//   if (absl::Status s = spec.Validate(); !s.ok()) return s;
//   nibble::QuantizedWeight w = nibble::RandomQuantizedWeight(spec, 42);
//   uint8_t q = w.Code(/*row=*/17, /*col=*/3);
//   w.activation_order = nibble::RandomActivationOrder(spec.k, 7);
#ifndef NIBBLE_KERNELS_WEIGHT_FORMAT_H_
#define NIBBLE_KERNELS_WEIGHT_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nibble {

enum class WeightFormat { kFp4, kU4b8, kU4, kMxfp4, kNvfp4 };

inline constexpr WeightFormat kAllWeightFormats[] = {
    WeightFormat::kFp4, WeightFormat::kU4b8, WeightFormat::kU4,
    WeightFormat::kMxfp4, WeightFormat::kNvfp4};

// "fp4", "u4b8", "u4", "mxfp4" or "nvfp4".
absl::string_view WeightFormatName(WeightFormat format);
absl::StatusOr<WeightFormat> ParseWeightFormat(absl::string_view name);
bool HasZeros(WeightFormat format);
// Whether codes are FP4 E2M1 values (kFp4, kMxfp4, kNvfp4).
bool HasFp4Codes(WeightFormat format);
// The group size a format fixes (32 for kMxfp4, 16 for kNvfp4); 0 when the
// group size is free.
int64_t FixedGroupSize(WeightFormat format);

// Rows per packed uint32 word.
inline constexpr int64_t kCodesPerWord = 8;
// Largest K and N accepted, so that every byte count fits comfortably.
inline constexpr int64_t kMaxDimension = int64_t{1} << 20;

struct WeightSpec {
  WeightFormat format = WeightFormat::kU4b8;
  int64_t k = 0;
  int64_t n = 0;
  int64_t group_size = 0;
  // kNvfp4's per-weight scale; 1 for every other format.
  float global_scale = 1.0f;

  // OK when K is a positive multiple of 8 and of the group size, N positive,
  // both at most kMaxDimension, and the group size is 32, 64, 128 or K (the
  // format's own for kMxfp4 and kNvfp4); the global scale is finite and
  // positive for kNvfp4 and 1 otherwise.
  absl::Status Validate() const;

  int64_t groups() const { return k / group_size; }
  int64_t qweight_bytes() const { return k / kCodesPerWord * n * 4; }
  int64_t scales_bytes() const { return groups() * n * 2; }
  int64_t zeros_bytes() const { return HasZeros(format) ? groups() * n : 0; }
  int64_t canonical_bytes() const {
    return qweight_bytes() + scales_bytes() + zeros_bytes();
  }
  // e.g. "u4b8 k=4096 n=4096 group=128", "nvfp4 k=64 n=8 group=16
  // global_scale=0.002".
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
// above, or for kMxfp4 and kNvfp4 the column layout their checkpoints store
// (fp4_columns.h).
enum class CodeLayout { kCanonical, kColumns };

// Whether weights of `format` may come in CodeLayout::kColumns: kMxfp4 and
// kNvfp4, whose scales are 8-bit codes.
bool HasColumnLayout(WeightFormat format);
// OK where HasColumnLayout; otherwise INVALID_ARGUMENT saying that `what`
// (e.g. "the column layout") is for mxfp4 and nvfp4 weights, not `format`.
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

// Random codes, zero points and positive scales in [2^-8, 2^-4) (for kNvfp4,
// the product of the E4M3 scale and spec.global_scale), so that products of
// random activations and weights stay well inside fp16 range.
QuantizedWeight RandomQuantizedWeight(const WeightSpec& spec, uint64_t seed);

}  // namespace nibble

#endif  // NIBBLE_KERNELS_WEIGHT_FORMAT_H_
