#include "base/file_contents.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <system_error>
#include <utility>

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

}  // namespace

absl::StatusOr<ReadOnlyFile> ReadOnlyFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO would otherwise wait for a writer, forever;
  // regular files, the only ones read, ignore it.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return FileError("open", path, errno);
  // Closes `fd` on the refusals below.
  ReadOnlyFile file(path, fd, 0);
  struct stat info;
  if (fstat(fd, &info) != 0) return FileError("stat", path, errno);
  if (!S_ISREG(info.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", path, ": not a regular file but ",
                     FileKind(info.st_mode)));
  }
  file.size_ = info.st_size;
  return file;
}

ReadOnlyFile::ReadOnlyFile(ReadOnlyFile&& other) noexcept
    : path_(std::move(other.path_)),
      fd_(std::exchange(other.fd_, -1)),
      size_(other.size_) {}

ReadOnlyFile& ReadOnlyFile::operator=(ReadOnlyFile&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    size_ = other.size_;
  }
  return *this;
}

ReadOnlyFile::~ReadOnlyFile() {
  if (fd_ >= 0) close(fd_);
}

absl::Status ReadOnlyFile::ReadAt(int64_t offset, absl::Span<char> out) const {
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t got =
        pread(fd_, out.data() + done, out.size() - done, offset + done);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return FileError("read", path_, errno);
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat("cannot read ", path_, ": it shrank while being read"));
    }
    done += got;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadFileContents(const std::string& path) {
  absl::StatusOr<ReadOnlyFile> file = ReadOnlyFile::Open(path);
  if (!file.ok()) return file.status();
  std::string bytes(file->size(), '\0');
  if (absl::Status status = file->ReadAt(0, absl::MakeSpan(bytes));
      !status.ok()) {
    return status;
  }
  return bytes;
}

}  // namespace nibble
