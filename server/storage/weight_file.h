// The on-disk form of one weight, as nibbled --data_dir keeps it: a fixed
// header, the weight's name, its tensors in the canonical layout, its
// activation order if it has one, and a 64-bit checksum over everything
// before it. All integers are little-endian.
//
//   offset  size  field
//        0     8  magic "NIBWEIGH"
//        8     4  format version: 1, or 2 for a weight with an activation
//                 order (GPTQ act-order), so that a nibbled that predates
//                 orders refuses such a file instead of dropping its order
//       12     4  weight format: its file_code (format/weight_format.h)
//       16     8  k
//       24     8  n
//       32     8  group size
//       40     8  qweight bytes
//       48     8  scales bytes
//       56     8  zeros bytes
//       64     4  name length
//       68     4  global scale, fp32 bits, where the format has one;
//                 zero otherwise
//       72     -  name, then qweight, scales, zeros (canonical layout),
//                 then, in version 2 only, the activation order: K int32
//   end - 8    8  WeightFileChecksum of every byte before it
//
// The parser trusts nothing: every size is checked against the spec and
// against the bytes actually present before anything is allocated.
//
// Example:
//   std::string bytes = nibble::server::SerializeWeightFile("proj", weight);
//   absl::StatusOr<nibble::server::WeightFile> file =
//       nibble::server::ParseWeightFile(bytes);
//   // Or from disk, in pieces:
//   absl::StatusOr<nibble::server::WeightFileReader> reader =
//       nibble::server::WeightFileReader::Open("/var/lib/nibble/proj.nibble");
//   RETURN_IF_ERROR(reader->ReadTensors(
//       [&](absl::string_view piece) { return Consume(piece); }));
#ifndef NIBBLE_SERVER_STORAGE_WEIGHT_FILE_H_
#define NIBBLE_SERVER_STORAGE_WEIGHT_FILE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/file_contents.h"
#include "format/weight_format.h"

namespace nibble::server {

inline constexpr absl::string_view kWeightFileMagic = "NIBWEIGH";
// Files of weights without an activation order are written as version 1,
// byte for byte as before orders existed; with one, as version 2.
inline constexpr uint32_t kWeightFileVersion = 1;
inline constexpr uint32_t kWeightFileVersionWithActivationOrder = 2;
inline constexpr int64_t kWeightFileHeaderBytes = 72;
inline constexpr int64_t kWeightFileChecksumBytes = 8;

// A 64-bit hash fed in pieces. Not CRC-32C (Debian's absl has no absl/crc),
// but a word-at-a-time multiply-rotate hash: each step is a bijection of the
// state for a fixed input word and of the input word for a fixed state, so
// any change confined to one 8-byte word always changes the result, and other
// corruption goes unnoticed with probability about 2^-64. It runs at several
// GB/s, so hashing a large weight costs little next to writing it. It guards
// against torn writes and bit rot, not against deliberate tampering.
class WeightFileChecksum {
 public:
  void Update(absl::string_view bytes);
  // The hash of every byte given so far; call once.
  uint64_t Finish();

 private:
  void Mix(uint64_t word);
  uint64_t state_ = 0x6e6962626c65ull;  // "nibble"
  uint64_t length_ = 0;
  // Bytes of an unfinished word, carried to the next Update.
  char pending_[8] = {};
  int pending_bytes_ = 0;
};

// A weight as read back from its file.
struct WeightFile {
  std::string name;
  QuantizedWeight weight;
};

// Where a weight file's bytes go, in order; an error stops the writing.
using WeightFileSink = std::function<absl::Status(absl::string_view)>;

// Writes a weight file as its tensors arrive, so that neither the file nor
// the weight need be held whole: Start hands the header and name to the
// sink, Append the tensors' bytes in file order (qweight, scales, zeros, in
// the canonical layout) in pieces of any size, and Finish the activation
// order and the checksum. The result passes ParseWeightFile when the spec
// passes Validate(), the name ValidateWeightName and the tensors
// QuantizedWeight::Validate().
class WeightFileWriter {
 public:
  // The sink's error when it refuses the header.
  static absl::StatusOr<WeightFileWriter> Start(
      absl::string_view name, const WeightSpec& spec,
      std::vector<int32_t> activation_order, WeightFileSink sink);

