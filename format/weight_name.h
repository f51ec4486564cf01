// The rule for weight names, which the server enforces and the client checks
// before it uploads: 1 to 128 characters from [A-Za-z0-9._-], not starting
// with '.', so that a name is safe as a file name and in logs.
//
// Example:
//   if (absl::Status s = nibble::ValidateWeightName(name); !s.ok()) return s;
#ifndef NIBBLE_FORMAT_WEIGHT_NAME_H_
#define NIBBLE_FORMAT_WEIGHT_NAME_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace nibble {

// The rule, in words for messages.
inline constexpr char kWeightNameRule[] =
    "1 to 128 characters from [A-Za-z0-9._-], not starting with '.'";

// OK when `name` follows the rule; INVALID_ARGUMENT saying how it does not.
absl::Status ValidateWeightName(absl::string_view name);

}  // namespace nibble

#endif  // NIBBLE_FORMAT_WEIGHT_NAME_H_
