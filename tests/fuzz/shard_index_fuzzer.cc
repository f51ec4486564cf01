// Fuzzes the reader of a sharded checkpoint's index: ParseShardIndex must
// refuse bad text with INVALID_ARGUMENT naming the index, and what it
// accepts must name only files beside the index and read back the same when
// written out again as an index.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "nlohmann/json.hpp"
#include "tests/fuzz/fuzz_check.h"

namespace {

using nibble::checkpoint::ParseShardIndex;
using nibble::checkpoint::ShardIndex;

constexpr char kPath[] = "model.safetensors.index.json";

std::string AsIndex(const ShardIndex& index) {
  nlohmann::json json;
  json["weight_map"] = nlohmann::json::object();
  for (const auto& [tensor, shard] : index.shard_of_tensor) {
    json["weight_map"][tensor] = shard;
  }
  json["metadata"] = nlohmann::json::object();
  for (const auto& [key, value] : index.metadata) json["metadata"][key] = value;
  return json.dump();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ShardIndex> index = ParseShardIndex(text, kPath);
  if (!index.ok()) {
    FUZZ_CHECK(index.status().code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(absl::StartsWith(index.status().message(), kPath));
    return 0;
  }
  for (const auto& [tensor, shard] : index->shard_of_tensor) {
    FUZZ_CHECK(!shard.empty() && shard != "." && shard != ".." &&
               shard.find('/') == std::string::npos);
  }
  absl::StatusOr<ShardIndex> reparsed = ParseShardIndex(AsIndex(*index), kPath);
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(reparsed->shard_of_tensor == index->shard_of_tensor);
  FUZZ_CHECK(reparsed->metadata == index->metadata);
  return 0;
}
