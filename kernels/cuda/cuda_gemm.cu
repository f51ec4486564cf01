// Planning and launching the GEMM kernels of gemm_kernel.cuh and
// wgmma_kernel.cuh: which kernel by GPU, variant, format, type and rows, and
// how many blocks share the work.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/cuda/cuda_gemm.h"
#include "kernels/cuda/device_layout.h"
#include "kernels/cuda/gemm_kernel.cuh"
#include "kernels/cuda/wgmma_kernel.cuh"

namespace nibble::cuda {
namespace {

using internal::ChooseFormatKernel;
using internal::ChooseWgmmaKernel;
using internal::KernelChoice;
using internal::kWgmmaStepK;
using internal::OutType;
using internal::Params;
using internal::ScaleRowK;
using internal::WgmmaParams;

// Rows of C per mma.sync tile: 8, 16, 32, 64 or 128 (as 8-row tiles), the
// fewest that cover M (up to 128).
int RowTilesFor(int64_t m) {
  int row_tiles = 1;
  while (row_tiles < 16 && 8 * row_tiles < m) row_tiles *= 2;
  return row_tiles;
}

template <WeightFormat kFormat>
KernelChoice ChooseFor(KernelVariant variant, bool wgmma, DType a_dtype,
                       int64_t m, bool hopper) {
  if (wgmma) {
    return ChooseWgmmaKernel<kFormat>(
        a_dtype, static_cast<int>(std::min<int64_t>(m, 256)));
  }
  return ChooseFormatKernel<kFormat>(a_dtype, RowTilesFor(m),
                                     variant == KernelVariant::kFused, hopper);
}

KernelChoice Choose(KernelVariant variant, bool wgmma, WeightFormat format,
                    DType a_dtype, int64_t m, bool hopper) {
  switch (format) {
    // fp4's kernels run mxfp4 (KernelFormat).
    case WeightFormat::kFp4:
    case WeightFormat::kMxfp4:
      return ChooseFor<WeightFormat::kFp4>(variant, wgmma, a_dtype, m, hopper);
    case WeightFormat::kNvfp4:
      return ChooseFor<WeightFormat::kNvfp4>(variant, wgmma, a_dtype, m,
                                             hopper);
    case WeightFormat::kU4b8:
      return ChooseFor<WeightFormat::kU4b8>(variant, wgmma, a_dtype, m, hopper);
    case WeightFormat::kU4:
      return ChooseFor<WeightFormat::kU4>(variant, wgmma, a_dtype, m, hopper);
  }
  return {};
}

const void* FunctionOf(const KernelChoice& kernel) {
  return kernel.function != nullptr
             ? reinterpret_cast<const void*>(kernel.function)
             : reinterpret_cast<const void*>(kernel.wgmma_function);
}

// What launches learn once per kernel on a GPU (its shared-memory limit is
// that GPU's own), each GPU's behind a lock of its own.
struct LaunchFacts {
  absl::Mutex mutex;
  absl::flat_hash_map<const void*, int> blocks_per_sm ABSL_GUARDED_BY(mutex);
  absl::flat_hash_map<std::pair<const void*, int64_t>, int> active_clusters
      ABSL_GUARDED_BY(mutex);
};

// The calling thread's current GPU's.
LaunchFacts& CurrentGpuFacts() {
  static const auto* facts = [] {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    auto* made = new std::vector<std::unique_ptr<LaunchFacts>>();
    for (int device = 0; device < std::max(count, 1); ++device) {
      made->push_back(std::make_unique<LaunchFacts>());
    }
    return made;
  }();
  int device = 0;
  cudaGetDevice(&device);
  return *(*facts)[device];
}

// Raises the kernel's shared-memory limit on the current GPU and asks how
// many of its blocks fit on a multiprocessor there, once per kernel and GPU:
// launches stay cheap on the host.
absl::StatusOr<int> BlocksPerSm(const KernelChoice& kernel) {
  LaunchFacts& facts = CurrentGpuFacts();
  const void* function = FunctionOf(kernel);
  absl::MutexLock lock(&facts.mutex);
  if (auto it = facts.blocks_per_sm.find(function);
      it != facts.blocks_per_sm.end()) {
    return it->second;
  }
  if (absl::Status status =
          CudaStatus(cudaFuncSetAttribute(
                         function, cudaFuncAttributeMaxDynamicSharedMemorySize,
                         kernel.shared_bytes),
                     "cudaFuncSetAttribute");
      !status.ok()) {
    return status;
  }
  int blocks = 0;
  if (absl::Status status = CudaStatus(
          cudaOccupancyMaxActiveBlocksPerMultiprocessor(
              &blocks, function, kernel.threads, kernel.shared_bytes),
          "cudaOccupancyMaxActiveBlocksPerMultiprocessor");
      !status.ok()) {
    return status;
  }
  facts.blocks_per_sm.emplace(function, blocks);
  return blocks;
}

// A launch of `blocks` blocks of `kernel`, in clusters of `cluster_size`
// blocks from 2 on, that may start before the previous kernel in `stream`
// ends where `overlap_previous_kernel`; `attributes` holds what the config
// points to.
cudaLaunchConfig_t LaunchConfig(
    const KernelChoice& kernel, int64_t blocks, int64_t cluster_size,
    cudaStream_t stream, bool overlap_previous_kernel,
    std::array<cudaLaunchAttribute, 2>& attributes) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(blocks));
  config.blockDim = dim3(static_cast<unsigned>(kernel.threads));
  config.dynamicSmemBytes = static_cast<size_t>(kernel.shared_bytes);
  config.stream = stream;
  config.attrs = attributes.data();
  config.numAttrs = 0;
  if (cluster_size >= 2) {
    cudaLaunchAttribute& cluster = attributes[config.numAttrs++];
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = static_cast<unsigned>(cluster_size);
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
  }
  if (overlap_previous_kernel) {
    attributes[config.numAttrs++] = OverlapPreviousKernelAttribute();
  }
  return config;
}

