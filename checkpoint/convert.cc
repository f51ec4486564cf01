#include "checkpoint/convert.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "kernels/dequant.h"
#include "kernels/dtype.h"

namespace nibble::checkpoint {
namespace {

constexpr uint16_t kHalfExponentBits = 0x7c00;
constexpr uint16_t kLargestHalfBits = 0x7bff;  // 65504
constexpr double kLargestHalf = 65504.0;

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// "NAME [d0, d1]", for messages that compare two tensors.
std::string Described(const TensorInfo& tensor) {
  return absl::StrCat(tensor.name, " ", ShapeString(tensor.shape));
}

absl::Status CheckDtype(const TensorInfo& tensor,
                        std::initializer_list<SafetensorsDtype> allowed) {
  std::vector<absl::string_view> names;
  for (SafetensorsDtype dtype : allowed) {
    if (tensor.dtype == dtype) return absl::OkStatus();
    names.push_back(SafetensorsDtypeName(dtype));
  }
  return absl::InvalidArgumentError(absl::StrCat(
      tensor.name, " has dtype ", SafetensorsDtypeName(tensor.dtype),
      ", expected ", absl::StrJoin(names, " or ")));
}

absl::Status CheckRank(const TensorInfo& tensor, size_t rank) {
  if (tensor.shape.size() == rank) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(tensor.name, " has shape ", ShapeString(tensor.shape),
                   ", expected ", rank, " dimension", rank == 1 ? "" : "s"));
}

// The spec's own check, with the tensors it was derived from named.
absl::Status CheckSpec(const WeightSpec& spec, absl::string_view derived_from) {
  if (absl::Status status = spec.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        derived_from, " imply K=", spec.k, ", N=", spec.n, " and group size ",
        spec.group_size, ", which nibble cannot hold: ", status.message()));
  }
  return absl::OkStatus();
}

uint32_t LoadWord(absl::Span<const uint8_t> bytes, int64_t index) {
  const uint8_t* p = bytes.data() + 4 * index;
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
         uint32_t{p[3]} << 24;
}

uint16_t LoadHalf(absl::Span<const uint8_t> bytes, int64_t index) {
  const uint8_t* p = bytes.data() + 2 * index;
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}

// The tensors of a GPTQ or AWQ layer, checked against each other, and the
// weight they describe (format still to be decided from the zero points).
struct PackedTensors {
  const TensorInfo* qweight = nullptr;
  const TensorInfo* qzeros = nullptr;
  const TensorInfo* scales = nullptr;
  const TensorInfo* g_idx = nullptr;  // GPTQ only, optional
  WeightSpec spec;
};

// Finds qweight, qzeros and scales, and checks their dtypes and ranks.
absl::StatusOr<PackedTensors> FindPackedTensors(const SafetensorsFile& file,
                                                absl::string_view prefix) {
  PackedTensors tensors;
  for (auto [field, suffix] : {std::pair{&tensors.qweight, "qweight"},
                               {&tensors.qzeros, "qzeros"},
                               {&tensors.scales, "scales"}}) {
    const std::string name = absl::StrCat(prefix, ".", suffix);
    *field = file.Find(name);
    if (*field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " is missing from ", file.source_name(),
          ": a GPTQ or AWQ layer needs qweight, qzeros and scales"));
    }
  }
  for (const TensorInfo* packed : {tensors.qweight, tensors.qzeros}) {
    if (absl::Status s = CheckDtype(
            *packed, {SafetensorsDtype::kI32, SafetensorsDtype::kU32});
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CheckDtype(*tensors.scales, {SafetensorsDtype::kF16});
      !s.ok()) {
    return s;
  }
  for (const TensorInfo* tensor :
       {tensors.qweight, tensors.qzeros, tensors.scales}) {
    if (absl::Status s = CheckRank(*tensor, 2); !s.ok()) return s;
  }
  return tensors;
}

// Bits per value that a packed dimension of `packed` int32 words holds for
// `values` values, when that is one of GPTQ's other widths (2, 3 or 8).
std::optional<int64_t> OtherGptqBits(int64_t packed, int64_t values) {
  if (values <= 0 || packed * 32 % values != 0) return std::nullopt;
  const int64_t bits = packed * 32 / values;
  if (bits == 2 || bits == 3 || bits == 8) return bits;
  return std::nullopt;
}

