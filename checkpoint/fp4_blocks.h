// Converts the FP4 block layers of a safetensors checkpoint, FP4 E2M1 codes
// in blocks that share an 8-bit scale, into nibble weights
// (format/weight_format.h) without changing a single dequantized value:
// MXFP4 as OpenAI's gpt-oss checkpoints store it (kMxfp4) and NVFP4 as
// NVIDIA's TensorRT Model Optimizer exports it (kNvfp4). The checkpoints
// store the weight column by column, as Fp4Columns (format/fp4_columns.h)
// holds it: uploads may carry it as it is, or it is transposed into the
// canonical layout.
//
// Every function takes a layer prefix such as "model.layers.0.mlp.down_proj".
// Every dtype and shape is checked before any data is read (but NVFP4's
// one-value global scale, which its spec holds); a mismatch is
// INVALID_ARGUMENT naming the tensor, its shape and the shape it should have,
// and so is a missing tensor.
//
// Example:
//   absl::StatusOr<QuantizedWeight> expert3 =
//       ConvertMxfp4Weight(file, "model.layers.0.mlp.experts.down_proj", 3);
//   absl::StatusOr<Fp4Columns> columns =
//       Nvfp4Columns(file, "model.layers.0.self_attn.o_proj");
//   if (!columns.ok()) return columns.status();
//   absl::StatusOr<PackedWeight> panels = PackedWeight::PackColumns(*columns);
#ifndef NIBBLE_CHECKPOINT_FP4_BLOCKS_H_
#define NIBBLE_CHECKPOINT_FP4_BLOCKS_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {

// --- MXFP4.

// Whether the file has PREFIX_blocks or PREFIX.blocks, an MXFP4 layer's
// codes.
bool HasMxfp4Blocks(const SafetensorsFile& file, absl::string_view prefix);

// The leading dimensions of an MXFP4 layer's blocks, one weight per index
// (gpt-oss stores its experts [E, N, K/32, 16]): empty for a single weight
// [N, K/32, 16]. The same errors as ConvertMxfp4Weight's shape checks.
absl::StatusOr<std::vector<int64_t>> Mxfp4ExpertDims(
    const SafetensorsFile& file, absl::string_view prefix);

// An MXFP4 layer as OpenAI's gpt-oss checkpoints store it (the original
// checkpoint names the tensors PREFIX.blocks and PREFIX.scales, Hugging Face's
// conversion PREFIX_blocks and PREFIX_scales; both are read):
//   PREFIX_blocks U8 [..., N, K/32, 16]: row n of the weight [N, K]
//                 ([out_features, in_features]), two FP4 E2M1 codes per
//                 byte, the lower nibble first along K;
//   PREFIX_scales U8 or F8_E8M0 [..., N, K/32]: one E8M0 exponent per 32
//                 codes, w = fp4(q) * 2^(e - 127).
// B = W^T [K, N] becomes kMxfp4, group 32: the codes and exponents are copied
// as they are. `expert` indexes the leading dimensions flattened (row-major),
// and must be 0 when there are none. INVALID_ARGUMENT, naming the tensor, for
// a wrong dtype or shape, a missing PREFIX_scales, an expert out of range or
// an exponent of 0xff (NaN).
absl::StatusOr<QuantizedWeight> ConvertMxfp4Weight(const SafetensorsFile& file,
                                                   absl::string_view prefix,
                                                   int64_t expert = 0);

// ConvertMxfp4Weight's weight as the checkpoint stores it, column by column,
// in the file's memory: for PackedWeight::PackColumns and uploads in
// CodeLayout::kColumns, which save transposing it into the canonical layout.
// The same checks and errors.
absl::StatusOr<Fp4Columns> Mxfp4Columns(const SafetensorsFile& file,
                                        absl::string_view prefix,
                                        int64_t expert);

// --- NVFP4.

// An NVFP4 layer as NVIDIA's TensorRT Model Optimizer (ModelOpt) exports it:
//   PREFIX.weight         U8 [N, K/2]: two FP4 E2M1 codes per byte, the lower
//                         nibble first along K;
//   PREFIX.weight_scale   F8_E4M3 [N, K/16]: one scale per 16 codes;
//   PREFIX.weight_scale_2 F32 [] or [1]: the global scale g;
// w = fp4(q) * e4m3(s) * g. (PREFIX.input_scale, the activations' scale, is
// not part of the weight.) B = W^T [K, N] becomes kNvfp4, group 16, with
// global_scale g, codes and scales copied as they are. INVALID_ARGUMENT,
// naming the tensor, for a wrong dtype or shape, a missing scale tensor, K
// not a multiple of 16, a NaN scale or a global scale that is not finite and
// positive.
absl::StatusOr<QuantizedWeight> ConvertNvfp4Weight(const SafetensorsFile& file,
                                                   absl::string_view prefix);

// ConvertNvfp4Weight's checks but those of the scales' values: dtypes,
// shapes and the global scale.
absl::Status CheckNvfp4Tensors(const SafetensorsFile& file,
                               absl::string_view prefix);

// ConvertNvfp4Weight's weight column by column, as Mxfp4Columns.
absl::StatusOr<Fp4Columns> Nvfp4Columns(const SafetensorsFile& file,
                                        absl::string_view prefix);

}  // namespace nibble::checkpoint

#endif  // NIBBLE_CHECKPOINT_FP4_BLOCKS_H_
