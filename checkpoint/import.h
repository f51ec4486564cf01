// Imports the linear layers of a safetensors checkpoint into nibble weights
// (`nibble import`): GPTQ, AWQ, MXFP4 and NVFP4 layers are repacked as they
// are (gptq.h, awq.h, fp4_blocks.h), float layers quantized
// (float_quantizer.h); GPTQ act-order layers have their rows regrouped by
// group and carry the permutation as the weight's activation order, which
// the server applies to A's columns before every matmul. DetectLayout says
// which of these layouts a layer holds, CheckLayer checks it as converting
// it would. Import runs in two steps. PlanImport finds the layers, names
// them and checks every one without converting it (dtypes, shapes and every
// value a conversion would refuse), so that a checkpoint with a single bad
// layer is refused before anything is uploaded; ExecuteImport then converts
// and uploads them in order, converting the next two layers on threads of
// their own while one uploads (or two, for `nibble import` and for the
// canonical weights of `nibbled --import`), so that at most three (four)
// converted layers are held in memory.
//
// Example:
//   absl::StatusOr<checkpoint::SafetensorsFile> file =
//       checkpoint::SafetensorsFile::Open("model.safetensors");
//   absl::StatusOr<checkpoint::CheckpointLayout> layout =
//       checkpoint::DetectLayout(*file, "model.layers.0.self_attn.q_proj");
//   ImportOptions options;
//   options.name_map = *ParseNameMap({"model.layers.=L"});
//   options.quantize = *ParseQuantizeSpec("u4:32");
//   absl::StatusOr<ImportPlan> plan = PlanImport(*file, options);
//   if (!plan.ok()) return plan.status();
//   const ImportReport report = ExecuteImport(
//       *file, *plan,
//       [&](const QuantizedWeight& weight, absl::string_view name) {
//         return client.Upload(weight, name).status();
//       },
//       std::cerr);
#ifndef NIBBLE_CHECKPOINT_IMPORT_H_
#define NIBBLE_CHECKPOINT_IMPORT_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "checkpoint/gptq.h"
#include "checkpoint/safetensors.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "kernels/packed_weight.h"

namespace nibble {
namespace checkpoint {

enum class CheckpointLayout { kGptq, kAwq, kFloat, kMxfp4, kNvfp4 };

// "gptq", "awq", "float", "mxfp4" or "nvfp4".
absl::string_view CheckpointLayoutName(CheckpointLayout layout);

// Which layout the tensors under `prefix` hold, after checking that their
// dtypes and shapes are consistent with it (without reading data, but
// NVFP4's one-value global scale):
//   PREFIX.qweight with PREFIX.g_idx, or whose column count equals that of
//     PREFIX.scales: kGptq;
//   PREFIX.qweight with 8 times fewer columns than PREFIX.scales: kAwq;
//   PREFIX_blocks or PREFIX.blocks: kMxfp4;
//   a U8 PREFIX.weight: kNvfp4;
//   otherwise PREFIX.weight: kFloat.
// NOT_FOUND when none of PREFIX.qweight, PREFIX_blocks, PREFIX.blocks and
// PREFIX.weight exists;
// UNIMPLEMENTED for GPTQ with other than 4 bits; INVALID_ARGUMENT, naming
// the tensor, for every other mismatch.
absl::StatusOr<CheckpointLayout> DetectLayout(const SafetensorsFile& file,
                                              absl::string_view prefix);

// What converting a layer of `layout` gives, without its codes.
struct LayerCheck {
  WeightSpec spec;
  // GPTQ act-order: ConvertGptqWeight would regroup the rows and return a
  // non-empty activation_order.
  bool reorders_rows = false;
};

// Checks the layer under `prefix` as converting it would, and says what the
// conversion gives, without producing the weight: every dtype and shape, and
// every value a conversion refuses (scales, zero points, g_idx; for float
// layers NaN or infinite elements and fp16 scales that overflow). It reads
// only the small tensors, except for float layers, whose elements it scans
// once. A layer it accepts converts without error (GPTQ with
// `gptq_zeros`; MXFP4's `expert`; float layers as
// QuantizeFloatWeight with `float_format` and `float_group_size`); it
// refuses with the converter's own errors.
absl::StatusOr<LayerCheck> CheckLayer(
    const SafetensorsFile& file, absl::string_view prefix,
    CheckpointLayout layout, WeightFormat float_format,
    int64_t float_group_size, int64_t expert = 0,
    GptqZeroConvention gptq_zeros = GptqZeroConvention::kV1);

}  // namespace checkpoint

// How float layers are quantized: `nibble import --quantize FORMAT:GROUP`.
struct QuantizeSpec {
  WeightFormat format = WeightFormat::kU4b8;
  // 32, 64 or 128; 0 for one group per column (group size K).
  int64_t group_size = 128;

