#include "checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/file_contents.h"
#include "nlohmann/json.hpp"

namespace nibble::checkpoint {
namespace {

using Json = nlohmann::json;

constexpr int64_t kLengthPrefixBytes = 8;
constexpr absl::string_view kMetadataKey = "__metadata__";

struct DtypeEntry {
  SafetensorsDtype dtype;
  absl::string_view name;
  int64_t bytes;
};

constexpr DtypeEntry kDtypes[] = {
    {SafetensorsDtype::kBool, "BOOL", 1},
    {SafetensorsDtype::kU8, "U8", 1},
    {SafetensorsDtype::kI8, "I8", 1},
    {SafetensorsDtype::kF8E4M3, "F8_E4M3", 1},
    {SafetensorsDtype::kF8E5M2, "F8_E5M2", 1},
    {SafetensorsDtype::kF8E8M0, "F8_E8M0", 1},
    {SafetensorsDtype::kU16, "U16", 2},
    {SafetensorsDtype::kI16, "I16", 2},
    {SafetensorsDtype::kF16, "F16", 2},
    {SafetensorsDtype::kBF16, "BF16", 2},
    {SafetensorsDtype::kU32, "U32", 4},
    {SafetensorsDtype::kI32, "I32", 4},
    {SafetensorsDtype::kF32, "F32", 4},
    {SafetensorsDtype::kU64, "U64", 8},
    {SafetensorsDtype::kI64, "I64", 8},
    {SafetensorsDtype::kF64, "F64", 8},
};

const DtypeEntry& EntryOf(SafetensorsDtype dtype) {
  for (const DtypeEntry& entry : kDtypes) {
    if (entry.dtype == dtype) return entry;
  }
  return kDtypes[0];  // unreachable for a valid enumerator
}

std::string KnownDtypeNames() {
  return absl::StrJoin(kDtypes, ", ",
                       [](std::string* out, const DtypeEntry& entry) {
                         absl::StrAppend(out, entry.name);
                       });
}

// The product of `shape` times `element_bytes`, or nullopt when a dimension
// is negative or the product overflows int64.
std::optional<int64_t> CheckedByteCount(absl::Span<const int64_t> shape,
                                        int64_t element_bytes) {
  int64_t product = element_bytes;
  for (int64_t dim : shape) {
    if (dim < 0 || __builtin_mul_overflow(product, dim, &product)) {
      return std::nullopt;
    }
  }
  return product;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

uint64_t LoadLittleEndianU64(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

void AppendLittleEndianU64(uint64_t value, std::string* out) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(value >> 8 * i));
}

// A JSON integer that fits int64_t, or nullopt for any other value.
std::optional<int64_t> JsonInt64(const Json& value) {
  if (value.is_number_unsigned()) {
    const uint64_t unsigned_value = value.get<uint64_t>();
    if (unsigned_value >
        static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<int64_t>(unsigned_value);
  }
  if (value.is_number_integer()) return value.get<int64_t>();
  return std::nullopt;
}

// Whether `text` can be written as a JSON string: nlohmann::json refuses
// (throws) on invalid UTF-8.
bool IsValidUtf8(absl::string_view text) {
  try {
    (void)Json(std::string(text)).dump();
    return true;
  } catch (const Json::exception&) {
    return false;
  }
}

// Interprets one tensor entry of the header. `prefix` starts the messages.
absl::StatusOr<TensorInfo> ParseTensorEntry(const std::string& prefix,
                                            const std::string& name,
                                            const Json& entry) {
  const std::string where = absl::StrCat(prefix, "tensor \"", name, "\"");
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": its entry must be a JSON object with dtype, shape and "
                     "data_offsets, not a ",
                     entry.type_name()));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": missing field \"", field, "\""));
    }
  }
  TensorInfo tensor;
  tensor.name = name;

  const Json& dtype = entry["dtype"];
  if (!dtype.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where,
                     ": \"dtype\" must be a string such as \"F16\", "
                     "not a ",
                     dtype.type_name()));
  }
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  const std::optional<SafetensorsDtype> known =
      SafetensorsDtypeFromName(dtype_name);
  if (!known.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": unsupported dtype \"", dtype_name,
                     "\"; the supported dtypes are ", KnownDtypeNames()));
  }
  tensor.dtype = *known;

  const Json& shape = entry["shape"];
  if (!shape.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": \"shape\" must be an array of integers, not a ",
                     shape.type_name()));
  }
  for (const Json& dim : shape) {
    const std::optional<int64_t> value = JsonInt64(dim);
    if (!value.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": \"shape\" must be an array of integers, but holds ",
          dim.dump(-1, ' ', false, Json::error_handler_t::replace)));
    }
    if (*value < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape ", ShapeString(tensor.shape),
                       " has a negative ", "dimension ", *value));
    }
    tensor.shape.push_back(*value);
  }

  const Json& offsets = entry["data_offsets"];
  std::optional<int64_t> begin, end;
  if (offsets.is_array() && offsets.size() == 2) {
    begin = JsonInt64(offsets[0]);
    end = JsonInt64(offsets[1]);
  }
  if (!begin.has_value() || !end.has_value() || *begin < 0 || *end < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": \"data_offsets\" must be [begin, end], two integers from 0 "
        "to 2^63-1, not ",
        offsets.dump(-1, ' ', false, Json::error_handler_t::replace)));
  }
  if (*begin > *end) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets [",
                                                   *begin, ", ", *end,
                                                   "] begin after they end"));
  }
  tensor.begin = *begin;
  tensor.end = *end;

  const std::optional<int64_t> bytes =
      CheckedByteCount(tensor.shape, SafetensorsDtypeBytes(tensor.dtype));
  if (!bytes.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": shape ", ShapeString(tensor.shape), " of ", dtype_name,
        " is too large: its size in bytes overflows a 64-bit integer"));
  }
  if (*bytes != tensor.num_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": shape ", ShapeString(tensor.shape), " of ", dtype_name,
        " needs ", *bytes, " bytes, but data_offsets [", tensor.begin, ", ",
        tensor.end, "] hold ", tensor.num_bytes()));
  }
  return tensor;
}

