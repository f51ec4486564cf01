// Quantizes a float layer of a safetensors checkpoint, PREFIX.weight as
// PyTorch's nn.Linear stores it, into a nibble weight of any format
// (format/weight_format.h), by documented rounding rules that never clamp a
// code. The per-element loops run with AVX2 where cpu::DetectIsa()
// (kernels/cpu/cpu_kernels.h) says the CPU has it, so NIBBLE_ISA=scalar
// selects the baseline loops; both give the same weight.
//
// Example:
//   absl::StatusOr<QuantizedWeight> quantized = QuantizeFloatWeight(
//       file, "model.layers.0.self_attn.q_proj", WeightFormat::kU4b8, 128);
//   if (!quantized.ok()) return quantized.status();
#ifndef NIBBLE_CHECKPOINT_FLOAT_QUANTIZER_H_
#define NIBBLE_CHECKPOINT_FLOAT_QUANTIZER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {

// Quantizes PREFIX.weight, F16, BF16 or F32 [N, K] as PyTorch's nn.Linear
// stores it (out_features, in_features), into B = weight^T [K, N] of
// `format` with `group_size` (32, 64, 128 or K; the format's own where it
// fixes one, FixedGroupSize). For each group of `group_size` rows of one
// column:
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
// The FP4 formats with 8-bit scales (HasEightBitScales) round to the nearest
// E2M1 code as kFp4, with scales chosen so that nothing clips:
//   E8M0 scales: s = the smallest power of two with absmax / s <= 6 (from
//           2^-127 up); a group of zeros gets 2^-127 and +0 codes.
//   E4M3 scales under a global scale (HasGlobalScale): one global scale
//           g = amax / (6 * 448) over the whole tensor (fp32, stepped up
//           when rounding would leave amax / g above 6 * 448; 1 for a tensor
//           of zeros), then per group s = E4M3(absmax / 6 / g), stepped up
//           to the next E4M3 value when rounding would leave
//           absmax / (s * g) above 6; a group of zeros gets s = 0 and +0
//           codes.
// INVALID_ARGUMENT, naming the tensor, for another dtype or rank, a NaN or
// infinite element, or a group whose scale exceeds fp16's largest, 65504
// (the formats with fp16 scales).
absl::StatusOr<QuantizedWeight> QuantizeFloatWeight(const SafetensorsFile& file,
                                                    absl::string_view prefix,
                                                    WeightFormat format,
                                                    int64_t group_size);

// PREFIX.weight after checking its dtype (F16, BF16 or F32) and rank (2);
// INVALID_ARGUMENT, naming it, when it is missing or fails a check.
absl::StatusOr<const TensorInfo*> CheckFloatTensor(const SafetensorsFile& file,
                                                   absl::string_view prefix);

// The checks of a float layer's PREFIX.weight that need no element (dtype,
// shape, group size), and the spec QuantizeFloatWeight gives it, without
// the global scale of a format that has one, which needs the values.
absl::StatusOr<WeightSpec> CheckFloatSpec(const SafetensorsFile& file,
                                          absl::string_view prefix,
                                          WeightFormat format,
                                          int64_t group_size);

// QuantizeFloatWeight's checks without quantizing: CheckFloatSpec's, then
// every element (NaN, infinity) and every fp16 scale that would overflow,
// with QuantizeFloatWeight's errors. The spec it gives, global scale and all.
absl::StatusOr<WeightSpec> CheckFloatWeight(const SafetensorsFile& file,
                                            absl::string_view prefix,
                                            WeightFormat format,
                                            int64_t group_size);

}  // namespace nibble::checkpoint

#endif  // NIBBLE_CHECKPOINT_FLOAT_QUANTIZER_H_
