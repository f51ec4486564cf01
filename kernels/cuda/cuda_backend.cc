// cuda_backend.h on the CUDA runtime: each run of the backend's GemmKernels
// takes a lane of its weight's GPU (a stream there, pinned host staging and
// device buffers, all reused), so that runs on several threads overlap on the
// GPU, and runs on different GPUs share no lock.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
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

// Page-locked host memory, which the GPU copies from and to at full speed and
// asynchronously; it only grows.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { cudaFreeHost(data_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // At least `bytes`; what it held is lost when it grows.
  absl::Status Reserve(int64_t bytes, const std::string& what) {
    if (bytes <= capacity_) return absl::OkStatus();
    cudaFreeHost(data_);
    data_ = nullptr;
    capacity_ = 0;
    if (absl::Status status = CudaStatus(
            cudaHostAlloc(reinterpret_cast<void**>(&data_), bytes,
                          cudaHostAllocDefault),
            absl::StrFormat("cudaHostAlloc of %d bytes for %s", bytes, what));
        !status.ok()) {
      return status;
    }
    capacity_ = bytes;
    return absl::OkStatus();
  }
  uint8_t* data() const { return data_; }
  int64_t capacity() const { return capacity_; }

 private:
  uint8_t* data_ = nullptr;
  int64_t capacity_ = 0;
};

// What one run in flight holds, so that the copies of one run overlap the
// kernel of another.
struct Lane {
  ~Lane() {
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
  Workspace workspace;
  PinnedBuffer host_a;  // A as the GPU reads it (f32 rounded to bf16)
  PinnedBuffer host_c;
  DeviceBuffer a;
  DeviceBuffer c;
};

// The lanes of one GPU: a run takes a free one, makes one (on the calling
// thread's current GPU, which must be the pool's) while fewer than kMaxLanes
// exist, or waits for one. The lock is held only to take and give back.
class LanePool {
 public:
  absl::StatusOr<Lane*> Acquire() {
    absl::MutexLock lock(&mutex_);
    mutex_.Await(absl::Condition(this, &LanePool::CanAcquire));
    if (!free_.empty()) {
      Lane* lane = free_.back();
      free_.pop_back();
      return lane;
    }
    auto lane = std::make_unique<Lane>();
    if (absl::Status status = CudaStatus(
            cudaStreamCreateWithFlags(&lane->stream, cudaStreamNonBlocking),
            "cudaStreamCreate");
        !status.ok()) {
      return status;
    }
    lanes_.push_back(std::move(lane));
    return lanes_.back().get();
  }

  void Release(Lane* lane) {
    absl::MutexLock lock(&mutex_);
    free_.push_back(lane);
  }

  // Counts the buffers of idle lanes only: a running one may be growing its
  // own.
  StagingStats Stats() {
    absl::MutexLock lock(&mutex_);
    StagingStats stats{.lanes = static_cast<int>(lanes_.size())};
    for (const Lane* lane : free_) {
      stats.pinned_bytes += lane->host_a.capacity() + lane->host_c.capacity();
      stats.device_bytes += lane->a.capacity() + lane->c.capacity();
    }
    return stats;
  }

 private:
  bool CanAcquire() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mutex_) {
    return !free_.empty() || static_cast<int>(lanes_.size()) < kMaxLanes;
  }

  absl::Mutex mutex_;
  std::vector<std::unique_ptr<Lane>> lanes_ ABSL_GUARDED_BY(mutex_);
  std::vector<Lane*> free_ ABSL_GUARDED_BY(mutex_);
};

// RunStageTimes, added to by every run without a lock.
struct RunStageCounters {
  std::atomic<int64_t> runs{0};
  std::atomic<int64_t> lane_wait_ns{0};
  std::atomic<int64_t> gather_ns{0};
  std::atomic<int64_t> device_ns{0};
  std::atomic<int64_t> scatter_ns{0};
};

