// Planning and launching the GEMM kernel of gemm_kernel.cuh: which kernel
// by format, type and rows, and how many blocks share the work.
#include <algorithm>
#include <bit>
#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/cuda_gemm.h"
#include "kernels/cuda/device_layout.h"
#include "kernels/cuda/gemm_kernel.cuh"

namespace nibble::cuda {
namespace {

using internal::ChooseFormatKernel;
using internal::KernelChoice;
using internal::KernelFunction;
using internal::kThreads;
using internal::OutType;
using internal::Params;
using internal::ScaleRowsPerStep;

// Rows of C per tile: 16, 32, 64 or 128, the fewest that cover M (up to 128).
int MTilesFor(int64_t m) {
  if (m <= 16) return 1;
  if (m <= 32) return 2;
  if (m <= 64) return 4;
  return 8;
}

KernelChoice Choose(WeightFormat format, DType a_dtype, int m_tiles,
                    bool register_codes) {
  switch (format) {
    // E8M0 scales are fp16 in the device layout: fp4 from there.
    case WeightFormat::kFp4:
    case WeightFormat::kMxfp4:
      return ChooseFormatKernel<WeightFormat::kFp4>(a_dtype, m_tiles,
                                                    register_codes);
    case WeightFormat::kNvfp4:
      return ChooseFormatKernel<WeightFormat::kNvfp4>(a_dtype, m_tiles,
                                                      register_codes);
    case WeightFormat::kU4b8:
      return ChooseFormatKernel<WeightFormat::kU4b8>(a_dtype, m_tiles,
                                                     register_codes);
    case WeightFormat::kU4:
      return ChooseFormatKernel<WeightFormat::kU4>(a_dtype, m_tiles,
                                                   register_codes);
  }
  return {};
}

// Raises the kernel's shared-memory limit and asks how many of its blocks
// fit on a multiprocessor, once per kernel: launches stay cheap on the host.
absl::StatusOr<int> BlocksPerSm(const KernelChoice& kernel) {
  static absl::Mutex mutex;
  static auto* known = new absl::flat_hash_map<KernelFunction, int>();
  absl::MutexLock lock(&mutex);
  if (auto it = known->find(kernel.function); it != known->end()) {
    return it->second;
  }
  if (absl::Status status = CudaStatus(
          cudaFuncSetAttribute(kernel.function,
                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kernel.shared_bytes),
          "cudaFuncSetAttribute");
      !status.ok()) {
    return status;
  }
  int blocks = 0;
  if (absl::Status status = CudaStatus(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &blocks, kernel.function, kThreads, kernel.shared_bytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      !status.ok()) {
    return status;
  }
  known->emplace(kernel.function, blocks);
  return blocks;
}

// How a launch divides a problem: rows per tile (16 · m_tiles), thread
// blocks, and output tiles, which blocks share when there are more blocks.
struct LaunchPlan {
  int m_tiles = 1;
  int64_t blocks = 0;
  int64_t tiles = 0;
  int64_t steps_per_tile = 0;
};

struct Plan {
  LaunchPlan launch;
  KernelChoice kernel;
  int iters_base = 0;
  int iters_extra = 0;
};

absl::StatusOr<Plan> MakePlan(KernelVariant variant, int64_t m,
                              const WeightSpec& spec, DType a_dtype,
                              int sm_count) {
  Plan plan;
  const bool register_codes = variant == KernelVariant::kFused;
  plan.kernel = Choose(spec.format, a_dtype, MTilesFor(m), register_codes);
  absl::StatusOr<int> blocks_per_sm = BlocksPerSm(plan.kernel);
  if (!blocks_per_sm.ok()) return blocks_per_sm.status();
  LaunchPlan& launch = plan.launch;
  launch.m_tiles = plan.kernel.m_tiles;
  const int64_t rows = 16 * launch.m_tiles;
  const int64_t padded_n = (spec.n + kTileN - 1) / kTileN * kTileN;
  launch.tiles = (m + rows - 1) / rows * (padded_n / plan.kernel.columns);
  launch.steps_per_tile = spec.k / kKMultiple;
  const int64_t iterations = launch.tiles * launch.steps_per_tile;
  if (iterations >= int64_t{1} << 31) {
    return absl::InvalidArgumentError(
        absl::StrCat("m=", m, " with ", spec.DebugString(),
                     " has too many tiles for one launch: split the rows"));
  }
  const int64_t slots = int64_t{std::max(1, *blocks_per_sm)} * sm_count;
  if (variant == KernelVariant::kStriped) {
    launch.blocks = std::min(iterations, slots);
  } else {
    // Whole tiles when they fill the GPU; otherwise each tile's K steps split
    // in as many parts as fill it, keeping at least 4 steps per part.
    int64_t split = 1;
    if (launch.tiles < slots) {
      split = std::min((slots + launch.tiles - 1) / launch.tiles,
                       std::max<int64_t>(1, launch.steps_per_tile / 4));
    }
    launch.blocks = launch.tiles * split;
  }
  plan.iters_base = static_cast<int>(iterations / launch.blocks);
  plan.iters_extra = static_cast<int>(iterations % launch.blocks);
  return plan;
}

// Params::group_step_shift: log2 of the scale rows in a group (a scale row
// is kKMultiple / ScaleRowsPerStep rows of K), or 31 for one group.
int GroupStepShift(const WeightSpec& spec) {
  if (spec.group_size == spec.k) return 31;
  const int64_t scale_row = kKMultiple / ScaleRowsPerStep(spec.format);
  return std::countr_zero(static_cast<uint64_t>(spec.group_size / scale_row));
}

OutType OutTypeOf(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return OutType::kF16;
    case DType::kBF16:
      return OutType::kBF16;
    case DType::kF32:
      return OutType::kF32;
  }
  return OutType::kF32;
}

}  // namespace

absl::Status LaunchGemm(const DeviceGemm& gemm, Workspace& workspace,
                        cudaStream_t stream) {
  if (gemm.b == nullptr || gemm.a == nullptr || gemm.c == nullptr) {
    return absl::InvalidArgumentError("LaunchGemm needs B, A and C");
  }
  if (gemm.variant == KernelVariant::kReference) {
    return absl::InvalidArgumentError(
        "the CUDA backend has no reference variant: compare against "
        "nibble::ReferenceGemm on the host");
  }
  if (gemm.a_dtype == DType::kF32) {
    return absl::InvalidArgumentError(
        "the CUDA kernels take A in f16 or bf16; convert f32 first");
  }
  const WeightSpec& spec = gemm.b->spec();
  if (gemm.m <= 0 || gemm.m * spec.k > int64_t{1} << 31 ||
      gemm.m * spec.n > int64_t{1} << 31) {
    return absl::InvalidArgumentError(
        absl::StrCat("m=", gemm.m, " is out of range for ", spec.DebugString(),
                     ": A and C must have between 1 and 2^31 elements"));
  }
  absl::StatusOr<DeviceInfo> device = CurrentDevice();
  if (!device.ok()) return device.status();
  absl::StatusOr<Plan> plan =
      MakePlan(gemm.variant, gemm.m, spec, gemm.a_dtype, device->sm_count);
  if (!plan.ok()) return plan.status();
  const LaunchPlan& launch = plan->launch;
  if (launch.blocks != launch.tiles) {
    if (absl::Status status = workspace.Reserve(
            launch.tiles * 16 * launch.m_tiles * plan->kernel.columns,
            launch.tiles);
        !status.ok()) {
      return status;
    }
  }
  Params params{};
  params.codes = reinterpret_cast<const uint4*>(gemm.b->codes());
  params.scales = gemm.b->scales();
  params.zeros = gemm.b->zeros();
  params.a = gemm.a;
  params.c = gemm.c;
  params.partials = workspace.partials();
  params.counters = workspace.counters();
  params.m = static_cast<int>(gemm.m);
  params.n = static_cast<int>(spec.n);
  params.k = static_cast<int>(spec.k);
  params.blocks16_n = static_cast<int>(gemm.b->padded_n() / 16);
  params.group_step_shift = GroupStepShift(spec);
  params.k_steps = static_cast<int>(launch.steps_per_tile);
  params.tiles_m = static_cast<int>((gemm.m + 16 * launch.m_tiles - 1) /
                                    (16 * launch.m_tiles));
  params.iters_base = plan->iters_base;
  params.iters_extra = plan->iters_extra;
  params.out = OutTypeOf(gemm.c_dtype);
  params.output_scale = gemm.b->output_scale();
  plan->kernel.function<<<static_cast<unsigned>(launch.blocks), kThreads,
                          plan->kernel.shared_bytes, stream>>>(params);
  return CudaStatus(
      cudaGetLastError(),
      absl::StrCat("launching ", KernelName(gemm.variant, spec.format,
                                            device->compute_capability)));
}

}  // namespace nibble::cuda
