#include "checkpoint/convert.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "base/bulk_allocator.h"
#include "format/dequant.h"
#include "format/dtype.h"
#include "format/fp4_columns.h"

namespace nibble::checkpoint {
namespace {

constexpr uint16_t kHalfExponentBits = 0x7c00;
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

// Sets each field to the tensor PREFIX.<suffix>; INVALID_ARGUMENT naming the
// first one missing, followed by `needs` (what such a layer holds).
absl::Status FindLayerTensors(
    const SafetensorsFile& file, absl::string_view prefix,
    std::initializer_list<std::pair<const TensorInfo**, absl::string_view>>
        fields,
    absl::string_view needs) {
  for (const auto& [field, suffix] : fields) {
    const std::string name = absl::StrCat(prefix, ".", suffix);
    *field = file.Find(name);
    if (*field == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          name, " is missing from ", file.source_name(), ": ", needs));
    }
  }
  return absl::OkStatus();
}

// Finds qweight, qzeros and scales, and checks their dtypes and ranks.
absl::StatusOr<PackedTensors> FindPackedTensors(const SafetensorsFile& file,
                                                absl::string_view prefix) {
  PackedTensors tensors;
  if (absl::Status s = FindLayerTensors(
          file, prefix,
          {{&tensors.qweight, "qweight"},
           {&tensors.qzeros, "qzeros"},
           {&tensors.scales, "scales"}},
          "a GPTQ or AWQ layer needs qweight, qzeros and scales");
      !s.ok()) {
    return s;
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

// The tensors of an MXFP4 layer, checked against each other.
struct Mxfp4Tensors {
  const TensorInfo* blocks = nullptr;
  const TensorInfo* scales = nullptr;
  // The dimensions before [N, K/32, 16]: one weight per index.
  std::vector<int64_t> expert_dims;
  int64_t experts = 1;
  WeightSpec spec;
};

// PREFIX_blocks (Hugging Face's name) or PREFIX.blocks (gpt-oss' original
// checkpoint), or nullptr.
const TensorInfo* FindMxfp4Blocks(const SafetensorsFile& file,
                                  absl::string_view prefix) {
  const TensorInfo* blocks = file.Find(absl::StrCat(prefix, "_blocks"));
  return blocks != nullptr ? blocks
                           : file.Find(absl::StrCat(prefix, ".blocks"));
}

absl::StatusOr<Mxfp4Tensors> CheckMxfp4Tensors(const SafetensorsFile& file,
                                               absl::string_view prefix) {
  Mxfp4Tensors tensors;
  tensors.blocks = FindMxfp4Blocks(file, prefix);
  if (tensors.blocks == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "_blocks is missing from ", file.source_name(),
                     ": an MXFP4 layer needs its blocks and scales"));
  }
  const TensorInfo& blocks = *tensors.blocks;
  // The scales go by the same separator as the blocks.
  const std::string scales_name = absl::StrCat(
      blocks.name.substr(0, blocks.name.size() - std::string("blocks").size()),
      "scales");
  tensors.scales = file.Find(scales_name);
  if (tensors.scales == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        scales_name, " is missing from ", file.source_name(), ": ", blocks.name,
        " holds MXFP4 codes, which need their E8M0 scales"));
  }
  const TensorInfo& scales = *tensors.scales;
  if (absl::Status s = CheckDtype(blocks, {SafetensorsDtype::kU8}); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDtype(
          scales, {SafetensorsDtype::kU8, SafetensorsDtype::kF8E8M0});
      !s.ok()) {
    return s;
  }
  const size_t rank = blocks.shape.size();
  if (rank < 3 || blocks.shape[rank - 1] != 16) {
    return absl::InvalidArgumentError(absl::StrCat(
        Described(blocks),
        " should be [..., N, K/32, 16]: 16 bytes of two FP4 codes each for "
        "every group of 32 values along K"));
  }
  const std::vector<int64_t> want_scales(blocks.shape.begin(),
                                         blocks.shape.end() - 1);
  if (scales.shape != want_scales) {
    return absl::InvalidArgumentError(
        absl::StrCat(Described(scales), " should be ", ShapeString(want_scales),
                     ": one E8M0 scale per group of ", Described(blocks)));
  }
  tensors.expert_dims.assign(blocks.shape.begin(), blocks.shape.end() - 3);
  for (int64_t dim : tensors.expert_dims) tensors.experts *= dim;
  tensors.spec = {WeightFormat::kMxfp4, blocks.shape[rank - 2] * 32,
                  blocks.shape[rank - 3], 32};
  if (absl::Status s = CheckSpec(tensors.spec, Described(blocks)); !s.ok()) {
    return s;
  }
  return tensors;
}

