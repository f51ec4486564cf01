#include "checkpoint/gptq.h"

#include <cstdint>
#include <cstring>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/bulk_allocator.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_checks.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {
namespace {

// Bits per value that a packed dimension of `packed` int32 words holds for
// `values` values, when that is one of GPTQ's other widths (2, 3 or 8).
std::optional<int64_t> OtherGptqBits(int64_t packed, int64_t values) {
  if (values <= 0 || packed * 32 % values != 0) return std::nullopt;
  const int64_t bits = packed * 32 / values;
  if (bits == 2 || bits == 3 || bits == 8) return bits;
  return std::nullopt;
}

// The layer's tensors, their dtypes and shapes checked against each other.
absl::StatusOr<PackedTensors> FindGptqTensors(const SafetensorsFile& file,
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

constexpr int kIdentityNibbles[8] = {0, 1, 2, 3, 4, 5, 6, 7};

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

// The layer's weight without its codes (qweight left empty): spec, scales,
// zero points (format kU4b8 when every one is 8) and the row order. Reads
// everything but qweight, so it also checks the values cheaply.
absl::StatusOr<GptqWeight> GptqWithoutCodes(
    const SafetensorsFile& file, const PackedTensors& tensors,
    GptqZeroConvention zero_convention) {
  const WeightSpec& spec = tensors.spec;
  GptqWeight result;
  QuantizedWeight& weight = result.weight;
  weight.spec = spec;
  absl::StatusOr<std::vector<uint16_t>> scales =
      ReadFp16Scales(file, *tensors.scales);
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

}  // namespace

absl::Status CheckGptqTensors(const SafetensorsFile& file,
                              absl::string_view prefix) {
  return FindGptqTensors(file, prefix).status();
}

absl::StatusOr<GptqWeight> GptqWeightWithoutCodes(
    const SafetensorsFile& file, absl::string_view prefix,
    GptqZeroConvention zero_convention) {
  absl::StatusOr<PackedTensors> tensors = FindGptqTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  return GptqWithoutCodes(file, *tensors, zero_convention);
}

absl::StatusOr<GptqWeight> ConvertGptqWeight(
    const SafetensorsFile& file, absl::string_view prefix,
    GptqZeroConvention zero_convention) {
  absl::StatusOr<PackedTensors> tensors = FindGptqTensors(file, prefix);
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
  absl::StatusOr<PackedTensors> tensors = FindGptqTensors(file, prefix);
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

}  // namespace nibble::checkpoint
