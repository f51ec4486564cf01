// Checkpoint layers written the way their producers write them, for tests of
// the code that reads them: GPTQ tensors packed as AutoGPTQ packs them, AWQ
// tensors as AutoAWQ does, and float weights [N, K] as PyTorch's nn.Linear
// stores them. The packing is written here from the producers' code,
// independently of checkpoint/convert.cc, so that a test of the converter
// does not check it against itself.
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
#include "checkpoint/convert.h"
#include "checkpoint/safetensors.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"

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
