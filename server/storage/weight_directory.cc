#include "server/storage/weight_directory.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <system_error>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "format/weight_name.h"

namespace nibble::server {
namespace {

constexpr absl::string_view kWeightFileSuffix = ".nibble";
// Marks the files of unfinished saves, <name>.nibble.tmp-<pid>-<n>. They end
// in digits, so they never end in kWeightFileSuffix, even for a weight named
// like "x.nibble.tmp-1".
constexpr absl::string_view kTempMarker = ".nibble.tmp-";
// The name before kTempMarker of Prepare's probe file, which no weight can
// have (weight names do not start with a dot).
constexpr absl::string_view kProbeName = ".write-probe";

std::string ErrnoText(int error) {
  return std::error_code(error, std::generic_category()).message();
}

// "cannot <action> <path>: <reason>", as RESOURCE_EXHAUSTED when the disk is
// full and UNAVAILABLE otherwise.
absl::Status IoError(absl::string_view action, absl::string_view path,
                     int error) {
  std::string message =
      absl::StrCat("cannot ", action, " ", path, ": ", ErrnoText(error));
  if (error == ENOSPC || error == EDQUOT) {
    return absl::ResourceExhaustedError(std::move(message));
  }
  return absl::UnavailableError(std::move(message));
}

// Appended to "<dir>/<name>.nibble": a name that no concurrent save, in this
// process or another, also uses.
std::string UniqueTempSuffix() {
  static std::atomic<uint64_t> next_save{0};
  return absl::StrCat(".tmp-", getpid(), "-", next_save.fetch_add(1));
}

bool AllDigits(absl::string_view text) {
  return !text.empty() && absl::c_all_of(text, absl::ascii_isdigit);
}

// Whether `file_name` is one that Save or Prepare gives its temporary file,
// <weight name or kProbeName>.nibble.tmp-<pid>-<n>, and nothing else, so that
// a user's "notes.nibble.tmp-old" is never taken for one.
bool IsOwnTempFileName(absl::string_view file_name) {
  const size_t marker = file_name.rfind(kTempMarker);
  if (marker == absl::string_view::npos) return false;
  const absl::string_view name = file_name.substr(0, marker);
  const absl::string_view suffix =
      file_name.substr(marker + kTempMarker.size());
  const size_t dash = suffix.find('-');
  if (dash == absl::string_view::npos || !AllDigits(suffix.substr(0, dash)) ||
      !AllDigits(suffix.substr(dash + 1))) {
    return false;
  }
  return name == kProbeName || ValidateWeightName(name).ok();
}

absl::Status WriteAll(int fd, absl::string_view bytes, absl::string_view path) {
  while (!bytes.empty()) {
    const ssize_t written = write(fd, bytes.data(), bytes.size());
    if (written < 0) {
      if (errno == EINTR) continue;
      return IoError("write", path, errno);
    }
    bytes.remove_prefix(written);
  }
  return absl::OkStatus();
}

// A new file at `path`, opened for writing.
absl::StatusOr<int> CreateNewFile(const std::string& path) {
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return IoError("create", path, errno);
  return fd;
}

// Syncs and closes `fd`, the file at `path`, after `written` (the writes'
// status); on any failure removes the file.
absl::Status SyncAndClose(int fd, const std::string& path,
                          absl::Status written) {
  if (written.ok() && fsync(fd) != 0) written = IoError("sync", path, errno);
  if (close(fd) != 0 && written.ok()) written = IoError("close", path, errno);
  if (!written.ok()) unlink(path.c_str());
  return written;
}

// OK unless `path` is a symbolic link that leads outside `inside`, a
// canonical directory path; then FAILED_PRECONDITION naming where it leads,
// so that a link cannot make nibbled read files it was not given.
absl::Status CheckLinkStaysInside(const std::string& path,
                                  const std::filesystem::path& inside) {
  std::error_code error;
  if (!std::filesystem::is_symlink(
          std::filesystem::symlink_status(path, error))) {
    return absl::OkStatus();
  }
  const std::filesystem::path target = std::filesystem::canonical(path, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "is a symbolic link that cannot be followed: ", error.message()));
  }
  const auto [inside_end, target_rest] =
      std::mismatch(inside.begin(), inside.end(), target.begin(), target.end());
  if (inside_end != inside.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("is a symbolic link to ", target.string(),
                     ", outside the data directory; nibbled loads only files "
                     "inside it"));
  }
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return IoError("open directory", path, errno);
  absl::Status status = absl::OkStatus();
  if (fsync(fd) != 0) status = IoError("sync directory", path, errno);
  close(fd);
  return status;
}

}  // namespace

