// The limit on open files (RLIMIT_NOFILE), raised at start from its soft
// value to its hard one. Every connection takes a descriptor, and gRPC 1.51
// stops accepting for good once accept4 fails with EMFILE (CVE-2023-4785), so
// a client holding idle connections must open as many as the hard limit
// allows (often 524288 or more) instead of the soft 1024.
//
// Example:
//   absl::StatusOr<nibble::server::OpenFileLimit> files =
//       nibble::server::RaiseOpenFileLimit();
//   if (files.ok()) LogInfo("open files", {{"max_open_files", files->now}});
#ifndef NIBBLE_SERVER_OPERATIONS_OPEN_FILE_LIMIT_H_
#define NIBBLE_SERVER_OPERATIONS_OPEN_FILE_LIMIT_H_

#include <cstdint>

#include "absl/status/statusor.h"

namespace nibble::server {

struct OpenFileLimit {
  // The soft limit found, and the one in effect now.
  int64_t before = 0;
  int64_t now = 0;
};

// Sets the soft RLIMIT_NOFILE to the hard one. Where the hard limit is
// unlimited, to the kernel's cap (/proc/sys/fs/nr_open). INTERNAL, with the
// reason, when the limit cannot be read or set; the soft limit is then left
// as it was.
absl::StatusOr<OpenFileLimit> RaiseOpenFileLimit();

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_OPEN_FILE_LIMIT_H_
