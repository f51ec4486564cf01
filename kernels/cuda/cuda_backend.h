// The CUDA backend as the rest of nibble sees it, with no CUDA types: whether
// a GPU is there, copying a weight to it, and the GemmKernels that run on it.
// Builds without nvcc get a stub that reports no GPU.
//
// Example:
//   if (nibble::cuda::DeviceCount() > 0) {
//     absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
//         nibble::cuda::UploadWeight(canonical);
//     nibble::Scheduler scheduler(nibble::cuda::CudaKernels(), {},
//                                 nibble::cuda::PreferredVariant);
//   }
#ifndef NIBBLE_KERNELS_CUDA_CUDA_BACKEND_H_
#define NIBBLE_KERNELS_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "kernels/device_weight.h"
#include "kernels/gemm_kernel.h"

namespace nibble::cuda {

// Whether nvcc built the backend into this program.
bool CompiledIn();
// GPUs this process can use: 0 without the backend, a driver or a GPU.
int DeviceCount();
// e.g. "NVIDIA H100 80GB HBM3, 132 SMs, sm_90, 79.1 GiB"; empty with no GPU.
std::string DeviceDescription();

// Whether the CUDA kernels take weights of this shape (K a multiple of 128).
bool SupportsSpec(const WeightSpec& spec);
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

// fused, double_buffered (cp.async pipeline) and striped (stream-K) for each
// format; empty without a GPU. They live for the whole program. Their Run
// needs GemmOperands::device from UploadWeight and takes host A and C.
std::vector<const GemmKernel*> CudaKernels();

// The variant for a problem on this GPU, by shape and multiprocessor count.
KernelVariant PreferredVariant(const GemmProblem& problem);

}  // namespace nibble::cuda

#endif  // NIBBLE_KERNELS_CUDA_CUDA_BACKEND_H_
