// Reads and writes safetensors files, the checkpoint format of Hugging Face
// models: 8 bytes of little-endian uint64 N, then N bytes of a UTF-8 JSON
// object mapping each tensor's name to its dtype, shape and byte range
// ("data_offsets", relative to the end of the header), with an optional
// "__metadata__" object of string -> string; then the tensors' bytes.
//
// A file is validated whole when it is opened: every tensor's size must agree
// with its dtype and shape, and the byte ranges must tile the data section
// exactly (no overlaps, no holes, nothing past the end), as the format's
// specification requires. After that, Data() needs no further checks.
//
// Status codes: DATA_LOSS when the file ends before what its header promises
// (a truncated download or copy); INVALID_ARGUMENT for every other malformed
// header; the operating system's errors as ReadFileContents reports them.
// Every message names the file (its path, or FromBytes' source_name).
//
// A sharded checkpoint (Hugging Face's model.safetensors.index.json, whose
// "weight_map" names the file of each tensor) opens as one SafetensorsFile
// through its index: the shards beside it are mapped and validated each, and
// tensors() lists the tensors of all of them, so that one layer may take its
// tensors from different shards.
//
// Example:
//   absl::StatusOr<nibble::checkpoint::SafetensorsFile> file =
//       nibble::checkpoint::SafetensorsFile::Open("model.safetensors");
//   if (!file.ok()) return file.status();
//   const nibble::checkpoint::TensorInfo* q = file->Find("layers.0.q_proj");
//   if (q == nullptr) return absl::NotFoundError("no layers.0.q_proj");
//   absl::Span<const uint8_t> bytes = file->Data(*q);  // q->num_bytes() long
#ifndef NIBBLE_CHECKPOINT_SAFETENSORS_H_
#define NIBBLE_CHECKPOINT_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nibble::checkpoint {

// The element types whose sizes are known. Sub-byte types (F4, F6_*) are not
// supported: a tensor of one is refused with its name and dtype.
enum class SafetensorsDtype {
  kBool,
  kU8,
  kI8,
  kF8E4M3,
  kF8E5M2,
  kF8E8M0,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kU64,
  kI64,
  kF64,
};

// Every SafetensorsDtype, for tests and for listing them in messages.
inline constexpr SafetensorsDtype kAllSafetensorsDtypes[] = {
    SafetensorsDtype::kBool,   SafetensorsDtype::kU8,
    SafetensorsDtype::kI8,     SafetensorsDtype::kF8E4M3,
    SafetensorsDtype::kF8E5M2, SafetensorsDtype::kF8E8M0,
    SafetensorsDtype::kU16,    SafetensorsDtype::kI16,
    SafetensorsDtype::kF16,    SafetensorsDtype::kBF16,
    SafetensorsDtype::kU32,    SafetensorsDtype::kI32,
    SafetensorsDtype::kF32,    SafetensorsDtype::kU64,
    SafetensorsDtype::kI64,    SafetensorsDtype::kF64,
};

// The name the format uses: "F16", "BF16", "F8_E4M3", "BOOL", ...
absl::string_view SafetensorsDtypeName(SafetensorsDtype dtype);
// The dtype of a name as the format spells it (case-sensitive), or nullopt.
std::optional<SafetensorsDtype> SafetensorsDtypeFromName(
    absl::string_view name);
// Bytes per element: 1, 2, 4 or 8.
int64_t SafetensorsDtypeBytes(SafetensorsDtype dtype);

// A header larger than this is refused before it is parsed, so that a
// corrupt length cannot make the reader allocate without bound.
inline constexpr int64_t kMaxSafetensorsHeaderBytes = int64_t{100} << 20;

// One tensor of a file as its header describes it.
struct TensorInfo {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  // Empty for a scalar. Every dimension is >= 0.
  std::vector<int64_t> shape;
  // The tensor's bytes are [begin, end) of the data section.
  int64_t begin = 0;
  int64_t end = 0;
  // For a sharded checkpoint, which of its shards holds the tensor (in the
  // order of their file names); 0 in a single file.
  int32_t shard = 0;

  // The product of `shape` (1 for a scalar). Cannot overflow for a tensor
  // of a SafetensorsFile, whose sizes are checked.
  int64_t num_elements() const;
  int64_t num_bytes() const { return end - begin; }

  bool operator==(const TensorInfo& other) const = default;
};