// Checks that qzeros is [groups, N/8], where scales is [groups, N].
absl::Status CheckPackedZeros(const PackedTensors& tensors) {
  const TensorInfo& scales = *tensors.scales;
  const TensorInfo& qzeros = *tensors.qzeros;
  const int64_t n = scales.shape[1];
  if (n % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Described(scales), " has N=", n,
        " columns, not a multiple of 8 as packing 8 zero points per word in ",
        qzeros.name, " needs"));
  }
  if (qzeros.shape[0] != scales.shape[0] || qzeros.shape[1] != n / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(Described(qzeros), " does not match ", Described(scales),
                     ": with ", scales.shape[0], " groups and N=", n,
                     " it should be [", scales.shape[0], ", ", n / 8, "]"));
  }
  return absl::OkStatus();
}

// Checks that scales' row count divides K evenly, and the spec they imply.
absl::StatusOr<WeightSpec> GroupedSpec(const PackedTensors& tensors, int64_t k,
                                       int64_t n) {
  const int64_t groups = tensors.scales->shape[0];
  if (groups <= 0 || k % groups != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Described(*tensors.scales), " has ", groups, " groups but ",
        Described(*tensors.qweight), " implies K=", k, ", which ", groups,
        " groups of equal size cannot cover"));
  }
  WeightSpec spec{WeightFormat::kU4, k, n, k / groups};
  if (absl::Status s =
          CheckSpec(spec, absl::StrCat(Described(*tensors.qweight), " and ",
                                       Described(*tensors.scales)));
      !s.ok()) {
    return s;
  }
  return spec;
}

absl::StatusOr<PackedTensors> CheckGptqTensors(const SafetensorsFile& file,
                                               absl::string_view prefix) {
  absl::StatusOr<PackedTensors> tensors = FindPackedTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  const TensorInfo& qweight = *tensors->qweight;
  const TensorInfo& qzeros = *tensors->qzeros;
  const TensorInfo& scales = *tensors->scales;
  tensors->g_idx = file.Find(absl::StrCat(prefix, ".g_idx"));
  const int64_t n = scales.shape[1];
  if (qweight.shape[1] != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        Described(qweight), " and ", Described(scales),
        " disagree on N: GPTQ stores qweight [K/8, N] and scales [groups, N]"));
  }
  // Other widths pack 32/bits values per word: the zero points show it.
  if (std::optional<int64_t> bits = OtherGptqBits(qzeros.shape[1], n);
      bits.has_value() && qzeros.shape[0] == scales.shape[0]) {
    return absl::UnimplementedError(absl::StrCat(
        Described(qzeros), " packs ", n, " zero points per group into ",
        qzeros.shape[1], " words, ", *bits, " bits each: only 4-bit GPTQ (",
        n / 8, " words) can be imported"));
  }
  if (absl::Status s = CheckPackedZeros(*tensors); !s.ok()) return s;
  const int64_t k = qweight.shape[0] * 8;
  if (const TensorInfo* g_idx = tensors->g_idx; g_idx != nullptr) {
    if (absl::Status s = CheckDtype(*g_idx, {SafetensorsDtype::kI32});
        !s.ok()) {
      return s;
    }
    if (absl::Status s = CheckRank(*g_idx, 1); !s.ok()) return s;
    if (g_idx->shape[0] != k) {
      if (std::optional<int64_t> bits =
              OtherGptqBits(qweight.shape[0], g_idx->shape[0])) {
        return absl::UnimplementedError(
            absl::StrCat(Described(qweight), " packs the K=", g_idx->shape[0],
                         " rows of ", Described(*g_idx), " at ", *bits,
                         " bits each: only 4-bit GPTQ can be imported"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat(Described(*g_idx), " should be [", k,
                       "]: ", Described(qweight), " implies K=", k));
    }
  }
  absl::StatusOr<WeightSpec> spec = GroupedSpec(*tensors, k, n);
  if (!spec.ok()) return spec.status();
  tensors->spec = *spec;
  return tensors;
}

absl::StatusOr<PackedTensors> CheckAwqTensors(const SafetensorsFile& file,
                                              absl::string_view prefix) {
  absl::StatusOr<PackedTensors> tensors = FindPackedTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  const TensorInfo& qweight = *tensors->qweight;
  const TensorInfo& scales = *tensors->scales;
  if (absl::Status s = CheckPackedZeros(*tensors); !s.ok()) return s;
  const int64_t n = scales.shape[1];
  if (qweight.shape[1] != n / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(Described(qweight), " should be [", qweight.shape[0], ", ",
                     n / 8, "]: AWQ stores qweight [K, N/8] and ",
                     Described(scales), " has N=", n));
  }
  absl::StatusOr<WeightSpec> spec = GroupedSpec(*tensors, qweight.shape[0], n);
  if (!spec.ok()) return spec.status();
  tensors->spec = *spec;
  return tensors;
}

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

