// Fuzzes the upload stream state machine: the input is a sequence of
// nibble.v1.UploadWeightRequest messages (see fuzz_messages.h) fed to an
// UploadAssembler the way NibbleServiceImpl::UploadReactor feeds it, and to one
// that packs its codes as they arrive, which must answer every message alike. A
// weight they complete must match its header, hold exactly the bytes the
// chunks carried (transposed, for MXFP4 and NVFP4 columns), and pack into the
// same panels both ways.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/fp4_columns.h"
#include "kernels/packed_weight.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/upload_assembler.h"
#include "server/edge/proto_conversions.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_messages.h"

namespace {

using nibble::CodeLayout;
using nibble::QuantizedWeight;
using nibble::WeightSpec;
using nibble::server::UploadAssembler;
using nibble::server::WeightTensorKind;

// nibbled refuses, right after the header, a weight past its memory budget
// (--max_weight_bytes); this stands in for a small one, to keep each run fast.
constexpr int64_t kBudgetBytes = 1 << 20;

template <typename T>
absl::string_view BytesOf(const std::vector<T>& array) {
  return absl::string_view(reinterpret_cast<const char*>(array.data()),
                           array.size() * sizeof(T));
}

template <typename T>
bool SameArray(const T* a, const T* b, int64_t count) {
  return std::memcmp(a, b, count * sizeof(T)) == 0;
}

bool SamePanels(const nibble::PackedWeight& a, const nibble::PackedWeight& b) {
  constexpr int64_t kWidth = nibble::PackedWeight::kPanelWidth;
  if (!(a.spec() == b.spec()) || a.resident_bytes() != b.resident_bytes()) {
    return false;
  }
  const int64_t words = a.spec().k / nibble::kCodesPerWord * kWidth;
  const int64_t groups = a.spec().groups() * kWidth;
  for (int64_t panel = 0; panel < a.panels(); ++panel) {
    if (!SameArray(a.panel_codes(panel), b.panel_codes(panel), words) ||
        !SameArray(a.panel_scales(panel), b.panel_scales(panel), groups) ||
        (a.panel_zeros(panel) != nullptr &&
         !SameArray(a.panel_zeros(panel), b.panel_zeros(panel), groups))) {
      return false;
    }
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  UploadAssembler upload;
  UploadAssembler packing(nibble::server::CodePacking::kAll);
  WeightSpec header_spec;
  std::vector<int32_t> header_order;
  CodeLayout header_layout = CodeLayout::kCanonical;
  std::string sent[3];  // the chunks' bytes, by WeightTensorKind
  for (absl::string_view message : nibble::fuzz::SplitMessages(
           absl::string_view(reinterpret_cast<const char*>(data), size))) {
    nibble::v1::UploadWeightRequest request;
    if (!request.ParseFromArray(message.data(), message.size())) return 0;
    if (request.has_header()) {
      absl::StatusOr<WeightSpec> spec =
          nibble::server::FromProto(request.header());
      if (!spec.ok()) return 0;
      absl::StatusOr<std::vector<int32_t>> order =
          nibble::server::ActivationOrderFromProto(request.header());
      if (!order.ok()) return 0;
      absl::StatusOr<CodeLayout> layout =
          nibble::server::FromProto(request.header().code_layout());
      if (!layout.ok()) return 0;
      const absl::Status status =
          upload.OnHeader(request.header().name(), *spec, *order, *layout);
      FUZZ_CHECK(status == packing.OnHeader(request.header().name(), *spec,
                                            *order, *layout));
      if (!status.ok()) return 0;
      if (spec->canonical_bytes() > kBudgetBytes) return 0;
      header_spec = *spec;
      header_order = *std::move(order);
      header_layout = *layout;
    } else if (request.has_chunk()) {
      absl::StatusOr<WeightTensorKind> tensor =
          nibble::server::TensorFromProto(request.chunk().tensor());
      if (!tensor.ok()) return 0;
      const absl::Status status = upload.OnChunk(
          *tensor, request.chunk().offset(), request.chunk().data());
      FUZZ_CHECK(status == packing.OnChunk(*tensor, request.chunk().offset(),
                                           request.chunk().data()));
      if (!status.ok()) return 0;
      sent[static_cast<int>(*tensor)] += request.chunk().data();
    } else {
      return 0;
    }
  }
  absl::StatusOr<QuantizedWeight> weight = upload.Finish();
  absl::StatusOr<nibble::PackedWeight> packed = packing.FinishPacked();
  FUZZ_CHECK(weight.ok() == packed.ok());
  if (!weight.ok()) return 0;
  FUZZ_CHECK(upload.has_header());
  FUZZ_CHECK(weight->spec == header_spec);
  FUZZ_CHECK(weight->activation_order == header_order);
  FUZZ_CHECK(weight->Validate().ok());
  if (header_layout == CodeLayout::kColumns) {
    const nibble::Fp4Columns columns{
        header_spec, reinterpret_cast<const uint8_t*>(sent[0].data()),
        reinterpret_cast<const uint8_t*>(sent[1].data())};
    FUZZ_CHECK(static_cast<int64_t>(sent[0].size()) == columns.code_bytes());
    FUZZ_CHECK(static_cast<int64_t>(sent[1].size()) ==
               columns.scale_code_bytes());
    const QuantizedWeight canonical = nibble::CanonicalFromColumns(columns);
    FUZZ_CHECK(weight->qweight == canonical.qweight);
    FUZZ_CHECK(weight->scales == canonical.scales);
  } else {
    FUZZ_CHECK(BytesOf(weight->qweight) == sent[0]);
    FUZZ_CHECK(BytesOf(weight->scales) == sent[1]);
    FUZZ_CHECK(static_cast<int64_t>(sent[0].size() + sent[1].size() +
                                    sent[2].size()) ==
               header_spec.canonical_bytes());
  }
  FUZZ_CHECK(BytesOf(weight->zeros) == sent[2]);
  absl::StatusOr<nibble::PackedWeight> canonical_packed =
      nibble::PackedWeight::Pack(*weight);
  FUZZ_CHECK(canonical_packed.ok());
  FUZZ_CHECK(SamePanels(*canonical_packed, *packed));
  return 0;
}
