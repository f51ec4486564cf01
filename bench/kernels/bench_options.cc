#include "bench/kernels/bench_options.h"

#include <algorithm>
#include <optional>
#include <thread>
#include <utility>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "base/command_line.h"

// Strings, empty when not given, so that ApplyValueFlag parses and checks
// them and names the flag in every mistake. BenchUsage says more.
ABSL_FLAG(std::string, m, "", "rows of A, comma-separated");
ABSL_FLAG(std::string, shapes, "", "weight shapes, KxN,...");
ABSL_FLAG(std::string, formats, "", "weight formats, comma-separated");
ABSL_FLAG(std::string, groups, "",
          "group sizes, for every format whose group is free");
ABSL_FLAG(std::string, threads, "", "kernel threads");
ABSL_FLAG(std::string, repeats, "", "timed calls per kernel and problem");
ABSL_FLAG(std::string, rounds, "", "passes over the grid, medians taken");
ABSL_FLAG(bool, quick, false, "a grid of seconds, for CI");
ABSL_FLAG(std::string, tuning_table, "", "the scheduler's table");
ABSL_FLAG(std::string, json, "",
          "JSON lines into this file; alone, JSON lines on stdout");
ABSL_FLAG(std::string, activation_precision, "",
          "what the scheduler's pick may make of A: exact, bf16 or int8");
ABSL_FLAG(std::string, dtype, "", "dtype of A and C: f32, f16 or bf16");
ABSL_FLAG(std::string, write_tuning_table, "",
          "the fastest variant per shape and M, as a tuning table");

