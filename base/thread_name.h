// Names for the threads nibble starts, so that `top -H`, `ps -L` and
// debuggers say which part of the server a busy thread belongs to.
//
// Example:
//   std::thread([] {
//     nibble::NameCurrentThread("nibble-batch");
//     ...
//   });
#ifndef NIBBLE_BASE_THREAD_NAME_H_
#define NIBBLE_BASE_THREAD_NAME_H_

#include <string>

#include "absl/strings/string_view.h"

namespace nibble {

// The most characters of a name that Linux keeps.
inline constexpr int kMaxThreadNameLength = 15;

// Names the calling thread `name`, cut to kMaxThreadNameLength characters.
void NameCurrentThread(absl::string_view name);

// The calling thread's name ("" where the platform has none).
std::string CurrentThreadName();

}  // namespace nibble

#endif  // NIBBLE_BASE_THREAD_NAME_H_
