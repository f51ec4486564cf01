// Pieces of JSON text, for tools that write a small JSON report by hand.
//
// Example:
//   std::string json = absl::StrCat("{", nibble::client::JsonString("p99"),
//                                    ": ", nibble::client::JsonNumber(1.5),
//                                    "}");  // {"p99": 1.5}
#ifndef NIBBLE_CLIENT_JSON_TEXT_H_
#define NIBBLE_CLIENT_JSON_TEXT_H_

#include <string>

#include "absl/strings/string_view.h"

namespace nibble {
namespace client {

// `text` as a quoted JSON string: quotes, backslashes and control characters
// escaped; other bytes, UTF-8 included, pass through.
std::string JsonString(absl::string_view text);

// `value` with enough digits to read back the same double, or null for NaN
// and infinities, which JSON cannot hold.
std::string JsonNumber(double value);

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_JSON_TEXT_H_
