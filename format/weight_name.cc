#include "format/weight_name.h"

#include <cstddef>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace nibble {
namespace {

constexpr size_t kMaxNameLength = 128;

bool IsNameCharacter(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
         (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

}  // namespace

absl::Status ValidateWeightName(absl::string_view name) {
  if (name.empty()) {
    return absl::InvalidArgumentError("weight name is empty");
  }
  if (name.size() > kMaxNameLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight name has ", name.size(), " characters, at most ",
                     kMaxNameLength, " are allowed"));
  }
  if (name.front() == '.') {
    return absl::InvalidArgumentError(
        absl::StrCat("weight name \"", name, "\" must not start with '.'"));
  }
  for (char c : name) {
    if (!IsNameCharacter(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weight name \"", absl::CHexEscape(name),
          "\" may only contain letters, digits, '.', '_' and '-'"));
    }
  }
  return absl::OkStatus();
}

}  // namespace nibble
