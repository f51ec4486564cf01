// nibble-bench's output: the human table and the JSON lines, both read
// against the machine's limits. A row's rates are those of the weight it
// reads: GB/s is the packed weight's bytes over the median time, floor_us the
// time those bytes take at the measured read bandwidth, GFLOP/s 2·M·N·K over
// the median time.
//
// Example:
//   nibble::bench::ReportContext context{.limits = limits,
//                                        .kernel_isa = "avx512"};
//   std::cout << nibble::bench::FormatTable(context, results, sgemm);
//   for (const std::string& line :
//        nibble::bench::JsonLines(context, results, sgemm)) { ... }
#ifndef NIBBLE_BENCH_KERNELS_REPORT_H_
#define NIBBLE_BENCH_KERNELS_REPORT_H_

#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "bench/kernels/bench_flags.h"
#include "bench/kernels/bench_grid.h"
#include "bench/kernels/machine_limits.h"
#include "bench/kernels/timing.h"
#include "format/dtype.h"

namespace nibble::bench {

// OpenBLAS sgemm at one (M, K, N).
struct SgemmResult {
  Shape shape;
  int64_t m = 0;
  int threads = 1;
  Timing timing;
};

// What the header and the machine object say besides the limits.
struct ReportContext {
  MachineLimits limits;
  std::string kernel_isa;  // the level of the CPU kernels, e.g. "avx512"
  bool openblas = false;
  std::string openblas_description;
  std::string tuning_table;  // "built-in" or the file
  int repeats = 0;
  DType dtype = DType::kF32;  // of A and C
};

// GB/s reading `bytes` in `micros`.
double GigabytesPerSecond(int64_t bytes, double micros);
// GFLOP/s of an M x K x N product in `micros`.
double Gflops(int64_t m, int64_t k, int64_t n, double micros);

// Opens `path` for writing before a long run, so that a bad path is a usage
// mistake found at once; false, having told stderr why (as `program`), when
// it cannot.
bool OpenOutput(absl::string_view program, const std::string& path,
                std::ofstream& file);

// `text` as a JSON string, quotes included.
std::string JsonString(absl::string_view text);

// The leading {"machine": {...}} line, then one object per timed kernel, then
// one per sgemm timing.
std::vector<std::string> JsonLines(const ReportContext& context,
                                   const std::vector<PointResult>& results,
                                   const std::vector<SgemmResult>& sgemm);

// A header with the machine's limits, then one line per grid point.
std::string FormatTable(const ReportContext& context,
                        const std::vector<PointResult>& results,
                        const std::vector<SgemmResult>& sgemm);

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_REPORT_H_
