// Tests every CPU kernel against the float64 reference on random problems.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/thread_pool.h"
#include "format/dequant.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/format_kernel.h"
#include "kernels/cpu/segments.h"
#include "kernels/gemm_kernel.h"
#include "kernels/packed_weight.h"
#include "tests/kernels/encoded_values.h"

namespace nibble {
namespace {

using ::nibble::testing::Decode;
using ::nibble::testing::Encode;
using ::nibble::testing::Encoded;

constexpr int kThreads = 2;
constexpr int64_t kGuardBytes = 64;
constexpr uint8_t kGuardByte = 0xa5;

struct Shape {
  int64_t m;
  int64_t k;
  int64_t n;
  int64_t group_size;
};

// Odd and even M, including M > 32 and M not a multiple of the 4 rows the
// fused kernel handles at once; N with and without a partial last panel; every
// group size, per-channel (group = K) included, and a group longer than the
// 512 rows the double-buffered kernels take at once. The formats with a fixed
// group size (kMxfp4, kNvfp4) take each shape at their own group, where K
// allows.
constexpr Shape kShapes[] = {
    {1, 128, 8, 32},     {3, 256, 40, 64},    {5, 512, 72, 128},
    {7, 384, 80, 128},   {17, 256, 40, 256},  {4, 64, 16, 32},
    {33, 192, 24, 64},   {2, 200, 72, 200},   {17, 512, 8, 32},
    {6, 128, 56, 128},   {1, 32, 16, 32},     {3, 64, 8, 64},
    {40, 1024, 40, 128}, {9, 1024, 24, 1024},
};

// kNvfp4's global scale in these tests: far from 1, so that a kernel that
// drops it fails.
constexpr float kNvfp4GlobalScale = 0.0123f;

// The bit that negates a scale slot of `format`; 0 for kMxfp4, whose E8M0
// scales are unsigned.
uint16_t ScaleSignBit(WeightFormat format) {
  switch (format) {
    case WeightFormat::kMxfp4:
      return 0;
    case WeightFormat::kNvfp4:
      return 0x80;  // E4M3 in the low byte
    default:
      return 0x8000;  // fp16
  }
}

struct KernelCase {
  const cpu::CpuKernel* entry;
  GemmProblem problem;
  uint64_t seed;
};

void PrintTo(const KernelCase& kernel_case, std::ostream* os) {
  *os << kernel_case.entry->kernel->name() << " "
      << kernel_case.problem.DebugString() << " seed=" << kernel_case.seed;
}

// A case's seed, from its kernel and problem alone (FNV-1a of their names,
// the same in every run, unlike absl::Hash), so that adding or removing
// kernels leaves every other case's data as it was.
uint64_t SeedOf(const GemmKernel& kernel, const GemmProblem& problem) {
  uint64_t hash = 14695981039346656037u;
  for (const char c : absl::StrCat(kernel.name(), " ", problem.DebugString())) {
    hash = (hash ^ static_cast<uint8_t>(c)) * 1099511628211u;
  }
  return hash;
}

std::string CaseName(const KernelCase& kernel_case) {
  const GemmProblem& problem = kernel_case.problem;
  const std::string group = problem.group_size == problem.k
                                ? "per_channel"
                                : absl::StrCat("g", problem.group_size);
  return absl::StrCat(kernel_case.entry->kernel->name(), "_m", problem.m, "_k",
                      problem.k, "_n", problem.n, "_", group, "_",
                      DTypeName(problem.dtype));
}

// A kernel made for two levels (cpu::CpuKernel::lowest_level) is tested once
// per problem, as the first entry that takes it.
std::vector<KernelCase> AllKernelCases() {
  std::vector<KernelCase> cases;
  std::set<std::string> names;
  for (const cpu::CpuKernel& entry : cpu::AllCpuKernels()) {
    for (WeightFormat format : kAllWeightFormats) {
      for (const Shape& shape : kShapes) {
        const int64_t group_size = FixedGroupSize(format) > 0
                                       ? FixedGroupSize(format)
                                       : shape.group_size;
        if (shape.k % group_size != 0) continue;
        for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
          const GemmProblem problem{
              .m = shape.m,
              .n = shape.n,
              .k = shape.k,
              .format = format,
              .group_size = group_size,
              .dtype = dtype,
              .threads = kThreads,
              .activation_precision = ActivationPrecision::kInt8};
          if (!entry.kernel->Supports(problem)) continue;
          const KernelCase kernel_case{&entry, problem,
                                       SeedOf(*entry.kernel, problem)};
          if (names.insert(CaseName(kernel_case)).second) {
            cases.push_back(kernel_case);
          }
        }
      }
    }
  }
  return cases;
}

std::string KernelCaseName(const ::testing::TestParamInfo<KernelCase>& info) {
  return CaseName(info.param);
}

// An int8 kernel rounds each A[i, k] to a multiple of its row's and
// segment's scale, at most max_k |A[i, k]| / 127, so by at most half that;
// the weights stay exact. Each C[i, j] is then off the float64 reference by
// at most (max_k |A[i, k]| / 254) * sum_k |B[k, j]|, plus fp32 accumulation
// (1e-5 of the same sum) and the rounding of C to its dtype.
void ExpectWithinInt8Bound(const std::vector<double>& a,
                           const QuantizedWeight& weight,
                           const GemmProblem& problem,
                           const std::vector<double>& got,
                           const std::vector<double>& want) {
  const std::vector<double> b = ReferenceDequantize(weight);
  std::vector<double> column_abs_sums(problem.n, 0.0);
  for (int64_t k = 0; k < problem.k; ++k) {
    for (int64_t j = 0; j < problem.n; ++j) {
      column_abs_sums[j] += std::abs(b[k * problem.n + j]);
    }
  }
  const double output_rounding = problem.dtype == DType::kF32   ? 0.0
                                 : problem.dtype == DType::kF16 ? 0x1p-11
                                                                : 0x1p-8;
  int64_t outside = 0;
  for (int64_t i = 0; i < problem.m; ++i) {
    double row_max = 0.0;
    for (int64_t k = 0; k < problem.k; ++k) {
      row_max = std::max(row_max, std::abs(a[i * problem.k + k]));
    }
    for (int64_t j = 0; j < problem.n; ++j) {
      const double sum = column_abs_sums[j];
      const double bound = row_max / 254.0 * sum + 1e-5 * row_max * sum +
                           output_rounding * std::abs(want[i * problem.n + j]);
      const double error =
          std::abs(got[i * problem.n + j] - want[i * problem.n + j]);
      if (!(error <= bound) && ++outside <= 3) {
        ADD_FAILURE() << "C[" << i << ", " << j
                      << "] = " << got[i * problem.n + j] << ", reference "
                      << want[i * problem.n + j] << ": off by " << error
                      << ", more than the int8 bound " << bound;
      }
    }
  }
  EXPECT_EQ(outside, 0) << "elements outside the int8 bound";

  // That rounding is all it may lose: on A quantized as the contract says
  // (per row and segment, to nearest, with the fp32 arithmetic of the
  // kernels: a product a half step from a rounding boundary in double may
  // round the other way in fp32) it must be as close as an fp32 kernel.
  std::vector<double> quantized = a;
  for (int64_t i = 0; i < problem.m; ++i) {
    for (const cpu::Segment& segment :
         cpu::Segments(problem.k, problem.group_size)) {
      double* values = quantized.data() + i * problem.k + segment.k;
      double largest = 0.0;
      for (int64_t k = 0; k < segment.len; ++k) {
        largest = std::max(largest, std::abs(values[k]));
      }
      const float scale = static_cast<float>(largest) / 127.0f;
      const float inverse = 127.0f / static_cast<float>(largest);
      for (int64_t k = 0; k < segment.len && largest > 0; ++k) {
        values[k] =
            scale * std::nearbyint(static_cast<float>(values[k]) * inverse);
      }
    }
  }
  EXPECT_LE(
      MaxRelativeError(got, ReferenceMatmul(quantized, problem.m, weight)),
      problem.dtype == DType::kF32 ? 1e-4 : 1e-2)
      << "against A quantized to int8";
}

class KernelTest : public ::testing::TestWithParam<KernelCase> {};

TEST_P(KernelTest, MatchesTheFloat64Reference) {
  const cpu::CpuKernel& entry = *GetParam().entry;
  const GemmProblem& problem = GetParam().problem;
  const uint64_t seed = GetParam().seed;
  if (entry.isa > cpu::DetectIsa()) {
    GTEST_SKIP() << entry.kernel->name() << " needs " << cpu::IsaName(entry.isa)
                 << ", this CPU runs " << cpu::IsaName(cpu::DetectIsa());
  }
  SCOPED_TRACE(absl::StrCat("seed=", seed, " ", problem.DebugString()));

  const WeightSpec spec{
      problem.format, problem.k, problem.n, problem.group_size,
      problem.format == WeightFormat::kNvfp4 ? kNvfp4GlobalScale : 1.0f};
  QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
  std::mt19937_64 rng(seed);
  // Random scales are positive; negate about half so that signs matter.
  for (uint16_t& scale : weight.scales) {
    if (rng() & 1) scale ^= ScaleSignBit(problem.format);
  }
  const absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(weight);
  ASSERT_TRUE(packed.ok()) << packed.status();

  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> activations(problem.m * problem.k);
  for (float& value : activations) value = uniform(rng);
  const Encoded a = Encode(problem.dtype, activations);

  // All-ones bytes are NaN in f32, f16 and bf16: unwritten outputs fail. A
  // guard past the end catches writes out of bounds.
  const size_t c_bytes = problem.m * problem.n * DTypeSize(problem.dtype);
  std::vector<uint8_t> c(c_bytes + kGuardBytes, 0xff);
  std::fill(c.begin() + c_bytes, c.end(), kGuardByte);
  ThreadPool pool(kThreads);
  const absl::Status status =
      entry.kernel->Run(problem, {&*packed, a.bytes.data(), c.data()}, pool);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(std::count(c.begin() + c_bytes, c.end(), kGuardByte), kGuardBytes)
      << "wrote past the end of C";
  c.resize(c_bytes);

  const std::vector<double> got = Decode(problem.dtype, c);
  const std::vector<double> want = ReferenceMatmul(a.values, problem.m, weight);
  if (entry.kernel->QuantizesActivationsToInt8()) {
    ExpectWithinInt8Bound(a.values, weight, problem, got, want);
    return;
  }
  const ActivationPrecision precision =
      ActivationPrecisionOf(*entry.kernel, problem.dtype);
  EXPECT_LE(MaxRelativeError(got, want),
            MatmulErrorBound(precision, problem.dtype));
  if (precision == ActivationPrecision::kBf16 && problem.dtype == DType::kF32) {
    // A rounded to bf16 is all the precision such a kernel may lose: on that
    // A it must be as close as an fp32 kernel, the weights staying exact.
    std::vector<double> rounded = a.values;
    for (double& value : rounded) {
      value = Bf16ToFloat(FloatToBf16(static_cast<float>(value)));
    }
    EXPECT_LE(
        MaxRelativeError(got, ReferenceMatmul(rounded, problem.m, weight)),
        1e-4)
        << "against A rounded to bf16";
  }
}

INSTANTIATE_TEST_SUITE_P(AllCpuKernels, KernelTest,
                         ::testing::ValuesIn(AllKernelCases()), KernelCaseName);

// The parameterized test above only proves the kernels it finds; this one
// proves that every variant exists for every format at every vector ISA.
TEST(CpuKernelCoverageTest, EveryIsaHasOneKernelPerVariantAndFormat) {
  for (WeightFormat format : kAllWeightFormats) {
    const GemmProblem problem{
        .m = 1,
        .n = 16,
        .k = 32,
        .format = format,
        .group_size = FixedGroupSize(format) > 0 ? FixedGroupSize(format) : 32,
        .dtype = DType::kF32,
        .threads = 1,
        .activation_precision = ActivationPrecision::kInt8};
    for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512}) {
      for (KernelVariant variant :
           {KernelVariant::kFused, KernelVariant::kDoubleBuffered,
            KernelVariant::kStriped}) {
        int supporting = 0;
        for (const cpu::CpuKernel& entry : cpu::AllCpuKernels()) {
          if (entry.isa == isa && entry.kernel->variant() == variant &&
              entry.kernel->Supports(problem)) {
            ++supporting;
          }
        }
        EXPECT_EQ(supporting, 1)
            << WeightFormatName(format) << " " << KernelVariantName(variant)
            << " " << cpu::IsaName(isa);
      }
    }
    // Every format's codes are exact int8 (or the format would fall back);
    // only groups shorter than 32 rows (nvfp4's) have no int8 kernel. Int8
    // kernels take problems of cpu::kMinConvertedRows rows or more.
    GemmProblem int8_problem = problem;
    int8_problem.m = cpu::kMinConvertedRows;
    int int8_kernels = 0;
    for (const cpu::CpuKernel& entry : cpu::AllCpuKernels()) {
      if (entry.isa == cpu::Isa::kAvx512Vnni &&
          entry.kernel->QuantizesActivationsToInt8() &&
          entry.kernel->Supports(int8_problem)) {
        ++int8_kernels;
      }
    }
    EXPECT_EQ(int8_kernels,
              FixedGroupSize(format) == 0 || FixedGroupSize(format) >= 32)
        << WeightFormatName(format) << " int8";
  }
}

// The AMX kernels multiply kNvfp4's E4M3 scales into the bf16 tile values;
// that is exact only because every such product fits bf16.
TEST(AmxNvfp4Test, EveryFp4ValueTimesEveryE4m3ScaleIsExactInBf16) {
  for (int code = 0; code < 16; ++code) {
    for (int scale = 0; scale < 256; ++scale) {
      if (IsE4m3Nan(static_cast<uint8_t>(scale))) continue;
      const float product = Fp4CodeToFloat(static_cast<uint8_t>(code)) *
                            E4m3ToFloat(static_cast<uint8_t>(scale));
      EXPECT_EQ(Bf16ToFloat(FloatToBf16(product)), product)
          << "code " << code << " scale " << scale;
    }
  }
}

}  // namespace
}  // namespace nibble
