#include "checkpoint/float_quantizer.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/bulk_allocator.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_checks.h"
#include "format/dequant.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "kernels/cpu/cpu_kernels.h"

namespace nibble::checkpoint {
namespace {

constexpr double kLargestHalf = 65504.0;

DType FloatDType(SafetensorsDtype dtype) {
  switch (dtype) {
    case SafetensorsDtype::kF16:
      return DType::kF16;
    case SafetensorsDtype::kBF16:
      return DType::kBF16;
    default:
      return DType::kF32;
  }
}

// Round to nearest, ties to even, for |x| < 2^51 (float: 2^22): adding
// 1.5 * 2^52 (float: 1.5 * 2^23) leaves no fraction bits, so the addition
// rounds as the FPU does (to even), and unlike std::nearbyint it is two
// vectorizable instructions.
template <typename T>
T RoundHalfEven(T x) {
  constexpr T kShift =
      T{1.5} *
      static_cast<T>(uint64_t{1} << (std::numeric_limits<T>::digits - 1));
  return (x + kShift) - kShift;
}

// The fp16 nearest to x in (0, 65504], ties to even. fp16 values in
// [2^e, 2^(e+1)) are the integers n * 2^q with q = max(e, -14) - 10 (below
// 2^-14, subnormals), and their bits are (q + 24) * 2^10 + n, into which a
// round up to n = 2^11 carries as the next exponent.
uint16_t NearestHalf(double x) {
  const int exponent =
      static_cast<int>(std::bit_cast<uint64_t>(x) >> 52) - 1023;
  const int q = std::max(exponent, -14) - 10;
  const double inverse_quantum =
      std::bit_cast<double>(static_cast<uint64_t>(1023 - q) << 52);
  const int n = static_cast<int>(RoundHalfEven(x * inverse_quantum));
  return static_cast<uint16_t>(((q + 24) << 10) + n);
}

// The E2M1 code whose value is nearest to x, ties to the even code (even
// mantissa); +0 for values that round to zero. The magnitudes 0, 0.5, 1,
// 1.5, 2, 3, 4, 6 are codes 0..7: the code counts the midpoints below |x|,
// a midpoint counting when |x| equals it only if the code above it is even.
template <typename T>
uint32_t NearestFp4Code(T x) {
  const T m = std::abs(x);
  const uint32_t code = (m > T{0.25}) + (m >= T{0.75}) + (m > T{1.25}) +
                        (m >= T{1.75}) + (m > T{2.5}) + (m >= T{3.5}) +
                        (m > T{5});
  return code | ((x < 0 && code != 0) ? 0x8u : 0u);
}

// One group of one column: its values' extremes.
struct GroupRange {
  double lo = 0;  // min(min w, 0)
  double hi = 0;  // max(max w, 0)
  double absmax() const { return std::max(hi, -lo); }
};

// The codes quantization may use without clamping, in units of the scale.
// Only FP4 codes have no zero point (kWeightFormatTable's static_assert).
double ScaleDivisor(WeightFormat format) {
  switch (Traits(format).zero_point) {
    case ZeroPoint::kNone:  // FP4 codes: 6 is the largest magnitude
      return 6;
    case ZeroPoint::kEight:
      return 7;
    case ZeroPoint::kPerGroup:
      return 15;
  }
  return 6;
}

// What the scale must cover: the range from lo to hi where a zero point
// shifts the codes, the largest magnitude where they are symmetric.
double Extent(WeightFormat format, const GroupRange& range) {
  return HasZeros(format) ? range.hi - range.lo : range.absmax();
}

// Whether scale s would leave one of the group's extremes outside the codes.
bool ScaleClamps(WeightFormat format, const GroupRange& range, double s) {
  if (s == 0) return true;
  switch (Traits(format).zero_point) {
    case ZeroPoint::kNone:  // FP4 codes: 6 is the largest magnitude
      return range.absmax() > 6 * s;
    case ZeroPoint::kEight:
      return RoundHalfEven(range.absmax() / s) > 7;
    case ZeroPoint::kPerGroup:
      return RoundHalfEven(range.hi / s) + RoundHalfEven(-range.lo / s) > 15;
  }
  return true;
}

// The E8M0 code of the smallest power of two s with absmax / s <= 6, at
// least 2^-127 (code 0). absmax <= FLT_MAX < 6 * 2^127 fits below code 255.
uint8_t E8m0ScaleCode(double absmax) {
  int exponent = 0;
  std::frexp(absmax / 6, &exponent);  // absmax / 6 < 2^exponent, about
  while (exponent > -127 && absmax <= 6 * std::ldexp(1.0, exponent - 1)) {
    --exponent;
  }
  while (absmax > 6 * std::ldexp(1.0, exponent)) ++exponent;
  return static_cast<uint8_t>(std::max(exponent, -127) + 127);
}

// The E4M3 code of absmax / 6 / g, stepped up while absmax / (s * g) > 6;
// the global scale guarantees that 448 (code 0x7e) never clips.
uint8_t E4m3ScaleCode(double absmax, float global_scale) {
  constexpr uint8_t kLargestE4m3 = 0x7e;
  uint8_t code = FloatToE4m3(static_cast<float>(absmax / 6 / global_scale));
  while (code < kLargestE4m3 &&
         absmax > 6 * (E4m3ToFloat(code) * double{global_scale})) {
    ++code;
  }
  return code;
}

// The global scale over E4M3 scales for a tensor whose largest magnitude is
// `amax`: amax / (6 * 448) in fp32, stepped up while rounding leaves it too
// small for amax to fit the largest E4M3 scale; 1 for a tensor of zeros.
float E4m3GlobalScale(double amax) {
  if (amax == 0) return 1.0f;
  float g = std::max(static_cast<float>(amax / (6 * 448)),
                     std::numeric_limits<float>::denorm_min());
  while (amax > 6 * 448 * double{g}) {
    g = std::nextafter(g, std::numeric_limits<float>::infinity());
  }
  return g;
}

// A group's scale: the slot stored, and what a code is multiplied by (with
// the global scale); both 0 for a group of zeros.
struct GroupScale {
  uint16_t slot = 0;
  double s = 0;
};

// The scale of a group of column `col` (the rules are in the header).
absl::StatusOr<GroupScale> ChooseScale(const WeightSpec& spec,
                                       const GroupRange& range,
                                       const TensorInfo& tensor, int64_t col,
                                       int64_t group) {
  const double extent = Extent(spec.format, range);
  // Slot 0 is 0 (fp16, E4M3) or 2^-127 (E8M0); the codes of zeros follow.
  if (extent == 0) return GroupScale{};
  switch (Traits(spec.format).scale_type) {
    case ScaleType::kE8m0: {
      const uint8_t code = E8m0ScaleCode(extent);
      return GroupScale{code, E8m0ToFloat(code)};
    }
    case ScaleType::kE4m3: {
      const uint8_t code = E4m3ScaleCode(extent, spec.global_scale);
      return GroupScale{code, E4m3ToFloat(code) * double{spec.global_scale}};
    }
    case ScaleType::kFp16:
      break;
  }
  const double ideal_scale = extent / ScaleDivisor(spec.format);
  uint16_t slot =
      ideal_scale > kLargestHalf ? kHalfExponentBits : NearestHalf(ideal_scale);
  if (slot < kHalfExponentBits &&
      ScaleClamps(spec.format, range, HalfToFloat(slot))) {
    ++slot;
  }
  if (slot >= kHalfExponentBits) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the values of row %d, columns %d..%d span [%g, %g], which "
        "need a scale of %g for %s, beyond fp16's largest, 65504",
        tensor.name, col, group * spec.group_size,
        (group + 1) * spec.group_size - 1, range.lo, range.hi, ideal_scale,
        WeightFormatName(spec.format)));
  }
  return GroupScale{slot, HalfToFloat(slot)};
}