// Copies the fp16 scales, refusing NaN and infinity: a scale that is not
// finite would spoil every product with its group.
absl::StatusOr<std::vector<uint16_t>> ReadScales(const SafetensorsFile& file,
                                                 const TensorInfo& scales) {
  const absl::Span<const uint8_t> bytes = file.Data(scales);
  const int64_t n = scales.shape[1];
  std::vector<uint16_t> result(scales.num_elements());
  for (size_t i = 0; i < result.size(); ++i) {
    result[i] = LoadHalf(bytes, i);
    if ((result[i] & kHalfExponentBits) == kHalfExponentBits) {
      return absl::InvalidArgumentError(
          absl::StrCat(scales.name, "[", i / n, ", ", i % n, "] is ",
                       (result[i] & 0x3ff) != 0 ? "NaN" : "infinite",
                       absl::StrFormat(" (fp16 bits 0x%04x)", result[i]),
                       ": scales must be finite"));
    }
  }
  return result;
}

// The 4-bit value of column `col` in a row of words that pack 8 columns
// each, nibble j of word c holding column 8c + column_of_nibble[j].
uint8_t UnpackColumn(absl::Span<const uint8_t> bytes, int64_t row_start_word,
                     int64_t col, const int (&nibble_of_column)[8]) {
  const uint32_t word = LoadWord(bytes, row_start_word + col / 8);
  return (word >> (4 * nibble_of_column[col % 8])) & 0xfu;
}

constexpr int kIdentityNibbles[8] = {0, 1, 2, 3, 4, 5, 6, 7};
// The inverse of kAwqNibbleColumn (AutoAWQ's AWQ_REVERSE_ORDER).
constexpr int kAwqNibbleOfColumn[8] = {0, 4, 1, 5, 2, 6, 3, 7};

constexpr bool IsAwqInverse() {
  for (int nibble = 0; nibble < 8; ++nibble) {
    if (kAwqNibbleOfColumn[kAwqNibbleColumn[nibble]] != nibble) return false;
  }
  return true;
}
static_assert(IsAwqInverse());

// Reads g_idx and returns the stable order of rows by group, or an empty
// vector when the groups are already k / group_size.
absl::StatusOr<std::vector<int64_t>> GptqRowOrder(const SafetensorsFile& file,
                                                  const TensorInfo& g_idx,
                                                  const WeightSpec& spec) {
  const absl::Span<const uint8_t> bytes = file.Data(g_idx);
  std::vector<int64_t> group_of_row(spec.k);
  std::vector<int64_t> rows_in_group(spec.groups(), 0);
  bool trivial = true;
  for (int64_t row = 0; row < spec.k; ++row) {
    const int64_t group = static_cast<int32_t>(LoadWord(bytes, row));
    if (group < 0 || group >= spec.groups()) {
      return absl::InvalidArgumentError(
          absl::StrCat(g_idx.name, "[", row, "] is ", group, ", outside the ",
                       spec.groups(), " groups of the scales"));
    }
    group_of_row[row] = group;
    ++rows_in_group[group];
    trivial = trivial && group == row / spec.group_size;
  }
  if (trivial) return std::vector<int64_t>();
  for (int64_t group = 0; group < spec.groups(); ++group) {
    if (rows_in_group[group] != spec.group_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          g_idx.name, " puts ", rows_in_group[group], " rows in group ", group,
          ", but making groups contiguous needs K / groups = ", spec.group_size,
          " rows in every group"));
    }
  }
  // Counting sort: group g's rows go to [g * group_size, (g+1) * group_size).
  std::vector<int64_t> next_slot(spec.groups());
  for (int64_t group = 0; group < spec.groups(); ++group) {
    next_slot[group] = group * spec.group_size;
  }
  std::vector<int64_t> order(spec.k);
  for (int64_t row = 0; row < spec.k; ++row) {
    order[next_slot[group_of_row[row]]++] = row;
  }
  return order;
}

