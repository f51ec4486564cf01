// Turns nibble-bench's measurements into the tuning table that nibbled and
// the scheduler read: for each format, group, shape and thread count, the
// fastest variant at each M of the grid. Consecutive Ms with the same winner
// merge into one rule, and a winner at grid M_i covers m up to M_{i+1} - 1;
// the last one covers any m (max_m 0). Every rule carries the ISA level the
// kernels ran at.
//
// Example:
//   nibble::TuningTable table =
//       nibble::bench::MeasuredTuningTable(results, "avx512_bf16");
//   file << table.Serialize();
#ifndef NIBBLE_BENCH_KERNELS_TUNING_WRITER_H_
#define NIBBLE_BENCH_KERNELS_TUNING_WRITER_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "bench/kernels/bench_grid.h"
#include "kernels/tuning_table.h"

namespace nibble::bench {

// Rules of level `isa` in the order the keys first appear in `results`.
// Points without a timed kernel are left out.
TuningTable MeasuredTuningTable(const std::vector<PointResult>& results,
                                absl::string_view isa);

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_TUNING_WRITER_H_
