// Tests nibbled's backend choice (--backend): parsing the flag, resolving
// auto against the GPUs found, refusing cuda without one, and the weights'
// device copies in the store.
#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/device_weight.h"
#include "server/core/weight_store.h"
#include "server/edge/nibble_server.h"
#include "server/edge/proto_conversions.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

TEST(ParseBackendTest, ParsesEveryNameBackendNameGives) {
  for (Backend backend : {Backend::kAuto, Backend::kCpu, Backend::kCuda}) {
    absl::StatusOr<Backend> parsed = ParseBackend(BackendName(backend));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, backend);
  }
  EXPECT_EQ(BackendName(Backend::kCuda), "cuda");
}

TEST(ParseBackendTest, OtherNamesAreInvalidAndListTheChoices) {
  for (const char* name : {"", "bogus", "CUDA", "gpu", "cpu "}) {
    absl::StatusOr<Backend> parsed = ParseBackend(name);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("is not one of auto, cpu or cuda"));
  }
}

TEST(ResolveBackendTest, AutoTakesTheGpuWhenThereIsOne) {
  EXPECT_EQ(*ResolveBackend(Backend::kAuto, true, 1), Backend::kCuda);
  EXPECT_EQ(*ResolveBackend(Backend::kAuto, true, 0), Backend::kCpu);
  EXPECT_EQ(*ResolveBackend(Backend::kAuto, false, 0), Backend::kCpu);
}

TEST(ResolveBackendTest, CpuAndCudaWithAGpuStayAsAsked) {
  EXPECT_EQ(*ResolveBackend(Backend::kCpu, true, 2), Backend::kCpu);
  EXPECT_EQ(*ResolveBackend(Backend::kCpu, false, 0), Backend::kCpu);
  EXPECT_EQ(*ResolveBackend(Backend::kCuda, true, 1), Backend::kCuda);
}

TEST(ResolveBackendTest, CudaSaysWhatIsMissing) {
  absl::StatusOr<Backend> no_gpu = ResolveBackend(Backend::kCuda, true, 0);
  EXPECT_EQ(no_gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(no_gpu.status().message(),
              HasSubstr("--backend=cuda: no GPU is visible to nibbled"));
  absl::StatusOr<Backend> not_built = ResolveBackend(Backend::kCuda, false, 0);
  EXPECT_EQ(not_built.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(not_built.status().message(),
              HasSubstr("this build has no CUDA backend (nvcc was not found"));
}

TEST(UploadToBackendTest, CpuBackendKeepsNoDeviceCopy) {
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 128, 64, 64}, 3);
  absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
      UploadToBackend(Backend::kCpu, "w", weight, /*gpu=*/-1);
  ASSERT_TRUE(device.ok()) << device.status();
  EXPECT_EQ(*device, nullptr);
}

TEST(UploadToBackendTest, CudaBackendWithoutAGpuCopiesNothing) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 128, 64, 64}, 3);
  absl::StatusOr<std::unique_ptr<nibble::DeviceWeight>> device =
      UploadToBackend(Backend::kCuda, "w", weight, /*gpu=*/0);
  if (cuda::SupportsSpec(weight.spec)) {
    EXPECT_EQ(device.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(device.status().message(),
                HasSubstr("weight \"w\" could not be copied to GPU 0"));
  } else {
    ASSERT_TRUE(device.ok()) << device.status();
    EXPECT_EQ(*device, nullptr);
  }
}

TEST(PackForBackendTest, PanelsOnlyWhereTheCpuRunsTheMatmuls) {
  const WeightSpec spec{WeightFormat::kU4b8, 128, 64, 64};
  const QuantizedWeight weight = RandomQuantizedWeight(spec, 3);
  absl::StatusOr<PackedWeight> on_cpu = PackForBackend(Backend::kCpu, weight);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
  EXPECT_TRUE(on_cpu->has_panels());
  EXPECT_FALSE(AcceleratorServesWhole(Backend::kCpu, spec));

  // The GPU's kernels take this K (a multiple of 128) when compiled in.
  EXPECT_EQ(AcceleratorServesWhole(Backend::kCuda, spec), cuda::CompiledIn());
  absl::StatusOr<PackedWeight> on_gpu = PackForBackend(Backend::kCuda, weight);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  EXPECT_EQ(on_gpu->has_panels(), !cuda::CompiledIn());
  EXPECT_EQ(on_gpu->spec(), spec);

  // They refuse this one, so the CPU's kernels need its panels.
  const QuantizedWeight odd_k =
      RandomQuantizedWeight({WeightFormat::kU4b8, 96, 64, 32}, 4);
  EXPECT_FALSE(AcceleratorServesWhole(Backend::kCuda, odd_k.spec));
  absl::StatusOr<PackedWeight> fallback = PackForBackend(Backend::kCuda, odd_k);
  ASSERT_TRUE(fallback.ok()) << fallback.status();
  EXPECT_TRUE(fallback->has_panels());
}

