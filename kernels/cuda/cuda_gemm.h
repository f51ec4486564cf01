// Launching nibble's CUDA GEMM on operands already on the GPU: what the
// backend's GemmKernels, the GPU tests and the GPU benchmark call. Needs the
// CUDA runtime; the rest of nibble uses cuda_backend.h.
//
// C [M, N] = A [M, K] · dequant(B), A in fp16 or bf16, fp32 accumulation on
// mma.sync m16n8k16 or, on Hopper, wgmma m64n64k16; C in fp16, bf16 or fp32.
//
// Example:
//   nibble::cuda::Workspace workspace;
//   nibble::cuda::DeviceGemm gemm{.variant = nibble::KernelVariant::kFused,
//                                 .b = &weight, .a = a_dev,
//                                 .a_dtype = nibble::DType::kF16,
//                                 .c = c_dev, .c_dtype = nibble::DType::kF16,
//                                 .m = 16};
//   absl::Status s = nibble::cuda::LaunchGemm(gemm, workspace, stream);
#ifndef NIBBLE_KERNELS_CUDA_CUDA_GEMM_H_
#define NIBBLE_KERNELS_CUDA_CUDA_GEMM_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/dtype.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "kernels/cuda/arrange_weight.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device_weight.h"
#include "kernels/gemm_kernel.h"

namespace nibble::cuda {

// A CUDA error as a Status naming what failed, e.g. "cudaMalloc of 117 MB:
// out of memory". OK for cudaSuccess.
absl::Status CudaStatus(cudaError_t error, const std::string& what);

struct DeviceInfo {
  std::string name;
  int sm_count = 0;
  int compute_capability = 0;  // e.g. 90
  int64_t l2_bytes = 0;
  int64_t memory_bytes = 0;
};
// GPU `device` (a CUDA device ordinal); UNAVAILABLE with no driver or no
// such GPU.
absl::StatusOr<DeviceInfo> GetDeviceInfo(int device);
// The calling thread's current GPU; UNAVAILABLE with no driver or GPU.
absl::StatusOr<DeviceInfo> CurrentDevice();
// Runs `fn` with GPU `device` current on the calling thread, then makes the
// one before current again, so that work for one GPU leaves the thread as it
// found it. INVALID_ARGUMENT, naming the GPUs there are, for no such GPU.
absl::Status OnDevice(int device, absl::FunctionRef<absl::Status()> fn);

// A weight in GPU memory in the layout of device_layout.h, on the GPU that
// was current when it was uploaded.
class CudaWeight final : public DeviceWeight {
 public:
  // INVALID_ARGUMENT unless `canonical` validates with K a multiple of
  // kKMultiple.
  static absl::StatusOr<std::unique_ptr<CudaWeight>> Upload(
      const QuantizedWeight& canonical);
  // Upload for a weight (HasColumnLayout) in its checkpoints' column layout
  // (fp4_columns.h), which is never transposed on the host. INVALID_ARGUMENT
  // for other formats, a NaN scale code, and K not a multiple of kKMultiple.
  static absl::StatusOr<std::unique_ptr<CudaWeight>> UploadColumns(
      const Fp4Columns& columns);
  ~CudaWeight() override;
  CudaWeight(const CudaWeight&) = delete;
  CudaWeight& operator=(const CudaWeight&) = delete;

  // Another copy on the same GPU, copied device to device: what the
  // benchmark rotates through without laying the weight out again on the
  // host.
  absl::StatusOr<std::unique_ptr<CudaWeight>> Copy() const;

  const WeightSpec& spec() const override { return spec_; }
  int64_t device_bytes() const override { return bytes_; }
  int device() const override { return device_; }
  int64_t padded_n() const { return padded_n_; }
  // What the kernels multiply C by (DeviceLayout::output_scale).
  float output_scale() const { return output_scale_; }
  const uint32_t* codes() const { return codes_; }
  const uint32_t* scales() const { return scales_; }
  const uint16_t* zeros() const { return zeros_; }  // nullptr unless kU4
  // The bytes of each array, as a launch reads them (zero points: 0 without).
  int64_t code_bytes() const { return code_words() * sizeof(*codes_); }
  int64_t scale_bytes() const { return scale_pairs() * sizeof(*scales_); }
  int64_t zero_bytes() const {
    return zeros_ == nullptr ? 0 : scale_pairs() * sizeof(*zeros_);
  }

