// The CUDA backend as the rest of nibble sees it, with no CUDA types: which
// GPUs are there, copying a weight to one of them, and the GemmKernels that
// run on the GPU holding their weight. GPUs are CUDA device ordinals as this
// process sees them (after CUDA_VISIBLE_DEVICES). Builds without nvcc get a
// stub that reports no GPU.
//
// Example:
//   if (nibble::cuda::DeviceCount() > 0) {
//     absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
//         nibble::cuda::UploadWeight(canonical, /*device=*/0);
//     nibble::Scheduler scheduler(
//         nibble::cuda::CudaKernels(),
//         nibble::cuda::ForGpu(nibble::TuningTable::Default(), 0),
//         [](const nibble::GemmProblem& problem) {
//           return nibble::cuda::PreferredVariant(problem, 0);
//         });
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
// GPU `device`, e.g. "NVIDIA H100 80GB HBM3, 132 SMs, sm_90, 79.1 GiB";
// empty with no such GPU.
std::string DeviceDescription(int device);
// Whether GPUs `a` and `b` run the same kernels equally fast: the same
// compute capability and SM count (the key of their tuning rules).
bool SameKind(int a, int b);

// The level a tuning table keys a GPU's rules by: "sm" and its compute
// capability, e.g. "sm90" for 90. Also the isa() of the CUDA kernels.
inline std::string GpuLevelName(int compute_capability) {
  return absl::StrCat("sm", compute_capability);
}
// `table` as the scheduler reads it on GPU `device`: the rules of its level
// at its SM count (TuningTable::ForGpu); no rules without such a GPU.
TuningTable ForGpu(const TuningTable& table, int device);

// The kernels take K in multiples of this: one pipeline stage.
inline constexpr int64_t kKMultiple = 128;

// Whether the CUDA kernels take weights of this shape (K a multiple of
// kKMultiple).
bool SupportsSpec(const WeightSpec& spec);
// Bytes of GPU memory UploadWeight takes for a weight of `spec` (one that
// SupportsSpec), known before its data; 0 without the backend.
int64_t DeviceBytes(const WeightSpec& spec);

struct GpuMemory {
  int64_t free_bytes = 0;
  int64_t total_bytes = 0;
};
// GPU `device`'s memory as the driver reports it now; UNAVAILABLE without
// a GPU, INVALID_ARGUMENT without that one.
absl::StatusOr<GpuMemory> DeviceMemory(int device);
// Copies `canonical` to the memory of GPU `device` in the kernels' layout.
// UNAVAILABLE with no GPU, INVALID_ARGUMENT for a shape SupportsSpec refuses
// or no such GPU, RESOURCE_EXHAUSTED when its memory is short.
absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const QuantizedWeight& canonical, int device);
// UploadWeight for a weight (HasColumnLayout) in its checkpoints' column
// layout, which the GPU arranges without a transpose on the host; also
// INVALID_ARGUMENT for other formats and NaN scale codes.
absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const Fp4Columns& columns, int device);

// Runs of the kernels below in flight at once at most on one GPU, each on its
// own CUDA stream with its own staging.
inline constexpr int kMaxLanes = 8;

// The staging of the kernels' runs. A run takes a lane of its weight's GPU:
// a stream there, pinned host buffers for A and C and device buffers for
// them. A lane is made for a run that finds every other one of its GPU busy,
// up to kMaxLanes per GPU; its buffers grow to the largest run it has had and
// are reused after, so repeated runs allocate nothing. The bytes are those of
// the lanes idle now, over all GPUs: all of them while no run is in flight.
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

// Each of kVariants for each format, named for GPU 0's architecture; empty
// without a GPU. They live for the whole program. Their Run needs
// GemmOperands::device from UploadWeight, runs on the GPU holding it and
// takes host A and C; runs on several threads at once overlap on the GPU
// (kMaxLanes), and runs on different GPUs share nothing.
std::vector<const GemmKernel*> CudaKernels();

// The variant for a problem on GPU `device`, by shape and multiprocessor
// count: what the scheduler takes where ForGpu's table has no rule.
KernelVariant PreferredVariant(const GemmProblem& problem, int device);

}  // namespace nibble::cuda

#endif  // NIBBLE_KERNELS_CUDA_CUDA_BACKEND_H_
