// Fuzzes the safetensors reader: SafetensorsFile::FromBytes must refuse bad
// bytes cleanly, and whatever it accepts must hold together: every tensor's
// bytes lie inside the input and tile its data section, and writing the
// tensors out again with SerializeSafetensors reads back the same tensors.
// Each input is parsed twice: as it is, and with its length prefix rewritten
// to end the header at the input's last '}', so that mutations which grow or
// shrink the JSON still reach the checks behind the framing.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using nibble::checkpoint::NamedTensorBytes;
using nibble::checkpoint::SafetensorsDtypeBytes;
using nibble::checkpoint::SafetensorsFile;
using nibble::checkpoint::SerializeSafetensors;
using nibble::checkpoint::TensorInfo;

absl::string_view AsStringView(absl::Span<const uint8_t> bytes) {
  return absl::string_view(reinterpret_cast<const char*>(bytes.data()),
                           bytes.size());
}

std::vector<NamedTensorBytes> TensorsOf(const SafetensorsFile& file) {
  std::vector<NamedTensorBytes> tensors;
  for (const TensorInfo& tensor : file.tensors()) {
    tensors.push_back({tensor.name, tensor.dtype, tensor.shape,
                       AsStringView(file.Data(tensor))});
  }
  return tensors;
}

// The same tensors, whatever their layout in the data section.
bool SameTensors(const SafetensorsFile& a, const SafetensorsFile& b) {
  if (a.tensors().size() != b.tensors().size()) return false;
  for (size_t i = 0; i < a.tensors().size(); ++i) {
    const TensorInfo& x = a.tensors()[i];
    const TensorInfo& y = b.tensors()[i];
    if (x.name != y.name || x.dtype != y.dtype || x.shape != y.shape ||
        AsStringView(a.Data(x)) != AsStringView(b.Data(y))) {
      return false;
    }
  }
  return a.metadata() == b.metadata();
}

void ParseAndCheckInvariants(absl::string_view input) {
  absl::StatusOr<SafetensorsFile> file =
      SafetensorsFile::FromBytes(std::string(input));
  if (!file.ok()) return;
  const absl::Span<const uint8_t> bytes = file->bytes();
  FUZZ_CHECK(AsStringView(bytes) == input);
  FUZZ_CHECK(file->data_start() >= 8 &&
             file->data_start() <= static_cast<int64_t>(bytes.size()));

  int64_t tensor_bytes = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& tensor : file->tensors()) {
    FUZZ_CHECK(previous == nullptr || previous->name < tensor.name);
    FUZZ_CHECK(file->Find(tensor.name) == &tensor);
    FUZZ_CHECK(0 <= tensor.begin && tensor.begin <= tensor.end);
    FUZZ_CHECK(tensor.num_elements() * SafetensorsDtypeBytes(tensor.dtype) ==
               tensor.num_bytes());
    const absl::Span<const uint8_t> data = file->Data(tensor);
    FUZZ_CHECK(static_cast<int64_t>(data.size()) == tensor.num_bytes());
    FUZZ_CHECK(data.data() >= bytes.data() + file->data_start());
    FUZZ_CHECK(data.data() + data.size() <= bytes.data() + bytes.size());
    tensor_bytes += tensor.num_bytes();
    previous = &tensor;
  }
  // No overlaps and no holes: the tensors add up to the data section.
  FUZZ_CHECK(tensor_bytes ==
             static_cast<int64_t>(bytes.size()) - file->data_start());

  absl::StatusOr<std::string> serialized =
      SerializeSafetensors(TensorsOf(*file), file->metadata());
  FUZZ_CHECK(serialized.ok());
  absl::StatusOr<SafetensorsFile> reparsed =
      SafetensorsFile::FromBytes(*serialized);
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(SameTensors(*file, *reparsed));
  // The writer's output is canonical: writing it again changes nothing.
  absl::StatusOr<std::string> reserialized =
      SerializeSafetensors(TensorsOf(*reparsed), reparsed->metadata());
  FUZZ_CHECK(reserialized.ok() && *reserialized == *serialized);
}

std::string WithHeaderEndingAtLastBrace(absl::string_view bytes) {
  std::string fixed(bytes);
  const size_t brace = fixed.rfind('}');
  if (brace == std::string::npos || brace < 8) return fixed;
  const uint64_t header_bytes = brace + 1 - 8;
  for (int i = 0; i < 8; ++i)
    fixed[i] = static_cast<char>(header_bytes >> 8 * i);
  return fixed;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  ParseAndCheckInvariants(bytes);
  if (size >= 8) ParseAndCheckInvariants(WithHeaderEndingAtLastBrace(bytes));
  return 0;
}
