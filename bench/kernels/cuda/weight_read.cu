#include <algorithm>
#include <array>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "bench/kernels/cuda/weight_read.h"
#include "kernels/cuda/gemm_common.cuh"

namespace nibble::bench {
namespace {

constexpr int kThreads = 256;
// Each thread keeps kStages steps of kLoadsPerThread 16-byte loads in
// flight, 16 KB per block and step, two blocks per SM: on an H100, 121 MB
// (u4b8 8192 x 28672) in 45.5-46.2 us a launch, 2.6 TB/s, and 30 MB in
// 15.6-15.9 us (2026-11-27); eight loads a thread without the ring, four
// blocks per SM, took 3-10 % longer.
constexpr int kLoadsPerThread = 4;
constexpr int kStages = 4;
constexpr int kBlocksPerSm = 2;
constexpr int kStepPieces = kThreads * kLoadsPerThread;
// A fold no weight's bytes produce in practice; see WeightReader::sink_.
constexpr unsigned kNeverFolded = 0x9e3779b9u;

// Up to three arrays (codes, scales, zero points), each read by its own
// contiguous range of blocks, in proportion to its bytes.
struct Arrays {
  const uint4* data[3] = {};
  int64_t pieces[3] = {};  // 16-byte pieces
  int first_block[4] = {};
};

__device__ __forceinline__ unsigned Fold(uint4 piece) {
  return piece.x + piece.y * 3 + piece.z * 5 + piece.w * 7;
}

__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    ReadArrays(Arrays arrays, unsigned* sink) {
  cuda::internal::LetNextKernelStart();
  const int block = static_cast<int>(blockIdx.x);
  const int array =
      block >= arrays.first_block[2] ? 2 : (block >= arrays.first_block[1]);
  const int64_t blocks =
      arrays.first_block[array + 1] - arrays.first_block[array];
  const int64_t pieces = arrays.pieces[array];
  // Whole steps per block, the last block's share cut at the end.
  const int64_t per_block = ((pieces + blocks - 1) / blocks + kStepPieces - 1) /
                            kStepPieces * kStepPieces;
  const int64_t begin = (block - arrays.first_block[array]) * per_block;
  const int64_t end = min(begin + per_block, pieces);
  const int steps = static_cast<int>(
      (max(end - begin, int64_t{0}) + kStepPieces - 1) / kStepPieces);
  const uint4* data = arrays.data[array] + begin + threadIdx.x;
  const int64_t limit =
      end - begin - threadIdx.x;  // pieces this thread may read
  auto load = [&](int step, int i) {
    const int64_t piece =
        static_cast<int64_t>(step) * kStepPieces + i * kThreads;
    return piece < limit ? __ldcs(data + piece) : uint4{};
  };
  uint4 ring[kStages][kLoadsPerThread];
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
#pragma unroll
    for (int i = 0; i < kLoadsPerThread; ++i) ring[s][i] = load(s, i);
  }
  unsigned fold = 0;
  for (int step = 0; step < steps; step += kStages) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      const int ahead = step + s + kStages - 1;
#pragma unroll
      for (int i = 0; i < kLoadsPerThread; ++i) {
        ring[(s + kStages - 1) % kStages][i] = load(ahead, i);
      }
#pragma unroll
      for (int i = 0; i < kLoadsPerThread; ++i) fold ^= Fold(ring[s][i]);
    }
  }
  if (fold == kNeverFolded) *sink = fold;
  // Ends after the previous kernel, as a matmul does, so that an event
  // behind a chain of reads waits for all of them.
  cuda::internal::WaitForPreviousKernel();
}

}  // namespace

absl::StatusOr<WeightReader> WeightReader::Create() {
  absl::StatusOr<cuda::DeviceInfo> device = cuda::CurrentDevice();
  if (!device.ok()) return device.status();
  unsigned* sink = nullptr;
  if (absl::Status status = cuda::CudaStatus(
          cudaMalloc(&sink, sizeof(unsigned)), "cudaMalloc of the read sink");
      !status.ok()) {
    return status;
  }
  return WeightReader(kBlocksPerSm * device->sm_count,
                      cuda::OverlapsLaunches(device->compute_capability), sink);
}

WeightReader::~WeightReader() {
  if (sink_ != nullptr) cudaFree(sink_);
}

WeightReader::WeightReader(WeightReader&& other) noexcept
    : blocks_(other.blocks_),
      can_overlap_(other.can_overlap_),
      sink_(other.sink_) {
  other.sink_ = nullptr;
}

absl::Status WeightReader::Launch(const cuda::CudaWeight& weight,
                                  cudaStream_t stream,
                                  bool overlap_previous_kernel) const {
  const std::array<const void*, 3> data = {weight.codes(), weight.scales(),
                                           weight.zeros()};
  const std::array<int64_t, 3> bytes = {
      weight.code_bytes(), weight.scale_bytes(), weight.zero_bytes()};
  int64_t total = 0;
  for (int64_t array_bytes : bytes) total += array_bytes;
  Arrays arrays;
  int next_block = 0;
  for (int i = 0; i < 3; ++i) {
    arrays.first_block[i] = next_block;
    arrays.data[i] = static_cast<const uint4*>(data[i]);
    arrays.pieces[i] = bytes[i] / 16;
    if (arrays.pieces[i] > 0) {
      next_block += std::max<int>(
          1,
          static_cast<int>(bytes[i] * blocks_ / std::max<int64_t>(total, 1)));
    }
  }
  arrays.first_block[3] = next_block;
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(next_block));
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute overlap = cuda::OverlapPreviousKernelAttribute();
  config.attrs = &overlap;
  config.numAttrs = overlap_previous_kernel && can_overlap_ ? 1 : 0;
  return cuda::CudaStatus(
      cudaLaunchKernelEx(&config, ReadArrays, arrays, sink_),
      absl::StrCat("reading ", weight.spec().DebugString()));
}

}  // namespace nibble::bench
