// Checkpoint layers written the way their producers write them, for tests of
// the code that reads them: GPTQ tensors packed as AutoGPTQ packs them, AWQ
// tensors as AutoAWQ does, MXFP4 tensors as OpenAI's gpt-oss checkpoints
// hold them, NVFP4 tensors as NVIDIA's ModelOpt exports them, and float
// weights [N, K] as PyTorch's nn.Linear stores them. The packing is written
// here from the producers' code, independently of the converters in
// checkpoint/, so that a test of a converter does not check it against
// itself.
//
// Example:
//   const ProducerWeight w = RandomProducerWeight(/*seed=*/7, 256, 64, 32,
//                                                 /*zero_lo=*/8,
//                                                 /*zero_hi=*/8);
//   std::vector<Tensor> tensors =
//       GptqTensors("layers.0.q_proj", w, GptqZeroConvention::kV1);
//   tensors.push_back(GIdxTensor("layers.0.q_proj", w));
//   const SafetensorsFile file = MakeFile(tensors);
//   double w_17_3 = w.Dequantized(17, 3);  // what the converter must keep
#ifndef NIBBLE_TESTS_CHECKPOINT_PRODUCER_LAYERS_H_
#define NIBBLE_TESTS_CHECKPOINT_PRODUCER_LAYERS_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/gptq.h"
#include "checkpoint/safetensors.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "gtest/gtest.h"

namespace nibble::checkpoint::testing {

// The bytes of `values` as a safetensors file stores them (little-endian,
// which is also this host's order).
template <typename T>
std::string Bytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A tensor that owns its bytes, so that tests can edit it before writing.
struct Tensor {
  std::string name;
  SafetensorsDtype dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

// The safetensors file holding `tensors`, as bytes to write to disk.
inline std::string SerializeTensors(const std::vector<Tensor>& tensors) {
  std::vector<NamedTensorBytes> views;
  for (const Tensor& tensor : tensors) {
    views.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.bytes});
  }
  absl::StatusOr<std::string> bytes = SerializeSafetensors(views);
  EXPECT_TRUE(bytes.ok()) << bytes.status();
  return bytes.ok() ? *std::move(bytes) : "";
}

// The safetensors file holding `tensors`, in memory as "test.safetensors".
inline SafetensorsFile MakeFile(const std::vector<Tensor>& tensors) {
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::FromBytes(SerializeTensors(tensors), "test.safetensors");
  EXPECT_TRUE(file.ok()) << file.status();
  return *std::move(file);
}

// A quantized weight as its producer sees it, before packing.
struct ProducerWeight {
  int64_t k = 0;
  int64_t n = 0;
  int64_t groups = 0;
  std::vector<uint8_t> codes;         // [K, N]
  std::vector<uint8_t> zeros;         // [groups, N], the real zero points
  std::vector<uint16_t> scales;       // [groups, N], fp16 bits
  std::vector<int32_t> group_of_row;  // [K]

  double Dequantized(int64_t row, int64_t col) const {
    const int64_t g = group_of_row[row];
    return (static_cast<double>(codes[row * n + col]) - zeros[g * n + col]) *
           HalfToFloat(scales[g * n + col]);
  }
};

// Random codes, zero points in [zero_lo, zero_hi] and scales, with row k in
// group k / group_size.
inline ProducerWeight RandomProducerWeight(uint64_t seed, int64_t k, int64_t n,
                                           int64_t group_size, int zero_lo,
                                           int zero_hi) {
  std::mt19937_64 rng(seed);
  ProducerWeight w{k, n, k / group_size, {}, {}, {}, {}};
  w.codes.resize(k * n);
  for (uint8_t& code : w.codes) code = rng() & 0xf;
  w.zeros.resize(w.groups * n);
  std::uniform_int_distribution<int> zero(zero_lo, zero_hi);
  for (uint8_t& z : w.zeros) z = zero(rng);
  w.scales.resize(w.groups * n);
  std::uniform_real_distribution<float> scale(0x1p-8f, 0x1p-4f);
  for (uint16_t& s : w.scales) s = FloatToHalf(scale(rng));
  w.group_of_row.resize(k);
  for (int64_t row = 0; row < k; ++row) w.group_of_row[row] = row / group_size;
  return w;
}

// AutoGPTQ's packing: qweight [K/8, N], row 8i + j in bits 4j of word [i, n].
inline std::vector<int32_t> PackGptqQweight(const ProducerWeight& w) {
  std::vector<uint32_t> packed(w.k / 8 * w.n, 0);
  for (int64_t row = 0; row < w.k; ++row) {
    for (int64_t col = 0; col < w.n; ++col) {
      packed[row / 8 * w.n + col] |= uint32_t{w.codes[row * w.n + col]}
                                     << (4 * (row % 8));
    }
  }
  return std::vector<int32_t>(packed.begin(), packed.end());
}