RunStageCounters& StageCounters() {
  static RunStageCounters* counters = new RunStageCounters();
  return *counters;
}

// Adds the time since `*since` to `total` and moves `*since` to now.
void AddElapsed(std::atomic<int64_t>& total,
                std::chrono::steady_clock::time_point* since) {
  const auto now = std::chrono::steady_clock::now();
  total.fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(now - *since)
          .count(),
      std::memory_order_relaxed);
  *since = now;
}

// One pool per GPU this process sees, indexed by device ordinal.
std::vector<std::unique_ptr<LanePool>>& LanePools() {
  static auto* pools = [] {
    auto* made = new std::vector<std::unique_ptr<LanePool>>();
    for (int device = 0; device < DeviceCount(); ++device) {
      made->push_back(std::make_unique<LanePool>());
    }
    return made;
  }();
  return *pools;
}

// Gives a lane back to its pool when it goes out of scope.
class HeldLane {
 public:
  HeldLane(LanePool& pool, Lane* lane) : pool_(pool), lane_(lane) {}
  ~HeldLane() { pool_.Release(lane_); }
  HeldLane(const HeldLane&) = delete;
  HeldLane& operator=(const HeldLane&) = delete;
  Lane& operator*() const { return *lane_; }

 private:
  LanePool& pool_;
  Lane* lane_;
};

// The rows of a batch of blocks, as one range of rows that threads split.
class BatchRows {
 public:
  explicit BatchRows(absl::Span<const RowBlock> blocks) : blocks_(blocks) {
    starts_.reserve(blocks.size());
    for (const RowBlock& block : blocks) {
      starts_.push_back(rows_);
      rows_ += block.rows;
    }
  }
  int64_t rows() const { return rows_; }

  // Calls fn(block, first, count, row) for the rows [begin, end) of the
  // batch: `count` rows of `block` from its row `first`, which are the
  // batch's rows from `row`.
  template <typename Fn>
  void ForEach(int64_t begin, int64_t end, Fn fn) const {
    size_t b = std::upper_bound(starts_.begin(), starts_.end(), begin) -
               starts_.begin() - 1;
    for (int64_t row = begin; row < end; ++b) {
      const int64_t first = row - starts_[b];
      const int64_t count = std::min(end, starts_[b] + blocks_[b].rows) - row;
      fn(blocks_[b], first, count, row);
      row += count;
    }
  }

  // Splits the batch over up to all of `pool`'s threads, one for every
  // kBytesPerTask of `bytes` moved: fn(begin, end) on rows of the batch.
  void ParallelFor(ThreadPool& pool, int64_t bytes,
                   absl::FunctionRef<void(int64_t, int64_t)> fn) const {
    constexpr int64_t kBytesPerTask = int64_t{512} << 10;
    const int tasks = static_cast<int>(
        std::clamp<int64_t>(bytes / kBytesPerTask, 1, pool.threads()));
    pool.ParallelFor(rows_, fn, tasks);
  }

 private:
  absl::Span<const RowBlock> blocks_;
  std::vector<int64_t> starts_;
  int64_t rows_ = 0;
};

// A of the batch into `to`, f32 rounded to bf16 on the way.
void GatherRows(const BatchRows& batch, DType dtype, int64_t k, uint8_t* to,
                ThreadPool& pool) {
  const bool round = dtype == DType::kF32;
  const int64_t from_row_bytes = k * DTypeSize(dtype);
  const int64_t to_row_bytes =
      round ? k * int64_t{sizeof(uint16_t)} : from_row_bytes;
  batch.ParallelFor(
      pool, batch.rows() * from_row_bytes, [&](int64_t begin, int64_t end) {
        batch.ForEach(begin, end,
                      [&](const RowBlock& block, int64_t first, int64_t count,
                          int64_t row) {
                        const auto* from =
                            static_cast<const uint8_t*>(block.a) +
                            first * from_row_bytes;
                        uint8_t* out = to + row * to_row_bytes;
                        if (!round) {
                          std::memcpy(out, from, count * to_row_bytes);
                          return;
                        }
                        const auto* in = reinterpret_cast<const float*>(from);
                        auto* rounded = reinterpret_cast<uint16_t*>(out);
                        for (int64_t i = 0; i < count * k; ++i) {
                          rounded[i] = FloatToBf16(in[i]);
                        }
                      });
      });
}

