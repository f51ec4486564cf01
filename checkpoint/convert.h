// Converts one linear layer of a safetensors checkpoint into a nibble weight
// (format/weight_format.h): 4-bit GPTQ, AWQ, MXFP4 and NVFP4 tensors are
// repacked without changing a single dequantized value, and plain float
// weights are quantized.
//
// Every function takes a layer prefix such as "model.layers.0.self_attn.q_proj"
// and reads the tensors PREFIX.qweight, PREFIX.qzeros, PREFIX.scales,
// PREFIX.g_idx (GPTQ, optional), PREFIX_blocks and PREFIX_scales (MXFP4),
// PREFIX.weight, PREFIX.weight_scale and PREFIX.weight_scale_2 (NVFP4) or
// PREFIX.weight (floats). Other tensors of the layer (PREFIX.bias,
// PREFIX.input_scale) are not part of the weight and are left alone.
// Every dtype and shape is checked before any data is read (but NVFP4's
// one-value global scale, which its spec holds); a mismatch is
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
//     // activations' columns in this order before every matmul (what
//     // QuantizedWeight::activation_order does once it is moved there).
//     const std::vector<int32_t>& order = gptq->activation_order;
//   }
//   absl::StatusOr<QuantizedWeight> awq = ConvertAwqWeight(file, prefix);
//   absl::StatusOr<QuantizedWeight> expert3 =
//       ConvertMxfp4Weight(file, "model.layers.0.mlp.experts.down_proj", 3);
//   absl::StatusOr<QuantizedWeight> quantized =
//       QuantizeFloatWeight(file, prefix, WeightFormat::kU4b8, 128);
#ifndef NIBBLE_CHECKPOINT_CONVERT_H_
#define NIBBLE_CHECKPOINT_CONVERT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {

enum class CheckpointLayout { kGptq, kAwq, kFloat, kMxfp4, kNvfp4 };

// "gptq", "awq", "float", "mxfp4" or "nvfp4".
absl::string_view CheckpointLayoutName(CheckpointLayout layout);

// Which layout the tensors under `prefix` hold, after checking that their
// dtypes and shapes are consistent with it (without reading data):
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
  // matmul with `weight`: ExecuteImport moves it into
  // weight.activation_order, which nibbled applies.
  std::vector<int32_t> activation_order;
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

// A GPTQ layer without act-order whose codes stay in the file: its qweight
// is nibble's canonical qweight as it is.
struct GptqFileWeight {
  // ConvertGptqWeight's weight but for its qweight, which is empty.
  QuantizedWeight weight;
  // The file's PREFIX.qweight bytes.
  absl::string_view qweight;

  // The tensors to upload; `weight` and the file must outlive them.
  WeightBytes bytes() const;
};

// ConvertGptqWeight without copying the codes, for uploads that send them
// from the file. The same checks and errors, and FAILED_PRECONDITION for an
// act-order layer, whose rows must be regrouped (ConvertGptqWeight).
absl::StatusOr<GptqFileWeight> GptqWeightWithFileCodes(
    const SafetensorsFile& file, absl::string_view prefix,
    GptqZeroConvention zero_convention = GptqZeroConvention::kV1);

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

// An AWQ layer whose codes stay in the file, to be repacked a few rows at a
// time by whoever reads them, so that the whole canonical qweight is never
// held (packing straight into panels, PanelCodeWriter).
struct AwqFileWeight {
  // ConvertAwqWeight's weight but for its qweight, which is empty.
  QuantizedWeight weight;
  // The file's PREFIX.qweight, AWQ's [K, N/8].
  const uint8_t* qweight = nullptr;

  // Word rows [first, first + count) of ConvertAwqWeight's qweight (rows
  // 8 * first onward of B), [count][N] words, into `out`.
  void CanonicalWordRows(int64_t first, int64_t count, uint32_t* out) const;
};

// ConvertAwqWeight without repacking the codes: the same checks and errors.
absl::StatusOr<AwqFileWeight> AwqWeightWithFileCodes(
    const SafetensorsFile& file, absl::string_view prefix);

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

// ConvertMxfp4Weight's and ConvertNvfp4Weight's weights as the checkpoint
// stores them, column by column, in the file's memory: for PackedWeight::
// PackColumns and uploads in CodeLayout::kColumns, which save transposing
// them into the canonical layout. The same checks and errors.
absl::StatusOr<Fp4Columns> Mxfp4Columns(const SafetensorsFile& file,
                                        absl::string_view prefix,
                                        int64_t expert);
absl::StatusOr<Fp4Columns> Nvfp4Columns(const SafetensorsFile& file,
                                        absl::string_view prefix);

// Quantizes PREFIX.weight, F16, BF16 or F32 [N, K] as PyTorch's nn.Linear
// stores it (out_features, in_features), into B = weight^T [K, N] of
// `format` with `group_size` (32, 64, 128 or K; 32 for kMxfp4, 16 for
// kNvfp4). For each group of `group_size` rows of one column:
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
// The FP4 formats with 8-bit scales round to the nearest E2M1 code as kFp4,
// with scales chosen so that nothing clips:
//   kMxfp4: s = the smallest power of two with absmax / s <= 6 (E8M0, from
//           2^-127 up); a group of zeros gets 2^-127 and +0 codes.
//   kNvfp4: one global scale g = amax / (6 * 448) over the whole tensor
//           (fp32, stepped up when rounding would leave amax / g above
//           6 * 448; 1 for a tensor of zeros), then per group
//           s = E4M3(absmax / 6 / g), stepped up to the next E4M3 value when
//           rounding would leave absmax / (s * g) above 6; a group of zeros
//           gets s = 0 and +0 codes.
// INVALID_ARGUMENT, naming the tensor, for another dtype or rank, a NaN or
// infinite element, or a group whose scale exceeds fp16's largest, 65504
// (the formats with fp16 scales).
absl::StatusOr<QuantizedWeight> QuantizeFloatWeight(const SafetensorsFile& file,
                                                    absl::string_view prefix,
                                                    WeightFormat format,
                                                    int64_t group_size);

// Whether QuantizeFloatWeight and CheckLayer may run their per-element loops
// with AVX2 where the CPU has it (the default) or must use the baseline ISA.
// Both give the same results; for tests that compare them.
void AllowFloatQuantizationAvx2ForTesting(bool allowed);

// What converting a layer of `layout` gives, without its codes.
struct LayerCheck {
  WeightSpec spec;
  // GPTQ act-order: ConvertGptqWeight would regroup the rows and return a
  // non-empty activation_order.
  bool reorders_rows = false;
};

// The checks of a float layer's PREFIX.weight that need no element (dtype,
// shape, group size), and the spec QuantizeFloatWeight gives it, without
// kNvfp4's global scale, which needs the values.
absl::StatusOr<WeightSpec> CheckFloatSpec(const SafetensorsFile& file,
                                          absl::string_view prefix,
                                          WeightFormat format,
                                          int64_t group_size);

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

}  // namespace nibble::checkpoint

#endif  // NIBBLE_CHECKPOINT_CONVERT_H_
