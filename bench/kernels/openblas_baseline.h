// The baseline nibble's kernels are compared with: OpenBLAS cblas_sgemm on the
// same M, K and N in fp32, the dense product that a 4-bit weight replaces.
// Without OpenBLAS at build time the baseline is missing, and says so.
//
// Example:
//   if (nibble::bench::HaveOpenBlas()) {
//     absl::StatusOr<std::vector<nibble::bench::Timing>> sgemm =
//         nibble::bench::TimeSgemm({4096, 4096}, {1, 16}, /*threads=*/2,
//                                  /*repeats=*/10, llc_bytes,
//                                  [](int64_t m) {});
//   }
#ifndef NIBBLE_BENCH_KERNELS_OPENBLAS_BASELINE_H_
#define NIBBLE_BENCH_KERNELS_OPENBLAS_BASELINE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "bench/kernels/bench_flags.h"
#include "bench/kernels/timing.h"

namespace nibble::bench {

bool HaveOpenBlas();

// OpenBLAS's own description ("OpenBLAS 0.3.21 DYNAMIC_ARCH ..."), or why
// there is no baseline.
std::string OpenBlasDescription();

// For each m of `ms`, C [m, n] = A [m, k] · B [k, n] in fp32 on `threads`
// threads, timed like the kernels (B rotating through copies that leave the
// cache). Calls before_each(m) before timing each m. UNIMPLEMENTED when
// built without OpenBLAS.
absl::StatusOr<std::vector<Timing>> TimeSgemm(
    const Shape& shape, const std::vector<int64_t>& ms, int threads,
    int repeats, int64_t llc_bytes,
    absl::FunctionRef<void(int64_t m)> before_each);

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_OPENBLAS_BASELINE_H_