// --- Quantization of float weights.

double RoundHalfEven(double x) { return std::nearbyint(x); }

// The fp16 nearest to x in (0, 65504], ties to even. Going through float
// rounds twice, which can miss by one step, so the neighbours are compared.
uint16_t NearestHalf(double x) {
  const uint16_t first = FloatToHalf(static_cast<float>(x));
  uint16_t best = first;
  for (int candidate : {first - 1, first + 1}) {
    if (candidate < 0 || candidate > kLargestHalfBits) continue;
    const double error =
        std::abs(HalfToFloat(static_cast<uint16_t>(candidate)) - x);
    const double best_error = std::abs(HalfToFloat(best) - x);
    if (error < best_error || (error == best_error && candidate % 2 == 0)) {
      best = static_cast<uint16_t>(candidate);
    }
  }
  return best;
}

// The E2M1 code whose value is nearest to x, ties to the even code (even
// mantissa); +0 for values that round to zero.
uint8_t NearestFp4Code(double x) {
  const double magnitude = std::abs(x);
  uint8_t best = 0;
  for (uint8_t code = 1; code < 8; ++code) {
    const double error = std::abs(Fp4CodeToFloat(code) - magnitude);
    const double best_error = std::abs(Fp4CodeToFloat(best) - magnitude);
    if (error < best_error || (error == best_error && code % 2 == 0)) {
      best = code;
    }
  }
  return (x < 0 && best != 0) ? (best | 0x8) : best;
}

// One group of one column: its values' extremes, and what they quantize to.
struct GroupRange {
  double lo = 0;  // min(min w, 0)
  double hi = 0;  // max(max w, 0)
  double absmax() const { return std::max(hi, -lo); }
};

// The codes quantization may use without clamping, in units of the scale.
double ScaleDivisor(WeightFormat format) {
  switch (format) {
    case WeightFormat::kFp4:
      return 6;
    case WeightFormat::kU4b8:
      return 7;
    case WeightFormat::kU4:
      return 15;
  }
  return 0;
}

double Extent(WeightFormat format, const GroupRange& range) {
  return format == WeightFormat::kU4 ? range.hi - range.lo : range.absmax();
}

// Whether scale s would leave one of the group's extremes outside the codes.
bool ScaleClamps(WeightFormat format, const GroupRange& range, double s) {
  if (s == 0) return true;
  switch (format) {
    case WeightFormat::kFp4:
      return range.absmax() / s > 6;
    case WeightFormat::kU4b8:
      return RoundHalfEven(range.absmax() / s) > 7;
    case WeightFormat::kU4:
      return RoundHalfEven(range.hi / s) + RoundHalfEven(-range.lo / s) > 15;
  }
  return true;
}

// Quantizes column `col` of B from `values`, the column's K inputs, group by
// group (the rules are in the header).
absl::Status QuantizeColumn(absl::Span<const float> values, int64_t col,
                            const TensorInfo& tensor, QuantizedWeight& weight) {
  const WeightSpec& spec = weight.spec;
  for (int64_t group = 0; group < spec.groups(); ++group) {
    const absl::Span<const float> inputs =
        values.subspan(group * spec.group_size, spec.group_size);
    GroupRange range;
    for (float w : inputs) {
      range.lo = std::min<double>(range.lo, w);
      range.hi = std::max<double>(range.hi, w);
    }
    const double extent = Extent(spec.format, range);
    const int64_t scale_index = group * spec.n + col;
    if (extent == 0) {
      weight.scales[scale_index] = 0;
      const uint8_t zero_code = spec.format == WeightFormat::kU4b8 ? 8 : 0;
      for (int64_t i = 0; i < spec.group_size; ++i) {
        weight.SetCode(group * spec.group_size + i, col, zero_code);
      }
      continue;
    }
    const double ideal_scale = extent / ScaleDivisor(spec.format);
    uint16_t scale_bits = ideal_scale > kLargestHalf ? kHalfExponentBits
                                                     : NearestHalf(ideal_scale);
    if (scale_bits < kHalfExponentBits &&
        ScaleClamps(spec.format, range, HalfToFloat(scale_bits))) {
      ++scale_bits;
    }
    if (scale_bits >= kHalfExponentBits) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the values of row %d, columns %d..%d span [%g, %g], which "
          "need a scale of %g for %s, beyond fp16's largest, 65504",
          tensor.name, col, group * spec.group_size,
          (group + 1) * spec.group_size - 1, range.lo, range.hi, ideal_scale,
          WeightFormatName(spec.format)));
    }
    weight.scales[scale_index] = scale_bits;
    const double s = HalfToFloat(scale_bits);
    const int zero = spec.format == WeightFormat::kU4
                         ? static_cast<int>(RoundHalfEven(-range.lo / s))
                         : 8;
    if (spec.format == WeightFormat::kU4) weight.zeros[scale_index] = zero;
    for (int64_t i = 0; i < spec.group_size; ++i) {
      const double scaled = inputs[i] / s;
      const uint8_t code =
          spec.format == WeightFormat::kFp4
              ? NearestFp4Code(scaled)
              : static_cast<uint8_t>(RoundHalfEven(scaled) + zero);
      weight.SetCode(group * spec.group_size + i, col, code);
    }
  }
  return absl::OkStatus();
}

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

}  // namespace

