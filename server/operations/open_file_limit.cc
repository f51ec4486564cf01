#include "server/operations/open_file_limit.h"

#include <sys/resource.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace nibble::server {
namespace {

// Linux refuses RLIM_INFINITY for RLIMIT_NOFILE; this file holds the most it
// takes.
constexpr char kKernelCapPath[] = "/proc/sys/fs/nr_open";

absl::Status Failure(absl::string_view what) {
  return absl::InternalError(absl::StrCat(
      "cannot ", what, " the open file limit: ", std::strerror(errno)));
}

}  // namespace

absl::StatusOr<OpenFileLimit> RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return Failure("read");
  const OpenFileLimit unchanged{.before = static_cast<int64_t>(limit.rlim_cur),
                                .now = static_cast<int64_t>(limit.rlim_cur)};
  rlim_t target = limit.rlim_max;
  if (target == RLIM_INFINITY) {
    // A stream: procfs files report a size of 0.
    std::ifstream in(kKernelCapPath);
    uint64_t cap_value = 0;
    if (!(in >> cap_value) || cap_value == 0) {
      return absl::InternalError(
          absl::StrCat("cannot raise the open file limit: the hard limit is "
                       "unlimited and ",
                       kKernelCapPath, " is unreadable"));
    }
    target = cap_value;
  }
  if (target <= limit.rlim_cur) return unchanged;
  limit.rlim_cur = target;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) return Failure("raise");
  return OpenFileLimit{.before = unchanged.before,
                       .now = static_cast<int64_t>(target)};
}

}  // namespace nibble::server
