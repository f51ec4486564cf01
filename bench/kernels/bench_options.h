// nibble-bench's command line: which grid of problems to time and where the
// results go. Its absl flags are parsed through base/command_line, so that a
// usage mistake is a status the tool turns into exit code 2, and --json works
// with and without a file.
//
// Example:
//   absl::StatusOr<nibble::bench::BenchOptions> options =
//       nibble::bench::ParseBenchCommandLine(argc, argv);
//   if (!options.ok()) return nibble::kExitUsage;
//   for (const nibble::bench::WeightKind& kind : options->weights) { ... }
#ifndef NIBBLE_BENCH_KERNELS_BENCH_OPTIONS_H_
#define NIBBLE_BENCH_KERNELS_BENCH_OPTIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/kernels/bench_flags.h"
#include "format/dtype.h"
#include "kernels/gemm_kernel.h"

namespace nibble::bench {

struct BenchOptions {
  std::vector<int64_t> ms;  // ascending, no repeats
  std::vector<Shape> shapes;
  std::vector<WeightKind> weights;
  int threads = 1;
  // Timed calls per kernel and problem.
  int repeats = 10;
  // Passes over the whole grid; each kernel's time is the median over them.
  int rounds = 1;
  // What the scheduler's pick may make of A; the fast variants are timed
  // as the default (bf16) picks them.
  ActivationPrecision activation_precision = ActivationPrecision::kBf16;
  // The dtype of A and C in every timed problem.
  DType dtype = DType::kF32;
  // Empty: TuningTable::Default().
  std::string tuning_table_path;
  std::string write_tuning_table_path;
  // JSON lines instead of the table on stdout, or into json_path.
  bool json_to_stdout = false;
  std::string json_path;
  bool help = false;
};

// Sets nibble-bench's flags from argv and reads them. INVALID_ARGUMENT naming
// the flag for an unknown flag, a missing or malformed value, or a grid point
// that is not a valid weight (e.g. a K that is not a multiple of the group
// size).
absl::StatusOr<BenchOptions> ParseBenchCommandLine(int argc, char* argv[]);

// ParseBenchCommandLine of `args` (without the program name), with the flags
// back at their defaults afterwards, so that every call is independent.
absl::StatusOr<BenchOptions> ParseBenchOptions(
    const std::vector<std::string>& args);

// What --help prints.
std::string BenchUsage();

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_BENCH_OPTIONS_H_
