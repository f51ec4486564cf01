// Command-line parsing for nibble's tools on absl flags, reporting usage
// mistakes as a status so that the tools can exit with 2 for them
// (absl::ParseCommandLine itself exits with 1, which the tools keep for
// failed requests).
//
// Example:
//   absl::StatusOr<nibble::CommandLine> command_line =
//       nibble::ParseCommandLine(argc, argv);
//   if (!command_line.ok()) return PrintUsageError(command_line.status());
//   if (command_line->help_requested) return PrintUsage();
//   std::cout << nibble::DescribeFlags({"target", "name"});
#ifndef NIBBLE_CLIENT_COMMAND_LINE_H_
#define NIBBLE_CLIENT_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nibble {

// The tools' exit codes: success, a refused request or failed check, and a
// usage mistake.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct CommandLine {
  // The arguments that are not flags, without the program name.
  std::vector<std::string> positional;
  // Names of the flags set, in order; "--nocheck" counts as "check".
  std::vector<std::string> flags_given;
  // --help or -h was given; nothing else is parsed then.
  bool help_requested = false;
};

// Sets the absl flags from argv. Unknown flags, missing values and values that
// do not parse give InvalidArgument naming the flag. absl's other help flags
// (--helpfull, --version, ...) still print and exit as absl does.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, char* argv[]);

// One line per flag: "  --name  help (default: value)".
std::string DescribeFlags(absl::Span<const absl::string_view> names);

}  // namespace nibble

#endif  // NIBBLE_CLIENT_COMMAND_LINE_H_