constexpr absl::string_view kIndexSuffix = ".index.json";

}  // namespace

absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype) {
  return EntryOf(dtype).name;
}

std::optional<SafetensorsDtype> SafetensorsDtypeFromName(
    absl::string_view name) {
  for (const DtypeEntry& entry : kDtypes) {
    if (entry.name == name) return entry.dtype;
  }
  return std::nullopt;
}

int64_t SafetensorsDtypeBytes(SafetensorsDtype dtype) {
  return EntryOf(dtype).bytes;
}

int64_t TensorInfo::num_elements() const {
  int64_t product = 1;
  for (int64_t dim : shape) product *= dim;
  return product;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  if (absl::EndsWith(path, kIndexSuffix)) return OpenIndex(path);
  return OpenFile(path);
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::OpenFile(
    const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer, forever,
  // before the check below could refuse it; regular files ignore it.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return FileError("open", path, errno);
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return FileError("stat", path, error);
  }
  if (!S_ISREG(info.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, ": not a regular file"));
  }
  // Checked before mapping, since an empty file cannot be mapped.
  if (info.st_size < kLengthPrefixBytes) {
    close(fd);
    return absl::DataLossError(absl::StrCat(
        path, ": the file is ", info.st_size,
        " bytes, shorter than the 8-byte header length: truncated or not a "
        "safetensors file"));
  }
  void* mapping =
      mmap(nullptr, info.st_size, PROT_READ, MAP_PRIVATE, fd, /*offset=*/0);
  const int error = errno;
  close(fd);  // the mapping keeps the file open
  if (mapping == MAP_FAILED) return FileError("map", path, error);

  SafetensorsFile file(path);
  file.mapped_ = static_cast<const uint8_t*>(mapping);
  file.mapped_size_ = info.st_size;
  // On an error `file` is destroyed here, which unmaps it.
  if (absl::Status status = file.ParseHeader(); !status.ok()) return status;
  return file;
}

