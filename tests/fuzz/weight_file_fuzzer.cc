// Fuzzes the persisted weight-file reader: ParseWeightFile must refuse bad
// bytes cleanly, and whatever it accepts must serialize back to exactly the
// bytes it came from. Each input is parsed twice: as it is, and with its
// trailing checksum rewritten to match, so that mutations also reach the
// checks behind the checksum (name, zero points).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "server/storage/weight_file.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using nibble::server::kWeightFileChecksumBytes;
using nibble::server::ParseWeightFile;
using nibble::server::SerializeWeightFile;
using nibble::server::WeightFile;
using nibble::server::WeightFileChecksum;

bool SameWeightFile(const WeightFile& a, const WeightFile& b) {
  return a.name == b.name && a.weight.spec == b.weight.spec &&
         a.weight.qweight == b.weight.qweight &&
         a.weight.scales == b.weight.scales && a.weight.zeros == b.weight.zeros;
}

void ParseAndCheckRoundTrip(absl::string_view bytes) {
  absl::StatusOr<WeightFile> file = ParseWeightFile(bytes);
  if (!file.ok()) return;
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
