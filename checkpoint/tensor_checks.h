// Checks and reads that the checkpoint layouts' converters share: a tensor's
// dtype and rank, the spec its shapes imply, the tensors a layer needs, fp16
// scales, and the packed INT4 tensors (qweight, qzeros, scales) that GPTQ
// and AWQ layers have in common. Every refusal is INVALID_ARGUMENT naming
// the tensor, with its shape and what it should be where shapes are at fault.
//
// Example:
//   const TensorInfo* weight = nullptr;
//   if (absl::Status s = FindLayerTensors(file, prefix, {{&weight, "weight"}},
//                                         "a layer needs its weight");
//       !s.ok()) {
//     return s;
//   }
//   if (absl::Status s = CheckDtype(*weight, {SafetensorsDtype::kU8});
//       !s.ok()) {
//     return s;
//   }
//   if (absl::Status s = CheckRank(*weight, 2); !s.ok()) return s;
#ifndef NIBBLE_CHECKPOINT_TENSOR_CHECKS_H_
#define NIBBLE_CHECKPOINT_TENSOR_CHECKS_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/safetensors.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {

// fp16's exponent field; all ones is infinity or NaN.
inline constexpr uint16_t kHalfExponentBits = 0x7c00;

// "[d0, d1]".
std::string ShapeString(absl::Span<const int64_t> shape);

// "NAME [d0, d1]", for messages that compare two tensors.
std::string Described(const TensorInfo& tensor);

absl::Status CheckDtype(const TensorInfo& tensor,
                        std::initializer_list<SafetensorsDtype> allowed);

absl::Status CheckRank(const TensorInfo& tensor, size_t rank);

// The spec's own check, with the tensors it was derived from named.
absl::Status CheckSpec(const WeightSpec& spec, absl::string_view derived_from);

// Sets each field to the tensor PREFIX.<suffix>; INVALID_ARGUMENT naming the
// first one missing, followed by `needs` (what such a layer holds).
absl::Status FindLayerTensors(
    const SafetensorsFile& file, absl::string_view prefix,
    std::initializer_list<std::pair<const TensorInfo**, absl::string_view>>
        fields,
    absl::string_view needs);

// Word `index` of little-endian 32-bit words.
inline uint32_t LoadWord(absl::Span<const uint8_t> bytes, int64_t index) {
  const uint8_t* p = bytes.data() + 4 * index;
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
         uint32_t{p[3]} << 24;
}

// Copies fp16 scales [groups, N], refusing NaN and infinity: a scale that is
// not finite would spoil every product with its group.
absl::StatusOr<std::vector<uint16_t>> ReadFp16Scales(
    const SafetensorsFile& file, const TensorInfo& scales);

// --- The packed INT4 tensors of GPTQ and AWQ layers.

// The tensors of a GPTQ or AWQ layer, checked against each other, and the
// weight they describe (format still to be decided from the zero points).
struct PackedTensors {
  const TensorInfo* qweight = nullptr;
  const TensorInfo* qzeros = nullptr;
  const TensorInfo* scales = nullptr;
  const TensorInfo* g_idx = nullptr;  // GPTQ only, optional
  WeightSpec spec;
};

// Finds PREFIX.qweight, .qzeros and .scales, and checks their dtypes and
// ranks (I32 or U32, I32 or U32, F16; 2 each).
absl::StatusOr<PackedTensors> FindPackedTensors(const SafetensorsFile& file,
                                                absl::string_view prefix);

// Checks that qzeros is [groups, N/8], where scales is [groups, N].
absl::Status CheckPackedZeros(const PackedTensors& tensors);

// Checks that scales' row count divides K evenly, and the spec they imply
// (kU4).
absl::StatusOr<WeightSpec> GroupedSpec(const PackedTensors& tensors, int64_t k,
                                       int64_t n);

// The 4-bit value of column `col` in a row of words, starting at word
// `row_start_word`, that pack 8 columns each: column 8c + j is in nibble
// nibble_of_column[j] of word c.
inline uint8_t UnpackColumn(absl::Span<const uint8_t> bytes,
                            int64_t row_start_word, int64_t col,
                            const int (&nibble_of_column)[8]) {
  const uint32_t word = LoadWord(bytes, row_start_word + col / 8);
  return (word >> (4 * nibble_of_column[col % 8])) & 0xfu;
}

}  // namespace nibble::checkpoint

#endif  // NIBBLE_CHECKPOINT_TENSOR_CHECKS_H_
