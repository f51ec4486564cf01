#include "bench/kernels/bench_flags.h"

#include <algorithm>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace nibble::bench {

absl::StatusOr<CommandLine> ParseBenchFlags(absl::string_view program, int argc,
                                            char* argv[],
                                            const CommandLineOptions& options) {
  absl::StatusOr<CommandLine> command_line =
      ParseCommandLine(argc, argv, options);
  if (!command_line.ok() || command_line->help_requested) return command_line;
  if (!command_line->positional.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unexpected argument \"", command_line->positional[0],
                     "\": ", program, " takes only --flags"));
  }
  for (const std::string& name : command_line->flags_given) {
    const std::vector<std::string>& optional = options.optional_value_flags;
    if (std::find(optional.begin(), optional.end(), name) != optional.end()) {
      continue;
    }
    // It would read as the default, as if the flag were not given.
    if (absl::FindCommandLineFlag(name)->CurrentValue().empty()) {
      return FlagError(name, "", "the value is empty");
    }
  }
  return command_line;
}

absl::Status FlagError(absl::string_view flag, absl::string_view value,
                       absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", flag, "=", value, ": ", what));
}

absl::StatusOr<int64_t> ParsePositive(absl::string_view flag,
                                      absl::string_view value,
                                      absl::string_view item, int64_t max) {
  int64_t number = 0;
  if (!absl::SimpleAtoi(item, &number) || number <= 0) {
    return FlagError(flag, value,
                     absl::StrCat("\"", item, "\" is not a positive integer"));
  }
  if (number > max) {
    return FlagError(
        flag, value,
        absl::StrCat(item, " is above the largest allowed, ", max));
  }
  return number;
}

// A comma-separated list of at least one item.
absl::StatusOr<std::vector<absl::string_view>> SplitList(
    absl::string_view flag, absl::string_view value) {
  std::vector<absl::string_view> items = absl::StrSplit(value, ',');
  for (absl::string_view item : items) {
    if (item.empty()) {
      return FlagError(flag, value,
                       "give a comma-separated list without empty items");
    }
  }
  return items;
}

absl::StatusOr<std::vector<int64_t>> ParsePositiveList(absl::string_view flag,
                                                       absl::string_view value,
                                                       int64_t max) {
  absl::StatusOr<std::vector<absl::string_view>> items = SplitList(flag, value);
  if (!items.ok()) return items.status();
  std::vector<int64_t> numbers;
  for (absl::string_view item : *items) {
    absl::StatusOr<int64_t> number = ParsePositive(flag, value, item, max);
    if (!number.ok()) return number.status();
    numbers.push_back(*number);
  }
  return numbers;
}

absl::StatusOr<std::vector<Shape>> ParseShapes(absl::string_view value) {
  absl::StatusOr<std::vector<absl::string_view>> items =
      SplitList("shapes", value);
  if (!items.ok()) return items.status();
  std::vector<Shape> shapes;
  for (absl::string_view item : *items) {
    const std::vector<absl::string_view> sides = absl::StrSplit(item, 'x');
    Shape shape;
    if (sides.size() != 2 || !absl::SimpleAtoi(sides[0], &shape.k) ||
        !absl::SimpleAtoi(sides[1], &shape.n) || shape.k <= 0 || shape.n <= 0) {
      return FlagError("shapes", value,
                       absl::StrCat("\"", item,
                                    "\" is not KxN with positive K and N "
                                    "(e.g. 4096x14336)"));
    }
    shapes.push_back(shape);
  }
  return shapes;
}

}  // namespace nibble::bench
