// Lists of choices in help and error texts: "a, b or c", and the error that
// names what was given and what would do.
//
// Example:
//   nibble::JoinList({"f32", "f16", "bf16"})        // "f32, f16 or bf16"
//   nibble::JoinList({"mxfp4", "nvfp4"}, " and ")   // "mxfp4 and nvfp4"
//   return nibble::UnsupportedChoiceError("dtype", "7", {"DTYPE_F32", ...});
//   // INVALID_ARGUMENT "dtype 7 is not supported: use DTYPE_F32, ..."
#ifndef NIBBLE_BASE_CHOICE_LIST_H_
#define NIBBLE_BASE_CHOICE_LIST_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nibble {

// The items separated by ", ", the last two by `last_separator`.
std::string JoinList(absl::Span<const std::string> items,
                     absl::string_view last_separator = " or ");

// INVALID_ARGUMENT "<what> <given> is not supported: use <JoinList(valid)>".
absl::Status UnsupportedChoiceError(absl::string_view what,
                                    absl::string_view given,
                                    absl::Span<const std::string> valid);

}  // namespace nibble

#endif  // NIBBLE_BASE_CHOICE_LIST_H_
