#include "checkpoint/tensor_checks.h"

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/safetensors.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {
namespace {

uint16_t LoadHalf(absl::Span<const uint8_t> bytes, int64_t index) {
  const uint8_t* p = bytes.data() + 2 * index;
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}

}  // namespace

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

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

absl::Status CheckSpec(const WeightSpec& spec, absl::string_view derived_from) {
  if (absl::Status status = spec.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        derived_from, " imply K=", spec.k, ", N=", spec.n, " and group size ",
        spec.group_size, ", which nibble cannot hold: ", status.message()));
  }
  return absl::OkStatus();
}

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

absl::StatusOr<std::vector<uint16_t>> ReadFp16Scales(
    const SafetensorsFile& file, const TensorInfo& scales) {
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

}  // namespace nibble::checkpoint
