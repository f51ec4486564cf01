#include "checkpoint/fp4_blocks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_checks.h"
#include "format/dequant.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {
namespace {

// Codes per scale, which the checkpoints' shapes follow.
constexpr int64_t kMxfp4Group = FixedGroupSize(WeightFormat::kMxfp4);
constexpr int64_t kNvfp4Group = FixedGroupSize(WeightFormat::kNvfp4);

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

// --- MXFP4.

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

// Checks dtypes and shapes; reads no data.
absl::StatusOr<Mxfp4Tensors> FindMxfp4Tensors(const SafetensorsFile& file,
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
  // Two codes per byte.
  constexpr int64_t kBlockBytes = kMxfp4Group / 2;
  const size_t rank = blocks.shape.size();
  if (rank < 3 || blocks.shape[rank - 1] != kBlockBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(Described(blocks), " should be [..., N, K/", kMxfp4Group,
                     ", ", kBlockBytes, "]: ", kBlockBytes,
                     " bytes of two FP4 codes each for every group of ",
                     kMxfp4Group, " values along K"));
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
  tensors.spec = {WeightFormat::kMxfp4, blocks.shape[rank - 2] * kMxfp4Group,
                  blocks.shape[rank - 3], kMxfp4Group};
  if (absl::Status s = CheckSpec(tensors.spec, Described(blocks)); !s.ok()) {
    return s;
  }
  return tensors;
}

// --- NVFP4.

// The tensors of an NVFP4 layer, checked against each other.
struct Nvfp4Tensors {
  const TensorInfo* weight = nullptr;
  const TensorInfo* scales = nullptr;
  const TensorInfo* global_scale = nullptr;
  WeightSpec spec;
};

// Checks dtypes and shapes; reads only the global scale.
absl::StatusOr<Nvfp4Tensors> FindNvfp4Tensors(const SafetensorsFile& file,
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
  if (k % kNvfp4Group != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Described(weight), " holds K=", k,
        " codes per row, not a multiple of NVFP4's group of ", kNvfp4Group));
  }
  if (scales.shape[0] != n || scales.shape[1] != k / kNvfp4Group) {
    return absl::InvalidArgumentError(absl::StrCat(
        Described(scales), " should be [", n, ", ", k / kNvfp4Group,
        "]: one scale per ", kNvfp4Group, " codes of ", Described(weight)));
  }
  float g = 0;
  std::memcpy(&g, file.Data(global_scale).data(), sizeof(g));
  if (!std::isfinite(g) || g <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(global_scale.name, " is ", g,
                     ": the global scale must be finite and positive"));
  }
  tensors.spec = {WeightFormat::kNvfp4, k, n, kNvfp4Group, g};
  if (absl::Status s = CheckSpec(tensors.spec, Described(weight)); !s.ok()) {
    return s;
  }
  return tensors;
}

}  // namespace

bool HasMxfp4Blocks(const SafetensorsFile& file, absl::string_view prefix) {
  return FindMxfp4Blocks(file, prefix) != nullptr;
}

absl::StatusOr<std::vector<int64_t>> Mxfp4ExpertDims(
    const SafetensorsFile& file, absl::string_view prefix) {
  absl::StatusOr<Mxfp4Tensors> tensors = FindMxfp4Tensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  return tensors->expert_dims;
}

absl::StatusOr<Fp4Columns> Mxfp4Columns(const SafetensorsFile& file,
                                        absl::string_view prefix,
                                        int64_t expert) {
  absl::StatusOr<Mxfp4Tensors> checked = FindMxfp4Tensors(file, prefix);
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

absl::StatusOr<QuantizedWeight> ConvertMxfp4Weight(const SafetensorsFile& file,
                                                   absl::string_view prefix,
                                                   int64_t expert) {
  absl::StatusOr<Fp4Columns> columns = Mxfp4Columns(file, prefix, expert);
  if (!columns.ok()) return columns.status();
  return CanonicalFromColumns(*columns);
}

absl::Status CheckNvfp4Tensors(const SafetensorsFile& file,
                               absl::string_view prefix) {
  return FindNvfp4Tensors(file, prefix).status();
}

absl::StatusOr<Fp4Columns> Nvfp4Columns(const SafetensorsFile& file,
                                        absl::string_view prefix) {
  absl::StatusOr<Nvfp4Tensors> tensors = FindNvfp4Tensors(file, prefix);
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

absl::StatusOr<QuantizedWeight> ConvertNvfp4Weight(const SafetensorsFile& file,
                                                   absl::string_view prefix) {
  absl::StatusOr<Fp4Columns> columns = Nvfp4Columns(file, prefix);
  if (!columns.ok()) return columns.status();
  return CanonicalFromColumns(*columns);
}

}  // namespace nibble::checkpoint