// C of the batch from `from` into the blocks.
void ScatterRows(const BatchRows& batch, const uint8_t* from, int64_t row_bytes,
                 ThreadPool& pool) {
  batch.ParallelFor(
      pool, batch.rows() * row_bytes, [&](int64_t begin, int64_t end) {
        batch.ForEach(begin, end,
                      [&](const RowBlock& block, int64_t first, int64_t count,
                          int64_t row) {
                        std::memcpy(
                            static_cast<uint8_t*>(block.c) + first * row_bytes,
                            from + row * row_bytes, count * row_bytes);
                      });
      });
}

class CudaGemmKernel final : public GemmKernel {
 public:
  CudaGemmKernel(KernelVariant variant, WeightFormat format,
                 int compute_capability)
      : variant_(variant),
        format_(format),
        name_(KernelName(variant, format, compute_capability)),
        level_(GpuLevelName(compute_capability)) {}

  absl::string_view name() const override { return name_; }
  absl::string_view isa() const override { return level_; }
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
                   ThreadPool& pool) const override {
    const RowBlock block{.a = operands.a, .c = operands.c, .rows = problem.m};
    return RunBlocks(problem, operands.b, operands.device, {block}, pool);
  }

  // Runs on the weight's GPU. A goes from the blocks straight into the
  // lane's pinned staging, and C from there straight into the blocks.
  absl::Status RunBlocks(const GemmProblem& problem, const PackedWeight*,
                         const DeviceWeight* device,
                         absl::Span<const RowBlock> blocks,
                         ThreadPool& pool) const override {
    const auto* weight = dynamic_cast<const CudaWeight*>(device);
    if (weight == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          name_, " needs the weight in GPU memory (UploadWeight) and got ",
          device == nullptr ? "none" : "another backend's copy"));
    }
    const BatchRows batch(blocks);
    if (batch.rows() != problem.m) {
      return absl::InvalidArgumentError(
          absl::StrCat(name_, ": the blocks hold ", batch.rows(),
                       " rows of A but the problem has m=", problem.m));
    }
    return OnDevice(weight->device(), [&] {
      return RunOnWeightsGpu(problem, *weight, batch, pool);
    });
  }

 private:
  absl::Status RunOnWeightsGpu(const GemmProblem& problem,
                               const CudaWeight& weight, const BatchRows& batch,
                               ThreadPool& pool) const {
    LanePool& lanes = *LanePools()[weight.device()];
    RunStageCounters& stages = StageCounters();
    auto stage_start = std::chrono::steady_clock::now();
    absl::StatusOr<Lane*> acquired = lanes.Acquire();
    AddElapsed(stages.lane_wait_ns, &stage_start);
    if (!acquired.ok()) return acquired.status();
    const HeldLane held(lanes, *acquired);
    Lane& lane = *held;
    const DType a_dtype =
        problem.dtype == DType::kF32 ? DType::kBF16 : problem.dtype;
    const int64_t a_bytes = problem.m * problem.k * DTypeSize(a_dtype);
    const int64_t c_row_bytes = problem.n * DTypeSize(problem.dtype);
    const int64_t c_bytes = problem.m * c_row_bytes;
    for (absl::Status status :
         {lane.host_a.Reserve(a_bytes, "staging A"),
          lane.host_c.Reserve(c_bytes, "staging C"),
          lane.a.Reserve(a_bytes, "A"), lane.c.Reserve(c_bytes, "C")}) {
      if (!status.ok()) return status;
    }
    stage_start = std::chrono::steady_clock::now();
    GatherRows(batch, problem.dtype, problem.k, lane.host_a.data(), pool);
    AddElapsed(stages.gather_ns, &stage_start);
    const absl::Status enqueued =
        Enqueue(lane, weight, problem, a_dtype, a_bytes, c_bytes);
    // Waits for this lane's stream alone, other runs going on meanwhile;
    // after a failed enqueue too, so that nothing still in flight uses the
    // lane's buffers once another run has it.
    const absl::Status ran = CudaStatus(cudaStreamSynchronize(lane.stream),
                                        absl::StrCat("running ", name_));
    AddElapsed(stages.device_ns, &stage_start);
    if (!enqueued.ok()) return enqueued;
    if (!ran.ok()) return ran;
    ScatterRows(batch, lane.host_c.data(), c_row_bytes, pool);
    AddElapsed(stages.scatter_ns, &stage_start);
    stages.runs.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }

  // Copies the lane's staged A to the GPU, runs, and copies C back into the
  // lane's staging, on the lane's stream.
  absl::Status Enqueue(Lane& lane, const CudaWeight& weight,
                       const GemmProblem& problem, DType a_dtype,
                       int64_t a_bytes, int64_t c_bytes) const {
    if (absl::Status status = CudaStatus(
            cudaMemcpyAsync(lane.a.data(), lane.host_a.data(), a_bytes,
                            cudaMemcpyHostToDevice, lane.stream),
            "copying A to the GPU");
        !status.ok()) {
      return status;
    }
    const DeviceGemm gemm{.variant = variant_,
                          .b = &weight,
                          .a = lane.a.data(),
                          .a_dtype = a_dtype,
                          .c = lane.c.data(),
                          .c_dtype = problem.dtype,
                          .m = problem.m};
    if (absl::Status status = LaunchGemm(gemm, lane.workspace, lane.stream);
        !status.ok()) {
      return status;
    }
    return CudaStatus(
        cudaMemcpyAsync(lane.host_c.data(), lane.c.data(), c_bytes,
                        cudaMemcpyDeviceToHost, lane.stream),
        "copying C from the GPU");
  }

  KernelVariant variant_;
  WeightFormat format_;
  std::string name_;
  std::string level_;
};

}  // namespace