// The loops read bf16 rows as they are stored (a bf16's bits are the upper
// half of a float's), and f16 and f32 rows converted to float.
float ElementToFloat(float value) { return value; }
float ElementToFloat(uint16_t bf16) { return Bf16ToFloat(bf16); }

// A group's largest positive value and largest negative magnitude, as bits
// of floats.
struct GroupMaxBits {
  int32_t positive = 0;
  int32_t negative = 0;
};

// The extremes of each group of a row of the [N, K] tensor (column n of B).
template <typename Element>
[[gnu::always_inline]] inline void GroupMaximaBody(const Element* row,
                                                   int64_t k,
                                                   int64_t group_size,
                                                   GroupMaxBits* maxima) {
  // On the bits: non-negative floats (and bf16s) order as integers, so the
  // largest positive value and the largest negative magnitude are integer
  // maxima, and any NaN or infinity is larger than every finite value.
  // Integer max reductions vectorize; floating-point ones do not.
  using Bits = std::conditional_t<sizeof(Element) == 2, int16_t, int32_t>;
  constexpr int kBits = 8 * sizeof(Bits);
  for (int64_t group = 0; group < k / group_size; ++group) {
    const Element* values = row + group * group_size;
    // bf16 rows are read where the file is mapped, for the first time: the
    // hardware prefetchers stop at page boundaries, so ask ahead of them.
    if constexpr (std::is_same_v<Element, uint16_t>) {
      constexpr int64_t kPrefetchBytes = 8192;
      for (int64_t b = 0; b < group_size * 2; b += 64) {
        __builtin_prefetch(reinterpret_cast<const char*>(values) +
                           kPrefetchBytes + b);
      }
    }
    Bits positive_max = 0, negative_max = 0;
    for (int64_t i = 0; i < group_size; ++i) {
      const Bits bits = std::bit_cast<Bits>(values[i]);
      const Bits magnitude = bits & std::numeric_limits<Bits>::max();
      const Bits negative = bits >> (kBits - 1);  // all ones when negative
      positive_max =
          std::max(positive_max, static_cast<Bits>(magnitude & ~negative));
      negative_max =
          std::max(negative_max, static_cast<Bits>(magnitude & negative));
    }
    maxima[group] = {int32_t{positive_max} << (32 - kBits),
                     int32_t{negative_max} << (32 - kBits)};
  }
}