absl::StatusOr<ShardIndex> ParseShardIndex(absl::string_view text,
                                           const std::string& path) {
  constexpr absl::string_view kShape =
      "an index is a JSON object whose \"weight_map\" maps tensor names to "
      "the safetensors files beside it that hold them";
  Json index;
  try {
    index = Json::parse(text);
  } catch (const Json::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not valid JSON (", error.what(), "); ", kShape));
  }
  if (!index.is_object() || !index.contains("weight_map") ||
      !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": no \"weight_map\" object; ", kShape));
  }
  ShardIndex parsed;
  for (const auto& [tensor, shard] : index["weight_map"].items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": weight_map entry \"", tensor, "\" is a ",
                       shard.type_name(), ", not a file name; ", kShape));
    }
    const std::string name = shard.get<std::string>();
    if (name.empty() || name == "." || name == ".." ||
        name.find('/') != std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": weight_map puts tensor \"", tensor, "\" in \"", name,
          "\", which is no file name: shards must lie beside the index"));
    }
    parsed.shard_of_tensor[tensor] = name;
  }
  if (index.contains("metadata") && index["metadata"].is_object()) {
    for (const auto& [key, value] : index["metadata"].items()) {
      parsed.metadata[key] =
          value.is_string() ? value.get<std::string>() : value.dump();
    }
  }
  return parsed;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::OpenIndex(
    const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileContents(path);
  if (!text.ok()) return text.status();
  absl::StatusOr<ShardIndex> index = ParseShardIndex(*text, path);
  if (!index.ok()) return index.status();

  SafetensorsFile checkpoint(path);
  checkpoint.metadata_ = std::move(index->metadata);
  const std::filesystem::path directory =
      std::filesystem::path(path).parent_path();
  std::vector<std::string> shard_names;
  for (const auto& [tensor, shard] : index->shard_of_tensor) {
    shard_names.push_back(shard);
  }
  std::sort(shard_names.begin(), shard_names.end());
  shard_names.erase(std::unique(shard_names.begin(), shard_names.end()),
                    shard_names.end());
  for (const std::string& name : shard_names) {
    absl::StatusOr<SafetensorsFile> shard =
        OpenFile((directory / name).string());
    if (!shard.ok()) {
      return absl::Status(
          shard.status().code(),
          absl::StrCat(path, ": shard ", name, ": ", shard.status().message()));
    }
    for (TensorInfo tensor : shard->tensors()) {
      tensor.shard = static_cast<int32_t>(checkpoint.shards_.size());
      checkpoint.tensors_.push_back(std::move(tensor));
    }
    checkpoint.shards_.push_back(*std::move(shard));
  }
  std::stable_sort(
      checkpoint.tensors_.begin(), checkpoint.tensors_.end(),
      [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  for (size_t i = 1; i < checkpoint.tensors_.size(); ++i) {
    const TensorInfo& first = checkpoint.tensors_[i - 1];
    const TensorInfo& second = checkpoint.tensors_[i];
    if (first.name == second.name) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor \"", first.name, "\" is in both ",
          shard_names[first.shard], " and ", shard_names[second.shard]));
    }
  }
  for (const auto& [name, shard] : index->shard_of_tensor) {
    const TensorInfo* tensor = checkpoint.Find(name);
    if (tensor == nullptr || shard_names[tensor->shard] != shard) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": weight_map puts tensor \"", name, "\" in ", shard,
          ", which has no such tensor",
          tensor == nullptr
              ? ""
              : absl::StrCat(" (", shard_names[tensor->shard], " has it)")));
    }
  }
  return checkpoint;
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::FromBytes(
    std::string bytes, absl::string_view source_name) {
  SafetensorsFile file{std::string(source_name)};
  file.owned_bytes_ = std::move(bytes);
  if (absl::Status status = file.ParseHeader(); !status.ok()) return status;
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : source_name_(std::move(other.source_name_)),
      mapped_(std::exchange(other.mapped_, nullptr)),
      mapped_size_(std::exchange(other.mapped_size_, 0)),
      owned_bytes_(std::move(other.owned_bytes_)),
      data_start_(other.data_start_),
      tensors_(std::move(other.tensors_)),
      shards_(std::move(other.shards_)),
      metadata_(std::move(other.metadata_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    source_name_ = std::move(other.source_name_);
    mapped_ = std::exchange(other.mapped_, nullptr);
    mapped_size_ = std::exchange(other.mapped_size_, 0);
    owned_bytes_ = std::move(other.owned_bytes_);
    data_start_ = other.data_start_;
    tensors_ = std::move(other.tensors_);
    shards_ = std::move(other.shards_);
    metadata_ = std::move(other.metadata_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (mapped_ != nullptr) {
    munmap(const_cast<uint8_t*>(mapped_), mapped_size_);
    mapped_ = nullptr;
    mapped_size_ = 0;
  }
}

absl::Span<const uint8_t> SafetensorsFile::bytes() const {
  if (mapped_ != nullptr) return {mapped_, mapped_size_};
  return {reinterpret_cast<const uint8_t*>(owned_bytes_.data()),
          owned_bytes_.size()};
}

const TensorInfo* SafetensorsFile::Find(absl::string_view name) const {
  const auto it =
      std::lower_bound(tensors_.begin(), tensors_.end(), name,
                       [](const TensorInfo& tensor, absl::string_view key) {
                         return tensor.name < key;
                       });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

absl::Span<const uint8_t> SafetensorsFile::Data(
    const TensorInfo& tensor) const {
  if (!shards_.empty()) return shards_[tensor.shard].Data(tensor);
  return bytes().subspan(data_start_ + tensor.begin, tensor.num_bytes());
}

void SafetensorsFile::Prefetch(const TensorInfo& tensor) const {
  if (!shards_.empty()) return shards_[tensor.shard].Prefetch(tensor);
  if (mapped_ == nullptr || tensor.num_bytes() == 0) return;
  // madvise wants a page-aligned start; the advice is only a hint, so its
  // errors do not matter.
  const uintptr_t page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin =
      reinterpret_cast<uintptr_t>(mapped_ + data_start_ + tensor.begin);
  const uintptr_t aligned = begin & ~(page - 1);
  (void)madvise(reinterpret_cast<void*>(aligned),
                begin - aligned + tensor.num_bytes(), MADV_WILLNEED);
}

absl::Status SafetensorsFile::ParseHeader() {
  const absl::Span<const uint8_t> file = bytes();
  const std::string prefix = absl::StrCat(source_name_, ": ");
  const int64_t file_bytes = static_cast<int64_t>(file.size());
  if (file_bytes < kLengthPrefixBytes) {
    return absl::DataLossError(absl::StrCat(
        prefix, "the file is ", file_bytes,
        " bytes, shorter than the 8-byte header length: truncated or not a "
        "safetensors file"));
  }
  const uint64_t header_bytes = LoadLittleEndianU64(file.data());
  if (header_bytes > static_cast<uint64_t>(kMaxSafetensorsHeaderBytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "the header length is ", header_bytes,
                     " bytes, over the limit of ", kMaxSafetensorsHeaderBytes,
                     " (100 MiB): corrupt or not a safetensors file"));
  }
  if (static_cast<int64_t>(header_bytes) > file_bytes - kLengthPrefixBytes) {
    return absl::DataLossError(absl::StrCat(
        prefix, "the header length is ", header_bytes, " bytes, but only ",
        file_bytes - kLengthPrefixBytes,
        " follow the length: truncated or not a safetensors file"));
  }
  data_start_ = kLengthPrefixBytes + static_cast<int64_t>(header_bytes);
  const int64_t data_bytes = file_bytes - data_start_;
  const char* header_text =
      reinterpret_cast<const char*>(file.data()) + kLengthPrefixBytes;

  // nlohmann::json keeps the last of duplicate keys; a duplicate tensor name
  // is caught here instead, where each top-level key goes by.
  std::set<std::string> top_level_keys;
  std::optional<std::string> duplicate_key;
  Json header;
  try {
    header = Json::parse(
        header_text, header_text + header_bytes,
        [&](int depth, Json::parse_event_t event, Json& parsed) {
          if (depth == 1 && event == Json::parse_event_t::key &&
              !top_level_keys.insert(parsed.get<std::string>()).second &&
              !duplicate_key.has_value()) {
            duplicate_key = parsed.get<std::string>();
          }
          return true;
        });
  } catch (const Json::exception& error) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "the header is not valid JSON: ", error.what()));
  }
  if (!header.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(prefix,
                     "the header must be a JSON object mapping "
                     "tensor names to their entries, not a ",
                     header.type_name()));
  }
  if (duplicate_key.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "the header names \"", *duplicate_key, "\" more than once"));
  }

  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (!entry.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            prefix, "\"__metadata__\" must be an object of strings, not a ",
            entry.type_name()));
      }
      for (const auto& [key, value] : entry.items()) {
        if (!value.is_string()) {
          return absl::InvalidArgumentError(
              absl::StrCat(prefix, "\"__metadata__\" entry \"", key,
                           "\" must be a string, not a ", value.type_name()));
        }
        metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    absl::StatusOr<TensorInfo> tensor = ParseTensorEntry(prefix, name, entry);
    if (!tensor.ok()) return tensor.status();
    if (tensor->end > data_bytes) {
      return absl::DataLossError(absl::StrCat(
          prefix, "tensor \"", name, "\" has data_offsets [", tensor->begin,
          ", ", tensor->end, "] past the end of the ", data_bytes,
          "-byte data section: truncated"));
    }
    tensors_.push_back(*std::move(tensor));
  }
  // Object keys come sorted, so tensors_ is sorted by name already.

  // The ranges must tile [0, data_bytes): walk them in order of offset.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const TensorInfo& tensor : tensors_) by_offset.push_back(&tensor);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) {
              return std::tie(a->begin, a->end) < std::tie(b->begin, b->end);
            });
  int64_t covered = 0;  // every byte before this belongs to a tensor
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* tensor : by_offset) {
    if (tensor->begin < covered) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "tensors \"", previous->name, "\" [", previous->begin, ", ",
          previous->end, ") and \"", tensor->name, "\" [", tensor->begin, ", ",
          tensor->end, ") overlap in the data section"));
    }
    if (tensor->begin > covered) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix, "bytes [", covered, ", ", tensor->begin,
          ") of the data section, before tensor \"", tensor->name,
          "\", belong to no tensor: the tensors must cover the data section "
          "without holes"));
    }
    // A zero-byte tensor must not reset `previous`, the one that covers.
    if (tensor->end > covered || previous == nullptr) previous = tensor;
    covered = std::max(covered, tensor->end);
  }
  if (covered != data_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "bytes [", covered, ", ", data_bytes,
        ") at the end of the data section belong to no tensor: the tensors "
        "must cover the data section without holes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const NamedTensorBytes> tensors,
    const std::map<std::string, std::string>& metadata) {
  std::set<absl::string_view> names;
  for (const NamedTensorBytes& tensor : tensors) {
    const std::string where = absl::StrCat("tensor \"", tensor.name, "\"");
    if (tensor.name == kMetadataKey) {
      return absl::InvalidArgumentError(
          "\"__metadata__\" is reserved and cannot name a tensor");
    }
    if (!names.insert(tensor.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " is given more than once"));
    }
    if (!IsValidUtf8(tensor.name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": the name is not valid UTF-8"));
    }
    const std::optional<int64_t> bytes =
        CheckedByteCount(tensor.shape, SafetensorsDtypeBytes(tensor.dtype));
    if (!bytes.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": shape ", ShapeString(tensor.shape),
          " has a negative dimension or a size that overflows 64 bits"));
    }
    if (*bytes != static_cast<int64_t>(tensor.bytes.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": shape ", ShapeString(tensor.shape), " of ",
                       SafetensorsDtypeName(tensor.dtype), " needs ", *bytes,
                       " bytes, but ", tensor.bytes.size(), " were given"));
    }
  }
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "metadata entry \"", key, "\": key or value is not valid UTF-8"));
    }
  }

  // Larger elements first, so that every tensor starts aligned to its
  // element size when the data section starts at a multiple of 8.
  std::vector<const NamedTensorBytes*> layout;
  for (const NamedTensorBytes& tensor : tensors) layout.push_back(&tensor);
  std::sort(layout.begin(), layout.end(),
            [](const NamedTensorBytes* a, const NamedTensorBytes* b) {
              const int64_t a_bytes = SafetensorsDtypeBytes(a->dtype);
              const int64_t b_bytes = SafetensorsDtypeBytes(b->dtype);
              if (a_bytes != b_bytes) return a_bytes > b_bytes;
              return a->name < b->name;
            });

  Json header = Json::object();
  if (!metadata.empty()) header[std::string(kMetadataKey)] = metadata;
  int64_t offset = 0;
  for (const NamedTensorBytes* tensor : layout) {
    const int64_t end = offset + static_cast<int64_t>(tensor->bytes.size());
    header[tensor->name] = {
        {"dtype", std::string(SafetensorsDtypeName(tensor->dtype))},
        {"shape", tensor->shape},
        {"data_offsets", {offset, end}}};
    offset = end;
  }
  std::string header_text = header.dump();
  // Trailing spaces are valid JSON and align the data section.
  const size_t unaligned = (kLengthPrefixBytes + header_text.size()) % 8;
  if (unaligned != 0) header_text.append(8 - unaligned, ' ');

  std::string file;
  file.reserve(kLengthPrefixBytes + header_text.size() + offset);
  AppendLittleEndianU64(header_text.size(), &file);
  file += header_text;
  for (const NamedTensorBytes* tensor : layout) {
    file.append(tensor->bytes.data(), tensor->bytes.size());
  }
  return file;
}

}  // namespace nibble::checkpoint
