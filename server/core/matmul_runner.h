// Runs one Matmul on a resident weight: validates the request's shape against
// the weight, gathers A by the weight's activation order when it has one
// (GPTQ act-order), asks the scheduler for a kernel and times it.
//
// A batch of requests runs as one kernel call on their rows (RunBlocks), each
// request's A read and its C written in place.
//
// Example:
//   nibble::server::MatmulRunner runner(&scheduler, &pool);
//   absl::StatusOr<nibble::server::MatmulResult> result =
//       runner.Run(weight, "proj", /*m=*/1, /*k=*/4096, nibble::DType::kF16,
//                  bytes);
#ifndef NIBBLE_SERVER_CORE_MATMUL_RUNNER_H_
#define NIBBLE_SERVER_CORE_MATMUL_RUNNER_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "format/dtype.h"
#include "kernels/device_weight.h"
#include "kernels/gemm_kernel.h"
#include "kernels/packed_weight.h"
#include "kernels/scheduler.h"

namespace nibble::server {

struct MatmulResult {
  std::string c;  // [M, N] in the request's dtype
  std::string kernel;
  // What the kernel made of A (ActivationPrecisionOf).
  ActivationPrecision activation_precision = ActivationPrecision::kExact;
  int64_t compute_time_ns = 0;
};

// What ran a batch (MatmulRunner::RunBlocks): MatmulResult but for C, which
// went into the blocks.
struct MatmulRun {
  std::string kernel;
  ActivationPrecision activation_precision = ActivationPrecision::kExact;
  int64_t compute_time_ns = 0;
};

// `k` is the request's K, 0 for the weight's. INVALID_ARGUMENT, naming the
// mismatch, when m is not positive, k differs from the weight's, or
// `a_bytes` is not the size of m * K elements of dtype.
absl::Status CheckMatmulShape(const WeightSpec& spec,
                              absl::string_view weight_name, int64_t m,
                              int64_t k, DType dtype, size_t a_bytes);

class MatmulRunner {
 public:
  // Both must outlive the runner.
  MatmulRunner(const Scheduler* scheduler, ThreadPool* pool);

  // INVALID_ARGUMENT as CheckMatmulShape answers. `device` is the weight's
  // copy in the backend's memory (ResidentWeight::device), null for none;
  // accelerator kernels read it. Runs at ActivationPrecision::kBf16.
  absl::StatusOr<MatmulResult> Run(
      const PackedWeight& weight, absl::string_view weight_name, int64_t m,
      int64_t k, DType dtype, absl::string_view a,
      const nibble::DeviceWeight* device = nullptr) const;

  // Runs the rows of `blocks` as one matmul of their summed rows: each
  // block's A (of the weight's K, already checked by CheckMatmulShape) is
  // read and its C, sized by the caller, written, by a kernel that treats A
  // at most as lossily as `precision` allows. INVALID_ARGUMENT for no rows;
  // `device` as for Run.
  absl::StatusOr<MatmulRun> RunBlocks(
      const PackedWeight& weight, DType dtype, ActivationPrecision precision,
      absl::Span<const RowBlock> blocks,
      const nibble::DeviceWeight* device = nullptr) const;

  // Whether RunBlocks on `m` rows would take A below the precision of
  // `dtype`: the kernel it picks rounds A to bf16 or quantizes it to int8.
  bool LosesPrecision(const PackedWeight& weight, int64_t m, DType dtype,
                      ActivationPrecision precision) const;

 private:
  const Scheduler* scheduler_;
  ThreadPool* pool_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_MATMUL_RUNNER_H_
