// Converts one linear layer of a safetensors checkpoint into a nibble weight
// (kernels/weight_format.h): 4-bit GPTQ and AWQ tensors are repacked without
// changing a single dequantized value, and plain float weights are quantized.
//
// Every function takes a layer prefix such as "model.layers.0.self_attn.q_proj"
// and reads the tensors PREFIX.qweight, PREFIX.qzeros, PREFIX.scales,
// PREFIX.g_idx (GPTQ, optional) or PREFIX.weight (floats). Other tensors of
// the layer (PREFIX.bias) are not part of the weight and are left alone.
// Every dtype and shape is checked before any data is read; a mismatch is
// INVALID_ARGUMENT naming the tensor, its shape and the shape it should have,
// and so is a missing tensor that the layout needs.
//
// Example:
//   absl::StatusOr<CheckpointLayout> layout = DetectLayout(file, prefix);
//   if (!layout.ok()) return layout.status();
//   if (*layout == CheckpointLayout::kGptq) {
//     absl::StatusOr<GptqWeight> gptq = ConvertGptqWeight(file, prefix);
//     if (!gptq.ok()) return gptq.status();
//     // Non-empty when act-order rows were regrouped: gather the
//     // activations' columns in this order before every matmul.
//     const std::vector<int64_t>& order = gptq->activation_order;
//   }
//   absl::StatusOr<QuantizedWeight> awq = ConvertAwqWeight(file, prefix);
//   absl::StatusOr<QuantizedWeight> quantized =
//       QuantizeFloatWeight(file, prefix, WeightFormat::kU4b8, 128);
#ifndef NIBBLE_CHECKPOINT_CONVERT_H_
#define NIBBLE_CHECKPOINT_CONVERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "kernels/weight_format.h"