absl::string_view CheckpointLayoutName(CheckpointLayout layout) {
  switch (layout) {
    case CheckpointLayout::kGptq:
      return "gptq";
    case CheckpointLayout::kAwq:
      return "awq";
    case CheckpointLayout::kFloat:
      return "float";
  }
  return "unknown";
}

absl::StatusOr<CheckpointLayout> DetectLayout(const SafetensorsFile& file,
                                              absl::string_view prefix) {
  const TensorInfo* qweight = file.Find(absl::StrCat(prefix, ".qweight"));
  if (qweight == nullptr) {
    if (file.Find(absl::StrCat(prefix, ".weight")) == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("neither ", prefix, ".qweight (GPTQ, AWQ) nor ", prefix,
                       ".weight (floats) is in ", file.source_name()));
    }
    absl::StatusOr<const TensorInfo*> weight = CheckFloatTensor(file, prefix);
    if (!weight.ok()) return weight.status();
    return CheckpointLayout::kFloat;
  }
  absl::StatusOr<PackedTensors> tensors = FindPackedTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  const int64_t qweight_columns = tensors->qweight->shape[1];
  const int64_t n = tensors->scales->shape[1];
  if (file.Find(absl::StrCat(prefix, ".g_idx")) != nullptr ||
      qweight_columns == n) {
    absl::StatusOr<PackedTensors> gptq = CheckGptqTensors(file, prefix);
    if (!gptq.ok()) return gptq.status();
    return CheckpointLayout::kGptq;
  }
  if (qweight_columns * 8 == n) {
    absl::StatusOr<PackedTensors> awq = CheckAwqTensors(file, prefix);
    if (!awq.ok()) return awq.status();
    return CheckpointLayout::kAwq;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      Described(*tensors->qweight), " fits neither GPTQ nor AWQ with ",
      Described(*tensors->scales), ": GPTQ's qweight [K/8, N] would have ", n,
      " columns, AWQ's [K, N/8] would have N/8 = ", n / 8));
}