std::string WeightDirectory::FilePath(absl::string_view name) const {
  return absl::StrCat(path_, "/", name, kWeightFileSuffix);
}

absl::Status WeightDirectory::Prepare() const {
  std::error_code error;
  std::filesystem::create_directories(path_, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot create data directory ", path_, ": ", error.message()));
  }
  if (!std::filesystem::is_directory(path_, error)) {
    return absl::FailedPreconditionError(
        absl::StrCat("data directory ", path_, " is not a directory"));
  }
  const std::string probe = absl::StrCat(path_, "/", kProbeName,
                                         kWeightFileSuffix, UniqueTempSuffix());
  absl::StatusOr<int> fd = CreateNewFile(probe);
  absl::Status written = fd.status();
  if (fd.ok())
    written = SyncAndClose(*fd, probe, WriteAll(*fd, "probe", probe));
  if (written.ok() && unlink(probe.c_str()) != 0) {
    written = IoError("delete", probe, errno);
  }
  if (!written.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data directory ", path_, " is not writable: ", written.message()));
  }
  return absl::OkStatus();
}

WeightDirectory::PendingSave::PendingSave(PendingSave&& other) noexcept
    : directory_(std::exchange(other.directory_, nullptr)),
      final_path_(std::move(other.final_path_)),
      temp_path_(std::move(other.temp_path_)),
      fd_(std::exchange(other.fd_, -1)),
      writer_(std::exchange(other.writer_, std::nullopt)) {}

WeightDirectory::PendingSave& WeightDirectory::PendingSave::operator=(
    PendingSave&& other) noexcept {
  if (this != &other) {
    Abandon();
    directory_ = std::exchange(other.directory_, nullptr);
    final_path_ = std::move(other.final_path_);
    temp_path_ = std::move(other.temp_path_);
    fd_ = std::exchange(other.fd_, -1);
    writer_ = std::exchange(other.writer_, std::nullopt);
  }
  return *this;
}

WeightDirectory::PendingSave::~PendingSave() { Abandon(); }

void WeightDirectory::PendingSave::Abandon() {
  if (fd_ < 0) return;
  close(fd_);
  unlink(temp_path_.c_str());
  fd_ = -1;
}

absl::Status WeightDirectory::PendingSave::Append(
    absl::string_view tensor_bytes) {
  return writer_->Append(tensor_bytes);
}

absl::Status WeightDirectory::PendingSave::Commit() {
  const int fd = std::exchange(fd_, -1);
  if (absl::Status status = SyncAndClose(fd, temp_path_, writer_->Finish());
      !status.ok()) {
    return status;
  }
  if (rename(temp_path_.c_str(), final_path_.c_str()) != 0) {
    const int error = errno;
    unlink(temp_path_.c_str());
    return IoError(absl::StrCat("rename ", temp_path_, " to"), final_path_,
                   error);
  }
  // Until the directory is synced the rename may not survive a power cut,
  // so the save has not happened.
  if (absl::Status status = SyncDirectory(directory_->path_); !status.ok()) {
    unlink(final_path_.c_str());
    return status;
  }
  return absl::OkStatus();
}

