#include "server/storage/weight_file.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "format/weight_name.h"

namespace nibble::server {
namespace {

// The canonical layout is little-endian and QuantizedWeight holds it in host
// order, so tensors are written and read as raw bytes.
static_assert(std::endian::native == std::endian::little,
              "weight files assume a little-endian host");

constexpr uint64_t kMultiplier1 = 0x9e3779b97f4a7c15ull;
constexpr uint64_t kMultiplier2 = 0xc2b2ae3d27d4eb4full;
constexpr uint64_t kMultiplier3 = 0xff51afd7ed558ccdull;

// Longest name ValidateWeightName accepts; checked before it is read.
constexpr uint32_t kMaxNameBytes = 128;

// Header field offsets; see the table in weight_file.h.
constexpr int kVersionOffset = 8;
constexpr int kFormatOffset = 12;
constexpr int kKOffset = 16;
constexpr int kNOffset = 24;
constexpr int kGroupSizeOffset = 32;
constexpr int kQweightBytesOffset = 40;
constexpr int kScalesBytesOffset = 48;
constexpr int kZerosBytesOffset = 56;
constexpr int kNameLengthOffset = 64;
constexpr int kGlobalScaleOffset = 68;

uint64_t LoadWord(const char* bytes) {
  uint64_t word;
  std::memcpy(&word, bytes, sizeof(word));
  return word;
}

void PutU32(uint32_t value, char* out) { std::memcpy(out, &value, 4); }
void PutU64(uint64_t value, char* out) { std::memcpy(out, &value, 8); }
uint32_t GetU32(absl::string_view bytes, size_t offset) {
  uint32_t value;
  std::memcpy(&value, bytes.data() + offset, 4);
  return value;
}
uint64_t GetU64(absl::string_view bytes, size_t offset) {
  uint64_t value;
  std::memcpy(&value, bytes.data() + offset, 8);
  return value;
}

// Header bytes 68..71: the global scale as fp32 bits where the format has
// one, zero otherwise.
uint32_t GlobalScaleField(const WeightSpec& spec) {
  return HasGlobalScale(spec.format)
             ? std::bit_cast<uint32_t>(spec.global_scale)
             : 0;
}

template <typename T>
absl::string_view AsBytes(const std::vector<T>& array) {
  return absl::string_view(reinterpret_cast<const char*>(array.data()),
                           array.size() * sizeof(T));
}

template <typename T>
std::vector<T> CopyArray(absl::string_view bytes) {
  std::vector<T> array(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(array.data(), bytes.data(), bytes.size());
  return array;
}

absl::Status CheckTensorBytes(absl::string_view tensor, uint64_t header_bytes,
                              int64_t spec_bytes) {
  if (header_bytes == static_cast<uint64_t>(spec_bytes)) {
    return absl::OkStatus();
  }
  return absl::DataLossError(
      absl::StrCat("header gives ", tensor, " ", header_bytes,
                   " bytes, but its shape needs ", spec_bytes));
}

// DATA_LOSS unless a file of `size` bytes has the size `header` gives.
absl::Status CheckFileSize(const WeightFileHeader& header, uint64_t size) {
  if (size < header.file_bytes) {
    return absl::DataLossError(absl::StrCat("file is truncated: ", size,
                                            " bytes, its header says ",
                                            header.file_bytes));
  }
  if (size > header.file_bytes) {
    return absl::DataLossError(
        absl::StrCat("file has ", size - header.file_bytes,
                     " bytes past the end its header gives (",
                     header.file_bytes, " bytes)"));
  }
  return absl::OkStatus();
}

// DATA_LOSS unless the checksum `stored` in a file is the one `computed`
// over its bytes.
absl::Status CheckChecksum(uint64_t stored, uint64_t computed) {
  if (computed == stored) return absl::OkStatus();
  return absl::DataLossError(
      absl::StrCat("checksum mismatch: the file is corrupt (stored ",
                   absl::Hex(stored), ", computed ", absl::Hex(computed), ")"));
}

// The name a file's bytes after its header give, checked.
absl::StatusOr<std::string> NameFromFile(absl::string_view bytes) {
  if (absl::Status status = ValidateWeightName(bytes); !status.ok()) {
    return absl::DataLossError(
        absl::StrCat("invalid name in the header: ", status.message()));
  }
  return std::string(bytes);
}

// DATA_LOSS unless `weight`, read from a file, passes Validate().
absl::Status CheckWeightData(const QuantizedWeight& weight) {
  if (absl::Status status = weight.Validate(); !status.ok()) {
    return absl::DataLossError(
        absl::StrCat("invalid weight data: ", status.message()));
  }
  return absl::OkStatus();
}

// Bytes of the activation order a file of `header` holds.
int64_t OrderBytes(const WeightFileHeader& header) {
  return header.has_activation_order ? header.spec.k * int64_t{sizeof(int32_t)}
                                     : 0;
}

}  // namespace

void WeightFileChecksum::Mix(uint64_t word) {
  state_ = std::rotl(state_ ^ (word * kMultiplier1), 29) * kMultiplier2;
}

void WeightFileChecksum::Update(absl::string_view bytes) {
  // An empty view may have a null data(), which memcpy must not be given.
  if (bytes.empty()) return;
  length_ += bytes.size();
  if (pending_bytes_ > 0) {
    const size_t take = std::min<size_t>(8 - pending_bytes_, bytes.size());
    std::memcpy(pending_ + pending_bytes_, bytes.data(), take);
    pending_bytes_ += take;
    bytes.remove_prefix(take);
    if (pending_bytes_ < 8) return;
    Mix(LoadWord(pending_));
    pending_bytes_ = 0;
  }
  const char* data = bytes.data();
  const size_t words = bytes.size() / 8;
  for (size_t i = 0; i < words; ++i) Mix(LoadWord(data + 8 * i));
  pending_bytes_ = bytes.size() % 8;
  if (pending_bytes_ > 0)
    std::memcpy(pending_, data + 8 * words, pending_bytes_);
}

uint64_t WeightFileChecksum::Finish() {
  if (pending_bytes_ > 0) {
    std::memset(pending_ + pending_bytes_, 0, 8 - pending_bytes_);
    Mix(LoadWord(pending_));
    pending_bytes_ = 0;
  }
  // The length tells a zero-padded last word from real zero bytes.
  Mix(length_);
  uint64_t hash = state_;
  hash ^= hash >> 33;
  hash *= kMultiplier3;
  hash ^= hash >> 33;
  return hash;
}

absl::StatusOr<WeightFileWriter> WeightFileWriter::Start(
    absl::string_view name, const WeightSpec& spec,
    std::vector<int32_t> activation_order, WeightFileSink sink) {
  char header[kWeightFileHeaderBytes] = {};
  std::memcpy(header, kWeightFileMagic.data(), kWeightFileMagic.size());
  PutU32(activation_order.empty() ? kWeightFileVersion
                                  : kWeightFileVersionWithActivationOrder,
         header + kVersionOffset);
  PutU32(Traits(spec.format).file_code, header + kFormatOffset);
  PutU64(spec.k, header + kKOffset);
  PutU64(spec.n, header + kNOffset);
  PutU64(spec.group_size, header + kGroupSizeOffset);
  PutU64(spec.qweight_bytes(), header + kQweightBytesOffset);
  PutU64(spec.scales_bytes(), header + kScalesBytesOffset);
  PutU64(spec.zeros_bytes(), header + kZerosBytesOffset);
  PutU32(name.size(), header + kNameLengthOffset);
  PutU32(GlobalScaleField(spec), header + kGlobalScaleOffset);

  WeightFileWriter writer(std::move(sink), spec.canonical_bytes(),
                          std::move(activation_order));
  for (absl::string_view piece :
       {absl::string_view(header, sizeof(header)), name}) {
    if (absl::Status status = writer.Put(piece); !status.ok()) return status;
  }
  return writer;
}

absl::Status WeightFileWriter::Put(absl::string_view bytes) {
  checksum_.Update(bytes);
  return sink_(bytes);
}

absl::Status WeightFileWriter::Append(absl::string_view tensor_bytes) {
  if (static_cast<int64_t>(tensor_bytes.size()) > tensor_bytes_ - appended_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight file given ", appended_ + tensor_bytes.size(),
        " bytes of tensors, but its header gives ", tensor_bytes_));
  }
  appended_ += tensor_bytes.size();
  return Put(tensor_bytes);
}