// How many clusters of `size` blocks of `kernel` the current GPU runs at
// once (0 for a size it does not run), once per kernel, size and GPU.
int ActiveClusters(const KernelChoice& kernel, int64_t size) {
  LaunchFacts& facts = CurrentGpuFacts();
  const void* function = FunctionOf(kernel);
  absl::MutexLock lock(&facts.mutex);
  if (auto it = facts.active_clusters.find({function, size});
      it != facts.active_clusters.end()) {
    return it->second;
  }
  std::array<cudaLaunchAttribute, 2> attributes;
  const cudaLaunchConfig_t config =
      LaunchConfig(kernel, size, size, nullptr, false, attributes);
  int clusters = 0;
  if (cudaOccupancyMaxActiveClusters(&clusters, function, &config) !=
      cudaSuccess) {
    cudaGetLastError();  // the workspace serves instead
    clusters = 0;
  }
  facts.active_clusters.emplace(std::make_pair(function, size), clusters);
  return clusters;
}

// Blocks per tile for a cluster (Params::cluster_split): the most that
// divide the tile's K steps evenly, at most `split`, and more than half of
// it, with every tile's cluster running at once; 0 for none.
int64_t ClusterSplit(const KernelChoice& kernel, int64_t split,
                     int64_t steps_per_tile, int64_t tiles) {
  if (split > internal::kMaxClusterSplit) return 0;
  for (int64_t size = split; size >= 2 && 2 * size > split; --size) {
    if (steps_per_tile % size == 0 && ActiveClusters(kernel, size) >= tiles) {
      return size;
    }
  }
  return 0;
}

