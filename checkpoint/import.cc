#include "checkpoint/import.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <iterator>
#include <map>
#include <numeric>
#include <ostream>
#include <set>
#include <string>
#include <utility>
#include <variant>
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
#include "checkpoint/awq.h"
#include "checkpoint/float_quantizer.h"
#include "checkpoint/fp4_blocks.h"
#include "checkpoint/gptq.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_checks.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "format/weight_name.h"
#include "kernels/packed_weight.h"

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
    "or k for one scale per column, or mxfp4:32 or nvfp4:16 (their groups "
    "are fixed), e.g. u4b8:128";

constexpr absl::string_view kNoLayers =
    "no tensor P.qweight, P_blocks or P.blocks (U8), U8 P.weight, or 2-D "
    "F16, BF16 or F32 P.weight";

bool IsFloatDtype(SafetensorsDtype dtype) {
  return dtype == SafetensorsDtype::kF16 || dtype == SafetensorsDtype::kBF16 ||
         dtype == SafetensorsDtype::kF32;
}

// Every prefix P with a tensor P.qweight, a U8 P_blocks or P.blocks
// (MXFP4), a 2-D U8 P.weight (NVFP4) or a 2-D float P.weight; sorted.
std::vector<std::string> DiscoverLayers(const SafetensorsFile& file) {
  std::set<std::string> prefixes;
  for (const TensorInfo& tensor : file.tensors()) {
    absl::string_view prefix = tensor.name;
    const bool is_u8 = tensor.dtype == SafetensorsDtype::kU8;
    if (absl::ConsumeSuffix(&prefix, ".qweight") ||
        (is_u8 && (absl::ConsumeSuffix(&prefix, "_blocks") ||
                   absl::ConsumeSuffix(&prefix, ".blocks"))) ||
        (absl::ConsumeSuffix(&prefix, ".weight") && tensor.shape.size() == 2 &&
         (is_u8 || IsFloatDtype(tensor.dtype)))) {
      prefixes.emplace(prefix);
    }
  }
  return std::vector<std::string>(prefixes.begin(), prefixes.end());
}

// The tensors of the layer, read by a conversion or (input_scale) part of it;
// some may be absent (g_idx, the MXFP4 names of the other convention).
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
    case CheckpointLayout::kMxfp4:
      return {absl::StrCat(prefix, "_blocks"), absl::StrCat(prefix, "_scales"),
              absl::StrCat(prefix, ".blocks"), absl::StrCat(prefix, ".scales")};
    case CheckpointLayout::kNvfp4:
      return {absl::StrCat(prefix, ".weight"),
              absl::StrCat(prefix, ".weight_scale"),
              absl::StrCat(prefix, ".weight_scale_2"),
              absl::StrCat(prefix, ".input_scale")};
  }
  return {};
}

