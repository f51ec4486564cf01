#include "checkpoint/import.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "checkpoint/convert.h"
#include "checkpoint/safetensors.h"
#include "kernels/weight_format.h"
#include "proto/weight_name.h"

namespace nibble {
namespace {

using ::nibble::checkpoint::CheckpointLayout;
using ::nibble::checkpoint::SafetensorsDtype;
using ::nibble::checkpoint::SafetensorsFile;
using ::nibble::checkpoint::TensorInfo;

// How many existing layers an unknown --layer prefix is answered with.
constexpr size_t kMaxSuggestions = 5;

constexpr absl::string_view kQuantizeSyntax =
    "expected FORMAT:GROUP with FORMAT fp4, u4b8 or u4 and GROUP 32, 64, 128, "
    "or k for one scale per column, e.g. u4b8:128";

bool IsFloatDtype(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF16 || dtype == SafetensorsDtype::kBF16 ||
         dtype == SafetensorsDtype::kF32;
}

// Every prefix P with a tensor P.qweight, or a 2-D float tensor P.weight;
// sorted.
std::vector<std::string> DiscoverLayers(const SafetensorsFile& file) {
  std::set<std::string> prefixes;
  for (const TensorInfo& tensor : file.tensors()) {
    absl::string_view prefix = tensor.name;
    if (absl::ConsumeSuffix(&prefix, ".qweight") ||
        (absl::ConsumeSuffix(&prefix, ".weight") && tensor.shape.size() == 2 &&
         IsFloatDtype(tensor.dtype))) {
      prefixes.emplace(prefix);
    }
  }
  return std::vector<std::string>(prefixes.begin(), prefixes.end());
}

// The tensors a conversion of the layer reads; some may be absent (g_idx).
std::vector<std::string> LayerTensorNames(absl::string_view prefix,
                                          CheckpointLayout layout) {
  switch (layout) {
    case CheckpointLayout::kGptq:
      return {absl::StrCat(prefix, ".qweight"), absl::StrCat(prefix, ".qzeros"),
              absl::StrCat(prefix, ".scales"), absl::StrCat(prefix, ".g_idx")};
    case CheckpointLayout::kAwq:
      return {absl::StrCat(prefix, ".qweight"), absl::StrCat(prefix, ".qzeros"),
              absl::StrCat(prefix, ".scales")};
    case CheckpointLayout::kFloat:
      return {absl::StrCat(prefix, ".weight")};
  }
  return {};
}

std::string DescribeTensor(const TensorInfo& tensor) {
  return absl::StrCat(tensor.name, " (",
                      checkpoint::SafetensorsDtypeName(tensor.dtype), " [",
                      absl::StrJoin(tensor.shape, ", "), "])");
}

// The NOT_FOUND answer to a --layer prefix that is no layer of `file`, with
// the layers that share the longest start with it.
absl::Status UnknownLayer(const SafetensorsFile& file, absl::string_view prefix,
                          absl::Span<const std::string> layers) {
  const std::string missing =
      absl::StrCat("no layer \"", prefix, "\" in ", file.source_name(), " (no ",
                   prefix, ".qweight or ", prefix, ".weight)");
  if (layers.empty()) {
    return absl::NotFoundError(absl::StrCat(
        missing,
        ", which has no layers at all: no tensor P.qweight, and no "
        "2-D F16, BF16 or F32 tensor P.weight"));
  }
  const auto common_start = [&](const std::string& layer) {
    const auto mismatch =
        std::mismatch(prefix.begin(), prefix.end(), layer.begin(), layer.end());
    return mismatch.first - prefix.begin();
  };
  ptrdiff_t longest = 0;
  for (const std::string& layer : layers) {
    longest = std::max(longest, common_start(layer));
  }
  std::vector<std::string> suggestions;
  for (const std::string& layer : layers) {
    if (common_start(layer) == longest) suggestions.push_back(layer);
  }
  const size_t more = suggestions.size() > kMaxSuggestions
                          ? suggestions.size() - kMaxSuggestions
                          : 0;
  suggestions.resize(suggestions.size() - more);
  return absl::NotFoundError(absl::StrCat(
      missing, "; layers it has include ", absl::StrJoin(suggestions, ", "),
      more > 0 ? absl::StrCat(" and ", more, " more like them") : ""));
}

// The weight ExecuteImport uploads for the layer.
absl::StatusOr<QuantizedWeight> ConvertLayer(const SafetensorsFile& file,
                                             absl::string_view prefix,
                                             CheckpointLayout layout,
                                             const QuantizeSpec& quantize) {
  switch (layout) {
    case CheckpointLayout::kGptq: {
      absl::StatusOr<checkpoint::GptqWeight> gptq =
          checkpoint::ConvertGptqWeight(file, prefix);
      if (!gptq.ok()) return gptq.status();
      if (!gptq->activation_order.empty()) {
        return absl::UnimplementedError(absl::StrCat(
            "GPTQ layer \"", prefix,
            "\" was quantized with act-order (desc_act, a g_idx that is not "
            "row / group size): nibble can serve it only with its "
            "activations' columns permuted before every matmul, and nibble's "
            "Matmul takes activations as given; quantize the model again "
            "without desc_act, or leave the layer out with --layer"));
      }
      return std::move(gptq->weight);
    }
    case CheckpointLayout::kAwq:
      return checkpoint::ConvertAwqWeight(file, prefix);
    case CheckpointLayout::kFloat: {
      // DetectLayout has checked that PREFIX.weight is [N, K].
      const TensorInfo* weight = file.Find(absl::StrCat(prefix, ".weight"));
      const int64_t group_size =
          quantize.group_size == 0 ? weight->shape[1] : quantize.group_size;
      absl::StatusOr<QuantizedWeight> quantized =
          checkpoint::QuantizeFloatWeight(file, prefix, quantize.format,
                                          group_size);
      if (!quantized.ok()) {
        return absl::Status(
            quantized.status().code(),
            absl::StrCat(quantized.status().message(), " (quantizing as ",
                         QuantizeSpecName(quantize),
                         "; --quantize picks another format or group)"));
      }
      return quantized;
    }
  }
  return absl::InternalError("unknown checkpoint layout");
}

std::string FormatMegabytes(int64_t bytes) {
  return absl::StrFormat("%.1f MB", static_cast<double>(bytes) / 1e6);
}

}  // namespace

absl::StatusOr<QuantizeSpec> ParseQuantizeSpec(absl::string_view text) {
  const size_t colon = text.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--quantize \"", text, "\": ", kQuantizeSyntax));
  }
  const absl::string_view format_name = text.substr(0, colon);
  const absl::string_view group = text.substr(colon + 1);
  absl::StatusOr<WeightFormat> format = ParseWeightFormat(format_name);
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--quantize \"", text,
                                                   "\": format \"", format_name,
                                                   "\": ", kQuantizeSyntax));
  }
  QuantizeSpec spec{.format = *format};
  if (group == "k" || group == "K") {
    spec.group_size = 0;
  } else if (!absl::SimpleAtoi(group, &spec.group_size) ||
             (spec.group_size != 32 && spec.group_size != 64 &&
              spec.group_size != 128)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--quantize \"", text, "\": group \"", group, "\": ", kQuantizeSyntax));
  }
  return spec;
}

