// What nibble-bench and nibble-gpu-bench share of their command lines: the
// points of their grids (Shape, WeightKind), parsing their absl flags through
// base/command_line, and the parsers of the flag values that list the grid.
// Usage mistakes are INVALID_ARGUMENT, which the tools turn into exit code 2.
//
// Example:
//   absl::StatusOr<nibble::CommandLine> command_line =
//       nibble::bench::ParseBenchFlags("nibble-bench", argc, argv, {});
//   if (!command_line.ok()) return command_line.status();
//   absl::StatusOr<std::vector<int64_t>> ms = nibble::bench::ParsePositiveList(
//       "m", absl::GetFlag(FLAGS_m), nibble::kMaxDimension);
#ifndef NIBBLE_BENCH_KERNELS_BENCH_FLAGS_H_
#define NIBBLE_BENCH_KERNELS_BENCH_FLAGS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/command_line.h"
#include "format/weight_format.h"

namespace nibble::bench {

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

// ParseCommandLine for the bench tool `program`, whose flags other than
// `options`' all take a non-empty value: INVALID_ARGUMENT also for an
// argument that is not a flag (naming `program`) and for a flag given an
// empty value.
absl::StatusOr<CommandLine> ParseBenchFlags(absl::string_view program, int argc,
                                            char* argv[],
                                            const CommandLineOptions& options);

// Flag value parsers. Errors are INVALID_ARGUMENT in the form
// "--FLAG=VALUE: what is wrong".
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

#endif  // NIBBLE_BENCH_KERNELS_BENCH_FLAGS_H_