// The tensors of an NVFP4 layer, checked against each other.
struct Nvfp4Tensors {
  const TensorInfo* weight = nullptr;
  const TensorInfo* scales = nullptr;
  const TensorInfo* global_scale = nullptr;
  WeightSpec spec;
};

// Checks dtypes and shapes; reads only the global scale.
absl::StatusOr<Nvfp4Tensors> CheckNvfp4Tensors(const SafetensorsFile& file,
                                               absl::string_view prefix) {
  Nvfp4Tensors tensors;
  if (absl::Status s = FindLayerTensors(
          file, prefix,
          {{&tensors.weight, "weight"},
           {&tensors.scales, "weight_scale"},
           {&tensors.global_scale, "weight_scale_2"}},
          absl::StrCat("an NVFP4 layer (U8 ", prefix,
                       ".weight) needs weight, weight_scale and "
                       "weight_scale_2"));
      !s.ok()) {
    return s;
  }
  const TensorInfo& weight = *tensors.weight;
  const TensorInfo& scales = *tensors.scales;
  const TensorInfo& global_scale = *tensors.global_scale;
  if (absl::Status s = CheckDtype(weight, {SafetensorsDtype::kU8}); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDtype(scales, {SafetensorsDtype::kF8E4M3});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckDtype(global_scale, {SafetensorsDtype::kF32});
      !s.ok()) {
    return s;
  }
  for (const TensorInfo* tensor : {&weight, &scales}) {
    if (absl::Status s = CheckRank(*tensor, 2); !s.ok()) return s;
  }
  if (global_scale.num_elements() != 1 || global_scale.shape.size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        Described(global_scale), " should be a single fp32 value ([] or [1])"));
  }
  const int64_t n = weight.shape[0];
  const int64_t k = weight.shape[1] * 2;
  if (k % 16 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Described(weight), " holds K=", k,
                     " codes per row, not a multiple of NVFP4's group of 16"));
  }
  if (scales.shape[0] != n || scales.shape[1] != k / 16) {
    return absl::InvalidArgumentError(
        absl::StrCat(Described(scales), " should be [", n, ", ", k / 16,
                     "]: one scale per 16 codes of ", Described(weight)));
  }
  float g = 0;
  std::memcpy(&g, file.Data(global_scale).data(), sizeof(g));
  if (!std::isfinite(g) || g <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(global_scale.name, " is ", g,
                     ": the global scale must be finite and positive"));
  }
  tensors.spec = {WeightFormat::kNvfp4, k, n, 16, g};
  if (absl::Status s = CheckSpec(tensors.spec, Described(weight)); !s.ok()) {
    return s;
  }
  return tensors;
}

