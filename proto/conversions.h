// Translation between the wire enums and messages of nibble.v1 and the kernel
// library's types, shared by the server and the client so that both read the
// contract the same way.
//
// Example:
//   request.set_dtype(nibble::ToProto(nibble::DType::kBF16));
//   absl::StatusOr<nibble::WeightSpec> spec = nibble::WeightSpecFromInfo(info);
#ifndef NIBBLE_PROTO_CONVERSIONS_H_
#define NIBBLE_PROTO_CONVERSIONS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "format/dtype.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "nibble/v1/nibble.pb.h"

namespace nibble {

v1::WeightFormat ToProto(WeightFormat format);
v1::DType ToProto(DType dtype);

// INVALID_ARGUMENT, listing the valid values, for UNSPECIFIED and unknown
// values.
absl::StatusOr<WeightFormat> FromProto(v1::WeightFormat format);
absl::StatusOr<DType> FromProto(v1::DType dtype);

v1::CodeLayout ToProto(CodeLayout layout);
// INVALID_ARGUMENT, listing the valid values, for unknown values.
absl::StatusOr<CodeLayout> FromProto(v1::CodeLayout layout);

// A proto's global_scale: 1 when unset (0), as formats without one have.
float GlobalScaleFromProto(float global_scale);

// The spec a header describes; not yet validated (see WeightSpec::Validate).
absl::StatusOr<WeightSpec> FromProto(const v1::WeightHeader& header);

// The header's activation order, not yet validated (see
// ValidateActivationOrder); INVALID_ARGUMENT for an entry past int32.
absl::StatusOr<std::vector<int32_t>> ActivationOrderFromProto(
    const v1::WeightHeader& header);

// The header that uploads a weight of `spec` with `activation_order` (empty
// for none) as `name`.
void FillWeightHeader(absl::string_view name, const WeightSpec& spec,
                      absl::Span<const int32_t> activation_order,
                      v1::WeightHeader* header);

// The spec a server reports for a resident weight, validated.
absl::StatusOr<WeightSpec> WeightSpecFromInfo(const v1::WeightInfo& info);

}  // namespace nibble

#endif  // NIBBLE_PROTO_CONVERSIONS_H_
