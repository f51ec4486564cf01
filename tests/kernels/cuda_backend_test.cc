// The CUDA backend's GemmKernels as the server runs them: batches of
// requests (RowBlocks) from many threads at once, each checked against the
// float64 reference, on every GPU the machine has, and the staging pool
// (lanes) that repeated runs reuse.
// Labelled `gpu`: ctest runs it only where a GPU exists, and each test skips
// itself without one. Random data from fixed seeds, printed on failure.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/thread_pool.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "kernels/gemm_kernel.h"
#include "tests/kernels/encoded_values.h"
#include "tests/kernels/skip_without_gpu.h"

namespace nibble::cuda {
namespace {

using ::nibble::testing::Decode;
using ::nibble::testing::Encode;
using ::nibble::testing::Encoded;

constexpr uint64_t kSeed = 20261125;
constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// A weight on the GPU with the canonical copy its reference reads.
struct GpuWeight {
  QuantizedWeight canonical;
  std::unique_ptr<DeviceWeight> device;
};

GpuWeight Upload(const WeightSpec& spec, uint64_t seed, int gpu = 0) {
  GpuWeight weight;
  weight.canonical = RandomQuantizedWeight(spec, seed);
  absl::StatusOr<std::unique_ptr<DeviceWeight>> device =
      UploadWeight(weight.canonical, gpu);
  EXPECT_TRUE(device.ok()) << device.status();
  if (device.ok()) weight.device = *std::move(device);
  return weight;
}

// The backend's kernel for `problem`, as the scheduler would pick it.
const GemmKernel* KernelFor(const GemmProblem& problem) {
  const KernelVariant variant = PreferredVariant(problem, /*device=*/0);
  for (const GemmKernel* kernel : CudaKernels()) {
    if (kernel->variant() == variant && kernel->Supports(problem)) {
      return kernel;
    }
  }
  return nullptr;
}

// f32 A goes to the tensor cores as bf16: bf16's tolerance.
double Tolerance(DType dtype) { return dtype == DType::kF16 ? 2e-3 : 1.5e-2; }

// Runs a batch of requests of `rows` each, random A from `seed`, through
// RunBlocks and checks every request's C against its own reference.
void ExpectBatchMatchesReference(const GpuWeight& weight,
                                 const std::vector<int64_t>& rows, DType dtype,
                                 uint64_t seed, ThreadPool& pool) {
  const WeightSpec& spec = weight.canonical.spec;
  SCOPED_TRACE(
      absl::StrCat(spec.DebugString(), " ", DTypeName(dtype), " seed=", seed));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<Encoded> a(rows.size());
  std::vector<std::vector<uint8_t>> c(rows.size());
  std::vector<RowBlock> blocks;
  int64_t m = 0;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::vector<float> values(rows[r] * spec.k);
    for (float& value : values) value = uniform(rng);
    a[r] = Encode(dtype, values);
    // All-ones bytes are NaN in every output type: unwritten outputs fail.
    c[r].assign(rows[r] * spec.n * DTypeSize(dtype), 0xff);
    blocks.push_back(
        {.a = a[r].bytes.data(), .c = c[r].data(), .rows = rows[r]});
    m += rows[r];
  }
  const GemmProblem problem{.m = m,
                            .n = spec.n,
                            .k = spec.k,
                            .format = spec.format,
                            .group_size = spec.group_size,
                            .dtype = dtype,
                            .cpu_panels = false};
  const GemmKernel* kernel = KernelFor(problem);
  ASSERT_NE(kernel, nullptr) << problem.DebugString();
  const absl::Status status =
      kernel->RunBlocks(problem, nullptr, weight.device.get(), blocks, pool);
  ASSERT_TRUE(status.ok()) << status;
  for (size_t r = 0; r < rows.size(); ++r) {
    const std::vector<double> want =
        ReferenceMatmul(a[r].values, rows[r], weight.canonical);
    EXPECT_LE(MaxRelativeError(Decode(dtype, c[r]), want), Tolerance(dtype))
        << "request " << r << " of " << rows.size() << " (" << rows[r]
        << " rows)";
  }
}

TEST(CudaBackendTest, ConcurrentBatchesFromManyThreadsMatchTheReference) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const GpuWeight weights[] = {
      Upload({WeightFormat::kU4b8, 1024, 520, 128}, kSeed),
      Upload({WeightFormat::kFp4, 512, 256, 32}, kSeed + 1),
      Upload({WeightFormat::kU4, 256, 72, 64}, kSeed + 2)};
  for (const GpuWeight& weight : weights) ASSERT_NE(weight.device, nullptr);
  constexpr int kThreads = 2 * kMaxLanes;  // more than there are lanes
  constexpr int kBatchesPerThread = 12;
  ThreadPool pool(4);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(kSeed + 100 + t);
      for (int i = 0; i < kBatchesPerThread; ++i) {
        // 1 to 4 requests of 1 to 40 rows, on any weight, in any dtype.
        std::vector<int64_t> rows(1 + rng() % 4);
        for (int64_t& r : rows) r = 1 + static_cast<int64_t>(rng() % 40);
        const DType dtype = kDTypes[rng() % 3];
        ExpectBatchMatchesReference(weights[rng() % 3], rows, dtype, rng(),
                                    pool);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  const StagingStats staging = Staging();
  EXPECT_GE(staging.lanes, 1);
  EXPECT_LE(staging.lanes, kMaxLanes);
}

// Weights on every GPU, run from threads that never choose a GPU: each run
// goes to its weight's GPU and leaves the thread's current GPU alone.
TEST(CudaBackendTest, EachWeightRunsOnItsOwnGpu) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE(absl::StrCat("seed=", kSeed, " gpus=", DeviceCount()));
  std::vector<GpuWeight> weights;
  for (int gpu = 0; gpu < DeviceCount(); ++gpu) {
    weights.push_back(
        Upload({WeightFormat::kU4b8, 512, 264, 128}, kSeed + 10 + gpu, gpu));
    weights.push_back(
        Upload({WeightFormat::kNvfp4, 256, 96, 16}, kSeed + 20 + gpu, gpu));
  }
  int current = -1;
  ASSERT_EQ(cudaGetDevice(&current), cudaSuccess);
  EXPECT_EQ(current, 0) << "an upload left another GPU current";
  for (size_t w = 0; w < weights.size(); ++w) {
    ASSERT_NE(weights[w].device, nullptr);
    EXPECT_EQ(weights[w].device->device(), static_cast<int>(w / 2));
  }
  ThreadPool pool(2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(kSeed + 200 + t);
      for (int i = 0; i < 8; ++i) {
        std::vector<int64_t> rows(1 + rng() % 3);
        for (int64_t& r : rows) r = 1 + static_cast<int64_t>(rng() % 24);
        ExpectBatchMatchesReference(weights[rng() % weights.size()], rows,
                                    kDTypes[rng() % 3], rng(), pool);
      }
      int after = -1;
      EXPECT_EQ(cudaGetDevice(&after), cudaSuccess);
      EXPECT_EQ(after, 0) << "a run left another GPU current";
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_LE(Staging().lanes, kMaxLanes * DeviceCount());
}

TEST(CudaBackendTest, AGpuThatIsNotThereIsNamed) {
  SKIP_WITHOUT_GPU();
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 128, 64, 128}, kSeed);
  absl::StatusOr<std::unique_ptr<DeviceWeight>> device =
      UploadWeight(weight, DeviceCount());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(device.status().message().find(
                absl::StrCat("there is no GPU ", DeviceCount())),
            std::string::npos)
      << device.status();
  EXPECT_EQ(DeviceMemory(-1).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(DeviceMemory(DeviceCount() - 1).ok());
}

