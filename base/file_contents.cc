#include "base/file_contents.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <system_error>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace nibble {
absl::Status FileError(absl::string_view action, const std::string& path,
                       int error) {
  std::string message =
      absl::StrCat("cannot ", action, " ", path, ": ",
                   std::error_code(error, std::generic_category()).message());
  if (error == ENOENT || error == ENOTDIR) {
    return absl::NotFoundError(std::move(message));
  }
  if (error == EACCES || error == EPERM) {
    return absl::PermissionDeniedError(std::move(message));
  }
  return absl::UnavailableError(std::move(message));
}

namespace {

// What a file that is not a regular one is, for messages.
absl::string_view FileKind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a file";
}

// The file's bytes, at most `max_bytes` of them (-1: all).
absl::StatusOr<std::string> ReadAtMost(const std::string& path,
                                       int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer, forever;
  // regular files, the only ones read, ignore it.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return FileError("open", path, errno);
  struct stat info;
  absl::Status status = absl::OkStatus();
  std::string bytes;
  if (fstat(fd, &info) != 0) {
    status = FileError("stat", path, errno);
  } else if (!S_ISREG(info.st_mode)) {
    status = absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, ": not a regular file but ",
                     FileKind(info.st_mode)));
  } else {
    bytes.resize(max_bytes < 0 ? info.st_size
                               : std::min<int64_t>(info.st_size, max_bytes));
    size_t done = 0;
    while (status.ok() && done < bytes.size()) {
      const ssize_t got =
          pread(fd, bytes.data() + done, bytes.size() - done, done);
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        status = FileError("read", path, errno);
      } else if (got == 0) {
        status = absl::DataLossError(
            absl::StrCat("cannot read ", path, ": it shrank while being read"));
      } else {
        done += got;
      }
    }
  }
  close(fd);
  if (!status.ok()) return status;
  return bytes;
}

}  // namespace

absl::StatusOr<std::string> ReadFileContents(const std::string& path) {
  return ReadAtMost(path, /*max_bytes=*/-1);
}

absl::StatusOr<std::string> ReadFilePrefix(const std::string& path,
                                           int64_t max_bytes) {
  return ReadAtMost(path, max_bytes);
}

}  // namespace nibble
