// Converts a 4-bit GPTQ layer of a safetensors checkpoint, as AutoGPTQ and
// GPTQModel write it, into a nibble weight (format/weight_format.h) without
// changing a single dequantized value. Act-order layers (desc_act=True, whose
// g_idx scatters rows over groups) have their rows regrouped, and say how.
//
// Every function takes a layer prefix such as "model.layers.0.self_attn.q_proj"
// and reads PREFIX.qweight, PREFIX.qzeros, PREFIX.scales and PREFIX.g_idx
// (optional). Every dtype and shape is checked before any data is read; a
// mismatch is INVALID_ARGUMENT naming the tensor, its shape and the shape it
// should have, and so is a missing tensor.
//
// Example:
//   absl::StatusOr<GptqWeight> gptq = ConvertGptqWeight(file, prefix);
//   if (!gptq.ok()) return gptq.status();
//   // Non-empty when act-order rows were regrouped: the weight multiplies
//   // the activations' columns in this order.
//   gptq->weight.activation_order = std::move(gptq->activation_order);
#ifndef NIBBLE_CHECKPOINT_GPTQ_H_
#define NIBBLE_CHECKPOINT_GPTQ_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {

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
// kU4 with the zero points. UNIMPLEMENTED for GPTQ with other than 4 bits.
absl::StatusOr<GptqWeight> ConvertGptqWeight(
    const SafetensorsFile& file, absl::string_view prefix,
    GptqZeroConvention zero_convention = GptqZeroConvention::kV1);

// ConvertGptqWeight's checks of dtypes and shapes, which read no data.
absl::Status CheckGptqTensors(const SafetensorsFile& file,
                              absl::string_view prefix);

// ConvertGptqWeight but for the codes (weight.qweight is empty): every check
// and error, reading the scales, zero points and g_idx but not qweight.
absl::StatusOr<GptqWeight> GptqWeightWithoutCodes(
    const SafetensorsFile& file, absl::string_view prefix,
    GptqZeroConvention zero_convention = GptqZeroConvention::kV1);

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

}  // namespace nibble::checkpoint

#endif  // NIBBLE_CHECKPOINT_GPTQ_H_