TEST(CudaBackendTest, RepeatedRunsAllocateNoMoreStaging) {
  SKIP_WITHOUT_GPU();
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const GpuWeight weight =
      Upload({WeightFormat::kU4b8, 2048, 1024, 128}, kSeed + 3);
  ASSERT_NE(weight.device, nullptr);
  ThreadPool pool(2);
  // The largest batch first: the lane it takes holds enough for all the rest.
  ExpectBatchMatchesReference(weight, {64, 64}, DType::kF32, kSeed + 4, pool);
  const StagingStats first = Staging();
  EXPECT_GT(first.pinned_bytes, 0);
  EXPECT_GT(first.device_bytes, 0);
  std::mt19937_64 rng(kSeed + 5);
  for (int i = 0; i < 50; ++i) {
    const std::vector<int64_t> rows = {1 + static_cast<int64_t>(rng() % 64),
                                       1 + static_cast<int64_t>(rng() % 64)};
    ExpectBatchMatchesReference(
        weight, rows, i % 2 == 0 ? DType::kF32 : DType::kF16, rng(), pool);
  }
  const StagingStats after = Staging();
  EXPECT_EQ(after.lanes, first.lanes);
  EXPECT_EQ(after.pinned_bytes, first.pinned_bytes);
  EXPECT_EQ(after.device_bytes, first.device_bytes);
}

}  // namespace
}  // namespace nibble::cuda
