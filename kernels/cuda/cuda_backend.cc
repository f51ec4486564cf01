// cuda_backend.h on the CUDA runtime: the GemmKernels of the backend stage
// host A and C through one stream and grow-only device buffers.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "format/dtype.h"
#include "kernels/cuda/cuda_gemm.h"
#include "kernels/cuda/device_layout.h"

namespace nibble::cuda {
namespace {

// What host-side runs share: the GPU runs one GEMM at a time anyway.
struct Session {
  absl::Mutex mutex;
  cudaStream_t stream = nullptr;
  Workspace workspace;
  DeviceBuffer a;
  DeviceBuffer c;
  std::vector<uint16_t> a_bf16;  // f32 A rounded for the tensor cores
};

absl::StatusOr<Session*> GetSession() {
  static Session* session = new Session();
  static const absl::Status created = CudaStatus(
      cudaStreamCreateWithFlags(&session->stream, cudaStreamNonBlocking),
      "cudaStreamCreate");
  if (!created.ok()) return created;
  return session;
}

class CudaGemmKernel final : public GemmKernel {
 public:
  CudaGemmKernel(KernelVariant variant, WeightFormat format,
                 int compute_capability)
      : variant_(variant),
        format_(format),
        name_(KernelName(variant, format, compute_capability)) {}

  absl::string_view name() const override { return name_; }
  KernelVariant variant() const override { return variant_; }
  bool Supports(const GemmProblem& problem) const override {
    return problem.format == format_ && problem.m > 0 &&
           problem.k % kKMultiple == 0;
  }
  // f32 activations go to the tensor cores as bf16; f16 and bf16 as they are.
  bool RoundsActivationsToBf16(DType dtype) const override {
    return dtype == DType::kF32;
  }

  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool&) const override {
    const auto* weight = dynamic_cast<const CudaWeight*>(operands.device);
    if (weight == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, " needs the weight in GPU memory (UploadWeight) and got ",
          operands.device == nullptr ? "none" : "another backend's copy"));
    }
    absl::StatusOr<Session*> session = GetSession();
    if (!session.ok()) return session.status();
    absl::MutexLock lock(&(*session)->mutex);
    const int64_t elements = problem.m * problem.k;
    const void* a = operands.a;
    DType a_dtype = problem.dtype;
    if (problem.dtype == DType::kF32) {
      std::vector<uint16_t>& rounded = (*session)->a_bf16;
      rounded.resize(elements);
      const float* a_f32 = static_cast<const float*>(operands.a);
      for (int64_t i = 0; i < elements; ++i) {
        rounded[i] = FloatToBf16(a_f32[i]);
      }
      a = rounded.data();
      a_dtype = DType::kBF16;
    }
    const size_t a_bytes = elements * DTypeSize(a_dtype);
    const size_t c_bytes = problem.m * problem.n * DTypeSize(problem.dtype);
    Session& s = **session;
    if (absl::Status status = s.a.Reserve(a_bytes, "A"); !status.ok()) {
      return status;
    }
    if (absl::Status status = s.c.Reserve(c_bytes, "C"); !status.ok()) {
      return status;
    }
    if (absl::Status status =
            CudaStatus(cudaMemcpyAsync(s.a.data(), a, a_bytes,
                                       cudaMemcpyHostToDevice, s.stream),
                       "copying A to the GPU");
        !status.ok()) {
      return status;
    }
    const DeviceGemm gemm{.variant = variant_,
                          .b = weight,
                          .a = s.a.data(),
                          .a_dtype = a_dtype,
                          .c = s.c.data(),
                          .c_dtype = problem.dtype,
                          .m = problem.m};
    if (absl::Status status = LaunchGemm(gemm, s.workspace, s.stream);
        !status.ok()) {
      return status;
    }
    if (absl::Status status =
            CudaStatus(cudaMemcpyAsync(operands.c, s.c.data(), c_bytes,
                                       cudaMemcpyDeviceToHost, s.stream),
                       "copying C from the GPU");
        !status.ok()) {
      return status;
    }
    return CudaStatus(cudaStreamSynchronize(s.stream),
                      absl::StrCat("running ", name_));
  }

 private:
  KernelVariant variant_;
  WeightFormat format_;
  std::string name_;
};

}  // namespace

bool CompiledIn() { return true; }

int DeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::string DeviceDescription() {
  if (DeviceCount() == 0) return "";
  absl::StatusOr<DeviceInfo> device = CurrentDevice();
  if (!device.ok()) return "";
  return absl::StrFormat("%s, %d SMs, sm_%d, %.1f GiB", device->name,
                         device->sm_count, device->compute_capability,
                         device->memory_bytes / double{1 << 30});
}

bool SupportsSpec(const WeightSpec& spec) { return spec.k % kKMultiple == 0; }

namespace {

// The weight `upload` makes, once a GPU is known to be there.
absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWith(
    absl::FunctionRef<absl::StatusOr<std::unique_ptr<CudaWeight>>()> upload) {
  if (DeviceCount() == 0) {
    return absl::UnavailableError("no CUDA GPU is visible to this process");
  }
  absl::StatusOr<std::unique_ptr<CudaWeight>> weight = upload();
  if (!weight.ok()) return weight.status();
  return std::unique_ptr<DeviceWeight>(std::move(*weight));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const QuantizedWeight& canonical) {
  return UploadWith([&] { return CudaWeight::Upload(canonical); });
}

absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const Fp4Columns& columns) {
  return UploadWith([&] { return CudaWeight::UploadColumns(columns); });
}

std::vector<const GemmKernel*> CudaKernels() {
  if (DeviceCount() == 0) return {};
  static const std::vector<const GemmKernel*>* kernels = [] {
    absl::StatusOr<DeviceInfo> device = CurrentDevice();
    const int capability = device.ok() ? device->compute_capability : 0;
    auto* list = new std::vector<const GemmKernel*>();
    for (KernelVariant variant :
         {KernelVariant::kFused, KernelVariant::kDoubleBuffered,
          KernelVariant::kStriped}) {
      for (WeightFormat format : kAllWeightFormats) {
        list->push_back(new CudaGemmKernel(variant, format, capability));
      }
    }
    return list;
  }();
  return *kernels;
}

KernelVariant PreferredVariant(const GemmProblem& problem) {
  // On an H100 (make gpu-check, docs/performance.md): on Hopper from 32 rows
  // double_buffered runs wgmma, each tile's K split evenly to fill one wave
  // (striped, whose blocks all end on a tile they share, reduces ~130 tiles
  // through L2 at once at the end); below that the weight read dominates and
  // stream-K keeps every multiprocessor streaming to the end; before Hopper,
  // above 64 rows, fused keeps the codes out of shared memory, which the
  // larger A tile needs.
  absl::StatusOr<DeviceInfo> device = CurrentDevice();
  if (device.ok() && UsesWgmma(KernelVariant::kDoubleBuffered, problem.m,
                               device->compute_capability)) {
    return KernelVariant::kDoubleBuffered;
  }
  return problem.m <= 64 ? KernelVariant::kStriped : KernelVariant::kFused;
}

}  // namespace nibble::cuda