bool CompiledIn() { return true; }

int DeviceCount() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess ? count : 0;
}

std::string DeviceDescription(int device) {
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo(device);
  if (!info.ok()) return "";
  return absl::StrFormat("%s, %d SMs, sm_%d, %.1f GiB", info->name,
                         info->sm_count, info->compute_capability,
                         info->memory_bytes / double{1 << 30});
}

bool SameKind(int a, int b) {
  absl::StatusOr<DeviceInfo> first = GetDeviceInfo(a);
  absl::StatusOr<DeviceInfo> second = GetDeviceInfo(b);
  return first.ok() && second.ok() &&
         first->compute_capability == second->compute_capability &&
         first->sm_count == second->sm_count;
}

TuningTable ForGpu(const TuningTable& table, int device) {
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo(device);
  if (!info.ok()) return table.ForGpu("", 0);
  return table.ForGpu(GpuLevelName(info->compute_capability), info->sm_count);
}

bool SupportsSpec(const WeightSpec& spec) { return spec.k % kKMultiple == 0; }

int64_t DeviceBytes(const WeightSpec& spec) {
  const int64_t padded_n = PaddedN(spec.n);
  const int64_t code_words = padded_n * spec.k / kCodesPerWord;
  const int64_t scale_pairs = spec.groups() * padded_n / 2;
  return (code_words + scale_pairs) * int64_t{sizeof(uint32_t)} +
         (HasZeros(spec.format) ? scale_pairs * int64_t{sizeof(uint16_t)} : 0);
}

