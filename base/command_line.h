// Command-line parsing for every nibble tool on absl flags, reporting usage
// mistakes as a status so that the tools can exit with kExitUsage (2) for
// them (absl::ParseCommandLine itself exits with 1, which the tools keep for
// failures). Options name the flags whose value may be left out (--json alone
// or --json=FILE) and the bool flags that only turn on (--quick).
//
// Example:
//   const nibble::CommandLineOptions options = {
//       .optional_value_flags = {"json"}, .switch_flags = {"quick"}};
//   absl::StatusOr<nibble::CommandLine> command_line =
//       nibble::ParseCommandLine(argc, argv, options);
//   if (!command_line.ok()) return PrintUsageError(command_line.status());
//   if (command_line->help_requested) return PrintUsage();
//   std::cout << nibble::DescribeFlags({"target", "name"});
#ifndef NIBBLE_BASE_COMMAND_LINE_H_
#define NIBBLE_BASE_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nibble {

// The exit codes of nibble's programs: success, a refused request or failed
// check or measurement, and a usage mistake.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

struct CommandLineOptions {
  // Flags whose value may be left out, e.g. "json": "--json" alone sets the
  // flag to "" (it must accept that) and counts as given; "--json=FILE" sets
  // FILE. The argument after such a flag is never its value, and "--json="
  // is a mistake, since it would read as "--json".
  std::vector<std::string> optional_value_flags;
  // Bool flags that only turn on, e.g. "quick": "--quick=VALUE" and
  // "--noquick" are mistakes.
  std::vector<std::string> switch_flags;
};

struct CommandLine {
  // The arguments that are not flags, without the program name.
  std::vector<std::string> positional;
  // Names of the flags set, in order; "--nocheck" counts as "check".
  std::vector<std::string> flags_given;
  // --help or -h was given; nothing else is parsed then.
  bool help_requested = false;
};

// Sets the absl flags from argv. Unknown flags (absl's --helpfull and
// --version among them), missing values and values that do not parse give
// InvalidArgument naming the flag. Whatever absl::ParseCommandLine handles
// itself, --flagfile and --fromenv, it still does, exiting with 1 for their
// mistakes.
absl::StatusOr<CommandLine> ParseCommandLine(
    int argc, char* argv[], const CommandLineOptions& options = {});

// One line per flag: "  --name  help (default: value)".
std::string DescribeFlags(absl::Span<const absl::string_view> names);

}  // namespace nibble

#endif  // NIBBLE_BASE_COMMAND_LINE_H_