  friend bool operator==(const QuantizeSpec&, const QuantizeSpec&) = default;
};

// "FORMAT:GROUP": FORMAT fp4, u4b8 or u4; GROUP 32, 64, 128, or k for one
// scale per column; or mxfp4:32, nvfp4:16, whose groups are fixed.
// INVALID_ARGUMENT saying what is expected otherwise, starting with the text
// quoted, so that the caller puts its flag's name in front.
absl::StatusOr<QuantizeSpec> ParseQuantizeSpec(absl::string_view text);
// The text ParseQuantizeSpec reads back: "u4b8:128", "fp4:k".
std::string QuantizeSpecName(const QuantizeSpec& spec);

// "v1" or "v2", the values of --gptq_zeros and --import_gptq_zeros;
// INVALID_ARGUMENT saying what each means otherwise.
absl::StatusOr<checkpoint::GptqZeroConvention> ParseGptqZeros(
    absl::string_view text);

// One rule of `nibble import --name_map`: a layer whose prefix starts with
// `from` is uploaded under that prefix with `from` replaced by `to`.
struct NameMapRule {
  std::string from;
  std::string to;

  friend bool operator==(const NameMapRule&, const NameMapRule&) = default;
};

// Rules from "FROM=TO" texts, in order. INVALID_ARGUMENT for a text without
// '=' or with an empty FROM, starting `rule "TEXT"` for the caller to put its
// flag's name in front.
absl::StatusOr<std::vector<NameMapRule>> ParseNameMap(
    absl::Span<const std::string> texts);
// `prefix` with the first rule whose `from` starts it applied; `prefix` as it
// is when none does.
std::string MapLayerName(absl::string_view prefix,
                         absl::Span<const NameMapRule> rules);

struct ImportOptions {
  // Layer prefixes to import, in order; empty for every layer of the file.
  std::vector<std::string> layers;
  std::vector<NameMapRule> name_map;
  // For float layers; GPTQ and AWQ layers keep their own format.
  QuantizeSpec quantize;
  // How GPTQ layers store their zero points: kV1 (AutoGPTQ's and GPTQModel's
  // default "gptq" format, stored = zero point - 1) or kV2 (GPTQModel's
  // "gptq_v2", stored = zero point). Files do not say which.
  checkpoint::GptqZeroConvention gptq_zeros =
      checkpoint::GptqZeroConvention::kV1;
  // Whether PlanImport reads every element of the float layers, for NaN,
  // infinity and scales that overflow, so that a bad one is refused before
  // anything is uploaded. Without, QuantizeFloatWeight refuses it as it
  // quantizes, and ExecuteImport stops at that layer: for an importer that
  // serves nothing until every layer is stored (nibbled --import), which
  // then reads each float layer once instead of twice. The plan's spec of a
  // layer quantized to nvfp4 then lacks its global scale.
  bool check_float_values = true;
};

// One layer to import, checked.
struct ImportLayer {
  // e.g. "model.layers.0.self_attn.q_proj".
  std::string prefix;
  checkpoint::CheckpointLayout layout = checkpoint::CheckpointLayout::kFloat;
  // For a GPTQ layer: ImportOptions::gptq_zeros.
  checkpoint::GptqZeroConvention gptq_zeros =
      checkpoint::GptqZeroConvention::kV1;
  // For an MXFP4 layer that holds several weights (experts [E, N, K/32, 16]):
  // which one, its index in the leading dimensions flattened; the weight is
  // named NAME.<expert>. -1 for a layer of one weight.
  int64_t expert = -1;
  // The weight name it is uploaded as.
  std::string name;
  // The weight it converts to.
  WeightSpec spec;
  // GPTQ act-order: the weight carries an activation order (K int32 entries,
  // which the server holds beside it).
  bool has_activation_order = false;
  // Bytes of the layer's tensors in the file, read by each conversion.
  int64_t file_bytes = 0;
};

struct ImportPlan {
  // In the order of ImportOptions::layers, else sorted by prefix.
  std::vector<ImportLayer> layers;
  // When every layer is imported: the tensors that belong to no layer (norms,
  // biases, 1-D and non-float tensors), each as "NAME (DTYPE [SHAPE])".
  std::vector<std::string> skipped;
  // How the float layers are quantized.
  QuantizeSpec quantize;
};

// The layers of `file` that `options` selects, each checked as converting it
// would (checkpoint::CheckLayer) without converting it: only float layers'
// elements are read, once, for NaN, infinity and scales that overflow (unless
// options.check_float_values is false). Without
// options.layers, a layer is every prefix P with a tensor P.qweight (GPTQ,
// AWQ), a U8 P_blocks or P.blocks (MXFP4; one layer per expert when it has
// leading dimensions), a 2-D U8 P.weight (NVFP4) or a 2-D F16, BF16 or F32
// P.weight. Errors, naming the layer: NOT_FOUND for an options.layers prefix
// that is no layer (suggesting the layers with the longest common start);
// INVALID_ARGUMENT for a weight name that is not a valid weight name or that
// two layers share; the converters' errors otherwise. A GPTQ act-order layer
// is accepted: its weight comes with an activation order.
absl::StatusOr<ImportPlan> PlanImport(const checkpoint::SafetensorsFile& file,
                                      const ImportOptions& options);

// Uploads `weight` as `name`; an RPC's status.
using UploadFunction =
    absl::FunctionRef<absl::Status(const QuantizedWeight&, absl::string_view)>;

// Stores a layer's panels as `name`, for a caller that has no use for its
// canonical weight (nibbled --import on the CPU backend without --data_dir):
// packing the file's codes straight into panels (PackedWeight::PackColumns
// for MXFP4 and NVFP4, PackWithCodes for GPTQ and AWQ) saves making the
// whole canonical codes first, a copy or transpose as large as the panels.
using PackedUploadFunction =
    absl::FunctionRef<absl::Status(PackedWeight, absl::string_view)>;

// Uploads a layer as `name` from its tensors' bytes, some straight from the
// mapped file: MXFP4 and NVFP4 layers in the column layout their checkpoints
// store, GPTQ layers without act-order with the file's qweight. For `nibble
// import`, whose servers take both, so that the client sends the file's bytes
// without copying or transposing them.
using BytesUploadFunction =
    absl::FunctionRef<absl::Status(const WeightBytes&, absl::string_view)>;

// Uploads an MXFP4 or NVFP4 layer as `name` in the column layout its
// checkpoint stores, for a server whose GPU arranges it without a transpose
// on the host (nibbled --import on the GPU backend).
using ColumnsUploadFunction =
    absl::FunctionRef<absl::Status(const Fp4Columns&, absl::string_view)>;

struct ImportReport {
  // The names of the weights uploaded, in order. With uploads at once, a
  // layer after the one that failed may have been uploaded too.
  std::vector<std::string> uploaded;
  // Canonical bytes of the weights uploaded.
  int64_t uploaded_bytes = 0;
  // Bytes of the file's tensors read for them.
  int64_t file_bytes = 0;
  absl::Duration elapsed;
  // OK, or the first failure: the layers after it were not tried.
  absl::Status status;
  // The index in the plan of the layer that failed; -1 when none did.
  int64_t failed_layer = -1;
  // The layers after a failure that were neither converted nor uploaded.
  int64_t not_tried = 0;
};

// Converts and uploads the layers of `plan` in order, stopping at the first
// failure; a GPTQ act-order layer's weight has its activation_order set.
// The next two layers convert on threads of their own while one uploads.
// With `uploads_at_once` 1, `upload` is called on the calling thread, one
// layer at a time; with more, on threads of their own, that many layers at
// once in plan order, so that a server stores one layer while the next
// arrives (`upload` must then be thread-safe). Writes a line per layer to
// `progress`, in order, with the time since the line before:
//   [3/84] model.layers.0.mlp.up_proj → L0.up (gptq → u4b8, k=4096 n=11008
//   group=128, 23.2 MB) 0.41 s
// with "u4b8 act-order" for a layer with an activation order.
ImportReport ExecuteImport(const checkpoint::SafetensorsFile& file,
                           const ImportPlan& plan, UploadFunction upload,
                           std::ostream& progress, int uploads_at_once = 1);
// The same, with MXFP4, NVFP4, AWQ and GPTQ layers (but act-order ones)
// packed and handed to `upload_packed` instead of `upload`, one at a time.
ImportReport ExecuteImport(const checkpoint::SafetensorsFile& file,
                           const ImportPlan& plan, UploadFunction upload,
                           PackedUploadFunction upload_packed,
                           std::ostream& progress);
// The same, with MXFP4, NVFP4 and GPTQ layers (but act-order ones) handed
// to `upload_bytes` instead of `upload`, `uploads_at_once` at a time.
ImportReport ExecuteImport(const checkpoint::SafetensorsFile& file,
                           const ImportPlan& plan, UploadFunction upload,
                           BytesUploadFunction upload_bytes,
                           std::ostream& progress, int uploads_at_once = 1);
// The same, with MXFP4 and NVFP4 layers handed to `upload_columns` instead of
// `upload`, `uploads_at_once` at a time.
ImportReport ExecuteImport(const checkpoint::SafetensorsFile& file,
                           const ImportPlan& plan, UploadFunction upload,
                           ColumnsUploadFunction upload_columns,
                           std::ostream& progress, int uploads_at_once = 1);

}  // namespace nibble

#endif  // NIBBLE_CHECKPOINT_IMPORT_H_
