// How the fuzz targets that take several protobuf messages cut their input
// into them: each message is a 2-byte little-endian length, then that many
// bytes of the serialized message (fewer at the end of the input).
#ifndef NIBBLE_TESTS_FUZZ_FUZZ_MESSAGES_H_
#define NIBBLE_TESTS_FUZZ_FUZZ_MESSAGES_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace nibble::fuzz {

inline std::vector<absl::string_view> SplitMessages(absl::string_view input) {
  std::vector<absl::string_view> messages;
  while (input.size() >= 2) {
    const size_t length = static_cast<uint8_t>(input[0]) |
                          static_cast<size_t>(static_cast<uint8_t>(input[1]))
                              << 8;
    input.remove_prefix(2);
    messages.push_back(input.substr(0, length));
    input.remove_prefix(messages.back().size());
  }
  return messages;
}

// The inverse of SplitMessages, for writing seeds; each message must be
// shorter than 64 KiB.
inline std::string JoinMessages(const std::vector<std::string>& messages) {
  std::string input;
  for (const std::string& message : messages) {
    input.push_back(static_cast<char>(message.size() & 0xff));
    input.push_back(static_cast<char>(message.size() >> 8));
    input.append(message);
  }
  return input;
}

}  // namespace nibble::fuzz

#endif  // NIBBLE_TESTS_FUZZ_FUZZ_MESSAGES_H_