// How a launch divides a problem: rows per tile, thread blocks, and output
// tiles, which blocks share when there are more blocks.
struct LaunchPlan {
  int64_t rows = 0;
  int64_t blocks = 0;
  int64_t tiles = 0;
  int64_t steps_per_tile = 0;
  int64_t cluster_split = 0;      // Params::cluster_split
  int64_t whole_tile_blocks = 0;  // Params::whole_tile_blocks
};

struct Plan {
  LaunchPlan launch;
  KernelChoice kernel;
  int iters_base = 0;
  int iters_extra = 0;
};

absl::StatusOr<Plan> MakePlan(KernelVariant variant, bool wgmma, int64_t m,
                              const WeightSpec& spec, DType a_dtype,
                              const DeviceInfo& device) {
  Plan plan;
  plan.kernel = Choose(variant, wgmma, spec.format, a_dtype, m,
                       RunsSm90a(device.compute_capability));
  absl::StatusOr<int> blocks_per_sm = BlocksPerSm(plan.kernel);
  if (!blocks_per_sm.ok()) return blocks_per_sm.status();
  LaunchPlan& launch = plan.launch;
  launch.rows = plan.kernel.rows;
  const int64_t padded_n = (spec.n + kTileN - 1) / kTileN * kTileN;
  launch.tiles =
      (m + launch.rows - 1) / launch.rows * (padded_n / plan.kernel.columns);
  launch.steps_per_tile = spec.k / (wgmma ? kWgmmaStepK : kKMultiple);
  const int64_t iterations = launch.tiles * launch.steps_per_tile;
  if (iterations >= int64_t{1} << 31) {
    return absl::InvalidArgumentError(
        absl::StrCat("m=", m, " with ", spec.DebugString(),
                     " has too many tiles for one launch: split the rows"));
  }
  const int64_t slots = int64_t{std::max(1, *blocks_per_sm)} * device.sm_count;
  if (variant == KernelVariant::kStriped) {
    launch.blocks = std::min(iterations, slots);
  } else {
    // Whole tiles in every full wave of blocks. The tiles of a last wave
    // that would leave SMs idle (all tiles, when they do not fill one wave)
    // split their K steps in as many parts as fill it, keeping at least 4
    // steps per part: 4096 x 14336 at M = 1024, 3.4 waves of 256-row tiles,
    // ends in half-tiles rather than a 40 % full fourth wave.
    const int64_t last_wave_tiles = launch.tiles % slots;
    int64_t split = 1;
    if (last_wave_tiles > 0) {
      split = std::min(slots / last_wave_tiles,
                       std::max<int64_t>(1, launch.steps_per_tile / 4));
    }
    // Only the sm_90a code has the cluster path (gemm_common.cuh), for
    // launches whose blocks all share tiles.
    if (split > 1 && launch.tiles < slots &&
        RunsSm90a(device.compute_capability)) {
      const int64_t cluster =
          ClusterSplit(plan.kernel, split, launch.steps_per_tile, launch.tiles);
      if (cluster > 0) split = launch.cluster_split = cluster;
    }
    if (split > 1) launch.whole_tile_blocks = launch.tiles - last_wave_tiles;
    launch.blocks = launch.whole_tile_blocks +
                    (launch.tiles - launch.whole_tile_blocks) * split;
  }
  const int64_t shared_iterations =
      iterations - launch.whole_tile_blocks * launch.steps_per_tile;
  const int64_t shared_blocks = launch.blocks - launch.whole_tile_blocks;
  plan.iters_base = static_cast<int>(shared_iterations / shared_blocks);
  plan.iters_extra = static_cast<int>(shared_iterations % shared_blocks);
  return plan;
}

// Params::group_step_shift: log2 of the scale rows in a group (a scale row
// is ScaleRowK rows of K), or 31 for one group.
int GroupStepShift(const WeightSpec& spec) {
  if (spec.group_size == spec.k) return 31;
  return std::countr_zero(
      static_cast<uint64_t>(spec.group_size / ScaleRowK(spec.format)));
}

