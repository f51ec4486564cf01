// The CUDA backend as the rest of nibble sees it, with no CUDA types: whether
// a GPU is there, copying a weight to it, and the GemmKernels that run on it.
// Builds without nvcc get a stub that reports no GPU.
//
// Example:
//   if (nibble::cuda::DeviceCount() > 0) {
//     absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
//         nibble::cuda::UploadWeight(canonical);
//     nibble::Scheduler scheduler(
//         nibble::cuda::CudaKernels(),
//         nibble::cuda::ForThisGpu(nibble::TuningTable::Default()),
//         nibble::cuda::PreferredVariant);
//   }
#ifndef NIBBLE_KERNELS_CUDA_CUDA_BACKEND_H_
#define NIBBLE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "kernels/device_weight.h"
#include "kernels/gemm_kernel.h"
#include "kernels/tuning_table.h"

namespace nibble::cuda {

// Whether nvcc built the backend into this program.
bool CompiledIn();
// GPUs this process can use: 0 without the backend, a driver or a GPU.
int DeviceCount();
// e.g. "NVIDIA H100 80GB HBM3, 132 SMs, sm_90, 79.1 GiB"; empty with no GPU.
std::string DeviceDescription();

// The level a tuning table keys a GPU's rules by: "sm" and its compute
// capability, e.g. "sm90" for 90. Also the isa() of the CUDA kernels.
inline std::string GpuLevelName(int compute_capability) {
  return absl::StrCat("sm", compute_capability);
}
// `table` as the scheduler reads it on this GPU: the rules of its level at
// its SM count (TuningTable::ForGpu); no rules without a GPU.
TuningTable ForThisGpu(const TuningTable& table);

// Whether the CUDA kernels take weights of this shape (K a multiple of 128).
bool SupportsSpec(const WeightSpec& spec);
// Bytes of GPU memory UploadWeight takes for a weight of `spec` (one that
// SupportsSpec), known before its data; 0 without the backend.
int64_t DeviceBytes(const WeightSpec& spec);

struct GpuMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
// The current device's memory as the driver reports it now; UNAVAILABLE
// without a GPU.
absl::StatusOr<GpuMemory> DeviceMemory();
// Copies `canonical` to GPU memory in the kernels' layout. UNAVAILABLE with
// no GPU, INVALID_ARGUMENT for a shape SupportsSpec refuses,
// RESOURCE_EXHAUSTED when GPU memory is short.
absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const QuantizedWeight& canonical);
// UploadWeight for a weight (HasColumnLayout) in its checkpoints' column
// layout, which the GPU arranges without a transpose on the host; also
// INVALID_ARGUMENT for other formats and NaN scale codes.
absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const Fp4Columns& columns);

// Runs of the kernels below in flight at once at most, each on its own CUDA
// stream with its own staging.
inline constexpr int kMaxLanes = 8;

// The staging of the kernels' runs. A run takes a lane: its own stream,
// pinned host buffers for A and C and device buffers for them. A lane is made
// for a run that finds every other one busy, up to kMaxLanes; its buffers
// grow to the largest run it has had and are reused after, so repeated runs
// allocate nothing. The bytes are those of the lanes idle now: all of them
// while no run is in flight.
struct StagingStats {
  int lanes = 0;
  int64_t pinned_bytes = 0;  // page-locked host memory
  int64_t device_bytes = 0;  // GPU memory for A and C
};
StagingStats Staging();

// Where the runs of the kernels below spent their host time, summed since the
// program started: waiting for a free lane, gathering A into the lane's pinned
// staging, waiting for the GPU (the stream's copy in, kernel and copy out,
// until cudaStreamSynchronize returns) and scattering C out of staging. What
// a run took beyond their sum went to its checks and buffer growth.
struct RunStageTimes {
  int64_t runs = 0;
  int64_t lane_wait_ns = 0;
  int64_t gather_ns = 0;
  int64_t device_ns = 0;
  int64_t scatter_ns = 0;
};
RunStageTimes RunStages();

// The variants the CUDA kernels come in: fused, double_buffered (cp.async
// pipeline) and striped (stream-K).
inline constexpr KernelVariant kVariants[] = {KernelVariant::kFused,
                                              KernelVariant::kDoubleBuffered,
                                              KernelVariant::kStriped};

// Each of kVariants for each format; empty without a GPU. They live for the
// whole program. Their Run needs GemmOperands::device from UploadWeight and
// takes host A and C; runs on several threads at once overlap on the GPU
// (kMaxLanes).
std::vector<const GemmKernel*> CudaKernels();

// The variant for a problem on this GPU, by shape and multiprocessor count:
// what the scheduler takes where ForThisGpu's table has no rule.
KernelVariant PreferredVariant(const GemmProblem& problem);

}  // namespace nibble::cuda

#endif  // NIBBLE_KERNELS_CUDA_CUDA_BACKEND_H_