namespace nibble::bench {
namespace {

constexpr int kMaxThreads = 1024;
constexpr int kMaxRepeats = 100000;
constexpr int kMaxRounds = 1000;

// The default grid: Llama-like projections at decode and prefill sizes.
BenchOptions DefaultGrid() {
  BenchOptions options;
  options.ms = {1, 4, 16, 64, 256};
  options.shapes = {{4096, 4096}, {4096, 14336}, {14336, 4096}, {8192, 28672}};
  options.weights = {{WeightFormat::kFp4, 128},
                     {WeightFormat::kFp4, 32},
                     {WeightFormat::kU4b8, 128},
                     {WeightFormat::kU4, 128}};
  options.threads =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return options;
}

// --quick: a grid that runs in seconds, for CI.
void ApplyQuickGrid(BenchOptions& options) {
  options.ms = {1, 16};
  options.shapes = {{1024, 1024}};
  options.weights = {{WeightFormat::kFp4, 128},
                     {WeightFormat::kU4b8, 128},
                     {WeightFormat::kU4, 128}};
  options.repeats = 3;
}

absl::StatusOr<std::vector<WeightFormat>> ParseFormats(
    absl::string_view value) {
  absl::StatusOr<std::vector<absl::string_view>> items =
      SplitList("formats", value);
  if (!items.ok()) return items.status();
  std::vector<WeightFormat> formats;
  for (absl::string_view item : *items) {
    absl::StatusOr<WeightFormat> format = ParseWeightFormat(item);
    if (!format.ok()) {
      return FlagError("formats", value, format.status().message());
    }
    formats.push_back(*format);
  }
  return formats;
}

template <typename T>
void Deduplicate(std::vector<T>& items) {
  std::vector<T> unique;
  for (const T& item : items) {
    if (std::find(unique.begin(), unique.end(), item) == unique.end()) {
      unique.push_back(item);
    }
  }
  items = std::move(unique);
}

// The flags given, before they are combined into the grid.
struct GivenFlags {
  std::optional<std::vector<int64_t>> ms;
  std::optional<std::vector<Shape>> shapes;
  std::optional<std::vector<WeightFormat>> formats;
  std::optional<std::vector<int64_t>> groups;
  std::optional<int> threads;
  std::optional<int> repeats;
  std::optional<int> rounds;
  bool quick = false;
};

absl::Status ApplyValueFlag(absl::string_view name, absl::string_view value,
                            GivenFlags& given, BenchOptions& options) {
  if (name == "m") {
    absl::StatusOr<std::vector<int64_t>> ms =
        ParsePositiveList(name, value, kMaxDimension);
    if (!ms.ok()) return ms.status();
    given.ms = *std::move(ms);
  } else if (name == "shapes") {
    absl::StatusOr<std::vector<Shape>> shapes = ParseShapes(value);
    if (!shapes.ok()) return shapes.status();
    given.shapes = *std::move(shapes);
  } else if (name == "formats") {
    absl::StatusOr<std::vector<WeightFormat>> formats = ParseFormats(value);
    if (!formats.ok()) return formats.status();
    given.formats = *std::move(formats);
  } else if (name == "groups") {
    absl::StatusOr<std::vector<int64_t>> groups =
        ParsePositiveList(name, value, kMaxDimension);
    if (!groups.ok()) return groups.status();
    given.groups = *std::move(groups);
  } else if (name == "threads") {
    absl::StatusOr<int64_t> threads =
        ParsePositive(name, value, value, kMaxThreads);
    if (!threads.ok()) return threads.status();
    given.threads = static_cast<int>(*threads);
  } else if (name == "repeats") {
    absl::StatusOr<int64_t> repeats =
        ParsePositive(name, value, value, kMaxRepeats);
    if (!repeats.ok()) return repeats.status();
    given.repeats = static_cast<int>(*repeats);
  } else if (name == "rounds") {
    absl::StatusOr<int64_t> rounds =
        ParsePositive(name, value, value, kMaxRounds);
    if (!rounds.ok()) return rounds.status();
    given.rounds = static_cast<int>(*rounds);
  } else if (name == "activation_precision") {
    absl::StatusOr<ActivationPrecision> precision =
        ParseActivationPrecision(value);
    if (!precision.ok()) {
      return FlagError(name, value, precision.status().message());
    }
    options.activation_precision = *precision;
  } else if (name == "dtype") {
    absl::StatusOr<DType> dtype = ParseDType(value);
    if (!dtype.ok()) return FlagError(name, value, dtype.status().message());
    options.dtype = *dtype;
  } else if (name == "tuning_table") {
    options.tuning_table_path = std::string(value);
  } else if (name == "write_tuning_table") {
    options.write_tuning_table_path = std::string(value);
  }
  return absl::OkStatus();
}

// Builds the grid from the defaults, --quick and the narrowing flags.
absl::Status BuildGrid(const GivenFlags& given, BenchOptions& options) {
  if (given.quick) ApplyQuickGrid(options);
  if (given.ms) options.ms = *given.ms;
  std::sort(options.ms.begin(), options.ms.end());
  options.ms.erase(std::unique(options.ms.begin(), options.ms.end()),
                   options.ms.end());
  if (given.shapes) options.shapes = *given.shapes;
  Deduplicate(options.shapes);
  if (given.groups || given.formats) {
    std::vector<WeightFormat> formats;
    for (const WeightKind& kind : options.weights) {
      formats.push_back(kind.format);
    }
    if (given.formats) formats = *given.formats;
    Deduplicate(formats);
    std::vector<WeightKind> weights;
    for (WeightFormat format : formats) {
      if (const int64_t fixed_group = FixedGroupSize(format); fixed_group > 0) {
        // Its one group size, whatever --groups says.
        weights.push_back({format, fixed_group});
      } else if (given.groups) {
        for (int64_t group : *given.groups) weights.push_back({format, group});
      } else {
        // Every other format has a group in the default and the quick grid.
        for (const WeightKind& kind : options.weights) {
          if (kind.format == format) weights.push_back(kind);
        }
      }
    }
    options.weights = std::move(weights);
  }
  Deduplicate(options.weights);
  if (options.activation_precision == ActivationPrecision::kInt8 &&
      !options.write_tuning_table_path.empty()) {
    return absl::InvalidArgumentError(
        "--write_tuning_table measures the variants the scheduler picks "
        "among by default; drop --activation_precision=int8 to write one");
  }
  if (options.dtype != DType::kF32 &&
      !options.write_tuning_table_path.empty()) {
    return absl::InvalidArgumentError(
        "--write_tuning_table measures f32 problems, as the table's rules "
        "were measured; drop --dtype to write one");
  }
  if (given.threads) options.threads = *given.threads;
  if (given.repeats) options.repeats = *given.repeats;
  if (given.rounds) options.rounds = *given.rounds;

  for (const Shape& shape : options.shapes) {
    for (const WeightKind& kind : options.weights) {
      const WeightSpec spec{kind.format, shape.k, shape.n, kind.group_size};
      if (absl::Status status = spec.Validate(); !status.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cannot time ", WeightFormatName(kind.format), " group ",
            kind.group_size, " at ", shape.k, "x", shape.n, ": ",
            status.message(), "; change --shapes or --groups"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<BenchOptions> ParseBenchCommandLine(int argc, char* argv[]) {
  // The flags ApplyValueFlag reads; the others given are --quick, --json
  // and absl's own (--flagfile, ...).
  static const std::vector<absl::string_view> kValueFlags = {
      "m",
      "shapes",
      "formats",
      "groups",
      "threads",
      "repeats",
      "rounds",
      "activation_precision",
      "dtype",
      "tuning_table",
      "write_tuning_table"};
  absl::StatusOr<CommandLine> command_line = ParseBenchFlags(
      "nibble-bench", argc, argv,
      {.optional_value_flags = {"json"}, .switch_flags = {"quick"}});
  if (!command_line.ok()) return command_line.status();
  BenchOptions options = DefaultGrid();
  if (command_line->help_requested) {
    options.help = true;
    return options;
  }
  GivenFlags given;
  given.quick = absl::GetFlag(FLAGS_quick);
  for (const std::string& name : command_line->flags_given) {
    if (name == "json") {
      options.json_path = absl::GetFlag(FLAGS_json);
      options.json_to_stdout = options.json_path.empty();
    } else if (std::find(kValueFlags.begin(), kValueFlags.end(), name) !=
               kValueFlags.end()) {
      const std::string value = absl::FindCommandLineFlag(name)->CurrentValue();
      if (absl::Status status = ApplyValueFlag(name, value, given, options);
          !status.ok()) {
        return status;
      }
    }
  }
  if (absl::Status status = BuildGrid(given, options); !status.ok()) {
    return status;
  }
  return options;
}

absl::StatusOr<BenchOptions> ParseBenchOptions(
    const std::vector<std::string>& args) {
  // Not in nibble-bench's own run: absl logs every flag a FlagSaver restores.
  const absl::FlagSaver defaults;
  std::vector<std::string> strings = {"nibble-bench"};
  strings.insert(strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& string : strings) argv.push_back(string.data());
  return ParseBenchCommandLine(static_cast<int>(argv.size()), argv.data());
}

std::string BenchUsage() {
  return absl::StrFormat(
      R"(nibble-bench: times the CPU kernels on a grid of problems against the
machine's limits (DRAM read bandwidth, fp32 FMA peak) and OpenBLAS sgemm.

Usage: nibble-bench [flags]
  --m=1,4,16,64,256     rows of A
  --shapes=KxN,...      weight shapes (default 4096x4096,4096x14336,
                        14336x4096,8192x28672)
  --formats=fp4,u4b8,u4 weight formats: %s
                        (default: fp4, u4b8 and u4 at group 128, and fp4 at
                        group 32 too); formats with a fixed group always at
                        it (%s)
  --groups=128,...      group sizes, applied to every format whose group is
                        free
  --threads=N           kernel threads (default: one per hardware thread)
  --repeats=N           timed calls per kernel and problem (default 10; fewer,
                        but at least 3, once they pass 2 s)
  --rounds=N            passes over the grid (default 1), each kernel's time
                        the median over them; OpenBLAS is timed in the first
  --quick               a grid of seconds, for CI (the flags above still
                        narrow or change it)
  --activation_precision=exact|bf16|int8
                        what the scheduler's pick may make of A (default
                        bf16); int8 times the int8 kernel beside the others
  --dtype=f32|f16|bf16  the dtype of A and C (default f32); the kernels
                        that support it are timed
  --tuning_table=FILE   the scheduler's table (default: the built-in one)
  --json                JSON lines on stdout instead of the table
  --json=FILE           JSON lines into FILE, the table on stdout
  --write_tuning_table=FILE
                        the fastest variant per shape and M, as a tuning
                        table for nibbled --tuning_table
  --help                this text

Exit codes: 0 done, 1 a measurement failed, 2 a usage mistake.
)",
      WeightFormatNames(", "), FixedGroupSizesText());
}

}  // namespace nibble::bench