// One tensor map (cuTensorMapEncodeTiled, found through the runtime so that
// nothing links libcuda): `sizes` and `box` in elements from the innermost
// dimension, `strides` in bytes of the outer ones; `what` names the operand
// in errors.
template <int kRank>
absl::StatusOr<CUtensorMap> EncodeTensorMap(
    absl::string_view what, CUtensorMapDataType type, const void* data,
    const std::array<cuuint64_t, kRank>& sizes,
    const std::array<cuuint64_t, kRank - 1>& strides,
    const std::array<cuuint32_t, kRank>& box, CUtensorMapSwizzle swizzle) {
  static const auto encode = [] {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found;
    const bool ok = cudaGetDriverEntryPointByVersion(
                        "cuTensorMapEncodeTiled", &function, 12000,
                        cudaEnableDefault, &found) == cudaSuccess &&
                    found == cudaDriverEntryPointSuccess;
    return ok ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function)
              : nullptr;
  }();
  if (encode == nullptr) {
    return absl::UnavailableError(
        "the CUDA driver has no cuTensorMapEncodeTiled: update the driver to "
        "one for CUDA 12 or later");
  }
  std::array<cuuint32_t, kRank> element_strides;
  element_strides.fill(1);
  CUtensorMap map;
  const CUresult result = encode(
      &map, type, kRank, const_cast<void*>(data), sizes.data(), strides.data(),
      box.data(), element_strides.data(), CU_TENSOR_MAP_INTERLEAVE_NONE,
      swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
      CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (result != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled for ", what,
                                            " failed: error ",
                                            static_cast<int>(result)));
  }
  return map;
}