// Refuses 8-bit scale codes [N, groups] for which `is_nan` holds.
// `index_prefix` starts the index of a code in `tensor` ("3, " for expert 3
// of a 3-D tensor).
template <typename IsNan>
absl::Status CheckScaleCodes(const TensorInfo& tensor,
                             absl::string_view index_prefix,
                             const uint8_t* codes, int64_t groups, int64_t n,
                             IsNan is_nan) {
  const uint8_t* end = codes + groups * n;
  if (AnyBranchFree(absl::MakeConstSpan(codes, end), is_nan)) {
    const int64_t i = std::find_if(codes, end, is_nan) - codes;
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s[%s%d, %d] is NaN (code 0x%02x): scales must be finite", tensor.name,
        index_prefix, i / groups, i % groups, codes[i]));
  }
  return absl::OkStatus();
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
absl::StatusOr<std::vector<int32_t>> GptqRowOrder(const SafetensorsFile& file,
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
  if (trivial) return std::vector<int32_t>();
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
  // K is at most kMaxDimension (2^20), so every row fits in int32.
  std::vector<int32_t> order(spec.k);
  for (int64_t row = 0; row < spec.k; ++row) {
    order[next_slot[group_of_row[row]]++] = static_cast<int32_t>(row);
  }
  return order;
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

// A GPTQ layer's weight without its codes (qweight left empty): spec,
// scales, zero points (format kU4b8 when every one is 8) and the row order.
// Reads everything but qweight, so it also checks the values cheaply.
absl::StatusOr<GptqWeight> GptqWithoutCodes(
    const SafetensorsFile& file, const PackedTensors& tensors,
    GptqZeroConvention zero_convention) {
  const WeightSpec& spec = tensors.spec;
  GptqWeight result;
  QuantizedWeight& weight = result.weight;
  weight.spec = spec;
  absl::StatusOr<std::vector<uint16_t>> scales =
      ReadScales(file, *tensors.scales);
  if (!scales.ok()) return scales.status();
  weight.scales = *std::move(scales);

  // v1 stores zero - 1; a stored 15 is zero 16, out of 4 bits.
  const int zero_offset = zero_convention == GptqZeroConvention::kV1 ? 1 : 0;
  const absl::Span<const uint8_t> qzeros = file.Data(*tensors.qzeros);
  weight.zeros.resize(spec.groups() * spec.n);
  bool all_eight = true;
  for (int64_t group = 0; group < spec.groups(); ++group) {
    for (int64_t col = 0; col < spec.n; ++col) {
      const int stored =
          UnpackColumn(qzeros, group * (spec.n / 8), col, kIdentityNibbles);
      const int zero = stored + zero_offset;
      if (zero > 15) {
        return absl::InvalidArgumentError(absl::StrCat(
            tensors.qzeros->name, " stores 15 for column ", col, ", group ",
            group,
            ": under the v1 convention (stored = zero point - 1) that is "
            "zero "
            "point 16, beyond 4 bits. AutoGPTQ writes this for a true zero "
            "point of 0, corrupting the rest of the word; if the checkpoint "
            "is GPTQModel's gptq_v2 (stored = zero point), import it with "
            "nibble import --gptq_zeros=v2 or nibbled "
            "--import_gptq_zeros=v2"));
      }
      weight.zeros[group * spec.n + col] = zero;
      all_eight = all_eight && zero == 8;
    }
  }
  if (all_eight) {
    weight.spec.format = WeightFormat::kU4b8;
    weight.zeros.clear();
  }
  if (tensors.g_idx != nullptr) {
    absl::StatusOr<std::vector<int32_t>> order =
        GptqRowOrder(file, *tensors.g_idx, spec);
    if (!order.ok()) return order.status();
    result.activation_order = *std::move(order);
  }
  return result;
}

// An AWQ layer's weight without its codes: spec, scales and zero points.
absl::StatusOr<QuantizedWeight> AwqWithoutCodes(const SafetensorsFile& file,
                                                const PackedTensors& tensors) {
  const WeightSpec& spec = tensors.spec;
  QuantizedWeight weight;
  weight.spec = spec;
  absl::StatusOr<std::vector<uint16_t>> scales =
      ReadScales(file, *tensors.scales);
  if (!scales.ok()) return scales.status();
  weight.scales = *std::move(scales);
  const absl::Span<const uint8_t> qzeros = file.Data(*tensors.qzeros);
  weight.zeros.resize(spec.groups() * spec.n);
  for (int64_t group = 0; group < spec.groups(); ++group) {
    for (int64_t col = 0; col < spec.n; ++col) {
      weight.zeros[group * spec.n + col] =
          UnpackColumn(qzeros, group * (spec.n / 8), col, kAwqNibbleOfColumn);
    }
  }
  return weight;
}

// Swaps the nibbles of `a` at positions p with p & s set against those of
// `b` at p - s (s = 4, 2 or 1 nibbles): one step of a blockwise transpose.
template <int s>
void SwapNibbleBlocks(uint32_t& a, uint32_t& b) {
  constexpr uint32_t kLowBlocks = s == 4   ? 0x0000ffffu
                                  : s == 2 ? 0x00ff00ffu
                                           : 0x0f0f0f0fu;
  const uint32_t t = ((a >> (4 * s)) ^ b) & kLowBlocks;
  b ^= t;
  a ^= t << (4 * s);
}

// AWQ's qweight [K, N/8] as nibble's [K/8, N]. Eight AWQ words of rows
// 8i..8i+7 and columns 8c..8c+7 are an 8x8 matrix of nibbles (word j = row
// 8i + j, nibble p = column 8c + kAwqNibbleColumn[p]); transposed in three
// rounds of block swaps, word p becomes rows 8i..8i+7 of that column.
void RepackAwqCodes(const uint8_t* awq, int64_t k, int64_t n,
                    uint32_t* qweight) {
  const int64_t words_per_row = n / 8;
  for (int64_t i = 0; i < k / kCodesPerWord; ++i) {
    const uint8_t* rows = awq + i * kCodesPerWord * words_per_row * 4;
    uint32_t* out = qweight + i * n;
    for (int64_t c = 0; c < words_per_row; ++c) {
      uint32_t m[8];
      for (int j = 0; j < 8; ++j) {
        std::memcpy(&m[j], rows + (j * words_per_row + c) * 4, 4);
      }
      for (int j : {0, 1, 2, 3}) SwapNibbleBlocks<4>(m[j], m[j + 4]);
      for (int j : {0, 1, 4, 5}) SwapNibbleBlocks<2>(m[j], m[j + 2]);
      for (int j : {0, 2, 4, 6}) SwapNibbleBlocks<1>(m[j], m[j + 1]);
      for (int p = 0; p < 8; ++p) out[8 * c + kAwqNibbleColumn[p]] = m[p];
    }
  }
}

// --- Quantization of float weights.

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
double ScaleDivisor(WeightFormat format) {
  return format == WeightFormat::kU4     ? 15
         : format == WeightFormat::kU4b8 ? 7
                                         : 6;
}

double Extent(WeightFormat format, const GroupRange& range) {
  return format == WeightFormat::kU4 ? range.hi - range.lo : range.absmax();
}

// Whether scale s would leave one of the group's extremes outside the codes.
bool ScaleClamps(WeightFormat format, const GroupRange& range, double s) {
  if (s == 0) return true;
  switch (format) {
    case WeightFormat::kU4b8:
      return RoundHalfEven(range.absmax() / s) > 7;
    case WeightFormat::kU4:
      return RoundHalfEven(range.hi / s) + RoundHalfEven(-range.lo / s) > 15;
    default:  // FP4 codes: 6 is the largest magnitude
      return range.absmax() > 6 * s;
  }
}

// The E8M0 code of the smallest power of two s with absmax / s <= 6, at
// least 2^-127 (code 0). absmax <= FLT_MAX < 6 * 2^127 fits below code 255.
uint8_t Mxfp4ScaleCode(double absmax) {
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
uint8_t Nvfp4ScaleCode(double absmax, float global_scale) {
  constexpr uint8_t kLargestE4m3 = 0x7e;
  uint8_t code = FloatToE4m3(static_cast<float>(absmax / 6 / global_scale));
  while (code < kLargestE4m3 &&
         ScaleClamps(WeightFormat::kNvfp4, {-absmax, absmax},
                     E4m3ToFloat(code) * double{global_scale})) {
    ++code;
  }
  return code;
}

// kNvfp4's global scale for a tensor whose largest magnitude is `amax`:
// amax / (6 * 448) in fp32, stepped up while rounding leaves it too small
// for amax to fit the largest E4M3 scale; 1 for a tensor of zeros.
float Nvfp4GlobalScale(double amax) {
  if (amax == 0) return 1.0f;
  float g = std::max(static_cast<float>(amax / (6 * 448)),
                     std::numeric_limits<float>::denorm_min());
  while (amax > 6 * 448 * double{g}) {
    g = std::nextafter(g, std::numeric_limits<float>::infinity());
  }
  return g;
}

// A group's scale: the slot stored, and what a code is multiplied by (with
// kNvfp4's global scale); both 0 for a group of zeros.
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
  if (spec.format == WeightFormat::kMxfp4) {
    const uint8_t code = Mxfp4ScaleCode(extent);
    return GroupScale{code, E8m0ToFloat(code)};
  }
  if (spec.format == WeightFormat::kNvfp4) {
    const uint8_t code = Nvfp4ScaleCode(extent, spec.global_scale);
    return GroupScale{code, E4m3ToFloat(code) * double{spec.global_scale}};
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

// The per-element loops of float quantization are compiled twice: for the
// baseline ISA and for AVX2, whose vectors are twice as wide (and which has
// 32-bit integer max). Both give the same results; tests can force the
// former.
std::atomic<bool> avx2_allowed{true};

bool UseAvx2() {
  static const bool has_avx2 = __builtin_cpu_supports("avx2");
  return has_avx2 && avx2_allowed.load(std::memory_order_relaxed);
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
// `words`, as CodeWords does.
//
// Dividing in float gives the codes that dividing exactly does (and so does
// double, as the rules are written) wherever s has at most 11 significant
// bits, as fp16 and E8M0 scales do: a float v over such an s that is not
// itself a midpoint between two codes (at most 5 significant bits) lies more
// than half a float ulp away from every midpoint, so rounding the quotient to
// float never moves it onto or across one. kNvfp4's scales, E4M3 times the
// global scale, have up to 28 bits and divide in double.
template <typename Element>
[[gnu::always_inline]] inline void GroupCodesBody(
    WeightFormat format, const Element* values, int64_t count,
    const GroupScale& scale, int zero, uint8_t* codes, uint32_t* words,
    int64_t stride) {
  const bool fp4 = HasFp4Codes(format);
  if (scale.s == 0) {
    std::fill_n(codes, count, format == WeightFormat::kU4b8 ? 8 : 0);
    StoreCodeWords(codes, count, words, stride);
  } else if (format == WeightFormat::kNvfp4) {
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
  const bool avx2 = UseAvx2();
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

// The spec a quantization of the float layer gives, with kNvfp4's global
// scale, after checking every element and every group's scale.
absl::StatusOr<WeightSpec> CheckFloatValues(const SafetensorsFile& file,
                                            const TensorInfo& tensor,
                                            WeightSpec spec) {
  double amax = 0;
  // 8-bit scales cannot overflow; fp16 ones can, but not below an ideal
  // scale (extent / divisor) of 2^15: rounded and stepped up, it stays under
  // 65504. So ChooseScale need only look at the rare larger groups.
  const bool half_scales =
      !HasFp4Codes(spec.format) || spec.format == WeightFormat::kFp4;
  const double largest_safe_extent =
      half_scales ? 0x1p15 * ScaleDivisor(spec.format)
                  : std::numeric_limits<double>::infinity();
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
  if (spec.format == WeightFormat::kNvfp4) {
    spec.global_scale = Nvfp4GlobalScale(amax);
  }
  return spec;
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
    case CheckpointLayout::kMxfp4:
      return "mxfp4";
    case CheckpointLayout::kNvfp4:
      return "nvfp4";
  }
  return "unknown";
}

absl::StatusOr<CheckpointLayout> DetectLayout(const SafetensorsFile& file,
                                              absl::string_view prefix) {
  const TensorInfo* qweight = file.Find(absl::StrCat(prefix, ".qweight"));
  if (qweight == nullptr) {
    if (FindMxfp4Blocks(file, prefix) != nullptr) {
      absl::StatusOr<Mxfp4Tensors> mxfp4 = CheckMxfp4Tensors(file, prefix);
      if (!mxfp4.ok()) return mxfp4.status();
      return CheckpointLayout::kMxfp4;
    }
    const TensorInfo* weight = file.Find(absl::StrCat(prefix, ".weight"));
    if (weight == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("none of ", prefix, ".qweight (GPTQ, AWQ), ", prefix,
                       "_blocks (MXFP4) and ", prefix,
                       ".weight (NVFP4, floats) is in ", file.source_name()));
    }
    // NVFP4 packs its codes in bytes; floats are F16, BF16 or F32.
    if (weight->dtype == SafetensorsDtype::kU8) {
      absl::StatusOr<Nvfp4Tensors> nvfp4 = CheckNvfp4Tensors(file, prefix);
      if (!nvfp4.ok()) return nvfp4.status();
      return CheckpointLayout::kNvfp4;
    }
    absl::StatusOr<const TensorInfo*> checked = CheckFloatTensor(file, prefix);
    if (!checked.ok()) return checked.status();
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
  absl::StatusOr<GptqWeight> result =
      GptqWithoutCodes(file, *tensors, zero_convention);
  if (!result.ok()) return result;
  QuantizedWeight& weight = result->weight;
  const WeightSpec& spec = weight.spec;
  // qweight is nibble's own layout already (both little-endian).
  const absl::Span<const uint8_t> qweight = file.Data(*tensors->qweight);
  ReserveBulk(weight.qweight, spec.k / kCodesPerWord * spec.n);
  weight.qweight.resize(spec.k / kCodesPerWord * spec.n);
  std::memcpy(weight.qweight.data(), qweight.data(), qweight.size());
  if (result->activation_order.empty()) return result;
  const QuantizedWeight checkpoint_order = weight;
  for (int64_t row = 0; row < spec.k; ++row) {
    for (int64_t col = 0; col < spec.n; ++col) {
      weight.SetCode(row, col,
                     checkpoint_order.Code(result->activation_order[row], col));
    }
  }
  return result;
}

WeightBytes GptqFileWeight::bytes() const {
  WeightBytes bytes = BytesOf(weight);
  bytes.qweight = qweight;
  return bytes;
}

absl::StatusOr<GptqFileWeight> GptqWeightWithFileCodes(
    const SafetensorsFile& file, absl::string_view prefix,
    GptqZeroConvention zero_convention) {
  absl::StatusOr<PackedTensors> tensors = CheckGptqTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  absl::StatusOr<GptqWeight> rest =
      GptqWithoutCodes(file, *tensors, zero_convention);
  if (!rest.ok()) return rest.status();
  if (!rest->activation_order.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        prefix,
        " is an act-order layer, whose rows must be regrouped: use "
        "ConvertGptqWeight"));
  }
  const absl::Span<const uint8_t> qweight = file.Data(*tensors->qweight);
  return GptqFileWeight{
      std::move(rest->weight),
      absl::string_view(reinterpret_cast<const char*>(qweight.data()),
                        qweight.size())};
}

void AwqFileWeight::CanonicalWordRows(int64_t first, int64_t count,
                                      uint32_t* out) const {
  // AWQ row r starts at byte r * (N / 8) * 4.
  RepackAwqCodes(qweight + first * kCodesPerWord * weight.spec.n / 2,
                 count * kCodesPerWord, weight.spec.n, out);
}

absl::StatusOr<AwqFileWeight> AwqWeightWithFileCodes(
    const SafetensorsFile& file, absl::string_view prefix) {
  absl::StatusOr<PackedTensors> tensors = CheckAwqTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  absl::StatusOr<QuantizedWeight> weight = AwqWithoutCodes(file, *tensors);
  if (!weight.ok()) return weight.status();
  return AwqFileWeight{*std::move(weight), file.Data(*tensors->qweight).data()};
}

absl::StatusOr<QuantizedWeight> ConvertAwqWeight(const SafetensorsFile& file,
                                                 absl::string_view prefix) {
  absl::StatusOr<AwqFileWeight> awq = AwqWeightWithFileCodes(file, prefix);
  if (!awq.ok()) return awq.status();
  QuantizedWeight& weight = awq->weight;
  const int64_t word_rows = weight.spec.k / kCodesPerWord;
  ReserveBulk(weight.qweight, word_rows * weight.spec.n);
  weight.qweight.resize(word_rows * weight.spec.n);
  awq->CanonicalWordRows(0, word_rows, weight.qweight.data());
  return std::move(weight);
}

absl::StatusOr<std::vector<int64_t>> Mxfp4ExpertDims(
    const SafetensorsFile& file, absl::string_view prefix) {
  absl::StatusOr<Mxfp4Tensors> tensors = CheckMxfp4Tensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  return tensors->expert_dims;
}

absl::StatusOr<Fp4Columns> Mxfp4Columns(const SafetensorsFile& file,
                                        absl::string_view prefix,
                                        int64_t expert) {
  absl::StatusOr<Mxfp4Tensors> checked = CheckMxfp4Tensors(file, prefix);
  if (!checked.ok()) return checked.status();
  const Mxfp4Tensors& tensors = *checked;
  const WeightSpec& spec = tensors.spec;
  if (expert < 0 || expert >= tensors.experts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expert ", expert, " of ", Described(*tensors.blocks),
        " does not exist: it holds ", tensors.experts, " weights"));
  }
  // The expert's index in the leading dimensions, for messages.
  std::string index_prefix;
  for (int64_t rest = expert, i = tensors.expert_dims.size() - 1; i >= 0; --i) {
    index_prefix =
        absl::StrCat(rest % tensors.expert_dims[i], ", ", index_prefix);
    rest /= tensors.expert_dims[i];
  }
  const uint8_t* scale_codes =
      file.Data(*tensors.scales).data() + expert * spec.groups() * spec.n;
  if (absl::Status s = CheckScaleCodes(
          *tensors.scales, index_prefix, scale_codes, spec.groups(), spec.n,
          [](uint8_t code) { return code == kE8m0Nan; });
      !s.ok()) {
    return s;
  }
  return Fp4Columns{
      spec, file.Data(*tensors.blocks).data() + expert * (spec.k / 2 * spec.n),
      scale_codes};
}

absl::StatusOr<Fp4Columns> Nvfp4Columns(const SafetensorsFile& file,
                                        absl::string_view prefix) {
  absl::StatusOr<Nvfp4Tensors> tensors = CheckNvfp4Tensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  const uint8_t* scale_codes = file.Data(*tensors->scales).data();
  if (absl::Status s = CheckScaleCodes(
          *tensors->scales, "", scale_codes, tensors->spec.groups(),
          tensors->spec.n, [](uint8_t code) { return IsE4m3Nan(code); });
      !s.ok()) {
    return s;
  }
  return Fp4Columns{tensors->spec, file.Data(*tensors->weight).data(),
                    scale_codes};
}

absl::StatusOr<QuantizedWeight> ConvertMxfp4Weight(const SafetensorsFile& file,
                                                   absl::string_view prefix,
                                                   int64_t expert) {
  absl::StatusOr<Fp4Columns> columns = Mxfp4Columns(file, prefix, expert);
  if (!columns.ok()) return columns.status();
  return CanonicalFromColumns(*columns);
}

absl::StatusOr<QuantizedWeight> ConvertNvfp4Weight(const SafetensorsFile& file,
                                                   absl::string_view prefix) {
  absl::StatusOr<Fp4Columns> columns = Nvfp4Columns(file, prefix);
  if (!columns.ok()) return columns.status();
  return CanonicalFromColumns(*columns);
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

absl::StatusOr<QuantizedWeight> QuantizeFloatWeight(const SafetensorsFile& file,
                                                    absl::string_view prefix,
                                                    WeightFormat format,
                                                    int64_t group_size) {
  absl::StatusOr<WeightSpec> checked =
      CheckFloatSpec(file, prefix, format, group_size);
  if (!checked.ok()) return checked.status();
  const TensorInfo& tensor = *file.Find(absl::StrCat(prefix, ".weight"));
  WeightSpec spec = *checked;
  // kNvfp4's global scale needs the whole tensor's amax first.
  if (format == WeightFormat::kNvfp4) {
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
  std::vector<int> column_zeros(spec.groups(), 8);
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
            if (spec.format == WeightFormat::kU4) {
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

void AllowFloatQuantizationAvx2ForTesting(bool allowed) {
  avx2_allowed.store(allowed, std::memory_order_relaxed);
}

absl::StatusOr<LayerCheck> CheckLayer(const SafetensorsFile& file,
                                      absl::string_view prefix,
                                      CheckpointLayout layout,
                                      WeightFormat float_format,
                                      int64_t float_group_size, int64_t expert,
                                      GptqZeroConvention gptq_zeros) {
  switch (layout) {
    case CheckpointLayout::kGptq: {
      absl::StatusOr<PackedTensors> tensors = CheckGptqTensors(file, prefix);
      if (!tensors.ok()) return tensors.status();
      absl::StatusOr<GptqWeight> gptq =
          GptqWithoutCodes(file, *tensors, gptq_zeros);
      if (!gptq.ok()) return gptq.status();
      return LayerCheck{gptq->weight.spec, !gptq->activation_order.empty()};
    }
    case CheckpointLayout::kAwq: {
      absl::StatusOr<PackedTensors> tensors = CheckAwqTensors(file, prefix);
      if (!tensors.ok()) return tensors.status();
      absl::StatusOr<QuantizedWeight> awq = AwqWithoutCodes(file, *tensors);
      if (!awq.ok()) return awq.status();
      return LayerCheck{awq->spec};
    }
    case CheckpointLayout::kMxfp4: {
      absl::StatusOr<Fp4Columns> columns = Mxfp4Columns(file, prefix, expert);
      if (!columns.ok()) return columns.status();
      return LayerCheck{columns->spec};
    }
    case CheckpointLayout::kNvfp4: {
      absl::StatusOr<Fp4Columns> columns = Nvfp4Columns(file, prefix);
      if (!columns.ok()) return columns.status();
      return LayerCheck{columns->spec};
    }
    case CheckpointLayout::kFloat: {
      absl::StatusOr<WeightSpec> spec =
          CheckFloatSpec(file, prefix, float_format, float_group_size);
      if (!spec.ok()) return spec.status();
      absl::StatusOr<WeightSpec> checked = CheckFloatValues(
          file, *file.Find(absl::StrCat(prefix, ".weight")), *spec);
      if (!checked.ok()) return checked.status();
      return LayerCheck{*checked};
    }
  }
  return absl::InternalError("unknown checkpoint layout");
}

}  // namespace nibble::checkpoint