std::string QuantizeSpecName(const QuantizeSpec& spec) {
  return absl::StrCat(
      WeightFormatName(spec.format), ":",
      spec.group_size == 0 ? "k" : absl::StrCat(spec.group_size));
}

absl::StatusOr<std::vector<NameMapRule>> ParseNameMap(
    absl::Span<const std::string> texts) {
  std::vector<NameMapRule> rules;
  for (const std::string& text : texts) {
    const size_t equals = text.find('=');
    if (equals == std::string::npos || equals == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--name_map rule \"", text,
                       "\": expected FROM=TO with a non-empty FROM, e.g. "
                       "model.layers.=L, which uploads "
                       "model.layers.0.mlp.up_proj as L0.mlp.up_proj"));
    }
    rules.push_back({text.substr(0, equals), text.substr(equals + 1)});
  }
  return rules;
}

std::string MapLayerName(absl::string_view prefix,
                         absl::Span<const NameMapRule> rules) {
  for (const NameMapRule& rule : rules) {
    if (absl::StartsWith(prefix, rule.from)) {
      return absl::StrCat(rule.to, prefix.substr(rule.from.size()));
    }
  }
  return std::string(prefix);
}

absl::StatusOr<ImportPlan> PlanImport(const SafetensorsFile& file,
                                      const ImportOptions& options) {
  const std::vector<std::string> discovered = DiscoverLayers(file);
  const bool every_layer = options.layers.empty();
  const std::vector<std::string>& prefixes =
      every_layer ? discovered : options.layers;
  if (prefixes.empty()) {
    return absl::NotFoundError(
        absl::StrCat(file.source_name(),
                     " has no layers to import: no tensor P.qweight, and no "
                     "2-D F16, BF16 or F32 tensor P.weight"));
  }

  // Names first: they are cheap to check, conversions are not.
  ImportPlan plan;
  plan.quantize = options.quantize;
  std::map<std::string, std::string> prefix_of_name;
  for (const std::string& prefix : prefixes) {
    ImportLayer& layer = plan.layers.emplace_back();
    layer.prefix = prefix;
    layer.name = MapLayerName(prefix, options.name_map);
    if (absl::Status status = ValidateWeightName(layer.name); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer \"", prefix, "\" cannot be uploaded under its name (",
          status.message(), "; weight names are ", kWeightNameRule,
          "): rename it with --name_map FROM=TO"));
    }
    const auto [existing, inserted] =
        prefix_of_name.emplace(layer.name, prefix);
    if (!inserted) {
      return absl::InvalidArgumentError(
          existing->second == prefix
              ? absl::StrCat("layer \"", prefix, "\" is listed twice")
              : absl::StrCat("layers \"", existing->second, "\" and \"", prefix,
                             "\" would both be uploaded as \"", layer.name,
                             "\": tell them apart with --name_map FROM=TO"));
    }
  }

  std::set<std::string> read_tensors;
  for (ImportLayer& layer : plan.layers) {
    absl::StatusOr<CheckpointLayout> layout =
        checkpoint::DetectLayout(file, layer.prefix);
    if (absl::IsNotFound(layout.status())) {
      return UnknownLayer(file, layer.prefix, discovered);
    }
    if (!layout.ok()) return layout.status();
    layer.layout = *layout;
    absl::StatusOr<QuantizedWeight> weight =
        ConvertLayer(file, layer.prefix, layer.layout, options.quantize);
    if (!weight.ok()) return weight.status();
    layer.spec = weight->spec;
    for (std::string& name : LayerTensorNames(layer.prefix, layer.layout)) {
      if (const TensorInfo* tensor = file.Find(name)) {
        layer.file_bytes += tensor->num_bytes();
        read_tensors.insert(std::move(name));
      }
    }
  }

  if (every_layer) {
    for (const TensorInfo& tensor : file.tensors()) {
      if (!read_tensors.contains(tensor.name)) {
        plan.skipped.push_back(DescribeTensor(tensor));
      }
    }
  }
  return plan;
}

