// nibble-bench: times nibble's CPU kernels on a grid of problems against the
// machine's limits and OpenBLAS, and can write the tuning table the scheduler
// reads. See bench/README.md.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/command_line.h"
#include "base/thread_pool.h"
#include "bench/kernels/bench_grid.h"
#include "bench/kernels/bench_options.h"
#include "bench/kernels/machine_limits.h"
#include "bench/kernels/openblas_baseline.h"
#include "bench/kernels/report.h"
#include "bench/kernels/tuning_writer.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/scheduler.h"
#include "kernels/tuning_table.h"

namespace nibble::bench {
namespace {

// "[3/80] u4b8 group 128 4096x4096 m=16" on stderr: rewritten in place on a
// terminal, one line each otherwise (CI logs).
class Progress {
 public:
  explicit Progress(int total) : total_(total), tty_(isatty(STDERR_FILENO)) {}

  void Note(const std::string& text) { Print(text); }
  void Step(const std::string& text) {
    Print(absl::StrFormat("[%d/%d] %s", ++done_, total_, text));
  }
  // Leaves the last line on a terminal and moves past it.
  void Finish() {
    if (tty_ && width_ > 0) std::fputc('\n', stderr);
  }

 private:
  void Print(const std::string& line) {
    if (tty_) {
      const int pad = std::max(0, width_ - static_cast<int>(line.size()));
      absl::FPrintF(stderr, "\r%s%*s", line, pad, "");
      width_ = static_cast<int>(line.size());
    } else {
      absl::FPrintF(stderr, "%s\n", line);
    }
    std::fflush(stderr);
  }

  int total_;
  int done_ = 0;
  bool tty_;
  int width_ = 0;
};

std::string PointName(const WeightKind& kind, const Shape& shape, int64_t m) {
  return absl::StrCat(WeightFormatName(kind.format), " group ", kind.group_size,
                      " ", shape.k, "x", shape.n, " m=", m);
}

int Run(const BenchOptions& options) {
  TuningTable table = TuningTable::Default();
  if (!options.tuning_table_path.empty()) {
    absl::StatusOr<TuningTable> loaded =
        TuningTable::Load(options.tuning_table_path);
    if (!loaded.ok()) {
      absl::FPrintF(stderr, "nibble-bench: --tuning_table: %s\n",
                    loaded.status().message());
      return kExitUsage;
    }
    table = *std::move(loaded);
  }
  std::ofstream json_file;
  std::ofstream tuning_file;
  if ((!options.json_path.empty() &&
       !OpenOutput("nibble-bench", options.json_path, json_file)) ||
      (!options.write_tuning_table_path.empty() &&
       !OpenOutput("nibble-bench", options.write_tuning_table_path,
                   tuning_file))) {
    return kExitUsage;
  }

  const auto start = std::chrono::steady_clock::now();
  ThreadPool pool(options.threads);
  const int cpu_points =
      static_cast<int>(options.shapes.size() * options.weights.size() *
                       options.ms.size()) *
      options.rounds;
  const int sgemm_points =
      HaveOpenBlas()
          ? static_cast<int>(options.shapes.size() * options.ms.size())
          : 0;
  Progress progress(cpu_points + sgemm_points);
  progress.Note("measuring the read bandwidth and the FMA peak");
  const Scheduler scheduler(cpu::CpuKernels(), table);
  // e.g. "built-in, avx512_bf16 rules".
  const std::string table_name = absl::StrCat(
      options.tuning_table_path.empty() ? "built-in"
                                        : options.tuning_table_path,
      ", ",
      scheduler.table().isa().empty() ? "no ISA level's"
                                      : scheduler.table().isa(),
      " rules");
  ReportContext context{
      .limits = MeasureMachineLimits(pool),
      .kernel_isa = std::string(cpu::IsaName(cpu::DetectIsa())),
      .openblas = HaveOpenBlas(),
      .openblas_description = OpenBlasDescription(),
      .tuning_table = table_name,
      .repeats = options.repeats,
      .dtype = options.dtype};
  const int64_t llc_bytes = context.limits.llc_bytes;

  std::vector<std::vector<PointResult>> rounds(options.rounds);
  std::vector<SgemmResult> sgemm;
  for (int round = 0; round < options.rounds; ++round) {
    for (const Shape& shape : options.shapes) {
      if (HaveOpenBlas() && round == 0) {
        absl::StatusOr<std::vector<Timing>> timings =
            TimeSgemm(shape, options.ms, options.threads, options.repeats,
                      llc_bytes, [&](int64_t m) {
                        progress.Step(absl::StrCat("OpenBLAS sgemm ", shape.k,
                                                   "x", shape.n, " m=", m));
                      });
        if (!timings.ok()) {
          progress.Finish();
          absl::FPrintF(stderr, "nibble-bench: %s\n",
                        timings.status().message());
          return kExitFailure;
        }
        for (size_t i = 0; i < options.ms.size(); ++i) {
          sgemm.push_back({.shape = shape,
                           .m = options.ms[i],
                           .threads = options.threads,
                           .timing = (*timings)[i]});
        }
      }
      for (const WeightKind& kind : options.weights) {
        absl::StatusOr<std::vector<PointResult>> timed = TimeWeight(
            kind, shape, options.ms, options.activation_precision,
            options.dtype, scheduler, pool, options.repeats, llc_bytes,
            [&](int64_t m) { progress.Step(PointName(kind, shape, m)); });
        if (!timed.ok()) {
          progress.Finish();
          absl::FPrintF(stderr, "nibble-bench: %s\n", timed.status().message());
          return kExitFailure;
        }
        rounds[round].insert(rounds[round].end(), timed->begin(), timed->end());
      }
    }
  }
  const std::vector<PointResult> results = MedianOverRounds(rounds);
  progress.Finish();
  absl::FPrintF(
      stderr, "nibble-bench: %d points in %.1f s\n", cpu_points + sgemm_points,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count());

  if (options.json_to_stdout || json_file.is_open()) {
    std::ostream& out = options.json_to_stdout ? std::cout : json_file;
    for (const std::string& line : JsonLines(context, results, sgemm)) {
      out << line << "\n";
    }
  }
  if (!options.json_to_stdout) {
    std::cout << FormatTable(context, results, sgemm);
  }
  if (tuning_file.is_open()) {
    tuning_file << absl::StrFormat(
                       "# nibble-bench on %s, %d threads, %s kernels\n",
                       context.limits.cpu_model, context.limits.threads,
                       context.kernel_isa)
                << MeasuredTuningTable(results, context.kernel_isa, kCpuNearTie)
                       .Serialize();
  }
  std::cout.flush();
  for (std::ofstream* file : {&json_file, &tuning_file}) {
    if (file->is_open()) file->close();
  }
  if (!std::cout || json_file.fail() || tuning_file.fail()) {
    absl::FPrintF(stderr, "nibble-bench: writing the results failed\n");
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace
}  // namespace nibble::bench

int main(int argc, char** argv) {
  const absl::StatusOr<nibble::bench::BenchOptions> options =
      nibble::bench::ParseBenchCommandLine(argc, argv);
  if (!options.ok()) {
    absl::FPrintF(stderr,
                  "nibble-bench: %s\n(`nibble-bench --help` lists the flags)\n",
                  options.status().message());
    return nibble::kExitUsage;
  }
  if (options->help) {
    std::cout << nibble::bench::BenchUsage();
    return nibble::kExitOk;
  }
  return nibble::bench::Run(*options);
}
