// Reading and writing nibble's canonical tensor files: raw little-endian bytes
// with no header, so a file's size alone says whether it fits a shape.
//
//   qweight [K/8, N] uint32   scales [K/group, N] fp16   zeros [K/group, N]
//   uint8 (u4 only)           matrices [rows, cols] of a DType, row-major
//
// Example:
//   nibble::WeightSpec spec{nibble::WeightFormat::kU4, 4096, 4096, 128};
//   absl::StatusOr<nibble::QuantizedWeight> weight = nibble::ReadWeightFiles(
//       spec, {.qweight = "q.bin", .scales = "s.bin", .zeros = "z.bin"});
//   absl::StatusOr<std::string> a =
//       nibble::ReadMatrixFile("a.bin", m, spec.k, nibble::DType::kBF16);
#ifndef NIBBLE_CLIENT_WEIGHT_FILES_H_
#define NIBBLE_CLIENT_WEIGHT_FILES_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/dtype.h"
#include "format/weight_format.h"

namespace nibble {

struct WeightFilePaths {
  std::string qweight;
  std::string scales;
  // Only for u4, the one format with zero points; empty otherwise.
  std::string zeros;
};

// Reads a weight of `spec` from its files. A file whose size does not match
// the spec, a zeros path given or missing against the format, or a zero point
// above 15 give InvalidArgument naming the file.
absl::StatusOr<QuantizedWeight> ReadWeightFiles(const WeightSpec& spec,
                                                const WeightFilePaths& paths);

// Where a weight's data comes from: a seed of RandomQuantizedWeight, or else
// its canonical files.
struct WeightSource {
  std::optional<uint64_t> seed;
  WeightFilePaths paths;
};

// How to give a weight's data, for error messages.
inline constexpr absl::string_view kWeightSourceHint =
    "--qweight FILE --scales FILE [--zeros FILE], or --random SEED";

// The source named by the optional flags --random, --qweight, --scales and
// --zeros; nullopt when none is given. InvalidArgument, saying what to add or
// drop, for both ways at once, a missing file or zeros against the format.
absl::StatusOr<std::optional<WeightSource>> MakeWeightSource(
    WeightFormat format, std::optional<uint64_t> seed,
    const std::optional<std::string>& qweight,
    const std::optional<std::string>& scales,
    const std::optional<std::string>& zeros);

// The weight of `spec` from its source.
absl::StatusOr<QuantizedWeight> LoadWeight(const WeightSpec& spec,
                                           const WeightSource& source);

// Writes each tensor of `weight` to its file; `paths.zeros` only for u4.
absl::Status WriteWeightFiles(const QuantizedWeight& weight,
                              const WeightFilePaths& paths);

// The bytes of a [rows, cols] matrix of `dtype` (activations A [M, K] or
// outputs C [M, N]); InvalidArgument naming the file when its size differs
// from rows * cols * DTypeSize(dtype).
absl::StatusOr<std::string> ReadMatrixFile(absl::string_view path, int64_t rows,
                                           int64_t cols, DType dtype);

// Writes `bytes` after checking that they hold a [rows, cols] matrix of
// `dtype`.
absl::Status WriteMatrixFile(absl::string_view path, int64_t rows, int64_t cols,
                             DType dtype, absl::string_view bytes);

}  // namespace nibble

#endif  // NIBBLE_CLIENT_WEIGHT_FILES_H_