 private:
  CudaWeight() = default;
  // A weight of `spec` with its arrays allocated, not yet filled.
  static absl::StatusOr<std::unique_ptr<CudaWeight>> Allocated(
      const WeightSpec& spec, float output_scale);
  ArrangedArrays arrays() const { return {codes_, scales_, zeros_}; }
  // `status` with the weight's shape in front.
  absl::Status Named(const absl::Status& status) const;
  // The element counts of DeviceLayout's arrays.
  int64_t code_words() const { return padded_n_ * spec_.k / kCodesPerWord; }
  int64_t scale_pairs() const { return spec_.groups() * padded_n_ / 2; }

  WeightSpec spec_;
  int device_ = 0;
  int64_t padded_n_ = 0;
  float output_scale_ = 1.0f;
  int64_t bytes_ = 0;
  uint32_t* codes_ = nullptr;
  uint32_t* scales_ = nullptr;
  uint16_t* zeros_ = nullptr;
};

// A device buffer that only grows, freed with it: the backend's A and C, and
// the staging of a weight's upload.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // At least `bytes`, allocated for `what` (named in the error); what it
  // held is lost when it grows.
  absl::Status Reserve(int64_t bytes, const std::string& what);
  template <typename T = void>
  T* data() const {
    return static_cast<T*>(static_cast<void*>(data_));
  }
  int64_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t capacity_ = 0;
};

// The fp32 partial sums and per-tile counters through which thread blocks
// that share an output tile reduce it. Grows on demand; the kernels leave it
// zeroed. Use one per stream.
class Workspace {
 public:
  // At least `partial_floats` floats and `counters` ints, all zero.
  absl::Status Reserve(int64_t partial_floats, int64_t counters);
  float* partials() const { return partials_.data<float>(); }
  int* counters() const { return counters_.data<int>(); }

 private:
  DeviceBuffer partials_;
  DeviceBuffer counters_;
};

struct DeviceGemm {
  KernelVariant variant = KernelVariant::kFused;  // not kReference
  const CudaWeight* b = nullptr;
  const void* a = nullptr;      // device [M, K]
  DType a_dtype = DType::kF16;  // kF16 or kBF16
  void* c = nullptr;            // device [M, N]
  DType c_dtype = DType::kF16;
  int64_t m = 0;
  // Set where the launch follows a kernel in the stream (a chain of
  // matmuls): on GPUs of compute capability 9.0 and up the kernel then
  // starts while that one still runs (programmatic dependent launch),
  // streams the first stages of its weight, which no kernel writes, as the
  // other ends, and touches A, C and the workspace only after
  // (gemm_common.cuh). Behind a copy or an event it would only delay its
  // first stage: false there.
  bool overlap_previous_kernel = false;
};

// Whether a GPU of `compute_capability` lets a kernel start before the
// previous kernel in its stream ends (programmatic dependent launch), and
// the launch attribute that asks for it.
constexpr bool OverlapsLaunches(int compute_capability) {
  return compute_capability >= 90;
}
inline cudaLaunchAttribute OverlapPreviousKernelAttribute() {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  return attribute;
}

// INVALID_ARGUMENT for operands the kernels do not take; launch errors as
// CudaStatus. Asynchronous on `stream`.
absl::Status LaunchGemm(const DeviceGemm& gemm, Workspace& workspace,
                        cudaStream_t stream);

// Whether a GPU of `compute_capability` runs the sm_90a code (the wgmma
// kernel, thread block clusters, the Hopper tile choices): 9.0 only, since
// sm_90a's instructions run on no other.
constexpr bool RunsSm90a(int compute_capability) {
  return compute_capability == 90;
}

// e.g. "fused_u4b8_sm90": variant, format and the architecture it runs.
std::string KernelName(KernelVariant variant, WeightFormat format,
                       int compute_capability);

// Whether a launch of `variant` for `m` rows of a `format` weight runs the
// wgmma kernel (wgmma_kernel.cuh) on a GPU of `compute_capability`: the
// pipelined variants on Hopper from the format's WgmmaMinRows do, unless A
// is not 16-byte aligned (the tensor copies need it); the rest run the
// mma.sync kernel.
bool UsesWgmma(KernelVariant variant, WeightFormat format, int64_t m,
               int compute_capability);

// KernelName with "_wgmma" where UsesWgmma: what a launch of m rows runs.
std::string LaunchedKernelName(KernelVariant variant, WeightFormat format,
                               int compute_capability, int64_t m);

}  // namespace nibble::cuda

#endif  // NIBBLE_KERNELS_CUDA_CUDA_GEMM_H_