// A validated safetensors file, memory-mapped (Open) or held in memory
// (FromBytes). Movable, not copyable; spans from Data() and bytes() stay
// valid until the object is destroyed, also across moves.
class SafetensorsFile {
 public:
  // Opens a sharded checkpoint when `path` ends in ".index.json": the index
  // must be a JSON object whose "weight_map" maps each tensor's name to the
  // name of a file in the index's directory; every file it names opens as
  // below, each tensor must be in the file the map names, and no tensor may
  // be in two. INVALID_ARGUMENT names the index and what is wrong with it.
  //
  // Otherwise maps `path` read-only and validates its header. The file must not
  // be truncated or rewritten while it is open: a mapped page that no longer
  // exists faults (SIGBUS) when read. NOT_FOUND, PERMISSION_DENIED,
  // FAILED_PRECONDITION (not a regular file) or UNAVAILABLE when the file
  // cannot be mapped; DATA_LOSS or INVALID_ARGUMENT (above) when it is not a
  // valid safetensors file.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  // The same validation on bytes already in memory; `source_name` starts the
  // error messages in place of a path. Safe on any input.
  static absl::StatusOr<SafetensorsFile> FromBytes(
      std::string bytes, absl::string_view source_name = "safetensors bytes");

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // The path given to Open, or FromBytes' source_name.
  const std::string& source_name() const { return source_name_; }
  // Sorted by name; names are unique.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  // The tensor called `name`, or nullptr.
  const TensorInfo* Find(absl::string_view name) const;
  // The bytes of `tensor`, which must be one of tensors().
  absl::Span<const uint8_t> Data(const TensorInfo& tensor) const;
  // Asks the kernel to start reading `tensor` from disk in the background
  // (madvise MADV_WILLNEED; nothing for FromBytes), so that small tensors
  // scattered over a large file are read concurrently, not one page fault at
  // a time.
  void Prefetch(const TensorInfo& tensor) const;
  // "__metadata__", empty when the header has none.
  const std::map<std::string, std::string>& metadata() const {
    return metadata_;
  }
  // The whole file: length prefix, header and data section; empty for a
  // sharded checkpoint.
  absl::Span<const uint8_t> bytes() const;
  // Where the data section starts in bytes(): 8 + the header's length.
  int64_t data_start() const { return data_start_; }
  // The files of a sharded checkpoint, in the order of TensorInfo::shard;
  // empty for a single file.
  const std::vector<SafetensorsFile>& shards() const { return shards_; }

 private:
  explicit SafetensorsFile(std::string source_name)
      : source_name_(std::move(source_name)) {}
  // Fills data_start_, tensors_ and metadata_ from bytes().
  absl::Status ParseHeader();
  // Open of a single file, and of an index.
  static absl::StatusOr<SafetensorsFile> OpenFile(const std::string& path);
  static absl::StatusOr<SafetensorsFile> OpenIndex(const std::string& path);
  void Unmap();

  std::string source_name_;
  // Exactly one of the two holds the file: a mapping from Open, or the
  // string given to FromBytes. bytes() is computed from them on each call,
  // since moving a short string moves its characters.
  const uint8_t* mapped_ = nullptr;
  size_t mapped_size_ = 0;
  std::string owned_bytes_;

  int64_t data_start_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, std::string> metadata_;
};

// What a sharded checkpoint's index says (model.safetensors.index.json).
struct ShardIndex {
  // Tensor name → the name of the file that holds it, beside the index:
  // never empty, ".", ".." or with a '/'.
  std::map<std::string, std::string> shard_of_tensor;
  // The index's "metadata", each value as a string (total_size is a number).
  std::map<std::string, std::string> metadata;
};

// The index text of a sharded checkpoint, which SafetensorsFile::Open reads
// for a path ending in ".index.json"; INVALID_ARGUMENT starting with `path`
// when it is not a JSON object with a "weight_map" of file names.
absl::StatusOr<ShardIndex> ParseShardIndex(absl::string_view text,
                                           const std::string& path);

// One tensor to write. `bytes` is not owned: it must outlive the call.
struct NamedTensorBytes {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  absl::string_view bytes;
};

// A complete safetensors file holding `tensors` and `metadata`, which
// SafetensorsFile reads back with the same names, dtypes, shapes, bytes and
// metadata. The header is padded with spaces so that the data section starts
// at a multiple of 8 bytes, and the tensors are laid out by decreasing
// element size, then by name, so that each starts at a multiple of its
// element size. INVALID_ARGUMENT, naming the tensor, for a duplicate or
// reserved ("__metadata__") name, a negative dimension, a size that
// overflows or disagrees with the shape and dtype, or a name or metadata
// string that is not valid UTF-8.
absl::StatusOr<std::string> SerializeSafetensors(
    absl::Span<const NamedTensorBytes> tensors,
    const std::map<std::string, std::string>& metadata = {});

}  // namespace nibble::checkpoint

#endif  // NIBBLE_CHECKPOINT_SAFETENSORS_H_