// Packs [rows, N] 4-bit values into [rows, N/8] words, nibble j of word
// [r, c] holding column 8c + column_of_nibble[j] (AutoGPTQ's qzeros with
// the identity, AutoAWQ's qweight and qzeros with AWQ_ORDER).
inline std::vector<int32_t> PackColumns(
    const std::vector<uint8_t>& values, int64_t rows, int64_t n,
    absl::Span<const int> column_of_nibble) {
  std::vector<int32_t> packed(rows * n / 8, 0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < n / 8; ++c) {
      uint32_t word = 0;
      for (int j = 0; j < 8; ++j) {
        word |= uint32_t{values[r * n + 8 * c + column_of_nibble[j]] & 0xfu}
                << (4 * j);
      }
      packed[r * n / 8 + c] = static_cast<int32_t>(word);
    }
  }
  return packed;
}

inline constexpr int kIdentityOrder[8] = {0, 1, 2, 3, 4, 5, 6, 7};
// AutoAWQ's AWQ_ORDER, as its from_linear packs: order_map[i] is the column
// offset that goes to bits 4i.
inline constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// The GPTQ tensors PREFIX.qweight, .qzeros and .scales of `w`, zero points
// stored as `zero_convention` says.
inline std::vector<Tensor> GptqTensors(absl::string_view prefix,
                                       const ProducerWeight& w,
                                       GptqZeroConvention zero_convention) {
  std::vector<uint8_t> stored_zeros = w.zeros;
  if (zero_convention == GptqZeroConvention::kV1) {
    for (uint8_t& z : stored_zeros) z = (z - 1) & 0xf;
  }
  return {
      {absl::StrCat(prefix, ".qweight"),
       SafetensorsDtype::kI32,
       {w.k / 8, w.n},
       Bytes(PackGptqQweight(w))},
      {absl::StrCat(prefix, ".qzeros"),
       SafetensorsDtype::kI32,
       {w.groups, w.n / 8},
       Bytes(PackColumns(stored_zeros, w.groups, w.n, kIdentityOrder))},
      {absl::StrCat(prefix, ".scales"),
       SafetensorsDtype::kF16,
       {w.groups, w.n},
       Bytes(w.scales)},
  };
}

// PREFIX.g_idx of `w`: the group of each row.
inline Tensor GIdxTensor(absl::string_view prefix, const ProducerWeight& w) {
  return {absl::StrCat(prefix, ".g_idx"),
          SafetensorsDtype::kI32,
          {w.k},
          Bytes(w.group_of_row)};
}

// The AWQ tensors PREFIX.qweight, .qzeros and .scales of `w`.
inline std::vector<Tensor> AwqTensors(absl::string_view prefix,
                                      const ProducerWeight& w) {
  return {
      {absl::StrCat(prefix, ".qweight"),
       SafetensorsDtype::kI32,
       {w.k, w.n / 8},
       Bytes(PackColumns(w.codes, w.k, w.n, kAwqOrder))},
      {absl::StrCat(prefix, ".qzeros"),
       SafetensorsDtype::kI32,
       {w.groups, w.n / 8},
       Bytes(PackColumns(w.zeros, w.groups, w.n, kAwqOrder))},
      {absl::StrCat(prefix, ".scales"),
       SafetensorsDtype::kF16,
       {w.groups, w.n},
       Bytes(w.scales)},
  };
}

// --- FP4 layers (MXFP4, NVFP4): codes of the weight W [N, K] = B^T.

// The E2M1 values of codes 0..15, as gpt-oss' FP4_VALUES lists them.
inline constexpr double kFp4Values[16] = {+0.0, +0.5, +1.0, +1.5, +2.0, +3.0,
                                          +4.0, +6.0, -0.0, -0.5, -1.0, -1.5,
                                          -2.0, -3.0, -4.0, -6.0};

// FP8 E4M3 (bias 7, no infinities) from its definition.
inline double E4m3Value(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  const double magnitude = exponent == 0
                               ? std::ldexp(mantissa, -9)
                               : std::ldexp(8 + mantissa, exponent - 10);
  return (bits & 0x80) ? -magnitude : magnitude;
}

// An MXFP4 or NVFP4 weight as its producer holds it before packing.
struct Fp4ProducerWeight {
  int64_t n = 0;
  int64_t k = 0;
  int64_t group_size = 0;       // 32 (MXFP4: E8M0 scales) or 16 (NVFP4)
  std::vector<uint8_t> codes;   // [N, K]
  std::vector<uint8_t> scales;  // [N, K / group_size], 8-bit codes
  float global_scale = 1.0f;    // NVFP4's weight_scale_2

  // Element [row, col] of B = W^T, in float64.
  double Dequantized(int64_t row, int64_t col) const {
    const uint8_t scale = scales[col * (k / group_size) + row / group_size];
    const double s = group_size == 32 ? std::ldexp(1.0, scale - 127)
                                      : E4m3Value(scale) * global_scale;
    return kFp4Values[codes[col * k + row]] * s;
  }
};