absl::StatusOr<GpuMemory> DeviceMemory(int device) {
  if (DeviceCount() == 0) {
    return absl::UnavailableError("no CUDA GPU is visible to this process");
  }
  size_t free_bytes = 0;
  size_t total_bytes = 0;
  if (absl::Status status = OnDevice(
          device,
          [&] {
            return CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes),
                              "cudaMemGetInfo");
          });
      !status.ok()) {
    return status;
  }
  return GpuMemory{.free_bytes = static_cast<int64_t>(free_bytes),
                   .total_bytes = static_cast<int64_t>(total_bytes)};
}

StagingStats Staging() {
  StagingStats all;
  for (const std::unique_ptr<LanePool>& pool : LanePools()) {
    const StagingStats stats = pool->Stats();
    all.lanes += stats.lanes;
    all.pinned_bytes += stats.pinned_bytes;
    all.device_bytes += stats.device_bytes;
  }
  return all;
}

RunStageTimes RunStages() {
  const RunStageCounters& stages = StageCounters();
  return {.runs = stages.runs.load(std::memory_order_relaxed),
          .lane_wait_ns = stages.lane_wait_ns.load(std::memory_order_relaxed),
          .gather_ns = stages.gather_ns.load(std::memory_order_relaxed),
          .device_ns = stages.device_ns.load(std::memory_order_relaxed),
          .scatter_ns = stages.scatter_ns.load(std::memory_order_relaxed)};
}

namespace {

// The weight `upload` makes on GPU `device`.
absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWith(
    int device,
    absl::FunctionRef<absl::StatusOr<std::unique_ptr<CudaWeight>>()> upload) {
  if (DeviceCount() == 0) {
    return absl::UnavailableError("no CUDA GPU is visible to this process");
  }
  absl::StatusOr<std::unique_ptr<CudaWeight>> weight;
  if (absl::Status status = OnDevice(device,
                                     [&] {
                                       weight = upload();
                                       return weight.status();
                                     });
      !status.ok()) {
    return status;
  }
  return std::unique_ptr<DeviceWeight>(*std::move(weight));
}

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const QuantizedWeight& canonical, int device) {
  return UploadWith(device, [&] { return CudaWeight::Upload(canonical); });
}

absl::StatusOr<std::unique_ptr<DeviceWeight>> UploadWeight(
    const Fp4Columns& columns, int device) {
  return UploadWith(device, [&] { return CudaWeight::UploadColumns(columns); });
}

std::vector<const GemmKernel*> CudaKernels() {
  if (DeviceCount() == 0) return {};
  static const std::vector<const GemmKernel*>* kernels = [] {
    absl::StatusOr<DeviceInfo> device = GetDeviceInfo(0);
    const int capability = device.ok() ? device->compute_capability : 0;
    auto* list = new std::vector<const GemmKernel*>();
    for (KernelVariant variant : kVariants) {
      for (WeightFormat format : kAllWeightFormats) {
        list->push_back(new CudaGemmKernel(variant, format, capability));
      }
    }
    return list;
  }();
  return *kernels;
}

KernelVariant PreferredVariant(const GemmProblem& problem, int device) {
  // On an H200 (make gpu-check, docs/performance.md): on Hopper
  // double_buffered at every M: from WgmmaMinRows it runs wgmma with each
  // tile's K split evenly to fill one wave (striped, whose blocks all end on a
  // tile they share, reduces ~130 tiles through L2 at once at the end); below,
  // the blocks that split a tile sum it in a thread block cluster, which beats
  // fused (up to 0.8x its time at M = 1) and is within 10 % of stream-K.
  // The built-in table (default_gpu_tuning_table.inc) picks per shape where
  // it has a rule. Before Hopper, above 64 rows, fused keeps the codes out
  // of shared memory, which the larger A tile needs.
  absl::StatusOr<DeviceInfo> info = GetDeviceInfo(device);
  if (info.ok() && RunsSm90a(info->compute_capability)) {
    return KernelVariant::kDoubleBuffered;
  }
  return problem.m <= 64 ? KernelVariant::kStriped : KernelVariant::kFused;
}

}  // namespace nibble::cuda