// The tensors CheckLayer reads scattered over the file: the scales, zero
// points and g_idx of a packed layer, but not its codes; none of a float
// layer, whose weight it reads in order (which the kernel reads ahead).
std::vector<std::string> ScatteredCheckedTensors(absl::string_view prefix,
                                                 CheckpointLayout layout) {
  if (layout == CheckpointLayout::kFloat) return {};
  std::vector<std::string> names = LayerTensorNames(prefix, layout);
  const std::string codes[] = {
      absl::StrCat(prefix, ".qweight"), absl::StrCat(prefix, "_blocks"),
      absl::StrCat(prefix, ".blocks"), absl::StrCat(prefix, ".weight")};
  std::erase_if(names, [&](const std::string& name) {
    return std::find(std::begin(codes), std::end(codes), name) !=
           std::end(codes);
  });
  return names;
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
  const std::string missing = absl::StrCat(
      "no layer \"", prefix, "\" in ", file.source_name(), " (no ", prefix,
      ".qweight, ", prefix, "_blocks or ", prefix, ".weight)");
  if (layers.empty()) {
    return absl::NotFoundError(
        absl::StrCat(missing, ", which has no layers at all: ", kNoLayers));
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

// The group size QuantizeFloatWeight gets for the float layer: K for "k".
int64_t FloatGroupSize(const SafetensorsFile& file, absl::string_view prefix,
                       const QuantizeSpec& quantize) {
  if (quantize.group_size != 0) return quantize.group_size;
  // DetectLayout has checked that PREFIX.weight is [N, K].
  return file.Find(absl::StrCat(prefix, ".weight"))->shape[1];
}

// A float layer's error, with how it was quantized and how to change it.
absl::Status WithQuantizeHint(const absl::Status& status,
                              const QuantizeSpec& quantize) {
  return absl::Status(
      status.code(),
      absl::StrCat(
          status.message(), " (quantizing as ", QuantizeSpecName(quantize),
          "; nibble import --quantize or nibbled --import_quantize picks "
          "another format or group)"));
}

// Checks the layer as converting it would, without converting (PlanImport);
// a float layer's elements only with `check_float_values`.
absl::StatusOr<checkpoint::LayerCheck> CheckPlannedLayer(
    const SafetensorsFile& file, const ImportLayer& layer,
    const QuantizeSpec& quantize, bool check_float_values) {
  const bool is_float = layer.layout == CheckpointLayout::kFloat;
  const int64_t float_group_size =
      is_float ? FloatGroupSize(file, layer.prefix, quantize) : 0;
  absl::StatusOr<checkpoint::LayerCheck> check;
  if (is_float && !check_float_values) {
    absl::StatusOr<WeightSpec> spec = checkpoint::CheckFloatSpec(
        file, layer.prefix, quantize.format, float_group_size);
    check = spec.ok() ? absl::StatusOr<checkpoint::LayerCheck>(
                            checkpoint::LayerCheck{*spec})
                      : spec.status();
  } else {
    check = checkpoint::CheckLayer(
        file, layer.prefix, layer.layout, quantize.format, float_group_size,
        std::max<int64_t>(layer.expert, 0), layer.gptq_zeros);
  }
  if (!check.ok() && is_float) {
    return WithQuantizeHint(check.status(), quantize);
  }
  return check;
}

// The weight ExecuteImport uploads for the layer.
absl::StatusOr<QuantizedWeight> ConvertLayer(const SafetensorsFile& file,
                                             const ImportLayer& layer,
                                             const QuantizeSpec& quantize) {
  const absl::string_view prefix = layer.prefix;
  switch (layer.layout) {
    case CheckpointLayout::kGptq: {
      absl::StatusOr<checkpoint::GptqWeight> gptq =
          checkpoint::ConvertGptqWeight(file, prefix, layer.gptq_zeros);
      if (!gptq.ok()) return gptq.status();
      gptq->weight.activation_order = std::move(gptq->activation_order);
      return std::move(gptq->weight);
    }
    case CheckpointLayout::kAwq:
      return checkpoint::ConvertAwqWeight(file, prefix);
    case CheckpointLayout::kMxfp4:
      return checkpoint::ConvertMxfp4Weight(file, prefix,
                                            std::max<int64_t>(layer.expert, 0));
    case CheckpointLayout::kNvfp4:
      return checkpoint::ConvertNvfp4Weight(file, prefix);
    case CheckpointLayout::kFloat: {
      absl::StatusOr<QuantizedWeight> quantized =
          checkpoint::QuantizeFloatWeight(
              file, prefix, quantize.format,
              FloatGroupSize(file, prefix, quantize));
      if (!quantized.ok())
        return WithQuantizeHint(quantized.status(), quantize);
      return quantized;
    }
  }
  return absl::InternalError("unknown checkpoint layout");
}

// Where ExecuteImport sends the layers that need no canonical weight made:
// kUploadPacked takes MXFP4, NVFP4, AWQ and GPTQ layers without act-order as
// panels, kUploadBytes MXFP4 and NVFP4 columns and GPTQ codes from the file,
// kUploadColumns MXFP4 and NVFP4 columns.
enum class Destination { kUpload, kUploadPacked, kUploadBytes, kUploadColumns };

// A converted layer: the canonical weight, or for `upload_packed` an MXFP4,
// NVFP4, GPTQ or AWQ layer's panels, or for `upload_bytes` and
// `upload_columns` an MXFP4 or NVFP4 layer's columns, or for `upload_bytes`
// a GPTQ layer with the file's codes.
using ConvertedWeight = std::variant<QuantizedWeight, PackedWeight, Fp4Columns,
                                     checkpoint::GptqFileWeight>;

// The rows of canonical words PackFromFile repacks an AWQ layer's codes into
// at a time: a few hundred KB, which stay in the cache until packed.
constexpr int64_t kAwqWordRowsAtOnce = 8;

// A GPTQ layer without act-order or an AWQ layer packed into panels from the
// file's codes, which are never held whole in the canonical layout.
absl::StatusOr<PackedWeight> PackFromFile(const SafetensorsFile& file,
                                          const ImportLayer& layer) {
  if (layer.layout == CheckpointLayout::kGptq) {
    absl::StatusOr<checkpoint::GptqFileWeight> gptq =
        checkpoint::GptqWeightWithFileCodes(file, layer.prefix,
                                            layer.gptq_zeros);
    if (!gptq.ok()) return gptq.status();
    PanelCodeWriter codes(gptq->weight.spec, CodeLayout::kCanonical);
    codes.Append(gptq->qweight);
    return PackedWeight::PackWithCodes(std::move(codes), gptq->weight);
  }
  absl::StatusOr<checkpoint::AwqFileWeight> awq =
      checkpoint::AwqWeightWithFileCodes(file, layer.prefix);
  if (!awq.ok()) return awq.status();
  const WeightSpec& spec = awq->weight.spec;
  PanelCodeWriter codes(spec, CodeLayout::kCanonical);
  std::vector<uint32_t> rows(kAwqWordRowsAtOnce * spec.n);
  const int64_t word_rows = spec.k / kCodesPerWord;
  for (int64_t first = 0; first < word_rows; first += kAwqWordRowsAtOnce) {
    const int64_t count = std::min(kAwqWordRowsAtOnce, word_rows - first);
    awq->CanonicalWordRows(first, count, rows.data());
    codes.Append(absl::string_view(reinterpret_cast<const char*>(rows.data()),
                                   count * spec.n * sizeof(uint32_t)));
  }
  return PackedWeight::PackWithCodes(std::move(codes), awq->weight);
}

absl::StatusOr<ConvertedWeight> ConvertLayerFor(const SafetensorsFile& file,
                                                const ImportLayer& layer,
                                                const QuantizeSpec& quantize,
                                                Destination destination) {
  const bool gptq_in_order =
      layer.layout == CheckpointLayout::kGptq && !layer.has_activation_order;
  if (destination == Destination::kUploadPacked &&
      (gptq_in_order || layer.layout == CheckpointLayout::kAwq)) {
    absl::StatusOr<PackedWeight> packed = PackFromFile(file, layer);
    if (!packed.ok()) return packed.status();
    return *std::move(packed);
  }
  if (destination == Destination::kUploadBytes && gptq_in_order) {
    absl::StatusOr<checkpoint::GptqFileWeight> gptq =
        checkpoint::GptqWeightWithFileCodes(file, layer.prefix,
                                            layer.gptq_zeros);
    if (!gptq.ok()) return gptq.status();
    return *std::move(gptq);
  }
  const bool fp4_columns = layer.layout == CheckpointLayout::kMxfp4 ||
                           layer.layout == CheckpointLayout::kNvfp4;
  if (!fp4_columns || destination == Destination::kUpload) {
    return ConvertLayer(file, layer, quantize);
  }
  absl::StatusOr<Fp4Columns> columns =
      layer.layout == CheckpointLayout::kMxfp4
          ? checkpoint::Mxfp4Columns(file, layer.prefix,
                                     std::max<int64_t>(layer.expert, 0))
          : checkpoint::Nvfp4Columns(file, layer.prefix);
  if (!columns.ok()) return columns.status();
  if (destination == Destination::kUploadPacked) {
    return PackedWeight::PackColumns(*columns);
  }
  return *columns;
}

// "PREFIX", or "PREFIX[3]" for expert 3 of an MXFP4 layer.
std::string LayerSource(const ImportLayer& layer) {
  return layer.expert < 0 ? layer.prefix
                          : absl::StrCat(layer.prefix, "[", layer.expert, "]");
}

std::string FormatMegabytes(int64_t bytes) {
  return absl::StrFormat("%.1f MB", static_cast<double>(bytes) / 1e6);
}

// Where ExecuteImport's forms send the layers that need no canonical weight:
// at most one is set.
struct OtherUploads {
  const PackedUploadFunction* packed = nullptr;
  const BytesUploadFunction* bytes = nullptr;
  const ColumnsUploadFunction* columns = nullptr;
};

ImportReport ConvertAndUpload(const SafetensorsFile& file,
                              const ImportPlan& plan, UploadFunction upload,
                              const OtherUploads& other, int uploads_at_once,
                              std::ostream& progress) {
  const Destination destination =
      other.packed != nullptr    ? Destination::kUploadPacked
      : other.bytes != nullptr   ? Destination::kUploadBytes
      : other.columns != nullptr ? Destination::kUploadColumns
                                 : Destination::kUpload;
  ImportReport report;
  const absl::Time start = absl::Now();
  // Starts reading layer i + 1 from the disk as layer i converts, so that
  // the disk is never idle while the CPUs work.
  const auto convert = [&](size_t i) {
    if (i + 1 < plan.layers.size()) {
      const ImportLayer& ahead = plan.layers[i + 1];
      for (const std::string& name :
           LayerTensorNames(ahead.prefix, ahead.layout)) {
        if (const TensorInfo* tensor = file.Find(name)) file.Prefetch(*tensor);
      }
    }
    return std::async(std::launch::async, [&file, &plan, destination, i] {
      return ConvertLayerFor(file, plan.layers[i], plan.quantize, destination);
    });
  };
  // Layers i + 1 and i + 2 convert on threads of their own while layer i
  // uploads: converting most layouts takes longer than uploading, and one
  // conversion alone would leave a core idle while it waits on memory.
  constexpr size_t kLayersAhead = 2;
  std::deque<std::future<absl::StatusOr<ConvertedWeight>>> ahead;
  size_t to_convert = 0;
  const auto convert_ahead = [&] {
    while (ahead.size() < kLayersAhead && to_convert < plan.layers.size()) {
      ahead.push_back(convert(to_convert++));
    }
  };
  const auto store = [&](ConvertedWeight weight, const ImportLayer& layer) {
    if (auto* packed = std::get_if<PackedWeight>(&weight)) {
      return (*other.packed)(std::move(*packed), layer.name);
    }
    if (const auto* columns = std::get_if<Fp4Columns>(&weight)) {
      return other.columns != nullptr
                 ? (*other.columns)(*columns, layer.name)
                 : (*other.bytes)(columns->bytes(), layer.name);
    }
    if (const auto* gptq = std::get_if<checkpoint::GptqFileWeight>(&weight)) {
      return (*other.bytes)(gptq->bytes(), layer.name);
    }
    return upload(std::get<QuantizedWeight>(weight), layer.name);
  };
  // The uploads under way, oldest first, each with its layer's index.
  std::deque<std::pair<size_t, std::future<absl::Status>>> uploading;
  absl::Time layer_start = start;
  // Waits for the oldest upload and reports it.
  const auto finish_oldest = [&] {
    const size_t i = uploading.front().first;
    absl::Status status = uploading.front().second.get();
    uploading.pop_front();
    const ImportLayer& layer = plan.layers[i];
    if (!status.ok()) {
      if (report.status.ok()) {
        report.status = std::move(status);
        report.failed_layer = static_cast<int64_t>(i);
      }
      return;
    }
    report.uploaded.push_back(layer.name);
    report.uploaded_bytes += layer.spec.canonical_bytes();
    report.file_bytes += layer.file_bytes;
    const absl::Time now = absl::Now();
    progress << absl::StrFormat(
        "[%d/%d] %s → %s (%s → %s%s, k=%d n=%d group=%d, %s) %.2f s\n", i + 1,
        plan.layers.size(), LayerSource(layer), layer.name,
        checkpoint::CheckpointLayoutName(layer.layout),
        WeightFormatName(layer.spec.format),
        layer.has_activation_order ? " act-order" : "", layer.spec.k,
        layer.spec.n, layer.spec.group_size,
        FormatMegabytes(layer.spec.canonical_bytes()),
        absl::ToDoubleSeconds(now - layer_start));
    layer_start = now;
  };

  convert_ahead();
  size_t next = 0;
  for (; next < plan.layers.size() && report.status.ok(); ++next) {
    absl::StatusOr<ConvertedWeight> weight = ahead.front().get();
    ahead.pop_front();
    if (!weight.ok()) {
      // Uploads under way come first: they are earlier layers.
      while (!uploading.empty()) finish_oldest();
      if (report.status.ok()) {
        report.status = weight.status();
        report.failed_layer = static_cast<int64_t>(next);
      }
      ++next;
      break;
    }
    convert_ahead();
    // One at a time, each upload runs on this thread when it is waited for.
    uploading.emplace_back(
        next, std::async(uploads_at_once > 1 ? std::launch::async
                                             : std::launch::deferred,
                         [&store, &layer = plan.layers[next],
                          weight = *std::move(weight)]() mutable {
                           return store(std::move(weight), layer);
                         }));
    while (uploading.size() >= static_cast<size_t>(uploads_at_once) ||
           (!uploading.empty() && !report.status.ok())) {
      finish_oldest();
    }
  }
  while (!uploading.empty()) finish_oldest();
  report.not_tried = static_cast<int64_t>(plan.layers.size() - next);
  // After a failure, the conversions in flight finish before `ahead` is
  // destroyed; their results are dropped.
  report.elapsed = absl::Now() - start;
  return report;
}

}  // namespace

namespace checkpoint {

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
    if (HasMxfp4Blocks(file, prefix)) {
      if (absl::Status s = Mxfp4ExpertDims(file, prefix).status(); !s.ok()) {
        return s;
      }
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
      if (absl::Status s = CheckNvfp4Tensors(file, prefix); !s.ok()) return s;
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
    if (absl::Status s = CheckGptqTensors(file, prefix); !s.ok()) return s;
    return CheckpointLayout::kGptq;
  }
  if (qweight_columns * 8 == n) {
    if (absl::Status s = CheckAwqTensors(file, prefix); !s.ok()) return s;
    return CheckpointLayout::kAwq;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      Described(*tensors->qweight), " fits neither GPTQ nor AWQ with ",
      Described(*tensors->scales), ": GPTQ's qweight [K/8, N] would have ", n,
      " columns, AWQ's [K, N/8] would have N/8 = ", n / 8));
}