absl::StatusOr<WeightDirectory::PendingSave> WeightDirectory::StartSave(
    absl::string_view name, const WeightSpec& spec,
    std::vector<int32_t> activation_order) const {
  if (absl::Status status = ValidateWeightName(name); !status.ok()) {
    return status;
  }
  std::string final_path = FilePath(name);
  std::string temp_path = absl::StrCat(final_path, UniqueTempSuffix());
  absl::StatusOr<int> fd = CreateNewFile(temp_path);
  if (!fd.ok()) return fd.status();
  PendingSave save(this, std::move(final_path), temp_path, *fd);
  // The writer's sink outlives moves of `save`, so it holds copies.
  absl::StatusOr<WeightFileWriter> writer = WeightFileWriter::Start(
      name, spec, std::move(activation_order),
      [fd = *fd, path = std::move(temp_path)](absl::string_view bytes) {
        return WriteAll(fd, bytes, path);
      });
  if (!writer.ok()) return writer.status();
  save.writer_.emplace(*std::move(writer));
  return save;
}

absl::StatusOr<WeightDirectory::PendingSave> WeightDirectory::StartSave(
    absl::string_view name, const QuantizedWeight& weight) const {
  absl::StatusOr<PendingSave> save =
      StartSave(name, weight.spec, weight.activation_order);
  if (!save.ok()) return save.status();
  if (absl::Status status = save->writer_->AppendTensors(weight);
      !status.ok()) {
    return status;
  }
  return save;
}

absl::Status WeightDirectory::Save(absl::string_view name,
                                   const QuantizedWeight& weight) const {
  absl::StatusOr<PendingSave> save = StartSave(name, weight);
  if (!save.ok()) return save.status();
  return save->Commit();
}

absl::Status WeightDirectory::Remove(absl::string_view name) const {
  if (absl::Status status = ValidateWeightName(name); !status.ok()) {
    return status;
  }
  const std::string path = FilePath(name);
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return IoError("delete", path, errno);
  }
  return SyncDirectory(path_);
}

absl::StatusOr<LoadReport> WeightDirectory::LoadAll(
    const std::function<absl::Status(WeightFileReader&)>& accept) const {
  std::error_code error;
  std::vector<std::string> file_names;
  for (std::filesystem::directory_iterator it(path_, error), end;
       !error && it != end; it.increment(error)) {
    file_names.push_back(it->path().filename().string());
  }
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot list data directory ", path_, ": ", error.message()));
  }
  std::sort(file_names.begin(), file_names.end());
  const std::filesystem::path canonical_path =
      std::filesystem::canonical(path_, error);
  if (error) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot resolve data directory ", path_, ": ", error.message()));
  }

  LoadReport report;
  for (const std::string& file_name : file_names) {
    const std::string path = absl::StrCat(path_, "/", file_name);
    absl::string_view stem = file_name;
    if (!absl::ConsumeSuffix(&stem, kWeightFileSuffix)) {
      if (!IsOwnTempFileName(file_name) ||
          !std::filesystem::is_regular_file(
              std::filesystem::symlink_status(path, error))) {
        continue;
      }
      if (unlink(path.c_str()) == 0 || errno == ENOENT) {
        report.removed_temp_files.push_back(path);
      } else {
        report.problems.push_back(
            {path, absl::StrCat("cannot delete this leftover temporary file: ",
                                ErrnoText(errno))});
      }
      continue;
    }
    if (absl::Status status = CheckLinkStaysInside(path, canonical_path);
        !status.ok()) {
      report.problems.push_back({path, std::string(status.message())});
      continue;
    }
    // Only the header, name and activation order so far: `accept` may skip
    // the weight unread (a 10 GiB sparse file included). FIFOs and devices
    // are refused without waiting on them.
    absl::StatusOr<WeightFileReader> file = WeightFileReader::Open(path);
    absl::Status accepted = file.status();
    if (accepted.ok() && file->name() != stem) {
      accepted = absl::DataLossError(
          absl::StrCat("holds weight \"", file->name(),
                       "\", but its file name says \"", stem, "\""));
    }
    if (accepted.ok()) accepted = accept(*file);
    if (!accepted.ok()) {
      report.problems.push_back({path, std::string(accepted.message())});
      continue;
    }
    ++report.weights_loaded;
  }
  return report;
}

}  // namespace nibble::server
