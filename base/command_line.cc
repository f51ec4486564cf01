#include "base/command_line.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace nibble {
namespace {

// The flag an argument like "--name=value", "-name" or "--noname" sets, with
// its value when the argument carries one.
struct FlagArgument {
  std::string name;
  absl::CommandLineFlag* flag = nullptr;
  std::optional<std::string> value;
  // "--noname" for the bool flag "name".
  bool negated = false;
};

FlagArgument IdentifyFlag(absl::string_view argument) {
  absl::ConsumePrefix(&argument, "-");
  absl::ConsumePrefix(&argument, "-");
  FlagArgument result;
  const size_t equals = argument.find('=');
  result.name = std::string(argument.substr(0, equals));
  if (equals != absl::string_view::npos) {
    result.value = std::string(argument.substr(equals + 1));
  }
  result.flag = absl::FindCommandLineFlag(result.name);
  if (result.flag == nullptr && !result.value.has_value() &&
      absl::StartsWith(result.name, "no")) {
    absl::CommandLineFlag* negated =
        absl::FindCommandLineFlag(absl::string_view(result.name).substr(2));
    if (negated != nullptr && negated->IsOfType<bool>()) {
      result.name = result.name.substr(2);
      result.flag = negated;
      result.value = "false";
      result.negated = true;
    }
  }
  return result;
}

bool Contains(const std::vector<std::string>& names, absl::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(
    int argc, char* argv[], const CommandLineOptions& options) {
  CommandLine command_line;
  // What absl::ParseCommandLine gets: argv, with an optional-value flag given
  // alone as "--name=", since absl would take the next argument as its value.
  std::vector<char*> absl_argv(argv, argv + argc);
  std::deque<std::string> rewritten;
  // Check every flag before absl::ParseCommandLine sees them, so that it has
  // nothing left to reject.
  for (int i = 1; i < argc; ++i) {
    const absl::string_view argument = argv[i];
    if (argument == "--") break;
    if (argument.size() < 2 || argument[0] != '-') continue;
    FlagArgument flag = IdentifyFlag(argument);
    if (flag.name == "help" || flag.name == "h") {
      command_line.help_requested = true;
      return command_line;
    }
    if (flag.flag == nullptr ||
        (flag.negated && Contains(options.switch_flags, flag.name))) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", flag.negated ? "no" : "", flag.name));
    }
    if (flag.value.has_value() && Contains(options.switch_flags, flag.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag.name, "=", *flag.value, ": --", flag.name,
                       " takes no value"));
    }
    if (Contains(options.optional_value_flags, flag.name)) {
      if (!flag.value.has_value()) {
        flag.value = "";
        absl_argv[i] =
            rewritten.emplace_back(absl::StrCat("--", flag.name, "=")).data();
      } else if (flag.value->empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag.name, "=: give a value, or --", flag.name, " alone"));
      }
    }
    if (!flag.value.has_value()) {
      if (flag.flag->IsOfType<bool>()) {
        flag.value = "true";
      } else if (i + 1 < argc) {
        flag.value = argv[++i];
      } else {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", flag.name, " needs a value"));
      }
    }
    if (std::string error; !flag.flag->ParseFrom(*flag.value, &error)) {
      // absl's own error only repeats the value; the help says what fits.
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag.name, " does not accept \"", *flag.value,
                       "\": ", flag.flag->Help()));
    }
    command_line.flags_given.push_back(flag.name);
  }
  const std::vector<char*> positional = absl::ParseCommandLine(
      static_cast<int>(absl_argv.size()), absl_argv.data());
  command_line.positional.assign(positional.begin() + 1, positional.end());
  return command_line;
}

std::string DescribeFlags(absl::Span<const absl::string_view> names) {
  size_t width = 0;
  for (absl::string_view name : names) width = std::max(width, name.size());
  std::string description;
  for (absl::string_view name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    const std::string default_value = flag->DefaultValue();
    absl::StrAppendFormat(
        &description, "  --%-*s  %s%s\n", width, name, flag->Help(),
        default_value.empty()
            ? ""
            : absl::StrCat(" (default: ", default_value, ")"));
  }
  return description;
}

}  // namespace nibble
