#include "server/operations/memory_limit.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace nibble::server {

absl::StatusOr<std::optional<int64_t>> ParseCgroupMemoryLimit(
    absl::string_view contents) {
  absl::string_view text = contents;
  absl::ConsumeSuffix(&text, "\n");
  if (text == "max") return std::nullopt;
  int64_t bytes = 0;
  // Digits only: SimpleAtoi also takes signs and spaces, which the kernel
  // never writes.
  if (text.empty() ||
      !std::all_of(text.begin(), text.end(),
                   [](char c) { return absl::ascii_isdigit(c); }) ||
      !absl::SimpleAtoi(text, &bytes) || bytes <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cgroup memory limit \"", absl::CHexEscape(contents),
                     "\" is neither a positive byte count nor \"max\""));
  }
  return bytes;
}

MemoryLimit AvailableMemory(int64_t physical_bytes,
                            const std::string& cgroup_root) {
  MemoryLimit limit{.bytes = physical_bytes, .source = "physical memory"};
  // cgroup v1 reports "no limit" as a huge number, which loses to physical
  // memory here.
  for (const char* file : {"/memory.max", "/memory/memory.limit_in_bytes"}) {
    const std::string path = cgroup_root + file;
    std::ifstream in(path);
    if (!in) continue;
    const std::string contents(std::istreambuf_iterator<char>(in), {});
    absl::StatusOr<std::optional<int64_t>> bytes =
        ParseCgroupMemoryLimit(contents);
    if (bytes.ok() && bytes->has_value() && **bytes < limit.bytes) {
      limit = {.bytes = **bytes, .source = absl::StrCat("cgroup limit ", path)};
    }
  }
  return limit;
}

int64_t PhysicalMemoryBytes() {
  return static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
}

}  // namespace nibble::server
