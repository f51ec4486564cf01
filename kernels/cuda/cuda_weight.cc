// The host side of cuda_gemm.h: device queries, weight upload and the
// workspace. Plain C++ on the CUDA runtime API.
#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cuda/arrange_weight.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_gemm.h"
#include "kernels/cuda/device_layout.h"

namespace nibble::cuda {
namespace {

template <typename T>
absl::Status Allocate(T** pointer, int64_t count, const std::string& what) {
  return CudaStatus(cudaMalloc(reinterpret_cast<void**>(pointer),
                               static_cast<size_t>(count) * sizeof(T)),
                    absl::StrFormat("cudaMalloc of %d bytes for %s",
                                    count * sizeof(T), what));
}

// Allocates `*to` and copies `count` elements of `from` into it, on the GPU.
template <typename T>
absl::Status CopyOnDevice(T** to, const T* from, int64_t count,
                          const std::string& what) {
  if (absl::Status status = Allocate(to, count, what); !status.ok()) {
    return status;
  }
  return CudaStatus(
      cudaMemcpy(*to, from, count * sizeof(T), cudaMemcpyDeviceToDevice),
      absl::StrCat("copying ", what, " on the GPU"));
}

// Grows `buffer` to at least `bytes`, zeroed, unless it holds that many: the
// kernels leave what they used zeroed, so only new memory needs clearing.
absl::Status ReserveZeroed(DeviceBuffer& buffer, int64_t bytes,
                           const std::string& what) {
  if (bytes <= buffer.capacity()) return absl::OkStatus();
  if (absl::Status status = buffer.Reserve(bytes, what); !status.ok()) {
    return status;
  }
  if (absl::Status status = CudaStatus(cudaMemset(buffer.data(), 0, bytes),
                                       absl::StrCat("clearing ", what));
      !status.ok()) {
    return status;
  }
  // cudaMemset runs on the legacy stream, which the backend's non-blocking
  // streams do not wait for: done before a kernel on one of them reads it.
  return CudaStatus(cudaStreamSynchronize(cudaStreamLegacy),
                    absl::StrCat("clearing ", what));
}

}  // namespace

absl::Status CudaStatus(cudaError_t error, const std::string& what) {
  if (error == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

namespace {

// Every GPU's properties, or the status that stopped their query: slow to
// ask for and never changing, so read once, and then without a lock, since
// each launch asks.
struct AllDevices {
  std::vector<DeviceInfo> devices;
  absl::Status status;
};

const AllDevices& KnownDevices() {
  static const AllDevices* all = [] {
    auto* made = new AllDevices();
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    for (int device = 0; device < count && made->status.ok(); ++device) {
      cudaDeviceProp properties{};
      made->status =
          CudaStatus(cudaGetDeviceProperties(&properties, device),
                     absl::StrCat("cudaGetDeviceProperties of GPU ", device));
      made->devices.push_back(
          {.name = properties.name,
           .sm_count = properties.multiProcessorCount,
           .compute_capability = properties.major * 10 + properties.minor,
           .l2_bytes = properties.l2CacheSize,
           .memory_bytes = static_cast<int64_t>(properties.totalGlobalMem)});
    }
    return made;
  }();
  return *all;
}

// `code` for GPU `device`, not among the `count` this process sees.
absl::Status NoSuchGpu(absl::StatusCode code, int device, int count) {
  return absl::Status(
      code, absl::StrCat("there is no GPU ", device, ": this process sees ",
                         count == 0   ? std::string("none")
                         : count == 1 ? std::string("GPU 0 only")
                                      : absl::StrCat("GPUs 0 to ", count - 1),
                         " after CUDA_VISIBLE_DEVICES"));
}

}  // namespace

absl::StatusOr<DeviceInfo> GetDeviceInfo(int device) {
  const AllDevices& all = KnownDevices();
  if (!all.status.ok()) return absl::UnavailableError(all.status.message());
  const int count = static_cast<int>(all.devices.size());
  if (device < 0 || device >= count) {
    return NoSuchGpu(absl::StatusCode::kUnavailable, device, count);
  }
  return all.devices[device];
}

absl::StatusOr<DeviceInfo> CurrentDevice() {
  int device = 0;
  if (absl::Status status = CudaStatus(cudaGetDevice(&device), "cudaGetDevice");
      !status.ok()) {
    return absl::UnavailableError(status.message());
  }
  return GetDeviceInfo(device);
}

absl::Status OnDevice(int device, absl::FunctionRef<absl::Status()> fn) {
  int previous = 0;
  if (absl::Status status =
          CudaStatus(cudaGetDevice(&previous), "cudaGetDevice");
      !status.ok()) {
    return status;
  }
  if (device == previous) return fn();
  const int count = static_cast<int>(KnownDevices().devices.size());
  if (device < 0 || device >= count) {
    return NoSuchGpu(absl::StatusCode::kInvalidArgument, device, count);
  }
  if (absl::Status status = CudaStatus(
          cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
      !status.ok()) {
    return status;
  }
  const absl::Status status = fn();
  cudaSetDevice(previous);
  return status;
}

namespace {

absl::Status CheckKMultiple(const WeightSpec& spec) {
  if (spec.k % kKMultiple != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        spec.DebugString(), ": the CUDA kernels need K to be a multiple of ",
        kKMultiple));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaWeight::Named(const absl::Status& status) const {
  return absl::Status(
      status.code(), absl::StrCat(spec_.DebugString(), ": ", status.message()));
}

absl::StatusOr<std::unique_ptr<CudaWeight>> CudaWeight::Allocated(
    const WeightSpec& spec, float output_scale) {
  std::unique_ptr<CudaWeight> weight(new CudaWeight());
  if (absl::Status status =
          CudaStatus(cudaGetDevice(&weight->device_), "cudaGetDevice");
      !status.ok()) {
    return status;
  }
  weight->spec_ = spec;
  weight->padded_n_ = PaddedN(spec.n);
  weight->output_scale_ = output_scale;
  const int64_t words = weight->code_words();
  const int64_t pairs = weight->scale_pairs();
  const bool has_zeros = HasZeros(spec.format);
  weight->bytes_ = DeviceBytes(spec);
  const std::string name = spec.DebugString();
  if (absl::Status status = Allocate(&weight->codes_, words, name + " codes");
      !status.ok()) {
    return status;
  }
  if (absl::Status status = Allocate(&weight->scales_, pairs, name + " scales");
      !status.ok()) {
    return status;
  }
  if (has_zeros) {
    if (absl::Status status = Allocate(&weight->zeros_, pairs, name + " zeros");
        !status.ok()) {
      return status;
    }
  }
  return weight;
}

absl::StatusOr<std::unique_ptr<CudaWeight>> CudaWeight::Upload(
    const QuantizedWeight& canonical) {
  if (absl::Status status = canonical.Validate(); !status.ok()) return status;
  if (absl::Status status = CheckKMultiple(canonical.spec); !status.ok()) {
    return status;
  }
  const ScaleConversion conversion = MakeScaleConversion(canonical);
  absl::StatusOr<std::unique_ptr<CudaWeight>> weight =
      Allocated(canonical.spec, conversion.output_scale);
  if (!weight.ok()) return weight.status();
  if (absl::Status status =
          ArrangeOnDevice(canonical, conversion, (*weight)->arrays());
      !status.ok()) {
    return (*weight)->Named(status);
  }
  return weight;
}

absl::StatusOr<std::unique_ptr<CudaWeight>> CudaWeight::UploadColumns(
    const Fp4Columns& columns) {
  const WeightSpec& spec = columns.spec;
  if (absl::Status status = CheckColumnLayout(spec.format, "the column layout");
      !status.ok()) {
    return status;
  }
  QuantizedWeight scales;
  scales.spec = spec;
  scales.scales =
      ScaleSlotsFromColumns(columns.scale_codes, spec.groups(), spec.n);
  if (absl::Status status = scales.ValidateAllButCodes(); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckKMultiple(spec); !status.ok()) return status;
  const ScaleConversion conversion = MakeScaleConversion(scales);
  absl::StatusOr<std::unique_ptr<CudaWeight>> weight =
      Allocated(spec, conversion.output_scale);
  if (!weight.ok()) return weight.status();
  if (absl::Status status =
          ArrangeOnDevice(columns, scales, conversion, (*weight)->arrays());
      !status.ok()) {
    return (*weight)->Named(status);
  }
  return weight;
}

absl::StatusOr<std::unique_ptr<CudaWeight>> CudaWeight::Copy() const {
  std::unique_ptr<CudaWeight> copy(new CudaWeight());
  copy->device_ = device_;
  copy->spec_ = spec_;
  copy->padded_n_ = padded_n_;
  copy->output_scale_ = output_scale_;
  copy->bytes_ = bytes_;
  const int64_t words = code_words();
  const int64_t pairs = scale_pairs();
  const std::string name = spec_.DebugString();
  const absl::Status copied = OnDevice(device_, [&]() -> absl::Status {
    if (absl::Status status =
            CopyOnDevice(&copy->codes_, codes_, words, name + " codes");
        !status.ok()) {
      return status;
    }
    if (absl::Status status =
            CopyOnDevice(&copy->scales_, scales_, pairs, name + " scales");
        !status.ok()) {
      return status;
    }
    if (zeros_ == nullptr) return absl::OkStatus();
    return CopyOnDevice(&copy->zeros_, zeros_, pairs, name + " zeros");
  });
  if (!copied.ok()) return copied;
  return copy;
}

CudaWeight::~CudaWeight() {
  OnDevice(device_, [this] {
    cudaFree(codes_);
    cudaFree(scales_);
    cudaFree(zeros_);
    return absl::OkStatus();
  }).IgnoreError();
}

DeviceBuffer::~DeviceBuffer() { cudaFree(data_); }

absl::Status DeviceBuffer::Reserve(int64_t bytes, const std::string& what) {
  if (bytes <= capacity_) return absl::OkStatus();
  cudaFree(data_);
  data_ = nullptr;
  capacity_ = 0;
  if (absl::Status status = Allocate(&data_, bytes, what); !status.ok()) {
    return status;
  }
  capacity_ = bytes;
  return absl::OkStatus();
}

absl::Status Workspace::Reserve(int64_t partial_floats, int64_t counters) {
  if (absl::Status status =
          ReserveZeroed(partials_, partial_floats * int64_t{sizeof(float)},
                        "the GEMM workspace");
      !status.ok()) {
    return status;
  }
  return ReserveZeroed(counters_, counters * int64_t{sizeof(int)},
                       "the GEMM tile counters");
}

std::string KernelName(KernelVariant variant, WeightFormat format,
                       int compute_capability) {
  // sm_90 runs the sm_90a code; older GPUs the sm_80 build.
  return absl::StrCat(KernelVariantName(variant), "_", WeightFormatName(format),
                      "_sm", compute_capability >= 90 ? 90 : 80);
}

}  // namespace nibble::cuda