absl::Status WeightFileWriter::AppendTensors(const QuantizedWeight& weight) {
  const WeightBytes tensors = BytesOf(weight);
  for (absl::string_view tensor :
       {tensors.qweight, tensors.scales, tensors.zeros}) {
    if (absl::Status status = Append(tensor); !status.ok()) return status;
  }
  return absl::OkStatus();
}

absl::Status WeightFileWriter::Finish() {
  if (appended_ != tensor_bytes_) {
    return absl::FailedPreconditionError(
        absl::StrCat("weight file finished after ", appended_, " of the ",
                     tensor_bytes_, " bytes of its tensors"));
  }
  if (absl::Status status = Put(AsBytes(activation_order_)); !status.ok()) {
    return status;
  }
  char trailer[kWeightFileChecksumBytes];
  PutU64(checksum_.Finish(), trailer);
  return sink_(absl::string_view(trailer, sizeof(trailer)));
}

absl::Status WriteWeightFile(absl::string_view name,
                             const QuantizedWeight& weight,
                             const WeightFileSink& sink) {
  absl::StatusOr<WeightFileWriter> writer =
      WeightFileWriter::Start(name, weight.spec, weight.activation_order, sink);
  if (!writer.ok()) return writer.status();
  if (absl::Status status = writer->AppendTensors(weight); !status.ok()) {
    return status;
  }
  return writer->Finish();
}