// A device copy of `bytes` bytes, as a backend's UploadWeight would make.
class FakeDeviceWeight final : public nibble::DeviceWeight {
 public:
  FakeDeviceWeight(WeightSpec spec, int64_t bytes)
      : spec_(spec), bytes_(bytes) {}
  const WeightSpec& spec() const override { return spec_; }
  int64_t device_bytes() const override { return bytes_; }
  int device() const override { return 1; }

 private:
  WeightSpec spec_;
  int64_t bytes_;
};

TEST(WeightStoreDeviceTest, KeepsTheDeviceCopyAndCountsItsBytes) {
  const WeightSpec spec{WeightFormat::kU4b8, 32, 8, 32};
  WeightStore store({.gpus = {{.gpu = 0}, {.gpu = 1}}});
  auto device = std::make_unique<FakeDeviceWeight>(spec, 1000);
  const nibble::DeviceWeight* raw = device.get();
  ASSERT_TRUE(store
                  .Insert("gpu",
                          *PackedWeight::Pack(RandomQuantizedWeight(spec, 1)),
                          std::move(device))
                  .ok());
  ASSERT_TRUE(
      store.Insert("cpu", *PackedWeight::Pack(RandomQuantizedWeight(spec, 2)))
          .ok());
  EXPECT_EQ(store.device_bytes(), 1000);
  EXPECT_EQ(store.gpu_usage()[1].resident_bytes, 1000);
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> gpu = store.Get("gpu");
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  EXPECT_EQ((*gpu)->device.get(), raw);
  EXPECT_EQ((*store.Get("cpu"))->device, nullptr);
  ASSERT_TRUE(store.Remove("gpu").ok());
  EXPECT_EQ(store.device_bytes(), 0);
  // A request still holding the weight still holds its device copy.
  EXPECT_EQ((*gpu)->device->device_bytes(), 1000);
}

TEST(WeightStoreDeviceTest, InfoSaysWhereTheWeightLives) {
  const WeightSpec spec{WeightFormat::kMxfp4, 128, 24, 32};
  const QuantizedWeight weight = RandomQuantizedWeight(spec, 5);
  v1::WeightInfo on_gpu;
  FillWeightInfo(ResidentWeight{"gpu", *PackedWeight::WithoutPanels(weight),
                                std::make_shared<FakeDeviceWeight>(spec, 1000)},
                 &on_gpu);
  EXPECT_EQ(on_gpu.resident_bytes(), 0);
  EXPECT_EQ(on_gpu.gpu_bytes(), 1000);
  EXPECT_EQ(on_gpu.gpu(), 1);
  v1::WeightInfo on_cpu;
  FillWeightInfo(ResidentWeight{"cpu", *PackedWeight::Pack(weight), nullptr},
                 &on_cpu);
  EXPECT_EQ(on_cpu.resident_bytes(), PackedResidentBytes(spec, false));
  EXPECT_EQ(on_cpu.gpu_bytes(), 0);
}

TEST(WeightStoreDeviceTest, RefusedInsertCountsNoDeviceBytes) {
  const WeightSpec spec{WeightFormat::kU4b8, 32, 8, 32};
  WeightStore store({.gpus = {{.gpu = 1}}});
  ASSERT_TRUE(
      store.Insert("w", *PackedWeight::Pack(RandomQuantizedWeight(spec, 1)))
          .ok());
  EXPECT_EQ(
      store
          .Insert("w", *PackedWeight::Pack(RandomQuantizedWeight(spec, 2)),
                  std::make_unique<FakeDeviceWeight>(spec, 1000))
          .code(),
      absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store.device_bytes(), 0);
}

TEST(NibbleServerBackendTest, CudaWithoutAGpuDoesNotStart) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.threads = 1;
  options.backend = Backend::kCuda;
  absl::StatusOr<std::unique_ptr<NibbleServer>> server =
      NibbleServer::Start(options, cpu::CpuKernels());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(server.status().message(), HasSubstr("--backend=cuda: "));
}

TEST(NibbleServerBackendTest, AutoWithoutAGpuServesOnTheCpu) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.threads = 1;
  options.backend = Backend::kAuto;
  absl::StatusOr<std::unique_ptr<NibbleServer>> server =
      NibbleServer::Start(options, cpu::CpuKernels());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_EQ((*server)->backend(), Backend::kCpu);
  (*server)->Shutdown();
}

}  // namespace
}  // namespace nibble::server
