#include "base/choice_list.h"

#include "absl/strings/str_cat.h"

namespace nibble {

std::string JoinList(absl::Span<const std::string> items,
                     absl::string_view last_separator) {
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i > 0) {
      absl::StrAppend(&text, i + 1 == items.size() ? last_separator : ", ");
    }
    absl::StrAppend(&text, items[i]);
  }
  return text;
}

absl::Status UnsupportedChoiceError(absl::string_view what,
                                    absl::string_view given,
                                    absl::Span<const std::string> valid) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " ", given, " is not supported: use ", JoinList(valid)));
}

}  // namespace nibble