template <typename Element>
void GroupMaximaBaseline(const Element* row, int64_t k, int64_t group_size,
                         GroupMaxBits* maxima) {
  GroupMaximaBody(row, k, group_size, maxima);
}

template <typename Element>
[[gnu::target("avx2")]] void GroupMaximaAvx2(const Element* row, int64_t k,
                                             int64_t group_size,
                                             GroupMaxBits* maxima) {
  GroupMaximaBody(row, k, group_size, maxima);
}

// Stores `count` 4-bit codes (a multiple of 8), one a byte, as words of 8
// (code j of a word in bits 4j..4j+3) at words[0], words[stride], ...: two
// codes to a byte first, which vectorizes, then a word is a load and a store.
[[gnu::always_inline]] inline void StoreCodeWords(const uint8_t* codes,
                                                  int64_t count,
                                                  uint32_t* words,
                                                  int64_t stride) {
  constexpr int64_t kChunk = 64;
  uint8_t pairs[kChunk / 2];
  for (int64_t first = 0; first < count; first += kChunk) {
    const int64_t chunk = std::min(kChunk, count - first);
    for (int64_t b = 0; b < chunk / 2; ++b) {
      pairs[b] = static_cast<uint8_t>(codes[first + 2 * b] |
                                      codes[first + 2 * b + 1] << 4);
    }
    for (int64_t w = 0; w < chunk / kCodesPerWord; ++w) {
      std::memcpy(&words[(first / kCodesPerWord + w) * stride], pairs + 4 * w,
                  sizeof(uint32_t));
    }
  }
}

// The codes of `count` values (a multiple of 8) in units of `s`, 8 rows to a
// word, written to words[0], words[stride], ... `codes` is scratch space for
// `count` codes.
template <typename Element, typename T>
[[gnu::always_inline]] inline void CodeWords(bool fp4, const Element* values,
                                             int64_t count, T s, int zero,
                                             uint8_t* codes, uint32_t* words,
                                             int64_t stride) {
  if (fp4) {
    for (int64_t i = 0; i < count; ++i) {
      codes[i] =
          static_cast<uint8_t>(NearestFp4Code(ElementToFloat(values[i]) / s));
    }
  } else {
    for (int64_t i = 0; i < count; ++i) {
      codes[i] = static_cast<uint8_t>(
          static_cast<int>(RoundHalfEven(ElementToFloat(values[i]) / s)) +
          zero);
    }
  }
  StoreCodeWords(codes, count, words, stride);
}

