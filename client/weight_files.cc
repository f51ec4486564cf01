#include "client/weight_files.h"

#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"

namespace nibble {
namespace {

// Files hold little-endian bytes, copied to and from host arrays as they are.
static_assert(std::endian::native == std::endian::little);

struct FileCloser {
  void operator()(std::FILE* file) const { std::fclose(file); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

// Reads the file at `path`, which must hold exactly `expected_bytes`. Errors
// name the file by `description`, e.g. `scales file "s.bin"`, and say what the
// size was expected for by `shape`.
absl::StatusOr<std::string> ReadSizedFile(absl::string_view path,
                                          absl::string_view description,
                                          absl::string_view shape,
                                          int64_t expected_bytes) {
  File file(std::fopen(std::string(path).c_str(), "rb"));
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot open ", description));
  }
  if (std::fseek(file.get(), 0, SEEK_END) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot seek ", description));
  }
  const long size = std::ftell(file.get());
  if (size < 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot size ", description));
  }
  if (size != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(description, " has ", size, " bytes, expected ",
                     expected_bytes, " for ", shape));
  }
  std::rewind(file.get());
  std::string bytes(expected_bytes, '\0');
  if (std::fread(bytes.data(), 1, bytes.size(), file.get()) != bytes.size()) {
    return absl::DataLossError(
        absl::StrCat("cannot read all of ", description));
  }
  return bytes;
}

absl::Status WriteFile(absl::string_view path, absl::string_view description,
                       absl::string_view bytes) {
  File file(std::fopen(std::string(path).c_str(), "wb"));
  if (file == nullptr) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot create ", description));
  }
  if (std::fwrite(bytes.data(), 1, bytes.size(), file.get()) != bytes.size() ||
      std::fclose(file.release()) != 0) {
    return absl::ErrnoToStatus(errno,
                               absl::StrCat("cannot write ", description));
  }
  return absl::OkStatus();
}

std::string Describe(absl::string_view tensor, absl::string_view path) {
  return absl::StrCat(tensor, " file \"", path, "\"");
}

template <typename T>
absl::Status ReadTensor(absl::string_view tensor, absl::string_view path,
                        absl::string_view shape, int64_t expected_bytes,
                        std::vector<T>& values) {
  absl::StatusOr<std::string> bytes =
      ReadSizedFile(path, Describe(tensor, path), shape, expected_bytes);
  if (!bytes.ok()) return bytes.status();
  values.resize(bytes->size() / sizeof(T));
  std::memcpy(values.data(), bytes->data(), bytes->size());
  return absl::OkStatus();
}

template <typename T>
absl::Status WriteTensor(absl::string_view tensor, absl::string_view path,
                         const std::vector<T>& values) {
  return WriteFile(
      path, Describe(tensor, path),
      absl::string_view(reinterpret_cast<const char*>(values.data()),
                        values.size() * sizeof(T)));
}

absl::Status CheckZerosPath(WeightFormat format, absl::string_view zeros_path) {
  if (HasZeros(format) && zeros_path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(WeightFormatName(format), " weights need a zeros file"));
  }
  if (!HasZeros(format) && !zeros_path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        WeightFormatName(format),
        " weights have no zero points, so no zeros file \"", zeros_path, "\""));
  }
  return absl::OkStatus();
}

std::string MatrixShape(int64_t rows, int64_t cols, DType dtype) {
  return absl::StrCat("a [", rows, ", ", cols, "] ", DTypeName(dtype),
                      " matrix");
}

int64_t MatrixBytes(int64_t rows, int64_t cols, DType dtype) {
  return rows * cols * static_cast<int64_t>(DTypeSize(dtype));
}

}  // namespace

