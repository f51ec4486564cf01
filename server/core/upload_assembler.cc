#include "server/core/upload_assembler.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/bulk_allocator.h"
#include "server/core/weight_store.h"

namespace nibble::server {
namespace {

constexpr WeightTensorKind kTensorOrder[] = {WeightTensorKind::kQweight,
                                             WeightTensorKind::kScales,
                                             WeightTensorKind::kZeros};

// Appends raw little-endian bytes to an array of T that already holds
// `received` bytes; the last element may stay partly filled until the next
// chunk completes it.
//
// The array is allocated whole (`expected` bytes) at its first chunk: growing
// with the chunks could leave up to twice its bytes allocated, past what the
// upload reserved in the budget. Not at the header, which the server checks
// against the budget first: a header may name 512 GiB.
template <typename T, typename Allocator>
void AppendBytes(std::vector<T, Allocator>& array, int64_t expected,
                 int64_t received, absl::string_view data) {
  if (received == 0) ReserveBulk(array, (expected + sizeof(T) - 1) / sizeof(T));
  const size_t total = received + data.size();
  array.resize((total + sizeof(T) - 1) / sizeof(T));
  std::memcpy(reinterpret_cast<char*>(array.data()) + received, data.data(),
              data.size());
}

// The canonical word (weight_format.h) of a word of packed panels, whose
// codes sit at PackedWeight::CodeShift.
uint32_t CanonicalWord(uint32_t packed) {
  uint32_t word = 0;
  for (int j = 0; j < kCodesPerWord; ++j) {
    word |= ((packed >> PackedWeight::CodeShift(j)) & 0xfu) << (4 * j);
  }
  return word;
}

template <typename T>
absl::string_view BytesOf(const std::vector<T>& array) {
  return absl::string_view(reinterpret_cast<const char*>(array.data()),
                           array.size() * sizeof(T));
}

}  // namespace

absl::string_view WeightTensorName(WeightTensorKind tensor) {
  switch (tensor) {
    case WeightTensorKind::kQweight:
      return "qweight";
    case WeightTensorKind::kScales:
      return "scales";
    case WeightTensorKind::kZeros:
      return "zeros";
  }
  return "unknown";
}

int64_t UploadAssembler::ExpectedBytes(WeightTensorKind tensor) const {
  switch (tensor) {
    case WeightTensorKind::kQweight:
      return weight_.spec.qweight_bytes();
    case WeightTensorKind::kScales:
      return ScalesBytes(weight_.spec, layout_);
    case WeightTensorKind::kZeros:
      return weight_.spec.zeros_bytes();
  }
  return 0;
}

absl::Status UploadAssembler::OnHeader(absl::string_view name,
                                       const WeightSpec& spec,
                                       std::vector<int32_t> activation_order,
                                       CodeLayout layout) {
  if (has_header_) {
    return absl::InvalidArgumentError(
        "upload sent a second header: send one header, then chunks");
  }
  if (absl::Status status = ValidateWeightName(name); !status.ok()) {
    return status;
  }
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  if (absl::Status status = ValidateActivationOrder(activation_order, spec.k);
      !status.ok()) {
    return status;
  }
  if (layout == CodeLayout::kColumns && !HasColumnLayout(spec.format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("code_layout COLUMNS is for ",
                     WeightFormatNamesWhere(HasColumnLayout, " and "),
                     " weights, not ", WeightFormatName(spec.format),
                     ": send its qweight and scales in the canonical layout"));
  }
  has_header_ = true;
  name_ = std::string(name);
  layout_ = layout;
  pack_codes_ = packing_ == CodePacking::kAll;
  weight_.spec = spec;
  weight_.activation_order = std::move(activation_order);
  return absl::OkStatus();
}

absl::Status UploadAssembler::OnChunk(WeightTensorKind tensor, uint64_t offset,
                                      absl::string_view data) {
  if (!has_header_) {
    return absl::InvalidArgumentError(
        "upload sent a chunk before the header: the first message must be the "
        "header");
  }
  const auto index = static_cast<int>(tensor);
  if (ExpectedBytes(tensor) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("upload sent ", WeightTensorName(tensor), " but format ",
                     WeightFormatName(weight_.spec.format), " has none"));
  }
  // Tensors arrive in enum order; every earlier one must be complete.
  for (int earlier = 0; earlier < index; ++earlier) {
    const auto earlier_tensor = static_cast<WeightTensorKind>(earlier);
    if (received_[earlier] < ExpectedBytes(earlier_tensor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "upload sent ", WeightTensorName(tensor), " before finishing ",
          WeightTensorName(earlier_tensor), " (", received_[earlier], " of ",
          ExpectedBytes(earlier_tensor),
          " bytes): send qweight, scales, zeros in that order"));
    }
  }
  if (offset != static_cast<uint64_t>(received_[index])) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload sent ", WeightTensorName(tensor), " bytes at offset ", offset,
        " but ", received_[index],
        " bytes have arrived: send chunks in order, without gaps or repeats"));
  }
  if (static_cast<int64_t>(data.size()) >
      ExpectedBytes(tensor) - received_[index]) {
    return absl::InvalidArgumentError(absl::StrCat(
        "upload sent ", received_[index] + data.size(), " bytes of ",
        WeightTensorName(tensor), " but ", weight_.spec.DebugString(),
        " needs ", ExpectedBytes(tensor)));
  }
  const int64_t expected = ExpectedBytes(tensor);
  switch (tensor) {
    case WeightTensorKind::kQweight:
      if (pack_codes_) {
        if (!codes_.has_value()) codes_.emplace(weight_.spec, layout_);
        codes_->Append(data);
      } else if (layout_ == CodeLayout::kColumns) {
        AppendBytes(column_codes_, expected, received_[index], data);
      } else {
        AppendBytes(weight_.qweight, expected, received_[index], data);
      }
      break;
    case WeightTensorKind::kScales:
      if (layout_ == CodeLayout::kColumns) {
        AppendBytes(column_scale_codes_, expected, received_[index], data);
      } else {
        AppendBytes(weight_.scales, expected, received_[index], data);
      }
      break;
    case WeightTensorKind::kZeros:
      AppendBytes(weight_.zeros, expected, received_[index], data);
      break;
  }
  received_[index] += data.size();
  return absl::OkStatus();
}