std::string SerializeWeightFile(absl::string_view name,
                                const QuantizedWeight& weight) {
  std::string bytes;
  bytes.reserve(kWeightFileHeaderBytes + name.size() +
                weight.spec.canonical_bytes() +
                weight.activation_order.size() * sizeof(int32_t) +
                kWeightFileChecksumBytes);
  WriteWeightFile(name, weight, [&bytes](absl::string_view piece) {
    bytes.append(piece.data(), piece.size());
    return absl::OkStatus();
  }).IgnoreError();  // appending to a string cannot fail
  return bytes;
}

absl::StatusOr<WeightFileHeader> ParseWeightFileHeader(
    absl::string_view bytes) {
  if (bytes.size() < kWeightFileHeaderBytes) {
    return absl::DataLossError(absl::StrCat(
        "file is truncated: ", bytes.size(),
        " bytes, a weight file's header has ", kWeightFileHeaderBytes));
  }
  if (bytes.substr(0, kWeightFileMagic.size()) != kWeightFileMagic) {
    return absl::DataLossError(
        "not a nibble weight file: it does not start with \"NIBWEIGH\"");
  }
  const uint32_t version = GetU32(bytes, kVersionOffset);
  if (version != kWeightFileVersion &&
      version != kWeightFileVersionWithActivationOrder) {
    return absl::DataLossError(absl::StrCat(
        "file format version ", version, ", this nibbled reads versions ",
        kWeightFileVersion, " and ", kWeightFileVersionWithActivationOrder));
  }
  absl::StatusOr<WeightFormat> format =
      WeightFormatFromFileCode(GetU32(bytes, kFormatOffset));
  if (!format.ok()) return format.status();
  // Out-of-range values wrap to negative numbers, which Validate refuses.
  const uint32_t global_scale_bits = GetU32(bytes, kGlobalScaleOffset);
  if (!HasGlobalScale(*format) && global_scale_bits != 0) {
    return absl::DataLossError(
        absl::StrCat("header bytes 68..71 are not zero, and ",
                     WeightFormatName(*format), " has no global scale"));
  }
  WeightFileHeader header;
  header.spec = WeightSpec{
      *format, static_cast<int64_t>(GetU64(bytes, kKOffset)),
      static_cast<int64_t>(GetU64(bytes, kNOffset)),
      static_cast<int64_t>(GetU64(bytes, kGroupSizeOffset)),
      HasGlobalScale(*format) ? std::bit_cast<float>(global_scale_bits) : 1.0f};
  const WeightSpec& spec = header.spec;
  if (absl::Status status = spec.Validate(); !status.ok()) {
    return absl::DataLossError(
        absl::StrCat("invalid weight spec in the header: ", status.message()));
  }
  // Validate bounds k and n by 2^20, so these sums cannot overflow.
  for (absl::Status status :
       {CheckTensorBytes("qweight", GetU64(bytes, kQweightBytesOffset),
                         spec.qweight_bytes()),
        CheckTensorBytes("scales", GetU64(bytes, kScalesBytesOffset),
                         spec.scales_bytes()),
        CheckTensorBytes("zeros", GetU64(bytes, kZerosBytesOffset),
                         spec.zeros_bytes())}) {
    if (!status.ok()) return status;
  }
  header.name_bytes = GetU32(bytes, kNameLengthOffset);
  if (header.name_bytes > kMaxNameBytes) {
    return absl::DataLossError(
        absl::StrCat("header gives a name of ", header.name_bytes,
                     " bytes, at most ", kMaxNameBytes, " are allowed"));
  }
  header.has_activation_order =
      version == kWeightFileVersionWithActivationOrder;
  header.file_bytes =
      kWeightFileHeaderBytes + header.name_bytes +
      static_cast<uint64_t>(spec.canonical_bytes()) +
      (header.has_activation_order ? spec.k * int64_t{sizeof(int32_t)} : 0) +
      kWeightFileChecksumBytes;
  return header;
}

