// Fuzzes the persisted weight-file readers: ParseWeightFile must refuse bad
// bytes cleanly, and whatever it accepts must serialize back to exactly the
// bytes it came from; WeightFileReader, reading the same bytes from a file
// in pieces, must accept exactly what ParseWeightFile accepts, with the same
// weight, and refuse the rest as DATA_LOSS too. Each input is parsed twice:
// as it is, and with its trailing checksum rewritten to match, so that
// mutations also reach the checks behind the checksum (name, zero points).
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/storage/weight_file.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using nibble::server::kWeightFileChecksumBytes;
using nibble::server::ParseWeightFile;
using nibble::server::SerializeWeightFile;
using nibble::server::WeightFile;
using nibble::server::WeightFileChecksum;
using nibble::server::WeightFileReader;

bool SameWeightFile(const WeightFile& a, const WeightFile& b) {
  return a.name == b.name && a.weight.spec == b.weight.spec &&
         a.weight.qweight == b.weight.qweight &&
         a.weight.scales == b.weight.scales &&
         a.weight.zeros == b.weight.zeros &&
         a.weight.activation_order == b.weight.activation_order;
}

// What WeightFileReader makes of `bytes` written to a file.
absl::StatusOr<WeightFile> ReadFromFile(absl::string_view bytes) {
  static const std::string path =
      (std::filesystem::temp_directory_path() /
       absl::StrCat("weight_file_fuzzer-", getpid(), ".nibble"))
          .string();
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), bytes.size());
  absl::StatusOr<WeightFileReader> reader = WeightFileReader::Open(path);
  if (!reader.ok()) return reader.status();
  absl::StatusOr<nibble::QuantizedWeight> weight = reader->ReadWhole();
  if (!weight.ok()) return weight.status();
  return WeightFile{reader->name(), *std::move(weight)};
}

void ParseAndCheckRoundTrip(absl::string_view bytes) {
  absl::StatusOr<WeightFile> file = ParseWeightFile(bytes);
  absl::StatusOr<WeightFile> read = ReadFromFile(bytes);
  FUZZ_CHECK(read.ok() == file.ok());
  if (!file.ok()) {
    FUZZ_CHECK(file.status().code() == absl::StatusCode::kDataLoss);
    FUZZ_CHECK(read.status().code() == absl::StatusCode::kDataLoss);
    return;
  }
  FUZZ_CHECK(SameWeightFile(*file, *read));
  // The format has one encoding per weight, so a file that parses is the
  // canonical one.
  const std::string serialized = SerializeWeightFile(file->name, file->weight);
  FUZZ_CHECK(serialized == bytes);
  absl::StatusOr<WeightFile> reparsed = ParseWeightFile(serialized);
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(SameWeightFile(*file, *reparsed));
}

std::string WithMatchingChecksum(absl::string_view bytes) {
  std::string fixed(bytes);
  const size_t body = fixed.size() - kWeightFileChecksumBytes;
  WeightFileChecksum checksum;
  checksum.Update(absl::string_view(fixed).substr(0, body));
  const uint64_t sum = checksum.Finish();
  std::memcpy(fixed.data() + body, &sum, sizeof(sum));  // little-endian host
  return fixed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  ParseAndCheckRoundTrip(bytes);
  if (size >= static_cast<size_t>(kWeightFileChecksumBytes)) {
    ParseAndCheckRoundTrip(WithMatchingChecksum(bytes));
  }
  return 0;
}
