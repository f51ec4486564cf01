// Every CUDA kernel against the float64 reference on the GPU: fresh random
// data each run (the seed is printed on failure), C poisoned with NaN before
// every launch, and every launch made twice so that a workspace left dirty by
// the first shows in the second. Labelled `gpu`: ctest runs it only where a
// GPU exists, and each test skips itself without one.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "base/thread_pool.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/arrange_weight.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_gemm.h"
#include "kernels/cuda/device_layout.h"
#include "tests/format/column_layout.h"
#include "tests/kernels/encoded_values.h"
#include "tests/kernels/skip_without_gpu.h"

namespace nibble::cuda {
namespace {

using ::nibble::testing::Decode;
using ::nibble::testing::Encode;
using ::nibble::testing::Encoded;

// A device allocation freed at scope exit.
class DeviceArray {
 public:
  explicit DeviceArray(size_t bytes) : bytes_(bytes) {
    EXPECT_EQ(cudaMalloc(&data_, bytes), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(data_); }
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_;
};

uint64_t FreshSeed() { return std::random_device{}(); }

template <typename T>
std::vector<T> Download(const T* device, int64_t count) {
  std::vector<T> host(count);
  EXPECT_EQ(cudaMemcpy(host.data(), device, count * sizeof(T),
                       cudaMemcpyDeviceToHost),
            cudaSuccess);
  return host;
}

// The sign bit of a scale slot: fp16's, E4M3's; E8M0 scales have none.
uint16_t ScaleSignBit(WeightFormat format) {
  switch (format) {
    case WeightFormat::kMxfp4:
      return 0;
    case WeightFormat::kNvfp4:
      return 0x80;
    default:
      return 0x8000;
  }
}

// Random weight with about half the scales negated, so that signs matter.
QuantizedWeight SignedRandomWeight(const WeightSpec& spec, uint64_t seed) {
  QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
  std::mt19937_64 rng(seed ^ 0x5eed);
  const uint16_t sign_bit = ScaleSignBit(spec.format);
  for (uint16_t& scale : weight.scales) {
    if (rng() & 1) scale ^= sign_bit;
  }
  return weight;
}

// A [M, K] uniform in [-1, 1) encoded in `dtype`, and the values it holds.
Encoded RandomActivations(int64_t m, int64_t k, DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(m * k);
  for (float& value : values) value = uniform(rng);
  return Encode(dtype, values);
}

// fp16 weights and activations round each product's inputs to 11 bits, bf16
// to 8; accumulation is fp32.
double Tolerance(DType a_dtype) {
  return a_dtype == DType::kF16 ? 2e-3 : 1.5e-2;
}

struct LaunchCase {
  KernelVariant variant;
  WeightSpec spec;
  int64_t m;
  DType a_dtype;
  DType c_dtype;
};

void PrintTo(const LaunchCase& c, std::ostream* os) {
  *os << KernelVariantName(c.variant) << " " << c.spec.DebugString()
      << " m=" << c.m << " a=" << DTypeName(c.a_dtype)
      << " c=" << DTypeName(c.c_dtype);
}

std::vector<LaunchCase> AllLaunchCases() {
  // N with a partial last tile, K from one step to many, every group size
  // (per-channel too), M across the mma.sync kernel's 8-, 16-, 32-, 64- and
  // 128-row tiles and the wgmma kernel's 16-, 32-, 64-, 128- and 256-row
  // ones, partial and several. Few tiles of K = 1024 split over clusters of
  // blocks on Hopper, other splits sum through the workspace. mxfp4 and nvfp4
  // fix their group size and share fp4's codes: two shapes each.
  const std::vector<std::vector<WeightSpec>> specs_by_format = {
      {{WeightFormat::kU4b8, 128, 16, 32},
       {WeightFormat::kU4b8, 1024, 200, 128},
       {WeightFormat::kU4b8, 4096, 1024, 128},
       {WeightFormat::kU4b8, 384, 384, 384}},
      {{WeightFormat::kFp4, 128, 136, 32},
       {WeightFormat::kFp4, 2048, 512, 32},
       {WeightFormat::kFp4, 256, 1000, 64},
       {WeightFormat::kFp4, 4096, 256, 4096},
       {WeightFormat::kFp4, 1024, 264, 32}},
      {{WeightFormat::kU4, 256, 72, 64},
       {WeightFormat::kU4, 1024, 640, 128},
       {WeightFormat::kU4, 2048, 256, 32},
       {WeightFormat::kU4, 640, 128, 640}},
      {{WeightFormat::kMxfp4, 128, 136, 32},
       {WeightFormat::kMxfp4, 2048, 520, 32}},
      {{WeightFormat::kNvfp4, 256, 72, 16, 0.0123f},
       {WeightFormat::kNvfp4, 1024, 1000, 16, 0.0123f}},
  };
  std::vector<LaunchCase> cases;
  for (KernelVariant variant :
       {KernelVariant::kFused, KernelVariant::kDoubleBuffered,
        KernelVariant::kStriped}) {
    for (const auto& specs : specs_by_format) {
      for (const WeightSpec& spec : specs) {
        for (int64_t m : {1, 9, 16, 20, 33, 64, 100, 130, 300}) {
          for (DType a_dtype : {DType::kF16, DType::kBF16}) {
            const DType c_dtype = m % 2 == 1 ? DType::kF32 : a_dtype;
            cases.push_back({variant, spec, m, a_dtype, c_dtype});
          }
        }
      }
    }
  }
  return cases;
}

std::string LaunchCaseName(const ::testing::TestParamInfo<LaunchCase>& info) {
  const LaunchCase& c = info.param;
  const std::string group = c.spec.group_size == c.spec.k
                                ? "per_channel"
                                : absl::StrCat("g", c.spec.group_size);
  return absl::StrCat(KernelVariantName(c.variant), "_",
                      WeightFormatName(c.spec.format), "_k", c.spec.k, "_n",
                      c.spec.n, "_", group, "_m", c.m, "_",
                      DTypeName(c.a_dtype), "_to_", DTypeName(c.c_dtype));
}

// Launches `c` on `b`, the GPU copy of `weight` (of spec c.spec), twice and
// compares C with the float64 reference; `seed` makes A.
void ExpectLaunchMatchesReference(const LaunchCase& c, const CudaWeight& b,
                                  const QuantizedWeight& weight,
                                  uint64_t seed) {
  SCOPED_TRACE(::testing::PrintToString(c));
  const Encoded a = RandomActivations(c.m, c.spec.k, c.a_dtype, seed);
  DeviceArray a_device(a.bytes.size());
  ASSERT_EQ(cudaMemcpy(a_device.data(), a.bytes.data(), a.bytes.size(),
                       cudaMemcpyHostToDevice),
            cudaSuccess);
  const size_t c_bytes = c.m * c.spec.n * DTypeSize(c.c_dtype);
  DeviceArray c_device(c_bytes);
  const std::vector<double> want = ReferenceMatmul(a.values, c.m, weight);

  Workspace workspace;
  for (int launch = 0; launch < 2; ++launch) {
    SCOPED_TRACE(absl::StrCat("launch ", launch));
    // All-ones bytes are NaN in every output type: unwritten outputs fail.
    ASSERT_EQ(cudaMemset(c_device.data(), 0xff, c_bytes), cudaSuccess);
    const DeviceGemm gemm{.variant = c.variant,
                          .b = &b,
                          .a = a_device.data(),
                          .a_dtype = c.a_dtype,
                          .c = c_device.data(),
                          .c_dtype = c.c_dtype,
                          .m = c.m};
    const absl::Status status = LaunchGemm(gemm, workspace, nullptr);
    ASSERT_TRUE(status.ok()) << status;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint8_t> c_host(c_bytes);
    ASSERT_EQ(cudaMemcpy(c_host.data(), c_device.data(), c_bytes,
                         cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_LE(MaxRelativeError(Decode(c.c_dtype, c_host), want),
              Tolerance(c.a_dtype));
  }
}

class LaunchGemmTest : public ::testing::TestWithParam<LaunchCase> {};

TEST_P(LaunchGemmTest, MatchesTheFloat64Reference) {
  SKIP_WITHOUT_GPU();
  const LaunchCase& c = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const QuantizedWeight weight = SignedRandomWeight(c.spec, seed);
  absl::StatusOr<std::unique_ptr<CudaWeight>> b = CudaWeight::Upload(weight);
  ASSERT_TRUE(b.ok()) << b.status();
  ExpectLaunchMatchesReference(c, **b, weight, seed + 1);
}

INSTANTIATE_TEST_SUITE_P(AllVariants, LaunchGemmTest,
                         ::testing::ValuesIn(AllLaunchCases()), LaunchCaseName);

// More tiles than one wave of blocks, with a partial last wave: the tiles of
// the full waves run whole, and those of the last wave split their K steps
// over blocks that would otherwise stay idle (on Hopper, two 16- or 32-row
// wgmma blocks per SM: 2 x SMs + 2 tiles, 2 of them split in two).
TEST(CudaKernelsTest, ALastPartialWaveSplitsItsTiles) {
  SKIP_WITHOUT_GPU();
  absl::StatusOr<DeviceInfo> device = CurrentDevice();
  ASSERT_TRUE(device.ok()) << device.status();
  const WeightSpec spec{WeightFormat::kU4b8, 512,
                        (2 * device->sm_count + 1) * 256 + 72, 128};
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const QuantizedWeight weight = SignedRandomWeight(spec, seed);
  absl::StatusOr<std::unique_ptr<CudaWeight>> b = CudaWeight::Upload(weight);
  ASSERT_TRUE(b.ok()) << b.status();
  for (const int64_t m : {16, 20}) {
    ExpectLaunchMatchesReference(
        {KernelVariant::kDoubleBuffered, spec, m, DType::kF16, DType::kF32},
        **b, weight, seed + 1);
  }
}

// Launches queued back to back on one stream, as a model's layers are, each
// after the first allowed to start before the one before it ends
// (DeviceGemm::overlap_previous_kernel; programmatic dependent launch on
// Hopper): the second reads as A what the first wrote as C, and the third
// overwrites that C while the second may still read it. NaN in C before the
// chain shows a read of A too early.
TEST(CudaKernelsTest, BackToBackLaunchesSeeWhatTheOneBeforeWrote) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const WeightSpec first_spec{WeightFormat::kU4b8, 1024, 1024, 128};
  const WeightSpec second_spec{WeightFormat::kFp4, 1024, 520, 32};
  const QuantizedWeight first = SignedRandomWeight(first_spec, seed);
  const QuantizedWeight second = SignedRandomWeight(second_spec, seed + 1);
  absl::StatusOr<std::unique_ptr<CudaWeight>> first_b =
      CudaWeight::Upload(first);
  ASSERT_TRUE(first_b.ok()) << first_b.status();
  absl::StatusOr<std::unique_ptr<CudaWeight>> second_b =
      CudaWeight::Upload(second);
  ASSERT_TRUE(second_b.ok()) << second_b.status();
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
            cudaSuccess);
  Workspace workspace;
  for (const KernelVariant variant :
       {KernelVariant::kFused, KernelVariant::kDoubleBuffered,
        KernelVariant::kStriped}) {
    for (const int64_t m : {1, 16, 64}) {
      SCOPED_TRACE(absl::StrCat(KernelVariantName(variant), " m=", m));
      const Encoded a = RandomActivations(m, first_spec.k, DType::kF16, seed);
      const Encoded a_last =
          RandomActivations(m, first_spec.k, DType::kF16, seed + 2);
      DeviceArray a_device(a.bytes.size());
      DeviceArray a_last_device(a_last.bytes.size());
      const size_t x_bytes = m * first_spec.n * 2;
      const size_t y_bytes = m * second_spec.n * 4;
      DeviceArray x(x_bytes);
      DeviceArray y(y_bytes);
      ASSERT_EQ(cudaMemcpy(a_device.data(), a.bytes.data(), a.bytes.size(),
                           cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(a_last_device.data(), a_last.bytes.data(),
                           a_last.bytes.size(), cudaMemcpyHostToDevice),
                cudaSuccess);
      ASSERT_EQ(cudaMemset(x.data(), 0xff, x_bytes), cudaSuccess);
      ASSERT_EQ(cudaMemset(y.data(), 0xff, y_bytes), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      auto launch = [&](const CudaWeight& b, const void* in, void* out,
                        DType c_dtype, bool after_a_kernel) {
        return LaunchGemm({.variant = variant,
                           .b = &b,
                           .a = in,
                           .a_dtype = DType::kF16,
                           .c = out,
                           .c_dtype = c_dtype,
                           .m = m,
                           .overlap_previous_kernel = after_a_kernel},
                          workspace, stream);
      };
      absl::Status status =
          launch(**first_b, a_device.data(), x.data(), DType::kF16, false);
      ASSERT_TRUE(status.ok()) << status;
      status = launch(**second_b, x.data(), y.data(), DType::kF32, true);
      ASSERT_TRUE(status.ok()) << status;
      status =
          launch(**first_b, a_last_device.data(), x.data(), DType::kF16, true);
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const std::vector<uint8_t> y_host =
          Download(static_cast<const uint8_t*>(y.data()), y_bytes);
      EXPECT_LE(
          MaxRelativeError(
              Decode(DType::kF16,
                     Download(static_cast<const uint8_t*>(x.data()), x_bytes)),
              ReferenceMatmul(a_last.values, m, first)),
          Tolerance(DType::kF16));
      // The second launch's A: the first's C, made again alone.
      status = launch(**first_b, a_device.data(), x.data(), DType::kF16, false);
      ASSERT_TRUE(status.ok()) << status;
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const std::vector<double> x_values =
          Decode(DType::kF16,
                 Download(static_cast<const uint8_t*>(x.data()), x_bytes));
      EXPECT_LE(MaxRelativeError(Decode(DType::kF32, y_host),
                                 ReferenceMatmul(x_values, m, second)),
                Tolerance(DType::kF16));
    }
  }
  EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
}

// mxfp4 scales far outside fp16's range, which the device layout moves into
// it (the power of two goes to C), and 2^24 apart, all it keeps exact.
TEST(CudaKernelsTest, Mxfp4ScalesOutsideHalfRangeMatchTheReference) {
  SKIP_WITHOUT_GPU();
  const WeightSpec spec{WeightFormat::kMxfp4, 512, 264, 32};
  // Each range spans 2^24; the highest keeps every output inside fp32's
  // range (6 * 2^97 * 512 < 2^128), so that the reference stays finite.
  for (const int first_code : {0, 150, 200}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat("seed=", seed, " codes from ", first_code));
    QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
    std::mt19937_64 rng(seed);
    for (uint16_t& scale : weight.scales) {
      scale = static_cast<uint16_t>(first_code + rng() % 25);
    }
    absl::StatusOr<std::unique_ptr<CudaWeight>> b = CudaWeight::Upload(weight);
    ASSERT_TRUE(b.ok()) << b.status();
    for (KernelVariant variant :
         {KernelVariant::kFused, KernelVariant::kDoubleBuffered,
          KernelVariant::kStriped}) {
      for (DType a_dtype : {DType::kF16, DType::kBF16}) {
        ExpectLaunchMatchesReference({variant, spec, 40, a_dtype, DType::kF32},
                                     **b, weight, seed + 1);
      }
    }
  }
}

// A checkpoint's MXFP4 and NVFP4 columns, uploaded as they are, multiply as
// the canonical weight does; bad scale codes and other formats are refused.
TEST(CudaKernelsTest, UploadColumnsRunsLikeTheCanonicalWeight) {
  SKIP_WITHOUT_GPU();
  for (const WeightSpec& spec :
       {WeightSpec{WeightFormat::kMxfp4, 256, 300, 32},
        WeightSpec{WeightFormat::kNvfp4, 384, 72, 16, 0.0123f}}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat("seed=", seed, " ", spec.DebugString()));
    const QuantizedWeight weight = SignedRandomWeight(spec, seed);
    testing::ColumnLayout columns = testing::ToColumns(weight);
    absl::StatusOr<std::unique_ptr<CudaWeight>> uploaded =
        CudaWeight::UploadColumns(columns.View(spec));
    ASSERT_TRUE(uploaded.ok()) << uploaded.status();
    ExpectLaunchMatchesReference(
        {KernelVariant::kStriped, spec, 20, DType::kBF16, DType::kF32},
        **uploaded, weight, seed + 1);

    columns.scale_codes[7] =
        spec.format == WeightFormat::kMxfp4 ? 0xff : 0x7f;  // NaN
    EXPECT_EQ(CudaWeight::UploadColumns(columns.View(spec)).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  const WeightSpec fp4{WeightFormat::kFp4, 256, 16, 32};
  const testing::ColumnLayout fp4_columns =
      testing::ToColumns(RandomQuantizedWeight(fp4, 1));
  const absl::Status refused =
      CudaWeight::UploadColumns(fp4_columns.View(fp4)).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("not fp4"));
}

// The benchmark's copies: each complete after the original is gone, zero
// points and nvfp4's output scale included.
TEST(CudaKernelsTest, CopyRunsLikeTheUploadedWeight) {
  SKIP_WITHOUT_GPU();
  for (const WeightSpec& spec :
       {WeightSpec{WeightFormat::kU4, 256, 300, 64},
        WeightSpec{WeightFormat::kNvfp4, 256, 300, 16, 0.0123f}}) {
    const uint64_t seed = FreshSeed();
    SCOPED_TRACE(absl::StrCat("seed=", seed));
    const QuantizedWeight weight = SignedRandomWeight(spec, seed);
    absl::StatusOr<std::unique_ptr<CudaWeight>> copy;
    {
      absl::StatusOr<std::unique_ptr<CudaWeight>> original =
          CudaWeight::Upload(weight);
      ASSERT_TRUE(original.ok()) << original.status();
      copy = (*original)->Copy();
      ASSERT_TRUE(copy.ok()) << copy.status();
      EXPECT_EQ((*copy)->device_bytes(), (*original)->device_bytes());
    }
    ExpectLaunchMatchesReference(
        {KernelVariant::kStriped, spec, 20, DType::kF16, DType::kF32}, **copy,
        weight, seed + 1);
  }
}

struct ArrangeCase {
  WeightSpec spec;
  int64_t staging_bytes;
};

class ArrangeOnDeviceTest : public ::testing::TestWithParam<ArrangeCase> {};

// Poisoned device arrays sized as `want`'s, filled by `arrange`, then
// compared with `want` word for word, padding included.
void ExpectArrangedLike(
    const DeviceLayout& want,
    absl::FunctionRef<absl::Status(const ArrangedArrays&)> arrange) {
  DeviceArray codes(want.codes.size() * 4), scales(want.scales.size() * 4),
      zeros(std::max<size_t>(want.zeros.size() * 2, 1));
  for (const DeviceArray* array : {&codes, &scales, &zeros}) {
    ASSERT_EQ(cudaMemset(array->data(), 0xa5, array->bytes()), cudaSuccess);
  }
  const ArrangedArrays to{
      static_cast<uint32_t*>(codes.data()),
      static_cast<uint32_t*>(scales.data()),
      want.zeros.empty() ? nullptr : static_cast<uint16_t*>(zeros.data())};
  const absl::Status status = arrange(to);
  ASSERT_TRUE(status.ok()) << status;

  const std::vector<uint32_t> got_codes =
      Download(to.codes, static_cast<int64_t>(want.codes.size()));
  for (size_t i = 0; i < want.codes.size(); ++i) {
    ASSERT_EQ(got_codes[i], want.codes[i]) << "code word " << i;
  }
  EXPECT_EQ(Download(to.scales, static_cast<int64_t>(want.scales.size())),
            want.scales);
  if (!want.zeros.empty()) {
    EXPECT_EQ(Download(to.zeros, static_cast<int64_t>(want.zeros.size())),
              want.zeros);
  }
}

// The GPU's arrangement against the host reference: a small staging buffer
// makes the codes and scales come over in many pieces. MXFP4 and NVFP4 also
// come from their checkpoints' column layout, a run of columns at a time.
TEST_P(ArrangeOnDeviceTest, MatchesTheHostLayoutWordForWord) {
  SKIP_WITHOUT_GPU();
  const ArrangeCase& arrange = GetParam();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed, " ", arrange.spec.DebugString(),
                            " staging=", arrange.staging_bytes));
  QuantizedWeight weight = RandomQuantizedWeight(arrange.spec, seed);
  if (arrange.spec.format == WeightFormat::kMxfp4) {
    // Exponents 2^-60 .. 2^20: the conversion must shift them.
    std::mt19937_64 rng(seed);
    std::uniform_int_distribution<int> code(67, 147);
    for (uint16_t& scale : weight.scales) {
      scale = static_cast<uint16_t>(code(rng));
    }
  }
  const DeviceLayout want = MakeDeviceLayout(weight);
  const ScaleConversion conversion = MakeScaleConversion(weight);
  EXPECT_EQ(conversion.output_scale, want.output_scale);
  ExpectArrangedLike(want, [&](const ArrangedArrays& to) {
    return ArrangeOnDevice(weight, conversion, to, arrange.staging_bytes);
  });
  if (!HasColumnLayout(arrange.spec.format)) return;
  SCOPED_TRACE("from the column layout");
  const testing::ColumnLayout columns = testing::ToColumns(weight);
  QuantizedWeight scales_only = weight;
  scales_only.qweight.clear();
  ExpectArrangedLike(want, [&](const ArrangedArrays& to) {
    return ArrangeOnDevice(columns.View(arrange.spec), scales_only, conversion,
                           to, arrange.staging_bytes);
  });
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, ArrangeOnDeviceTest,
    ::testing::Values(
        ArrangeCase{{WeightFormat::kU4b8, 128, 16, 32}, kStagingBytes},
        ArrangeCase{{WeightFormat::kU4, 256, 300, 64}, kStagingBytes},
        ArrangeCase{{WeightFormat::kU4, 512, 200, 128}, 4096},
        ArrangeCase{{WeightFormat::kFp4, 1024, 520, 1024}, 1},
        ArrangeCase{{WeightFormat::kMxfp4, 640, 300, 32}, 20000},
        ArrangeCase{{WeightFormat::kMxfp4, 256, 40, 32}, 1},
        ArrangeCase{{WeightFormat::kNvfp4, 384, 72, 16, 0.0123f}, 3000},
        ArrangeCase{{WeightFormat::kNvfp4, 4096, 1000, 16, 2.5f},
                    kStagingBytes},
        ArrangeCase{{WeightFormat::kU4b8, 4096, 4100, 128}, kStagingBytes}));

// The GemmKernel path nibbled takes: host A and C, f32 included.
TEST(CudaKernelsTest, RunOnHostOperandsMatchesTheReference) {
  SKIP_WITHOUT_GPU();
  const uint64_t seed = FreshSeed();
  SCOPED_TRACE(absl::StrCat("seed=", seed));
  const WeightSpec spec{WeightFormat::kU4, 512, 300, 64};
  const QuantizedWeight weight = SignedRandomWeight(spec, seed);
  absl::StatusOr<std::unique_ptr<DeviceWeight>> resident =
      UploadWeight(weight, /*device=*/0);
  ASSERT_TRUE(resident.ok()) << resident.status();
  ThreadPool pool(1);
  int ran = 0;
  for (const GemmKernel* kernel : CudaKernels()) {
    for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
      const GemmProblem problem{.m = 7,
                                .n = spec.n,
                                .k = spec.k,
                                .format = spec.format,
                                .group_size = spec.group_size,
                                .dtype = dtype,
                                .threads = 1};
      if (!kernel->Supports(problem)) continue;
      SCOPED_TRACE(absl::StrCat(kernel->name(), " ", DTypeName(dtype)));
      const Encoded a = RandomActivations(problem.m, spec.k, dtype, seed);
      std::vector<uint8_t> c(problem.m * spec.n * DTypeSize(dtype), 0xff);
      const absl::Status status = kernel->Run(
          problem, {nullptr, a.bytes.data(), c.data(), resident->get()}, pool);
      ASSERT_TRUE(status.ok()) << status;
      EXPECT_LE(MaxRelativeError(Decode(dtype, c),
                                 ReferenceMatmul(a.values, problem.m, weight)),
                Tolerance(dtype == DType::kF16 ? DType::kF16 : DType::kBF16));
      ++ran;
    }
  }
  EXPECT_EQ(ran, 9) << "three variants times three dtypes for u4";
}

TEST(CudaKernelsTest, RunWithoutAResidentWeightSaysWhatIsMissing) {
  SKIP_WITHOUT_GPU();
  const GemmProblem problem{.m = 1,
                            .n = 16,
                            .k = 128,
                            .format = WeightFormat::kU4b8,
                            .group_size = 64,
                            .dtype = DType::kF16,
                            .threads = 1};
  std::vector<uint8_t> a(128 * 2), c(16 * 2);
  ThreadPool pool(1);
  const absl::Status status =
      CudaKernels().front()->Run(problem, {nullptr, a.data(), c.data()}, pool);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("GPU memory"), std::string::npos) << status;
}

