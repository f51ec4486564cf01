// The directory where nibbled --data_dir keeps one file per weight,
// <dir>/<name>.nibble (format in weight_file.h). A save writes
// <name>.nibble.tmp-<pid>-<n>, fsyncs it, renames it over <name>.nibble and
// fsyncs the directory, so that after a crash the file is either the old one
// or the new one, never half of it, and a weight whose save returned OK
// survives a power cut. Temporary files left by a crash are removed by
// LoadAll; files of other names are never removed.
//
// Example:
//   nibble::server::WeightDirectory dir("/var/lib/nibble");
//   RETURN_IF_ERROR(dir.Prepare());
//   absl::StatusOr<nibble::server::LoadReport> report =
//       dir.LoadAll([&](nibble::server::WeightFileReader& file) { ... });
//   RETURN_IF_ERROR(dir.Save("proj", weight));
//   // Or as an upload arrives:
//   absl::StatusOr<nibble::server::WeightDirectory::PendingSave> save =
//       dir.StartSave("proj", spec, /*activation_order=*/{});
//   RETURN_IF_ERROR(save->Append(qweight_bytes));  // ... every tensor byte
//   RETURN_IF_ERROR(save->Commit());
//   RETURN_IF_ERROR(dir.Remove("proj"));
#ifndef NIBBLE_SERVER_STORAGE_WEIGHT_DIRECTORY_H_
#define NIBBLE_SERVER_STORAGE_WEIGHT_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/weight_format.h"
#include "server/storage/weight_file.h"

namespace nibble::server {

// A file LoadAll skipped, and why.
struct WeightFileProblem {
  std::string path;
  std::string reason;
};

struct LoadReport {
  int weights_loaded = 0;
  // Torn, corrupt, unreadable or refused .nibble files; they stay on disk,
  // unserved.
  std::vector<WeightFileProblem> problems;
  // Temporary files of saves that never finished, now deleted.
  std::vector<std::string> removed_temp_files;
};

class WeightDirectory {
 public:
  explicit WeightDirectory(std::string path) : path_(std::move(path)) {}

  const std::string& path() const { return path_; }

  // Creates the directory when missing and checks that a file can be
  // written, synced and removed in it. FAILED_PRECONDITION, naming the path
  // and the system's reason, when not.
  absl::Status Prepare() const;

  // A weight file being written under its temporary name (StartSave), so
  // that an upload goes to disk as it arrives; only Commit gives it the
  // weight's name. Destroyed uncommitted, it removes its temporary file.
  // Movable; the directory must outlive it.
  class PendingSave {
   public:
    PendingSave(PendingSave&& other) noexcept;
    PendingSave& operator=(PendingSave&& other) noexcept;
    ~PendingSave();

    // The next bytes of the weight's tensors, as WeightFileWriter::Append
    // takes them; RESOURCE_EXHAUSTED when the disk is full, UNAVAILABLE for
    // other I/O errors.
    absl::Status Append(absl::string_view tensor_bytes);

    // Finishes and syncs the file, renames it over <name>.nibble and syncs
    // the directory; fails as Save does, leaving nothing of this save on
    // disk. Call once.
    absl::Status Commit();

   private:
    friend class WeightDirectory;
    PendingSave(const WeightDirectory* directory, std::string final_path,
                std::string temp_path, int fd)
        : directory_(directory),
          final_path_(std::move(final_path)),
          temp_path_(std::move(temp_path)),
          fd_(fd) {}
    // Closes the file and removes it, unless committed.
    void Abandon();

    const WeightDirectory* directory_ = nullptr;
    std::string final_path_;
    std::string temp_path_;
    int fd_ = -1;  // -1 once committed or abandoned
    std::optional<WeightFileWriter> writer_;
  };

  // Creates the temporary file of weight `name` of `spec` (see above) and
  // writes its header; the tensors follow with PendingSave::Append.
  // INVALID_ARGUMENT for a name that is not a valid weight name; I/O errors
  // as PendingSave::Append answers them.
  absl::StatusOr<PendingSave> StartSave(
      absl::string_view name, const WeightSpec& spec,
      std::vector<int32_t> activation_order) const;
  // StartSave with every tensor of `weight` written: only Commit is left.
  absl::StatusOr<PendingSave> StartSave(absl::string_view name,
                                        const QuantizedWeight& weight) const;

  // Writes the weight's file atomically (see above), replacing any file of
  // that name: StartSave, then Commit. INVALID_ARGUMENT for a name that is
  // not a valid weight name; RESOURCE_EXHAUSTED when the disk is full;
  // UNAVAILABLE for other I/O errors. On failure nothing of this save is
  // left on disk.
  absl::Status Save(absl::string_view name,
                    const QuantizedWeight& weight) const;

  // Deletes the weight's file; OK when there is none. UNAVAILABLE, naming the
  // path, when it cannot be deleted.
  absl::Status Remove(absl::string_view name) const;

  // Opens every <name>.nibble, in file name order, and hands it to `accept`
  // with its header, name and activation order checked (WeightFileReader),
  // one at a time; `accept` reads its tensors, or refuses it unread (a
  // weight too large for the memory it would take), and removes leftover
  // temporary files. A file that cannot be read or parsed, that is not a
  // regular file (a FIFO, a device: refused without waiting on it), that is
  // a symbolic link leading outside the directory, whose name disagrees
  // with the weight in it, or that `accept` refuses is reported in
  // `problems` and left alone. Other files are ignored.
  // FAILED_PRECONDITION when the directory cannot be listed.
  absl::StatusOr<LoadReport> LoadAll(
      const std::function<absl::Status(WeightFileReader&)>& accept) const;

  // <dir>/<name>.nibble.
  std::string FilePath(absl::string_view name) const;

 private:
  std::string path_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_STORAGE_WEIGHT_DIRECTORY_H_