// Checks that `weight` is valid and dequantizes exactly to the producer's
// B = W^T.
inline void ExpectDequantizesTo(const QuantizedWeight& weight,
                                const Fp4ProducerWeight& want) {
  ASSERT_TRUE(weight.Validate().ok()) << weight.Validate();
  ASSERT_EQ(weight.spec.k, want.k);
  ASSERT_EQ(weight.spec.n, want.n);
  const std::vector<double> b = ReferenceDequantize(weight);
  for (int64_t row = 0; row < want.k; ++row) {
    for (int64_t col = 0; col < want.n; ++col) {
      ASSERT_EQ(b[row * want.n + col], want.Dequantized(row, col))
          << "row " << row << " column " << col;
    }
  }
}

// Random codes; MXFP4 exponents in [100, 150], NVFP4 scales among the
// positive finite E4M3 codes with a random global scale.
inline Fp4ProducerWeight RandomFp4ProducerWeight(uint64_t seed, int64_t n,
                                                 int64_t k,
                                                 int64_t group_size) {
  std::mt19937_64 rng(seed);
  Fp4ProducerWeight w{n, k, group_size, {}, {}, 1.0f};
  w.codes.resize(n * k);
  for (uint8_t& code : w.codes) code = rng() & 0xf;
  w.scales.resize(n * k / group_size);
  std::uniform_int_distribution<int> scale(group_size == 32 ? 100 : 0x01,
                                           group_size == 32 ? 150 : 0x7e);
  for (uint8_t& s : w.scales) s = scale(rng);
  if (group_size == 16) {
    w.global_scale = std::uniform_real_distribution<float>(1e-4f, 1e-2f)(rng);
  }
  return w;
}

// Two codes per byte, the even index of K in the lower nibble: gpt-oss reads
// `blocks & 0x0F` into the even positions, and ModelOpt packs
// (q[..., 1::2] << 4) | q[..., 0::2].
inline std::string PackFp4Codes(const std::vector<uint8_t>& codes) {
  std::string bytes(codes.size() / 2, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(codes[2 * i] | codes[2 * i + 1] << 4);
  }
  return bytes;
}

// gpt-oss' PREFIX<separator>blocks U8 [E, N, K/32, 16] and
// PREFIX<separator>scales U8 [E, N, K/32], one entry of E per expert; without
// the E dimension when `stacked` is false (one expert).
inline std::vector<Tensor> Mxfp4Tensors(
    absl::string_view prefix, const std::vector<Fp4ProducerWeight>& experts,
    absl::string_view separator = "_", bool stacked = true) {
  const Fp4ProducerWeight& first = experts.front();
  std::vector<int64_t> blocks_shape = {first.n, first.k / 32, 16};
  std::vector<int64_t> scales_shape = {first.n, first.k / 32};
  if (stacked) {
    const int64_t e = static_cast<int64_t>(experts.size());
    blocks_shape.insert(blocks_shape.begin(), e);
    scales_shape.insert(scales_shape.begin(), e);
  }
  std::string blocks, scales;
  for (const Fp4ProducerWeight& w : experts) {
    blocks += PackFp4Codes(w.codes);
    scales += Bytes(w.scales);
  }
  return {{absl::StrCat(prefix, separator, "blocks"), SafetensorsDtype::kU8,
           blocks_shape, std::move(blocks)},
          {absl::StrCat(prefix, separator, "scales"), SafetensorsDtype::kU8,
           scales_shape, std::move(scales)}};
}

// ModelOpt's PREFIX.weight U8 [N, K/2], .weight_scale F8_E4M3 [N, K/16],
// .weight_scale_2 F32 [] and .input_scale F32 [].
inline std::vector<Tensor> Nvfp4Tensors(absl::string_view prefix,
                                        const Fp4ProducerWeight& w) {
  return {{absl::StrCat(prefix, ".weight"),
           SafetensorsDtype::kU8,
           {w.n, w.k / 2},
           PackFp4Codes(w.codes)},
          {absl::StrCat(prefix, ".weight_scale"),
           SafetensorsDtype::kF8E4M3,
           {w.n, w.k / 16},
           Bytes(w.scales)},
          {absl::StrCat(prefix, ".weight_scale_2"),
           SafetensorsDtype::kF32,
           {},
           Bytes(std::vector<float>{w.global_scale})},
          {absl::StrCat(prefix, ".input_scale"),
           SafetensorsDtype::kF32,
           {},
           Bytes(std::vector<float>{0.5f})}};
}

// PREFIX.weight [N, K] of `dtype` (F16, BF16 or F32) holding `values`,
// rounded to the dtype.
inline Tensor FloatWeightTensor(absl::string_view prefix,
                                SafetensorsDtype dtype, int64_t n, int64_t k,
                                const std::vector<float>& values) {
  const DType element = dtype == SafetensorsDtype::kF16    ? DType::kF16
                        : dtype == SafetensorsDtype::kBF16 ? DType::kBF16
                                                           : DType::kF32;
  std::string bytes(values.size() * DTypeSize(element), '\0');
  ConvertFromFloat(element, values.data(), values.size(), bytes.data());
  return {absl::StrCat(prefix, ".weight"), dtype, {n, k}, std::move(bytes)};
}

}  // namespace nibble::checkpoint::testing

#endif  // NIBBLE_TESTS_CHECKPOINT_PRODUCER_LAYERS_H_