// Writes the codes of a group of one column (the rules are in the header) to
// `words`, as CodeWords does; `zero`, what int codes add, is also the code of
// zero that a group of zeros (scale 0) gets.
//
// Dividing in float gives the codes that dividing exactly does (and so does
// double, as the rules are written) wherever s has at most 11 significant
// bits, as fp16 and E8M0 scales do: a float v over such an s that is not
// itself a midpoint between two codes (at most 5 significant bits) lies more
// than half a float ulp away from every midpoint, so rounding the quotient to
// float never moves it onto or across one. Scales under a global scale,
// E4M3 times the global scale, have up to 28 bits and divide in double.
template <typename Element>
[[gnu::always_inline]] inline void GroupCodesBody(
    WeightFormat format, const Element* values, int64_t count,
    const GroupScale& scale, int zero, uint8_t* codes, uint32_t* words,
    int64_t stride) {
  const bool fp4 = HasFp4Codes(format);
  if (scale.s == 0) {
    std::fill_n(codes, count, zero);
    StoreCodeWords(codes, count, words, stride);
  } else if (HasGlobalScale(format)) {
    CodeWords(fp4, values, count, scale.s, zero, codes, words, stride);
  } else {
    CodeWords(fp4, values, count, static_cast<float>(scale.s), zero, codes,
              words, stride);
  }
}

template <typename Element>
void GroupCodesBaseline(WeightFormat format, const Element* values,
                        int64_t count, const GroupScale& scale, int zero,
                        uint8_t* codes, uint32_t* words, int64_t stride) {
  GroupCodesBody(format, values, count, scale, zero, codes, words, stride);
}

template <typename Element>
[[gnu::target("avx2")]] void GroupCodesAvx2(WeightFormat format,
                                            const Element* values,
                                            int64_t count,
                                            const GroupScale& scale, int zero,
                                            uint8_t* codes, uint32_t* words,
                                            int64_t stride) {
  GroupCodesBody(format, values, count, scale, zero, codes, words, stride);
}