absl::Status UploadAssembler::OnTensorBytes(absl::string_view bytes) {
  // Refused as a chunk before the header is.
  if (!has_header_) return OnChunk(WeightTensorKind::kQweight, 0, bytes);
  for (WeightTensorKind tensor : kTensorOrder) {
    const int index = static_cast<int>(tensor);
    const int64_t room = ExpectedBytes(tensor) - received_[index];
    if (room == 0) continue;
    const absl::string_view part = bytes.substr(0, room);
    if (absl::Status status = OnChunk(tensor, received_[index], part);
        !status.ok()) {
      return status;
    }
    bytes.remove_prefix(part.size());
    if (bytes.empty()) return absl::OkStatus();
  }
  if (bytes.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(bytes.size(), " bytes past the end of the tensors of ",
                   weight_.spec.DebugString()));
}

absl::Status UploadAssembler::CheckComplete() const {
  if (!has_header_) {
    return absl::InvalidArgumentError(
        "upload ended without a header: the first message must be the header");
  }
  for (WeightTensorKind tensor : kTensorOrder) {
    const int64_t received = received_[static_cast<int>(tensor)];
    if (received < ExpectedBytes(tensor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "upload of \"", name_, "\" ended early: ", received, " of ",
          ExpectedBytes(tensor), " bytes of ", WeightTensorName(tensor),
          " arrived; nothing was stored"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<QuantizedWeight> UploadAssembler::Finish() {
  if (pack_codes_) {
    return absl::InternalError("Finish on an upload that packs its codes");
  }
  if (absl::Status status = CheckComplete(); !status.ok()) return status;
  if (layout_ == CodeLayout::kColumns) {
    QuantizedWeight canonical = CanonicalFromColumns(
        {weight_.spec, column_codes_.data(), column_scale_codes_.data()});
    column_codes_ = {};
    column_scale_codes_ = {};
    weight_.qweight = std::move(canonical.qweight);
    weight_.scales = std::move(canonical.scales);
  }
  if (absl::Status status = weight_.Validate(); !status.ok()) return status;
  return std::move(weight_);
}

absl::StatusOr<Fp4Columns> UploadAssembler::FinishColumns() {
  if (pack_codes_ || layout_ != CodeLayout::kColumns) {
    return absl::InternalError(
        "FinishColumns on an upload that packs its codes or is not in the "
        "column layout");
  }
  if (absl::Status status = CheckComplete(); !status.ok()) return status;
  return Fp4Columns{weight_.spec, column_codes_.data(),
                    column_scale_codes_.data()};
}

absl::StatusOr<PackedWeight> UploadAssembler::FinishPacked() {
  if (!pack_codes_) {
    return absl::InternalError("FinishPacked on an upload of canonical codes");
  }
  if (absl::Status status = CheckComplete(); !status.ok()) return status;
  PanelCodeWriter codes = *std::move(codes_);
  codes_.reset();
  if (layout_ == CodeLayout::kColumns) {
    return PackedWeight::PackWithColumnScales(
        std::move(codes), column_scale_codes_.data(),
        std::move(weight_.activation_order));
  }
  return PackedWeight::PackWithCodes(std::move(codes), weight_);
}

absl::Status UploadAssembler::WriteCanonicalTensors(
    const PackedWeight& packed,
    absl::FunctionRef<absl::Status(absl::string_view)> sink) const {
  if (!pack_codes_ || codes_.has_value()) {
    return absl::InternalError(
        "WriteCanonicalTensors before FinishPacked or on an upload that does "
        "not pack its codes");
  }
  constexpr int64_t kPieceBytes = 1 << 20;
  constexpr int64_t kPanelWidth = PackedWeight::kPanelWidth;
  const WeightSpec& spec = weight_.spec;
  const int64_t word_rows = spec.k / kCodesPerWord;
  const int64_t rows_per_piece = std::max<int64_t>(
      1, kPieceBytes / (spec.n * static_cast<int64_t>(sizeof(uint32_t))));
  std::vector<uint32_t> piece;
  for (int64_t first = 0; first < word_rows; first += rows_per_piece) {
    const int64_t rows = std::min(rows_per_piece, word_rows - first);
    piece.resize(rows * spec.n);
    for (int64_t column = 0; column < spec.n; ++column) {
      const uint32_t* words = packed.panel_codes(column / kPanelWidth) +
                              first * kPanelWidth + column % kPanelWidth;
      for (int64_t row = 0; row < rows; ++row) {
        piece[row * spec.n + column] = CanonicalWord(words[row * kPanelWidth]);
      }
    }
    if (absl::Status status = sink(BytesOf(piece)); !status.ok()) {
      return status;
    }
  }
  if (absl::Status status =
          layout_ == CodeLayout::kColumns
              ? sink(BytesOf(ScaleSlotsFromColumns(column_scale_codes_.data(),
                                                   spec.groups(), spec.n)))
              : sink(BytesOf(weight_.scales));
      !status.ok()) {
    return status;
  }
  return sink(BytesOf(weight_.zeros));
}

}  // namespace nibble::server