absl::StatusOr<GptqWeight> ConvertGptqWeight(
    const SafetensorsFile& file, absl::string_view prefix,
    GptqZeroConvention zero_convention) {
  absl::StatusOr<PackedTensors> tensors = CheckGptqTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  const WeightSpec& spec = tensors->spec;

  QuantizedWeight checkpoint_order;
  checkpoint_order.spec = spec;
  absl::StatusOr<std::vector<uint16_t>> scales =
      ReadScales(file, *tensors->scales);
  if (!scales.ok()) return scales.status();
  checkpoint_order.scales = *std::move(scales);

  // v1 stores zero - 1; a stored 15 is zero 16, out of 4 bits.
  const int zero_offset = zero_convention == GptqZeroConvention::kV1 ? 1 : 0;
  const absl::Span<const uint8_t> qzeros = file.Data(*tensors->qzeros);
  checkpoint_order.zeros.resize(spec.groups() * spec.n);
  bool all_eight = true;
  for (int64_t group = 0; group < spec.groups(); ++group) {
    for (int64_t col = 0; col < spec.n; ++col) {
      const int stored =
          UnpackColumn(qzeros, group * (spec.n / 8), col, kIdentityNibbles);
      const int zero = stored + zero_offset;
      if (zero > 15) {
        return absl::InvalidArgumentError(absl::StrCat(
            tensors->qzeros->name, " stores 15 for column ", col, ", group ",
            group,
            ": under the v1 convention (stored = zero point - 1) that is zero "
            "point 16, beyond 4 bits. AutoGPTQ writes this for a true zero "
            "point of 0, corrupting the rest of the word; if the checkpoint "
            "is gptq_v2 (stored = zero point), use GptqZeroConvention::kV2"));
      }
      checkpoint_order.zeros[group * spec.n + col] = zero;
      all_eight = all_eight && zero == 8;
    }
  }
  if (all_eight) {
    checkpoint_order.spec.format = WeightFormat::kU4b8;
    checkpoint_order.zeros.clear();
  }

  const absl::Span<const uint8_t> qweight = file.Data(*tensors->qweight);
  checkpoint_order.qweight.resize(spec.k / kCodesPerWord * spec.n);
  for (size_t i = 0; i < checkpoint_order.qweight.size(); ++i) {
    checkpoint_order.qweight[i] = LoadWord(qweight, i);
  }

  GptqWeight result;
  if (tensors->g_idx != nullptr) {
    absl::StatusOr<std::vector<int64_t>> order =
        GptqRowOrder(file, *tensors->g_idx, spec);
    if (!order.ok()) return order.status();
    result.activation_order = *std::move(order);
  }
  if (result.activation_order.empty()) {
    result.weight = std::move(checkpoint_order);
    return result;
  }
  result.weight = checkpoint_order;
  for (int64_t row = 0; row < spec.k; ++row) {
    for (int64_t col = 0; col < spec.n; ++col) {
      result.weight.SetCode(
          row, col, checkpoint_order.Code(result.activation_order[row], col));
    }
  }
  return result;
}

absl::StatusOr<QuantizedWeight> ConvertAwqWeight(const SafetensorsFile& file,
                                                 absl::string_view prefix) {
  absl::StatusOr<PackedTensors> tensors = CheckAwqTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  const WeightSpec& spec = tensors->spec;

  QuantizedWeight weight;
  weight.spec = spec;
  absl::StatusOr<std::vector<uint16_t>> scales =
      ReadScales(file, *tensors->scales);
  if (!scales.ok()) return scales.status();
  weight.scales = *std::move(scales);

  const int64_t words_per_row = spec.n / 8;
  const absl::Span<const uint8_t> qzeros = file.Data(*tensors->qzeros);
  weight.zeros.resize(spec.groups() * spec.n);
  for (int64_t group = 0; group < spec.groups(); ++group) {
    for (int64_t col = 0; col < spec.n; ++col) {
      weight.zeros[group * spec.n + col] =
          UnpackColumn(qzeros, group * words_per_row, col, kAwqNibbleOfColumn);
    }
  }

  const absl::Span<const uint8_t> qweight = file.Data(*tensors->qweight);
  weight.qweight.assign(spec.k / kCodesPerWord * spec.n, 0);
  for (int64_t row = 0; row < spec.k; ++row) {
    for (int64_t col = 0; col < spec.n; ++col) {
      weight.SetCode(
          row, col,
          UnpackColumn(qweight, row * words_per_row, col, kAwqNibbleOfColumn));
    }
  }
  return weight;
}

absl::StatusOr<QuantizedWeight> QuantizeFloatWeight(const SafetensorsFile& file,
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

  std::vector<float> values(info.num_elements());
  ConvertToFloat(FloatDType(info.dtype), file.Data(info).data(), values.size(),
                 values.data());
  for (size_t i = 0; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(info.name, "[", i / spec.k, ", ", i % spec.k, "] is ",
                       values[i], ": only finite weights can be quantized"));
    }
  }

  QuantizedWeight weight;
  weight.spec = spec;
  weight.qweight.assign(spec.k / kCodesPerWord * spec.n, 0);
  weight.scales.assign(spec.groups() * spec.n, 0);
  weight.zeros.assign(spec.zeros_bytes(), 0);
  // Row n of the tensor is column n of B, its groups contiguous.
  for (int64_t col = 0; col < spec.n; ++col) {
    const absl::Span<const float> column =
        absl::MakeConstSpan(values).subspan(col * spec.k, spec.k);
    if (absl::Status s = QuantizeColumn(column, col, info, weight); !s.ok()) {
      return s;
    }
  }
  return weight;
}

}  // namespace nibble::checkpoint