// The wgmma kernel's tensor maps (WgmmaParams says their shapes).
absl::StatusOr<WgmmaParams> MakeWgmmaParams(const DeviceGemm& gemm,
                                            const Params& params,
                                            const KernelChoice& kernel) {
  const WeightSpec& spec = gemm.b->spec();
  const auto m = static_cast<cuuint64_t>(gemm.m);
  const auto k = static_cast<cuuint64_t>(spec.k);
  const auto padded_n = static_cast<cuuint64_t>(gemm.b->padded_n());
  const auto groups = static_cast<cuuint64_t>(spec.k / spec.group_size);
  const auto blocks = static_cast<cuuint32_t>(kernel.columns / 16);
  WgmmaParams wgmma{};
  wgmma.p = params;
  wgmma.stage_groups =
      static_cast<int>(std::max<int64_t>(1, kWgmmaStepK / spec.group_size));
  const auto stage_groups = static_cast<cuuint32_t>(wgmma.stage_groups);
  absl::StatusOr<CUtensorMap> a_map = EncodeTensorMap<2>(
      absl::StrCat("A [", m, ", ", k, "]"),
      gemm.a_dtype == DType::kBF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                   : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      gemm.a, {k, m}, {k * 2},
      {kWgmmaStepK, static_cast<cuuint32_t>(kernel.rows)},
      CU_TENSOR_MAP_SWIZZLE_128B);
  if (!a_map.ok()) return a_map.status();
  wgmma.a_map = *a_map;
  const auto span_blocks = static_cast<cuuint64_t>(kSpanBlocks);
  absl::StatusOr<CUtensorMap> codes_map = EncodeTensorMap<4>(
      "the weight's codes", CU_TENSOR_MAP_DATA_TYPE_UINT32, gemm.b->codes(),
      {128, span_blocks, k / kWgmmaStepK, padded_n / kTileN},
      {512, span_blocks * 512, k / kWgmmaStepK * span_blocks * 512},
      {128, blocks, 1, 1}, CU_TENSOR_MAP_SWIZZLE_NONE);
  if (!codes_map.ok()) return codes_map.status();
  wgmma.codes_map = *codes_map;
  absl::StatusOr<CUtensorMap> scales_map = EncodeTensorMap<2>(
      "the weight's scales", CU_TENSOR_MAP_DATA_TYPE_UINT32, gemm.b->scales(),
      {padded_n / 2, groups}, {padded_n * 2}, {blocks * 8, stage_groups},
      CU_TENSOR_MAP_SWIZZLE_NONE);
  if (!scales_map.ok()) return scales_map.status();
  wgmma.scales_map = *scales_map;
  if (gemm.b->zeros() != nullptr) {
    absl::StatusOr<CUtensorMap> zeros_map = EncodeTensorMap<2>(
        "the weight's zero points", CU_TENSOR_MAP_DATA_TYPE_UINT16,
        gemm.b->zeros(), {padded_n / 2, groups}, {padded_n},
        {blocks * 8, stage_groups}, CU_TENSOR_MAP_SWIZZLE_NONE);
    if (!zeros_map.ok()) return zeros_map.status();
    wgmma.zeros_map = *zeros_map;
  }
  return wgmma;
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
  // The tensor copies need A 16-byte aligned.
  const bool wgmma = UsesWgmma(gemm.variant, spec.format, gemm.m,
                               device->compute_capability) &&
                     reinterpret_cast<uintptr_t>(gemm.a) % 16 == 0;
  absl::StatusOr<Plan> plan =
      MakePlan(gemm.variant, wgmma, gemm.m, spec, gemm.a_dtype, *device);
  if (!plan.ok()) return plan.status();
  const LaunchPlan& launch = plan->launch;
  if (launch.blocks != launch.tiles && launch.cluster_split == 0) {
    if (absl::Status status = workspace.Reserve(
            launch.tiles * launch.rows * plan->kernel.columns, launch.tiles);
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
  params.tiles_m = static_cast<int>((gemm.m + launch.rows - 1) / launch.rows);
  params.whole_tile_blocks = static_cast<int>(launch.whole_tile_blocks);
  params.iters_base = plan->iters_base;
  params.iters_extra = plan->iters_extra;
  params.out = OutTypeOf(gemm.c_dtype);
  params.output_scale = gemm.b->output_scale();
  params.cluster_split = static_cast<int>(launch.cluster_split);
  const KernelChoice& kernel = plan->kernel;
  const bool overlap = gemm.overlap_previous_kernel &&
                       OverlapsLaunches(device->compute_capability);
  params.overlap_previous_kernel = overlap ? 1 : 0;
  std::array<cudaLaunchAttribute, 2> attributes;
  const cudaLaunchConfig_t config = LaunchConfig(
      kernel, launch.blocks, launch.cluster_split, stream, overlap, attributes);
  cudaError_t launched = cudaSuccess;
  if (wgmma) {
    absl::StatusOr<WgmmaParams> wgmma_params =
        MakeWgmmaParams(gemm, params, kernel);
    if (!wgmma_params.ok()) return wgmma_params.status();
    launched =
        cudaLaunchKernelEx(&config, kernel.wgmma_function, *wgmma_params);
  } else {
    launched = cudaLaunchKernelEx(&config, kernel.function, params);
  }
  if (launched == cudaSuccess) launched = cudaGetLastError();
  return CudaStatus(
      launched,
      absl::StrCat("launching ",
                   LaunchedKernelName(gemm.variant, spec.format,
                                      device->compute_capability, gemm.m)));
}

bool UsesWgmma(KernelVariant variant, WeightFormat format, int64_t m,
               int compute_capability) {
  return RunsSm90a(compute_capability) && variant != KernelVariant::kFused &&
         m >= internal::WgmmaMinRows(internal::KernelFormat(format));
}

std::string LaunchedKernelName(KernelVariant variant, WeightFormat format,
                               int compute_capability, int64_t m) {
  return absl::StrCat(
      KernelName(variant, format, compute_capability),
      UsesWgmma(variant, format, m, compute_capability) ? "_wgmma" : "");
}

}  // namespace nibble::cuda
