// The state machine of one weight upload: a header, then every byte of the
// weight's tensors in order (qweight, scales, zeros), each chunk at the offset
// where the previous one ended, in the canonical layout or, for formats with
// HasColumnLayout, the column layout their checkpoints store (fp4_columns.h).
// It builds the weight in the canonical layout, or packs its codes straight
// into the CPU kernels' panels as they arrive (CodePacking), and hands it
// over only when every byte has arrived; until then nothing is visible
// anywhere, so an abandoned upload leaves no trace. A weight read back from
// its file goes through it too (OnTensorBytes).
//
// Example:
//   nibble::server::UploadAssembler upload;
//   RETURN_IF_ERROR(upload.OnHeader("proj", spec));
//   RETURN_IF_ERROR(upload.OnChunk(WeightTensorKind::kQweight, 0, bytes));
//   ...
//   absl::StatusOr<nibble::QuantizedWeight> weight = upload.Finish();
#ifndef NIBBLE_SERVER_CORE_UPLOAD_ASSEMBLER_H_
#define NIBBLE_SERVER_CORE_UPLOAD_ASSEMBLER_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/bulk_allocator.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "kernels/packed_weight.h"

namespace nibble::server {

enum class WeightTensorKind { kQweight, kScales, kZeros };

absl::string_view WeightTensorName(WeightTensorKind tensor);

// Whether an upload's qweight goes into the CPU kernels' panels as it
// arrives (PanelCodeWriter), for FinishPacked to hand over, or is kept as it
// arrived, for Finish or FinishColumns.
enum class CodePacking { kNone, kAll };

class UploadAssembler {
 public:
  explicit UploadAssembler(CodePacking packing = CodePacking::kNone)
      : packing_(packing) {}

  // INVALID_ARGUMENT for a second header, a bad name, an invalid spec, an
  // activation order that is not a permutation of 0..K-1 (empty for none) or
  // kColumns for a format without a column layout.
  absl::Status OnHeader(absl::string_view name, const WeightSpec& spec,
                        std::vector<int32_t> activation_order = {},
                        CodeLayout layout = CodeLayout::kCanonical);

  // INVALID_ARGUMENT, saying what was expected, for a chunk before the
  // header, of a tensor the format lacks, out of order, at the wrong offset,
  // or running past the tensor's size.
  absl::Status OnChunk(WeightTensorKind tensor, uint64_t offset,
                       absl::string_view data);

  // The next bytes of the tensors in a weight file's order (qweight,
  // scales, zeros, in the canonical layout), in pieces that may span
  // tensors: OnChunk for each tensor's part, with its errors, and
  // INVALID_ARGUMENT for bytes past the last tensor. For a weight read from
  // its file (WeightFileReader::ReadTensors).
  absl::Status OnTensorBytes(absl::string_view bytes);

  // The complete weight; INVALID_ARGUMENT, saying how far the upload got,
  // when the header or any byte is missing. Call once.
  absl::StatusOr<QuantizedWeight> Finish();
  // The same, packed (PackedWeight::PackWithCodes), where packs_codes().
  absl::StatusOr<PackedWeight> FinishPacked();
  // The complete weight as it arrived in CodeLayout::kColumns, in memory the
  // assembler owns; fails as Finish does. For a server that copies it to the
  // GPU as it is. Call once, instead of Finish, unless packs_codes().
  absl::StatusOr<Fp4Columns> FinishColumns();

  // After FinishPacked: the weight's tensors as a weight file holds them
  // (the canonical layout, in file order), in pieces of about 1 MiB to
  // `sink`, unpacked from `packed` (FinishPacked's) and the scales kept
  // here. For a server that writes the file of an upload in
  // CodeLayout::kColumns without a second whole copy of the weight. Stops
  // at the first error of `sink`.
  absl::Status WriteCanonicalTensors(
      const PackedWeight& packed,
      absl::FunctionRef<absl::Status(absl::string_view)> sink) const;

  bool has_header() const { return has_header_; }
  // Whether this upload's codes go into panels (CodePacking); known from
  // the header on.
  bool packs_codes() const { return pack_codes_; }
  const std::string& name() const { return name_; }
  const WeightSpec& spec() const { return weight_.spec; }
  CodeLayout layout() const { return layout_; }
  // The header's; empty for none.
  const std::vector<int32_t>& activation_order() const {
    return weight_.activation_order;
  }

 private:
  // Bytes of `tensor` the spec calls for.
  int64_t ExpectedBytes(WeightTensorKind tensor) const;
  // OK when the header and every byte have arrived.
  absl::Status CheckComplete() const;

  const CodePacking packing_;
  // Set at the header, from packing_ and the layout.
  bool pack_codes_ = false;
  bool has_header_ = false;
  std::string name_;
  CodeLayout layout_ = CodeLayout::kCanonical;
  // Filled in place as chunks arrive; sized to the bytes received so far,
  // with capacity for exactly the spec's bytes. With kColumns, its qweight
  // and scales come from the columns at the end.
  QuantizedWeight weight_;
  // With kColumns: the codes (unless pack_codes_) and the scale codes, as
  // they arrive.
  std::vector<uint8_t, BulkAllocator<uint8_t>> column_codes_;
  std::vector<uint8_t, BulkAllocator<uint8_t>> column_scale_codes_;
  // Where pack_codes_: qweight's panels, from its first chunk on (not at the
  // header, which the server checks against the budget first).
  std::optional<PanelCodeWriter> codes_;
  std::array<int64_t, 3> received_ = {};  // bytes, by WeightTensorKind
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_UPLOAD_ASSEMBLER_H_
