// How much memory nibbled may use, for the default of --max_weight_bytes: the
// smaller of physical memory and the limit of the process's memory cgroup,
// so that a container with a memory limit gets a budget that fits in it.
//
// Example:
//   nibble::server::MemoryLimit limit = nibble::server::AvailableMemory(
//       nibble::server::PhysicalMemoryBytes(), "/sys/fs/cgroup");
//   int64_t budget = limit.bytes / 4 * 3;
#ifndef NIBBLE_SERVER_OPERATIONS_MEMORY_LIMIT_H_
#define NIBBLE_SERVER_OPERATIONS_MEMORY_LIMIT_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nibble::server {

// The contents of a cgroup memory limit file (v2 memory.max, v1
// memory.limit_in_bytes): the limit in bytes, or nullopt for none ("max").
// INVALID_ARGUMENT, quoting the text, for anything but a positive number or
// "max", each optionally followed by a newline.
absl::StatusOr<std::optional<int64_t>> ParseCgroupMemoryLimit(
    absl::string_view contents);

struct MemoryLimit {
  int64_t bytes = 0;
  // "physical memory", or "cgroup limit " and the file that set it.
  std::string source;
};

// The smaller of `physical_bytes` and the limits in the cgroup files under
// `cgroup_root`: memory.max (cgroup v2) and memory/memory.limit_in_bytes
// (cgroup v1). Missing, unreadable or malformed files set no limit.
MemoryLimit AvailableMemory(int64_t physical_bytes,
                            const std::string& cgroup_root);

// The machine's physical memory in bytes.
int64_t PhysicalMemoryBytes();

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_MEMORY_LIMIT_H_