absl::StatusOr<LayerCheck> CheckLayer(const SafetensorsFile& file,
                                      absl::string_view prefix,
                                      CheckpointLayout layout,
                                      WeightFormat float_format,
                                      int64_t float_group_size, int64_t expert,
                                      GptqZeroConvention gptq_zeros) {
  switch (layout) {
    case CheckpointLayout::kGptq: {
      absl::StatusOr<GptqWeight> gptq =
          GptqWeightWithoutCodes(file, prefix, gptq_zeros);
      if (!gptq.ok()) return gptq.status();
      return LayerCheck{gptq->weight.spec, !gptq->activation_order.empty()};
    }
    case CheckpointLayout::kAwq: {
      absl::StatusOr<AwqFileWeight> awq = AwqWeightWithFileCodes(file, prefix);
      if (!awq.ok()) return awq.status();
      return LayerCheck{awq->weight.spec};
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
          CheckFloatWeight(file, prefix, float_format, float_group_size);
      if (!spec.ok()) return spec.status();
      return LayerCheck{*spec};
    }
  }
  return absl::InternalError("unknown checkpoint layout");
}

}  // namespace checkpoint

absl::StatusOr<checkpoint::GptqZeroConvention> ParseGptqZeros(
    absl::string_view text) {
  if (text == "v1") return checkpoint::GptqZeroConvention::kV1;
  if (text == "v2") return checkpoint::GptqZeroConvention::kV2;
  return absl::InvalidArgumentError(absl::StrCat(
      "\"", text,
      "\" is neither v1 (AutoGPTQ's and GPTQModel's \"gptq\" format: qzeros "
      "store the zero point - 1) nor v2 (GPTQModel's \"gptq_v2\": qzeros "
      "store the zero point)"));
}