absl::StatusOr<WeightFile> ParseWeightFile(absl::string_view bytes) {
  constexpr uint64_t kSmallest =
      kWeightFileHeaderBytes + kWeightFileChecksumBytes;
  if (bytes.size() < kSmallest) {
    return absl::DataLossError(
        absl::StrCat("file is truncated: ", bytes.size(),
                     " bytes, a weight file has at least ", kSmallest));
  }
  absl::StatusOr<WeightFileHeader> header = ParseWeightFileHeader(bytes);
  if (!header.ok()) return header.status();
  if (absl::Status status = CheckFileSize(*header, bytes.size());
      !status.ok()) {
    return status;
  }
  const uint64_t file_bytes = header->file_bytes;
  WeightFileChecksum checksum;
  checksum.Update(bytes.substr(0, file_bytes - kWeightFileChecksumBytes));
  if (absl::Status status =
          CheckChecksum(GetU64(bytes, file_bytes - kWeightFileChecksumBytes),
                        checksum.Finish());
      !status.ok()) {
    return status;
  }

  const WeightSpec& spec = header->spec;
  absl::string_view rest = bytes.substr(kWeightFileHeaderBytes);
  absl::StatusOr<std::string> name =
      NameFromFile(rest.substr(0, header->name_bytes));
  if (!name.ok()) return name.status();
  WeightFile file;
  file.name = *std::move(name);
  rest.remove_prefix(header->name_bytes);
  file.weight.spec = spec;
  file.weight.qweight =
      CopyArray<uint32_t>(rest.substr(0, spec.qweight_bytes()));
  rest.remove_prefix(spec.qweight_bytes());
  file.weight.scales = CopyArray<uint16_t>(rest.substr(0, spec.scales_bytes()));
  rest.remove_prefix(spec.scales_bytes());
  file.weight.zeros = CopyArray<uint8_t>(rest.substr(0, spec.zeros_bytes()));
  rest.remove_prefix(spec.zeros_bytes());
  file.weight.activation_order =
      CopyArray<int32_t>(rest.substr(0, OrderBytes(*header)));
  if (absl::Status status = CheckWeightData(file.weight); !status.ok()) {
    return status;
  }
  return file;
}