// The groups of every column of a float layer whose rows (columns of B)
// row_at(col) gives as Elements, in order: calls
// visit(col, group, values, range, group_codes) for every group, after
// checking that its values are finite; group_codes is GroupCodesAvx2 or
// GroupCodesBaseline for Element. Stops at the first error.
template <typename Element, typename RowAt, typename Visit>
absl::Status ForEachGroupOfRows(const TensorInfo& tensor,
                                const WeightSpec& spec, RowAt row_at,
                                Visit visit) {
  // The loops are compiled twice: for the baseline ISA and for AVX2, whose
  // vectors are twice as wide (and which has 32-bit integer max). Both give
  // the same results. The kernels' dispatch picks, so that NIBBLE_ISA=scalar
  // reaches the baseline loops too.
  const bool avx2 = cpu::DetectIsa() >= cpu::Isa::kAvx2;
  const auto group_maxima =
      avx2 ? GroupMaximaAvx2<Element> : GroupMaximaBaseline<Element>;
  const auto group_codes =
      avx2 ? GroupCodesAvx2<Element> : GroupCodesBaseline<Element>;
  std::vector<GroupMaxBits> maxima(spec.groups());
  for (int64_t col = 0; col < spec.n; ++col) {
    const Element* row = row_at(col);
    group_maxima(row, spec.k, spec.group_size, maxima.data());
    for (int64_t group = 0; group < spec.groups(); ++group) {
      const Element* values = row + group * spec.group_size;
      const auto [positive_max, negative_max] = maxima[group];
      constexpr int32_t kInfinityBits = 0x7f800000;
      if (std::max(positive_max, negative_max) >= kInfinityBits) {
        const int64_t i =
            std::find_if(
                values, values + spec.group_size,
                [](Element v) { return !std::isfinite(ElementToFloat(v)); }) -
            row;
        return absl::InvalidArgumentError(absl::StrCat(
            tensor.name, "[", col, ", ", i, "] is ", ElementToFloat(row[i]),
            ": only finite weights can be quantized"));
      }
      const double lo =
          negative_max == 0 ? 0.0 : -std::bit_cast<float>(negative_max);
      const double hi = std::bit_cast<float>(positive_max);
      if (absl::Status s =
              visit(col, group, values, GroupRange{lo, hi}, group_codes);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

// ForEachGroupOfRows over the rows of a float layer's [N, K] tensor: bf16
// rows where they lie, others converted to float one at a time.
template <typename Visit>
absl::Status ForEachFloatGroup(const SafetensorsFile& file,
                               const TensorInfo& tensor, const WeightSpec& spec,
                               Visit visit) {
  const DType dtype = FloatDType(tensor.dtype);
  const uint8_t* data = file.Data(tensor).data();
  const int64_t row_bytes = spec.k * DTypeSize(dtype);
  if (dtype == DType::kBF16) {
    return ForEachGroupOfRows<uint16_t>(
        tensor, spec,
        [&](int64_t col) {
          return reinterpret_cast<const uint16_t*>(data + col * row_bytes);
        },
        visit);
  }
  std::vector<float> row(spec.k);
  return ForEachGroupOfRows<float>(
      tensor, spec,
      [&](int64_t col) {
        ConvertToFloat(dtype, data + col * row_bytes, spec.k, row.data());
        return row.data();
      },
      visit);
}

// The spec a quantization of the float layer gives, with the global scale
// where the format has one, after checking every element and every group's
// scale.
absl::StatusOr<WeightSpec> CheckFloatValues(const SafetensorsFile& file,
                                            const TensorInfo& tensor,
                                            WeightSpec spec) {
  double amax = 0;
  // 8-bit scales cannot overflow; fp16 ones can, but not below an ideal
  // scale (extent / divisor) of 2^15: rounded and stepped up, it stays under
  // 65504. So ChooseScale need only look at the rare larger groups.
  const double largest_safe_extent =
      HasEightBitScales(spec.format) ? std::numeric_limits<double>::infinity()
                                     : 0x1p15 * ScaleDivisor(spec.format);
  if (absl::Status s = ForEachFloatGroup(
          file, tensor, spec,
          [&](int64_t col, int64_t group, const auto*, const GroupRange& range,
              auto) -> absl::Status {
            amax = std::max(amax, range.absmax());
            if (Extent(spec.format, range) <= largest_safe_extent) {
              return absl::OkStatus();
            }
            return ChooseScale(spec, range, tensor, col, group).status();
          });
      !s.ok()) {
    return s;
  }
  if (HasGlobalScale(spec.format)) {
    spec.global_scale = E4m3GlobalScale(amax);
  }
  return spec;
}

}  // namespace

absl::StatusOr<const TensorInfo*> CheckFloatTensor(const SafetensorsFile& file,
                                                   absl::string_view prefix) {
  const std::string name = absl::StrCat(prefix, ".weight");
  const TensorInfo* weight = file.Find(name);
  if (weight == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is missing from ", file.source_name(),
                     ": a float layer needs its weight"));
  }
  if (absl::Status s =
          CheckDtype(*weight, {SafetensorsDtype::kF16, SafetensorsDtype::kBF16,
                               SafetensorsDtype::kF32});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckRank(*weight, 2); !s.ok()) return s;
  return weight;
}

absl::StatusOr<WeightSpec> CheckFloatSpec(const SafetensorsFile& file,
                                          absl::string_view prefix,
                                          WeightFormat format,
                                          int64_t group_size) {
  absl::StatusOr<const TensorInfo*> tensor = CheckFloatTensor(file, prefix);
  if (!tensor.ok()) return tensor.status();
  const TensorInfo& info = **tensor;
  // nn.Linear stores [out_features, in_features] = [N, K].
  const WeightSpec spec{format, info.shape[1], info.shape[0], group_size};
  if (absl::Status s = CheckSpec(
          spec, absl::StrCat(Described(info), " ([N, K]) and group size ",
                             group_size));
      !s.ok()) {
    return s;
  }
  return spec;
}

absl::StatusOr<WeightSpec> CheckFloatWeight(const SafetensorsFile& file,
                                            absl::string_view prefix,
                                            WeightFormat format,
                                            int64_t group_size) {
  absl::StatusOr<WeightSpec> spec =
      CheckFloatSpec(file, prefix, format, group_size);
  if (!spec.ok()) return spec.status();
  return CheckFloatValues(file, *file.Find(absl::StrCat(prefix, ".weight")),
                          *spec);
}

absl::StatusOr<QuantizedWeight> QuantizeFloatWeight(const SafetensorsFile& file,
                                                    absl::string_view prefix,
                                                    WeightFormat format,
                                                    int64_t group_size) {
  absl::StatusOr<WeightSpec> checked =
      CheckFloatSpec(file, prefix, format, group_size);
  if (!checked.ok()) return checked.status();
  const TensorInfo& tensor = *file.Find(absl::StrCat(prefix, ".weight"));
  WeightSpec spec = *checked;
  // A global scale needs the whole tensor's amax first.
  if (HasGlobalScale(format)) {
    absl::StatusOr<WeightSpec> with_global_scale =
        CheckFloatValues(file, tensor, spec);
    if (!with_global_scale.ok()) return with_global_scale.status();
    spec = *with_global_scale;
  }

  QuantizedWeight weight;
  weight.spec = spec;
  const int64_t words_per_column = spec.k / kCodesPerWord;
  ReserveBulk(weight.qweight, words_per_column * spec.n);
  weight.qweight.resize(words_per_column * spec.n);
  weight.scales.resize(spec.groups() * spec.n);
  weight.zeros.resize(spec.zeros_bytes());
  // The codes of kBlockColumns columns at a time gather in `block`, [K/8,
  // kBlockColumns], and go to qweight a cache line per row of words: written
  // straight to qweight, every word would touch a line (and often a page) of
  // its own.
  constexpr int64_t kBlockColumns = 16;
  std::vector<uint32_t> block(words_per_column * kBlockColumns);
  const int64_t words_per_group = spec.group_size / kCodesPerWord;
  std::vector<uint8_t> codes(spec.group_size);
  // A column's codes wait until all its scales are chosen: choosing one is a
  // chain of dependent steps, which overlap from one group to the next.
  std::vector<GroupScale> column_scales(spec.groups());
  // What int codes add (the zero point; 0 for FP4 codes), which is also the
  // code of zero, set per group below where the format has zero points.
  std::vector<int> column_zeros(spec.groups(), EffectiveZero(spec.format, 0));
  if (absl::Status s = ForEachFloatGroup(
          file, tensor, spec,
          [&](int64_t col, int64_t group, const auto* values,
              const GroupRange& range, auto group_codes) -> absl::Status {
            absl::StatusOr<GroupScale> scale =
                ChooseScale(spec, range, tensor, col, group);
            if (!scale.ok()) return scale.status();
            const int64_t index = group * spec.n + col;
            weight.scales[index] = scale->slot;
            column_scales[group] = *scale;
            if (HasZeros(spec.format)) {
              const int zero =
                  scale->s == 0
                      ? 0
                      : static_cast<int>(RoundHalfEven(-range.lo / scale->s));
              weight.zeros[index] = static_cast<uint8_t>(zero);
              column_zeros[group] = zero;
            }
            if (group < spec.groups() - 1) return absl::OkStatus();
            const auto* row = values - group * spec.group_size;
            const int64_t block_col = col % kBlockColumns;
            for (int64_t g = 0; g < spec.groups(); ++g) {
              group_codes(spec.format, row + g * spec.group_size,
                          spec.group_size, column_scales[g], column_zeros[g],
                          codes.data(),
                          block.data() + g * words_per_group * kBlockColumns +
                              block_col,
                          kBlockColumns);
            }
            if (block_col == kBlockColumns - 1 || col == spec.n - 1) {
              // Whole blocks copy a constant size: a few vector moves
              // rather than a call (or rep movs) per row.
              const int64_t first_col = col - block_col;
              const auto copy_block = [&](size_t bytes) {
                for (int64_t w = 0; w < words_per_column; ++w) {
                  std::memcpy(weight.qweight.data() + w * spec.n + first_col,
                              block.data() + w * kBlockColumns, bytes);
                }
              };
              if (block_col == kBlockColumns - 1) {
                copy_block(kBlockColumns * sizeof(uint32_t));
              } else {
                copy_block((block_col + 1) * sizeof(uint32_t));
              }
            }
            return absl::OkStatus();
          });
      !s.ok()) {
    return s;
  }
  return weight;
}

}  // namespace nibble::checkpoint