namespace nibble::checkpoint {

enum class CheckpointLayout { kGptq, kAwq, kFloat };

// "gptq", "awq" or "float".
absl::string_view CheckpointLayoutName(CheckpointLayout layout);

// Which layout the tensors under `prefix` hold, after checking that their
// dtypes and shapes are consistent with it (without reading data):
//   PREFIX.qweight with PREFIX.g_idx, or whose column count equals that of
//     PREFIX.scales: kGptq;
//   PREFIX.qweight with 8 times fewer columns than PREFIX.scales: kAwq;
//   otherwise PREFIX.weight: kFloat.
// NOT_FOUND when neither PREFIX.qweight nor PREFIX.weight exists;
// UNIMPLEMENTED for GPTQ with other than 4 bits; INVALID_ARGUMENT, naming
// the tensor, for every other mismatch.
absl::StatusOr<CheckpointLayout> DetectLayout(const SafetensorsFile& file,
                                              absl::string_view prefix);

// How a GPTQ checkpoint stores its zero points.
enum class GptqZeroConvention {
  // AutoGPTQ and GPTQModel's "gptq" checkpoint_format: the stored value is
  // the zero point minus 1 (AutoGPTQ subtracts 1 when packing and adds it
  // back when dequantizing), so symmetric 4-bit layers store 7 for zero 8.
  // A stored 15 would mean zero point 16, which 4 bits cannot hold (it is
  // what AutoGPTQ's packing writes for a true zero of 0): INVALID_ARGUMENT.
  kV1,
  // GPTQModel's "gptq_v2" checkpoint_format: the stored value is the zero
  // point.
  kV2,
};

// A GPTQ weight, possibly with its rows of K reordered.
struct GptqWeight {
  QuantizedWeight weight;
  // Empty when the rows keep the checkpoint's order. Otherwise row r of
  // `weight` is row activation_order[r] of the checkpoint's weight B, so
  // that for every A [M, K]
  //   A · B == A' · weight,  where A'[:, r] = A[:, activation_order[r]];
  // the caller must gather the activations' columns this way before every
  // matmul with `weight` (or permute the producing layer's outputs).
  std::vector<int64_t> activation_order;
};

// A 4-bit GPTQ layer as AutoGPTQ and GPTQModel write it:
//   PREFIX.qweight I32 [K/8, N]: the code of row k = 8i + j, column n, in
//                  bits 4j..4j+3 of word [i, n] (nibble's own layout);
//   PREFIX.qzeros  I32 [G, N/8]: the stored zero point of group g, column
//                  n = 8c + j, in bits 4j..4j+3 of word [g, c];
//   PREFIX.scales  F16 [G, N];
//   PREFIX.g_idx   I32 [K], optional: the group of each row k.
// (U32 is accepted wherever I32 is.) The group size is K / G. Without g_idx,
// or when g_idx[k] == k / group size for every k, row k is in group
// k / group size and the rows are copied as they are. Otherwise
// ("act-order", desc_act=True) every group must hold exactly K / G rows: the
// rows are stably sorted by group, so that groups become contiguous, and
// activation_order says how (above).
// w = (q - z) * s. When every zero point z is 8 the result is kU4b8, else
// kU4 with the zero points.
absl::StatusOr<GptqWeight> ConvertGptqWeight(
    const SafetensorsFile& file, absl::string_view prefix,
    GptqZeroConvention zero_convention = GptqZeroConvention::kV1);

// AWQ's nibble order within a packed word (AutoAWQ's AWQ_ORDER): nibble j
// (bits 4j..4j+3) of the word for columns 8c..8c+7 holds column
// 8c + kAwqNibbleColumn[j]. Its inverse, AWQ_REVERSE_ORDER
// = {0, 4, 1, 5, 2, 6, 3, 7}, gives the nibble that holds column 8c + j.
inline constexpr int kAwqNibbleColumn[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// A 4-bit AWQ layer as AutoAWQ's GEMM kernels store it:
//   PREFIX.qweight I32 [K, N/8]: row k, columns 8c..8c+7 in word [k, c],
//                  nibbles in kAwqNibbleColumn order;
//   PREFIX.qzeros  I32 [G, N/8]: the zero points (as they are, no offset),
//                  packed the same way;
//   PREFIX.scales  F16 [G, N].
// (U32 is accepted wherever I32 is.) The group size is K / G, and
// w = (q - z) * s: the result is kU4 with the codes repacked.
absl::StatusOr<QuantizedWeight> ConvertAwqWeight(const SafetensorsFile& file,
                                                 absl::string_view prefix);

// Quantizes PREFIX.weight, F16, BF16 or F32 [N, K] as PyTorch's nn.Linear
// stores it (out_features, in_features), into B = weight^T [K, N] of
// `format` with `group_size` (32, 64, 128 or K). For each group of
// `group_size` rows of one column:
//   kU4b8: s = absmax / 7,  q = round(w / s) + 8;
//   kU4:   lo = min(min w, 0), hi = max(max w, 0) (the range always holds 0,
//          so that zero dequantizes exactly), s = (hi - lo) / 15,
//          z = round(-lo / s), q = round(w / s) + z;
//   kFp4:  s = absmax / 6, q = the E2M1 code nearest to w / s (+0 for zero).
// round() is to nearest, ties to even (as torch.round), and E2M1 ties go to
// the code with an even mantissa. s is rounded to the nearest fp16; when that
// rounding would leave the group's extreme value outside the codes (s rounded
// down, a tie, or s underflowed to 0), s moves up one fp16 step, which always
// suffices. So no code is ever clamped: every int element is within s / 2 of
// its input, every fp4 element within half the gap between its neighbouring
// E2M1 values times s. A group of zeros gets s = 0 and the codes of zero
// (8 for kU4b8; q = z = 0 for kU4; +0 for kFp4): exact zeros either way.
// INVALID_ARGUMENT, naming the tensor, for another dtype or rank, a NaN or
// infinite element, or a group whose scale exceeds fp16's largest, 65504.
absl::StatusOr<QuantizedWeight> QuantizeFloatWeight(const SafetensorsFile& file,
                                                    absl::string_view prefix,
                                                    WeightFormat format,
                                                    int64_t group_size);

}  // namespace nibble::checkpoint

#endif  // NIBBLE_CHECKPOINT_CONVERT_H_