  // INVALID_ARGUMENT for bytes past the tensors' size
  // (WeightSpec::canonical_bytes()); the sink's error otherwise.
  absl::Status Append(absl::string_view tensor_bytes);
  // Append of every tensor of `weight`, whose spec Start was given.
  absl::Status AppendTensors(const QuantizedWeight& weight);

  // FAILED_PRECONDITION when not every byte of the tensors was appended;
  // the sink's error otherwise. Call once.
  absl::Status Finish();

 private:
  WeightFileWriter(WeightFileSink sink, int64_t tensor_bytes,
                   std::vector<int32_t> activation_order)
      : sink_(std::move(sink)),
        tensor_bytes_(tensor_bytes),
        activation_order_(std::move(activation_order)) {}
  // `bytes` to the checksum and the sink.
  absl::Status Put(absl::string_view bytes);

  WeightFileSink sink_;
  WeightFileChecksum checksum_;
  int64_t tensor_bytes_ = 0;
  int64_t appended_ = 0;
  std::vector<int32_t> activation_order_;
};

// The file of `weight` handed to `sink` in pieces (WeightFileWriter), so
// that a large weight is never copied whole; stops at the first error `sink`
// returns. `weight` must pass QuantizedWeight::Validate() and `name`
// ValidateWeightName, or ParseWeightFile will refuse the result.
absl::Status WriteWeightFile(absl::string_view name,
                             const QuantizedWeight& weight,
                             const WeightFileSink& sink);

// The whole file in memory.
std::string SerializeWeightFile(absl::string_view name,
                                const QuantizedWeight& weight);

// What a weight file's header says, checked.
struct WeightFileHeader {
  WeightSpec spec;
  bool has_activation_order = false;
  uint32_t name_bytes = 0;
  // The whole file's size, checksum included.
  uint64_t file_bytes = 0;
};

// The header at the start of `bytes`, which need hold only its
// kWeightFileHeaderBytes: so a file's size can be checked before its data
// is read. DATA_LOSS, as ParseWeightFile says, for a header that is short or
// wrong in itself.
absl::StatusOr<WeightFileHeader> ParseWeightFileHeader(absl::string_view bytes);

// DATA_LOSS, saying what is wrong, for bytes that are not a complete, intact
// weight file: too short or too long for what the header says, a bad magic,
// an unknown version or format, sizes that disagree with the spec, an invalid
// spec, name, zero point or activation order, or a checksum mismatch. Safe on
// any input.
absl::StatusOr<WeightFile> ParseWeightFile(absl::string_view bytes);

// A weight file read once, in pieces, so that neither the file nor (for a
// reader that packs it as it arrives) the weight is held whole: Open reads
// and checks the header, the name and the activation order; ReadTensors
// hands over the tensors and then checks the checksum of the whole file.
// Every check is ParseWeightFile's, with its messages.
class WeightFileReader {
 public:
  // ReadTensors hands over at most this many bytes at a time.
  static constexpr int64_t kPieceBytes = int64_t{1} << 20;

  // The regular file at `path`, with its header, name and activation order
  // read and checked, and its size checked against the header; none of its
  // tensors read. ReadFileContents' errors for a file that cannot be read or
  // is not a regular file (a FIFO is refused at once, not waited on);
  // DATA_LOSS as ParseWeightFile answers.
  static absl::StatusOr<WeightFileReader> Open(const std::string& path);

  const WeightFileHeader& header() const { return header_; }
  const std::string& name() const { return name_; }
  // Empty for none.
  const std::vector<int32_t>& activation_order() const {
    return activation_order_;
  }

  // Hands the tensors' bytes to `sink` in file order (qweight, scales,
  // zeros, in the canonical layout), in pieces of at most kPieceBytes, and
  // stops at its first error; then DATA_LOSS when the checksum shows the
  // file torn or corrupt, so that what `sink` built must be dropped unless
  // this returns OK. Values are not looked at. Call once.
  absl::Status ReadTensors(const WeightFileSink& sink);

  // The whole weight, by ReadTensors, its values checked as
  // ParseWeightFile checks them. Call once, instead of ReadTensors.
  absl::StatusOr<QuantizedWeight> ReadWhole();

 private:
  explicit WeightFileReader(ReadOnlyFile file) : file_(std::move(file)) {}

  ReadOnlyFile file_;
  WeightFileHeader header_;
  std::string name_;
  std::vector<int32_t> activation_order_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_STORAGE_WEIGHT_FILE_H_
