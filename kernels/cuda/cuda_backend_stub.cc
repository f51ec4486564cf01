// cuda_backend.h for builds without nvcc: no GPU, no kernels.
#include "absl/status/status.h"
#include "kernels/cuda/cuda_backend.h"

namespace nibble::cuda {

bool CompiledIn() { return false; }
int DeviceCount() { return 0; }
std::string DeviceDescription(int) { return ""; }
bool SameKind(int, int) { return false; }
bool SupportsSpec(const WeightSpec&) { return false; }
int64_t DeviceBytes(const WeightSpec&) { return 0; }
StagingStats Staging() { return {}; }
RunStageTimes RunStages() { return {}; }
TuningTable ForGpu(const TuningTable& table, int) {
  return table.ForGpu("", 0);
}

namespace {

absl::Status NotBuilt() {
  return absl::UnavailableError(
      "this build has no CUDA backend: nvcc was not found when it was "
      "configured");
}

}  // namespace

absl::StatusOr<GpuMemory> DeviceMemory(int) { return NotBuilt(); }

absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const QuantizedWeight&, int) {
  return NotBuilt();
}

absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(const Fp4Columns&,
                                                           int) {
  return NotBuilt();
}

std::vector<const GemmKernel*> CudaKernels() { return {}; }

KernelVariant PreferredVariant(const GemmProblem&, int) {
  return KernelVariant::kFused;
}

}  // namespace nibble::cuda