ImportReport ExecuteImport(const SafetensorsFile& file, const ImportPlan& plan,
                           UploadFunction upload, std::ostream& progress) {
  ImportReport report;
  const absl::Time start = absl::Now();
  for (size_t i = 0; i < plan.layers.size(); ++i) {
    const ImportLayer& layer = plan.layers[i];
    const absl::Time layer_start = absl::Now();
    absl::StatusOr<QuantizedWeight> weight =
        ConvertLayer(file, layer.prefix, layer.layout, plan.quantize);
    absl::Status status =
        weight.ok() ? upload(*weight, layer.name) : weight.status();
    if (!status.ok()) {
      report.status = std::move(status);
      report.failed_layer = static_cast<int64_t>(i);
      break;
    }
    report.uploaded.push_back(layer.name);
    report.uploaded_bytes += layer.spec.canonical_bytes();
    report.file_bytes += layer.file_bytes;
    progress << absl::StrFormat(
        "[%d/%d] %s → %s (%s → %s, k=%d n=%d group=%d, %s) %.2f s\n", i + 1,
        plan.layers.size(), layer.prefix, layer.name,
        checkpoint::CheckpointLayoutName(layer.layout),
        WeightFormatName(layer.spec.format), layer.spec.k, layer.spec.n,
        layer.spec.group_size, FormatMegabytes(layer.spec.canonical_bytes()),
        absl::ToDoubleSeconds(absl::Now() - layer_start));
  }
  report.elapsed = absl::Now() - start;
  return report;
}

}  // namespace nibble
