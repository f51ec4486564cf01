// Turns nibble-bench's or nibble-gpu-bench's measurements into the tuning
// table that nibbled and the scheduler read: for each format, group, shape
// and thread count (a GPU's: its SM count), the fastest variant at each M of
// the grid. Consecutive Ms with the same winner merge into one rule, and a
// winner at grid M_i covers m up to M_{i+1} - 1; the last one covers any m
// (max_m 0). Every rule carries the level the kernels ran at: the CPU's ISA
// level or the GPU's (cuda::GpuLevelName).
//
// Example:
//   nibble::TuningTable table = nibble::bench::MeasuredTuningTable(
//       results, "avx512_bf16", nibble::bench::kCpuNearTie);
//   file << table.Serialize();
#ifndef NIBBLE_BENCH_KERNELS_TUNING_WRITER_H_
#define NIBBLE_BENCH_KERNELS_TUNING_WRITER_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "bench/kernels/bench_grid.h"
#include "kernels/tuning_table.h"

namespace nibble::bench {

// Timings within this fraction of the fastest count as a tie, which the
// first variant measured wins (fused before double_buffered before striped),
// so that noise does not flip the table from run to run. CPU runs on a shared
// machine differ by more than 5 %; the GPU's medians of back-to-back launches
// on a card of its own move by about 1 % between runs.
inline constexpr double kCpuNearTie = 0.05;
inline constexpr double kGpuNearTie = 0.02;

// Rules of level `isa` in the order the keys first appear in `results`, the
// winner of each point picked with `near_tie`. Points without a timed kernel
// are left out.
TuningTable MeasuredTuningTable(const std::vector<PointResult>& results,
                                absl::string_view isa, double near_tie);

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_TUNING_WRITER_H_