absl::StatusOr<WeightFileReader> WeightFileReader::Open(
    const std::string& path) {
  absl::StatusOr<ReadOnlyFile> file = ReadOnlyFile::Open(path);
  if (!file.ok()) return file.status();
  WeightFileReader reader(*std::move(file));
  const ReadOnlyFile& opened = reader.file_;
  std::string header_bytes(
      std::min<int64_t>(opened.size(), kWeightFileHeaderBytes), '\0');
  if (absl::Status status = opened.ReadAt(0, absl::MakeSpan(header_bytes));
      !status.ok()) {
    return status;
  }
  absl::StatusOr<WeightFileHeader> header = ParseWeightFileHeader(header_bytes);
  if (!header.ok()) return header.status();
  reader.header_ = *header;
  if (absl::Status status = CheckFileSize(*header, opened.size());
      !status.ok()) {
    return status;
  }
  std::string name_bytes(header->name_bytes, '\0');
  if (absl::Status status =
          opened.ReadAt(kWeightFileHeaderBytes, absl::MakeSpan(name_bytes));
      !status.ok()) {
    return status;
  }
  absl::StatusOr<std::string> name = NameFromFile(name_bytes);
  if (!name.ok()) return name.status();
  reader.name_ = *std::move(name);
  // From before the checksum; ReadTensors checks it with the rest.
  const int64_t order_bytes = OrderBytes(*header);
  reader.activation_order_.resize(order_bytes / sizeof(int32_t));
  if (absl::Status status = opened.ReadAt(
          header->file_bytes - kWeightFileChecksumBytes - order_bytes,
          absl::MakeSpan(
              reinterpret_cast<char*>(reader.activation_order_.data()),
              order_bytes));
      !status.ok()) {
    return status;
  }
  return reader;
}

absl::Status WeightFileReader::ReadTensors(const WeightFileSink& sink) {
  WeightFileChecksum checksum;
  std::string piece(
      std::min<int64_t>(kWeightFileHeaderBytes + name_.size(), kPieceBytes),
      '\0');
  // The header and name again, so that the checksum covers what was read.
  if (absl::Status status = file_.ReadAt(0, absl::MakeSpan(piece));
      !status.ok()) {
    return status;
  }
  checksum.Update(piece);
  int64_t offset = piece.size();
  int64_t left = header_.spec.canonical_bytes();
  piece.resize(std::min(left, kPieceBytes));
  while (left > 0) {
    const absl::Span<char> next =
        absl::MakeSpan(piece).first(std::min(left, kPieceBytes));
    if (absl::Status status = file_.ReadAt(offset, next); !status.ok()) {
      return status;
    }
    const absl::string_view bytes(next.data(), next.size());
    checksum.Update(bytes);
    if (absl::Status status = sink(bytes); !status.ok()) return status;
    offset += next.size();
    left -= next.size();
  }
  checksum.Update(AsBytes(activation_order_));
  char stored[kWeightFileChecksumBytes];
  if (absl::Status status =
          file_.ReadAt(header_.file_bytes - kWeightFileChecksumBytes,
                       absl::MakeSpan(stored));
      !status.ok()) {
    return status;
  }
  return CheckChecksum(GetU64(absl::string_view(stored, sizeof(stored)), 0),
                       checksum.Finish());
}

absl::StatusOr<QuantizedWeight> WeightFileReader::ReadWhole() {
  const WeightSpec& spec = header_.spec;
  QuantizedWeight weight;
  weight.spec = spec;
  weight.qweight.resize(spec.qweight_bytes() / sizeof(uint32_t));
  weight.scales.resize(spec.scales_bytes() / sizeof(uint16_t));
  weight.zeros.resize(spec.zeros_bytes());
  // Where the pieces go, in file order.
  const absl::Span<char> tensors[] = {
      absl::MakeSpan(reinterpret_cast<char*>(weight.qweight.data()),
                     spec.qweight_bytes()),
      absl::MakeSpan(reinterpret_cast<char*>(weight.scales.data()),
                     spec.scales_bytes()),
      absl::MakeSpan(reinterpret_cast<char*>(weight.zeros.data()),
                     spec.zeros_bytes())};
  int tensor = 0;
  int64_t filled = 0;
  if (absl::Status status = ReadTensors([&](absl::string_view bytes) {
        while (!bytes.empty()) {
          const size_t take =
              std::min<size_t>(bytes.size(), tensors[tensor].size() - filled);
          std::memcpy(tensors[tensor].data() + filled, bytes.data(), take);
          bytes.remove_prefix(take);
          filled += take;
          if (filled == static_cast<int64_t>(tensors[tensor].size())) {
            ++tensor;
            filled = 0;
          }
        }
        return absl::OkStatus();
      });
      !status.ok()) {
    return status;
  }
  weight.activation_order = activation_order_;
  if (absl::Status status = CheckWeightData(weight); !status.ok()) {
    return status;
  }
  return weight;
}

}  // namespace nibble::server