absl::StatusOr<QuantizeSpec> ParseQuantizeSpec(absl::string_view text) {
  const size_t colon = text.find(':');
  if (colon == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", text, "\": ", kQuantizeSyntax));
  }
  const absl::string_view format_name = text.substr(0, colon);
  const absl::string_view group = text.substr(colon + 1);
  absl::StatusOr<WeightFormat> format = ParseWeightFormat(format_name);
  if (!format.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\": format \"", format_name, "\": ", kQuantizeSyntax));
  }
  QuantizeSpec spec{.format = *format};
  if (const int64_t fixed = FixedGroupSize(*format); fixed != 0) {
    if (group != absl::StrCat(fixed)) {
      return absl::InvalidArgumentError(
          absl::StrCat("\"", text, "\": ", format_name, " groups ", fixed,
                       " values per scale, so its GROUP must be ", fixed, ": ",
                       kQuantizeSyntax));
    }
    spec.group_size = fixed;
  } else if (group == "k" || group == "K") {
    spec.group_size = 0;
  } else if (!absl::SimpleAtoi(group, &spec.group_size) ||
             (spec.group_size != 32 && spec.group_size != 64 &&
              spec.group_size != 128)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "\"", text, "\": group \"", group, "\": ", kQuantizeSyntax));
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
          absl::StrCat("rule \"", text,
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
    return absl::NotFoundError(absl::StrCat(
        file.source_name(), " has no layers to import: ", kNoLayers));
  }

  // Layouts and names first: they are cheap to check, values are not.
  ImportPlan plan;
  plan.quantize = options.quantize;
  std::map<std::string, std::string> source_of_name;
  std::set<std::string> read_tensors;
  for (const std::string& prefix : prefixes) {
    absl::StatusOr<CheckpointLayout> layout =
        checkpoint::DetectLayout(file, prefix);
    if (absl::IsNotFound(layout.status())) {
      return UnknownLayer(file, prefix, discovered);
    }
    if (!layout.ok()) return layout.status();
    // An MXFP4 tensor of experts [E, N, K/32, 16] is E weights.
    int64_t experts = 0;
    if (*layout == CheckpointLayout::kMxfp4) {
      absl::StatusOr<std::vector<int64_t>> dims =
          checkpoint::Mxfp4ExpertDims(file, prefix);
      if (!dims.ok()) return dims.status();
      if (!dims->empty()) {
        experts = std::accumulate(dims->begin(), dims->end(), int64_t{1},
                                  std::multiplies<int64_t>());
      }
    }
    int64_t file_bytes = 0;
    for (std::string& tensor_name : LayerTensorNames(prefix, *layout)) {
      if (const TensorInfo* tensor = file.Find(tensor_name)) {
        file_bytes += tensor->num_bytes();
        read_tensors.insert(std::move(tensor_name));
      }
    }
    const std::string name = MapLayerName(prefix, options.name_map);
    for (int64_t expert = experts == 0 ? -1 : 0; expert < experts; ++expert) {
      ImportLayer& layer = plan.layers.emplace_back();
      layer.prefix = prefix;
      layer.layout = *layout;
      layer.gptq_zeros = options.gptq_zeros;
      layer.expert = expert;
      // Experts share their tensors evenly.
      layer.file_bytes = file_bytes / std::max<int64_t>(experts, 1);
      layer.name = expert < 0 ? name : absl::StrCat(name, ".", expert);
      if (absl::Status status = ValidateWeightName(layer.name); !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer \"", LayerSource(layer),
            "\" cannot be uploaded under its name (", status.message(),
            "; weight names are ", kWeightNameRule,
            "): rename it with FROM=TO in nibble import --name_map or "
            "nibbled --import_name_map"));
      }
      const auto [existing, inserted] =
          source_of_name.emplace(layer.name, LayerSource(layer));
      if (!inserted) {
        return absl::InvalidArgumentError(
            existing->second == LayerSource(layer)
                ? absl::StrCat("layer \"", prefix, "\" is listed twice")
                : absl::StrCat(
                      "layers \"", existing->second, "\" and \"",
                      LayerSource(layer), "\" would both be uploaded as \"",
                      layer.name,
                      "\": tell them apart with FROM=TO in nibble import "
                      "--name_map or nibbled --import_name_map"));
      }
    }
  }

  // Reads what the checks need from the disk at once, instead of one page
  // fault at a time.
  for (const ImportLayer& layer : plan.layers) {
    if (layer.expert > 0) continue;  // the same tensors as expert 0
    for (const std::string& name :
         ScatteredCheckedTensors(layer.prefix, layer.layout)) {
      if (const TensorInfo* tensor = file.Find(name)) file.Prefetch(*tensor);
    }
  }
  for (ImportLayer& layer : plan.layers) {
    absl::StatusOr<checkpoint::LayerCheck> check = CheckPlannedLayer(
        file, layer, options.quantize, options.check_float_values);
    if (!check.ok()) return check.status();
    layer.spec = check->spec;
    layer.has_activation_order = check->reorders_rows;
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
                           UploadFunction upload, std::ostream& progress,
                           int uploads_at_once) {
  return ConvertAndUpload(file, plan, upload, {}, uploads_at_once, progress);
}

ImportReport ExecuteImport(const SafetensorsFile& file, const ImportPlan& plan,
                           UploadFunction upload,
                           PackedUploadFunction upload_packed,
                           std::ostream& progress) {
  return ConvertAndUpload(file, plan, upload, {.packed = &upload_packed}, 1,
                          progress);
}

ImportReport ExecuteImport(const SafetensorsFile& file, const ImportPlan& plan,
                           UploadFunction upload,
                           BytesUploadFunction upload_bytes,
                           std::ostream& progress, int uploads_at_once) {
  return ConvertAndUpload(file, plan, upload, {.bytes = &upload_bytes},
                          uploads_at_once, progress);
}

ImportReport ExecuteImport(const SafetensorsFile& file, const ImportPlan& plan,
                           UploadFunction upload,
                           ColumnsUploadFunction upload_columns,
                           std::ostream& progress, int uploads_at_once) {
  return ConvertAndUpload(file, plan, upload, {.columns = &upload_columns},
                          uploads_at_once, progress);
}

}  // namespace nibble