TEST(CudaKernelsTest, UploadRefusesKNotAMultipleOf128) {
  SKIP_WITHOUT_GPU();
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 192, 16, 64}, FreshSeed());
  const absl::StatusOr<std::unique_ptr<CudaWeight>> b =
      CudaWeight::Upload(weight);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("multiple of 128"), std::string::npos)
      << b.status();
}

TEST(CudaKernelsTest, LaunchRefusesF32Activations) {
  SKIP_WITHOUT_GPU();
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 128, 16, 64}, FreshSeed());
  absl::StatusOr<std::unique_ptr<CudaWeight>> b = CudaWeight::Upload(weight);
  ASSERT_TRUE(b.ok()) << b.status();
  DeviceArray a(128 * 4), c(16 * 4);
  Workspace workspace;
  const absl::Status status = LaunchGemm({.variant = KernelVariant::kFused,
                                          .b = b->get(),
                                          .a = a.data(),
                                          .a_dtype = DType::kF32,
                                          .c = c.data(),
                                          .c_dtype = DType::kF32,
                                          .m = 1},
                                         workspace, nullptr);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
}

TEST(CudaKernelsTest, EveryVariantAndFormatHasAKernel) {
  SKIP_WITHOUT_GPU();
  EXPECT_EQ(CudaKernels().size(), 3 * std::size(kAllWeightFormats));
  for (const GemmKernel* kernel : CudaKernels()) {
    EXPECT_NE(kernel->name().find(KernelVariantName(kernel->variant())),
              std::string::npos)
        << kernel->name();
  }
}

}  // namespace
}  // namespace nibble::cuda
