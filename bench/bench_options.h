// nibble-bench's command line: which grid of problems to time and where the
// results go. A hand-written parser, so that a usage mistake is a status the
// tool turns into exit code 2, and so that --json works with and without a
// file.
//
// Example:
//   absl::StatusOr<nibble::bench::BenchOptions> options =
//       nibble::bench::ParseBenchOptions({"--m=1,16", "--formats=u4b8"});
//   if (!options.ok()) return nibble::bench::kExitUsage;
//   for (const nibble::bench::WeightKind& kind : options->weights) { ... }
#ifndef NIBBLE_BENCH_BENCH_OPTIONS_H_
#define NIBBLE_BENCH_BENCH_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/weight_format.h"

namespace nibble::bench {

// The exit codes of nibble's tools (client/command_line.h, which needs gRPC):
// success, a failure, and a usage mistake.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;
inline constexpr int kExitUsage = 2;

// A weight matrix shape: B is [k, n].
struct Shape {
  int64_t k = 0;
  int64_t n = 0;

  friend bool operator==(const Shape&, const Shape&) = default;
};

// A weight format at one group size.
struct WeightKind {
  WeightFormat format = WeightFormat::kU4b8;
  int64_t group_size = 128;

  friend bool operator==(const WeightKind&, const WeightKind&) = default;
};

struct BenchOptions {
  std::vector<int64_t> ms;  // ascending, no repeats
  std::vector<Shape> shapes;
  std::vector<WeightKind> weights;
  int threads = 1;
  // Timed calls per kernel and problem.
  int repeats = 10;
  // Empty: TuningTable::Default().
  std::string tuning_table_path;
  std::string write_tuning_table_path;
  // JSON lines instead of the table on stdout, or into json_path.
  bool json_to_stdout = false;
  std::string json_path;
  bool help = false;
};

// The flags, without the program name. INVALID_ARGUMENT naming the flag for
// an unknown flag, a missing or malformed value, or a grid point that is not
// a valid weight (e.g. a K that is not a multiple of the group size).
absl::StatusOr<BenchOptions> ParseBenchOptions(
    const std::vector<std::string>& args);

// What --help prints.
std::string BenchUsage();

// One command-line flag: --name, --name=value, or --name value for the flags
// that take a value.
struct FlagArgument {
  std::string name;
  std::optional<std::string> value;
};

// `args` (without the program name) as flags; "-h" or "--help" gives the one
// flag "help", whatever follows it. INVALID_ARGUMENT for an argument that is
// not a --flag (naming `program`), and for a flag of `takes_value` whose
// value is missing or empty.
absl::StatusOr<std::vector<FlagArgument>> SplitFlags(
    const std::vector<std::string>& args, absl::string_view program,
    const std::vector<absl::string_view>& takes_value);

// Flag value parsers, shared with nibble-gpu-bench. Errors are
// INVALID_ARGUMENT in the form "--FLAG=VALUE: what is wrong".
absl::Status FlagError(absl::string_view flag, absl::string_view value,
                       absl::string_view what);
// `item` of `value` as an integer from 1 to `max`.
absl::StatusOr<int64_t> ParsePositive(absl::string_view flag,
                                      absl::string_view value,
                                      absl::string_view item, int64_t max);
// A comma-separated list of at least one item.
absl::StatusOr<std::vector<absl::string_view>> SplitList(
    absl::string_view flag, absl::string_view value);
absl::StatusOr<std::vector<int64_t>> ParsePositiveList(absl::string_view flag,
                                                       absl::string_view value,
                                                       int64_t max);
// "KxN,KxN,...".
absl::StatusOr<std::vector<Shape>> ParseShapes(absl::string_view value);

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_BENCH_OPTIONS_H_
