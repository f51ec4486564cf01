// A kernel that only streams a weight's device arrays (codes, scales, zero
// points) and writes nothing: what the weight's stream takes without a
// matmul's math, launched as the matmuls are (starting before the previous
// kernel ends where they may: cuda::DeviceGemm::overlap_previous_kernel).
// nibble-gpu-bench times it per weight beside them (read_us), so that a
// kernel's time over it says what the kernel's own work adds to the stream;
// the floor (bytes at the copy bandwidth) also leaves out the launch, the
// first loads' latency and the last blocks' tail, which both pay.
//
// Example:
//   absl::StatusOr<WeightReader> reader = WeightReader::Create();
//   absl::Status status = reader->Launch(*weight, stream);
#ifndef NIBBLE_BENCH_KERNELS_CUDA_WEIGHT_READ_H_
#define NIBBLE_BENCH_KERNELS_CUDA_WEIGHT_READ_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_gemm.h"

namespace nibble::bench {

class WeightReader {
 public:
  // On the current GPU: its SM count sizes the grid.
  static absl::StatusOr<WeightReader> Create();
  ~WeightReader();
  WeightReader(WeightReader&& other) noexcept;
  WeightReader& operator=(WeightReader&&) = delete;
  WeightReader(const WeightReader&) = delete;
  WeightReader& operator=(const WeightReader&) = delete;

  // Reads every byte of `weight`'s device arrays once, in one launch on
  // `stream`; it finishes after the previous kernel in `stream`.
  absl::Status Launch(const cuda::CudaWeight& weight, cudaStream_t stream,
                      bool overlap_previous_kernel) const;

 private:
  WeightReader(int blocks, bool can_overlap, unsigned* sink)
      : blocks_(blocks), can_overlap_(can_overlap), sink_(sink) {}

  int blocks_;
  bool can_overlap_;  // the GPU has programmatic dependent launch
  // Where a read would write its fold of the bytes if it ever matched a
  // value no weight folds to: the compiler cannot drop the loads.
  unsigned* sink_;
};

}  // namespace nibble::bench

#endif  // NIBBLE_BENCH_KERNELS_CUDA_WEIGHT_READ_H_
