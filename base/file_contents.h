// Reads a whole file into memory, for the small files nibble's tools and
// server take by path (tuning tables, token and certificate files), or opens
// one to be read in pieces (a weight file).
// Errors name the path and the operating system's reason.
//
// Example:
//   absl::StatusOr<std::string> text = nibble::ReadFileContents("tokens");
//   if (!text.ok()) return text.status();  // "cannot open tokens: ..."
//   absl::StatusOr<nibble::ReadOnlyFile> file =
//       nibble::ReadOnlyFile::Open("proj.nibble");
//   RETURN_IF_ERROR(file->ReadAt(/*offset=*/72, absl::MakeSpan(name)));
#ifndef NIBBLE_BASE_FILE_CONTENTS_H_
#define NIBBLE_BASE_FILE_CONTENTS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace nibble {

// The bytes of the regular file at `path`. NOT_FOUND when it does not exist,
// PERMISSION_DENIED when it may not be read, FAILED_PRECONDITION, naming what
// it is, when it is not a regular file (a FIFO is refused at once, not waited
// on), DATA_LOSS when it shrinks while being read, UNAVAILABLE
// for other I/O errors.
absl::StatusOr<std::string> ReadFileContents(const std::string& path);

// A regular file opened for reading, for a reader that takes it in pieces
// (a weight file at start) instead of whole. Closed when destroyed; movable.
class ReadOnlyFile {
 public:
  // ReadFileContents' errors for a file that cannot be opened or that is
  // not a regular file (a FIFO is refused at once, not waited on).
  static absl::StatusOr<ReadOnlyFile> Open(const std::string& path);

  ReadOnlyFile(ReadOnlyFile&& other) noexcept;
  ReadOnlyFile& operator=(ReadOnlyFile&& other) noexcept;
  ~ReadOnlyFile();

  const std::string& path() const { return path_; }
  // The size when opened.
  int64_t size() const { return size_; }

  // Fills `out` with the bytes from `offset` on; ReadFileContents' errors,
  // DATA_LOSS when the file ends first.
  absl::Status ReadAt(int64_t offset, absl::Span<char> out) const;

 private:
  ReadOnlyFile(std::string path, int fd, int64_t size)
      : path_(std::move(path)), fd_(fd), size_(size) {}

  std::string path_;
  int fd_ = -1;
  int64_t size_ = 0;
};

// "cannot ACTION PATH: REASON" for the errno `error`: NOT_FOUND,
// PERMISSION_DENIED or UNAVAILABLE, as ReadFileContents answers. For other
// readers of files (a memory-mapped checkpoint).
absl::Status FileError(absl::string_view action, const std::string& path,
                       int error);

}  // namespace nibble

#endif  // NIBBLE_BASE_FILE_CONTENTS_H_
