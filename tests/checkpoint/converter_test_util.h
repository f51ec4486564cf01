// Helpers that the converters' tests share: the one layer prefix they write
// their tensors under, finding and reshaping those tensors by suffix, valid
// FP4 block layers to break, and the checks that a converted weight is
// exactly its producer's and that an error names the tensor at fault.
//
// Example:
//   std::vector<Tensor> tensors = ValidNvfp4();
//   Reshape(Find(tensors, "weight_scale"), {4, 2});
//   ExpectError(ConvertNvfp4Weight(MakeFile(tensors), kPrefix).status(),
//               absl::StatusCode::kInvalidArgument, "weight_scale",
//               "should be [4, 4]");
#ifndef NIBBLE_TESTS_CHECKPOINT_CONVERTER_TEST_UTIL_H_
#define NIBBLE_TESTS_CHECKPOINT_CONVERTER_TEST_UTIL_H_

#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/checkpoint/producer_layers.h"

namespace nibble::checkpoint::testing {

inline constexpr absl::string_view kPrefix = "model.layers.0.self_attn.q_proj";

// PREFIX.suffix.
inline std::string Name(absl::string_view suffix) {
  return absl::StrCat(kPrefix, ".", suffix);
}

// The tensor named PREFIX.suffix.
inline Tensor& Find(std::vector<Tensor>& tensors, absl::string_view suffix) {
  for (Tensor& tensor : tensors) {
    if (tensor.name == Name(suffix)) return tensor;
  }
  ADD_FAILURE() << "no tensor " << suffix;
  return tensors.front();
}

// The tensor named PREFIX_SUFFIX (the MXFP4 convention).
inline Tensor& FindUnderscored(std::vector<Tensor>& tensors,
                               absl::string_view suffix) {
  for (Tensor& tensor : tensors) {
    if (tensor.name == absl::StrCat(kPrefix, "_", suffix)) return tensor;
  }
  ADD_FAILURE() << "no tensor _" << suffix;
  return tensors.front();
}

// Sets a tensor's shape, resizing its bytes to match.
inline void Reshape(Tensor& tensor, std::vector<int64_t> shape) {
  int64_t elements = 1;
  for (int64_t d : shape) elements *= d;
  tensor.shape = std::move(shape);
  tensor.bytes.resize(elements * SafetensorsDtypeBytes(tensor.dtype), '\x11');
}

// Checks that `status` has `code` and a message naming PREFIX.tensor and
// holding `detail`.
inline void ExpectError(const absl::Status& status, absl::StatusCode code,
                        absl::string_view tensor, absl::string_view detail) {
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(status.message(),
              ::testing::AllOf(::testing::HasSubstr(Name(tensor)),
                               ::testing::HasSubstr(detail)));
}

// Checks that row r of `weight` dequantizes exactly to row order[r] of `want`
// (row r when `order` is empty), and that A' · weight == A · want with
// A'[:, r] = A[:, order[r]].
inline void ExpectEquivalent(const QuantizedWeight& weight,
                             const ProducerWeight& want,
                             const std::vector<int32_t>& order, uint64_t seed) {
  ASSERT_TRUE(weight.Validate().ok()) << weight.Validate();
  ASSERT_EQ(weight.spec.k, want.k);
  ASSERT_EQ(weight.spec.n, want.n);
  const auto source_row = [&](int64_t r) {
    return order.empty() ? r : order[r];
  };
  const std::vector<double> b = ReferenceDequantize(weight);
  for (int64_t r = 0; r < want.k; ++r) {
    for (int64_t col = 0; col < want.n; ++col) {
      ASSERT_EQ(b[r * want.n + col], want.Dequantized(source_row(r), col))
          << "row " << r << " column " << col;
    }
  }

  constexpr int64_t kM = 3;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> a(kM * want.k);
  for (double& value : a) value = uniform(rng);
  std::vector<double> want_c(kM * want.n, 0.0);
  std::vector<double> permuted_a(kM * want.k);
  for (int64_t m = 0; m < kM; ++m) {
    for (int64_t row = 0; row < want.k; ++row) {
      for (int64_t col = 0; col < want.n; ++col) {
        want_c[m * want.n + col] +=
            a[m * want.k + row] * want.Dequantized(row, col);
      }
      permuted_a[m * want.k + row] = a[m * want.k + source_row(row)];
    }
  }
  EXPECT_LE(MaxRelativeError(ReferenceMatmul(permuted_a, kM, weight), want_c),
            1e-12);
}

// Shapes of the GPTQ and AWQ layers.
struct Shape {
  int64_t k, n, group_size;
};
inline constexpr Shape kShapes[] = {
    {256, 64, 32}, {128, 16, 128}, {256, 24, 64}};

// A [N, K] PREFIX.weight of `dtype` holding `values` (rounded to the dtype).
inline SafetensorsFile FloatFile(SafetensorsDtype dtype, int64_t n, int64_t k,
                                 const std::vector<float>& values) {
  return MakeFile({FloatWeightTensor(kPrefix, dtype, n, k, values)});
}

// An MXFP4 layer of two experts [4, 64].
inline std::vector<Tensor> ValidMxfp4() {
  return Mxfp4Tensors(kPrefix, {RandomFp4ProducerWeight(50, 4, 64, 32),
                                RandomFp4ProducerWeight(51, 4, 64, 32)});
}

// An NVFP4 layer [4, 64].
inline std::vector<Tensor> ValidNvfp4() {
  return Nvfp4Tensors(kPrefix, RandomFp4ProducerWeight(52, 4, 64, 16));
}

}  // namespace nibble::checkpoint::testing

#endif  // NIBBLE_TESTS_CHECKPOINT_CONVERTER_TEST_UTIL_H_
