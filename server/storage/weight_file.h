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
#ifndef NIBBLE_SERVER_STORAGE_WEIGHT_FILE_H_
#define NIBBLE_SERVER_STORAGE_WEIGHT_FILE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// Hands the file's bytes for `weight` to `sink` in pieces, in order, so that
// a large weight is never copied whole; stops at the first error `sink`
// returns. `weight` must pass QuantizedWeight::Validate() and `name`
// ValidateWeightName, or ParseWeightFile will refuse the result.
absl::Status WriteWeightFile(
    absl::string_view name, const QuantizedWeight& weight,
    const std::function<absl::Status(absl::string_view)>& sink);

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

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_STORAGE_WEIGHT_FILE_H_