absl::StatusOr<QuantizedWeight> ReadWeightFiles(const WeightSpec& spec,
                                                const WeightFilePaths& paths) {
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  if (absl::Status status = CheckZerosPath(spec.format, paths.zeros);
      !status.ok()) {
    return status;
  }
  const std::string description = spec.DebugString();
  QuantizedWeight weight;
  weight.spec = spec;
  if (absl::Status status =
          ReadTensor("qweight", paths.qweight,
                     absl::StrCat(description, " ([K/8, N] uint32)"),
                     spec.qweight_bytes(), weight.qweight);
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          ReadTensor("scales", paths.scales,
                     absl::StrCat(description, " ([K/group, N] fp16)"),
                     spec.scales_bytes(), weight.scales);
      !status.ok()) {
    return status;
  }
  if (HasZeros(spec.format)) {
    if (absl::Status status =
            ReadTensor("zeros", paths.zeros,
                       absl::StrCat(description, " ([K/group, N] uint8)"),
                       spec.zeros_bytes(), weight.zeros);
        !status.ok()) {
      return status;
    }
  }
  // The sizes are right, so what is left to reject is a zero point above 15.
  if (absl::Status status = weight.Validate(); !status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(Describe("zeros", paths.zeros), ": ", status.message()));
  }
  return weight;
}

absl::Status WriteWeightFiles(const QuantizedWeight& weight,
                              const WeightFilePaths& paths) {
  if (absl::Status status = CheckZerosPath(weight.spec.format, paths.zeros);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = weight.Validate(); !status.ok()) return status;
  if (absl::Status status =
          WriteTensor("qweight", paths.qweight, weight.qweight);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = WriteTensor("scales", paths.scales, weight.scales);
      !status.ok()) {
    return status;
  }
  if (HasZeros(weight.spec.format)) {
    return WriteTensor("zeros", paths.zeros, weight.zeros);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadMatrixFile(absl::string_view path, int64_t rows,
                                           int64_t cols, DType dtype) {
  return ReadSizedFile(path, absl::StrCat("file \"", path, "\""),
                       MatrixShape(rows, cols, dtype),
                       MatrixBytes(rows, cols, dtype));
}

absl::Status WriteMatrixFile(absl::string_view path, int64_t rows, int64_t cols,
                             DType dtype, absl::string_view bytes) {
  const int64_t expected_bytes = MatrixBytes(rows, cols, dtype);
  if (static_cast<int64_t>(bytes.size()) != expected_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot write \"", path, "\": ", bytes.size(), " bytes, expected ",
        expected_bytes, " for ", MatrixShape(rows, cols, dtype)));
  }
  return WriteFile(path, absl::StrCat("file \"", path, "\""), bytes);
}

absl::StatusOr<std::optional<WeightSource>> MakeWeightSource(
    WeightFormat format, std::optional<uint64_t> seed,
    const std::optional<std::string>& qweight,
    const std::optional<std::string>& scales,
    const std::optional<std::string>& zeros) {
  const bool any_file = qweight || scales || zeros;
  if (!seed && !any_file) return std::nullopt;
  if (seed && any_file) {
    return absl::InvalidArgumentError(absl::StrCat(
        "give the weight's data one way, not both: ", kWeightSourceHint));
  }
  if (seed) return WeightSource{seed, {}};
  if (!qweight || !scales) {
    return absl::InvalidArgumentError(
        "the weight's files need both --qweight FILE and --scales FILE");
  }
  if (HasZeros(format) && !zeros) {
    return absl::InvalidArgumentError(
        absl::StrCat(WeightFormatName(format),
                     " weights have zero points: add --zeros FILE"));
  }
  if (!HasZeros(format) && zeros) {
    return absl::InvalidArgumentError(
        absl::StrCat(WeightFormatName(format),
                     " weights have no zero points: drop --zeros"));
  }
  return WeightSource{std::nullopt, {*qweight, *scales, zeros.value_or("")}};
}

absl::StatusOr<QuantizedWeight> LoadWeight(const WeightSpec& spec,
                                           const WeightSource& source) {
  if (source.seed) return RandomQuantizedWeight(spec, *source.seed);
  return ReadWeightFiles(spec, source.paths);
}

}  // namespace nibble
