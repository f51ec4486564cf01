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
//       dir.LoadAll([&](nibble::server::WeightFile file) { ... });
//   RETURN_IF_ERROR(dir.Save("proj", weight));
//   RETURN_IF_ERROR(dir.Remove("proj"));
#ifndef NIBBLE_SERVER_STORAGE_WEIGHT_DIRECTORY_H_
#define NIBBLE_SERVER_STORAGE_WEIGHT_DIRECTORY_H_

#include <cstdint>
#include <functional>
#include <string>
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

  // Writes the weight's file atomically (see above), replacing any file of
  // that name. INVALID_ARGUMENT for a name that is not a valid weight name;
  // RESOURCE_EXHAUSTED when the disk is full; UNAVAILABLE for other I/O
  // errors. On failure nothing of this save is left on disk.
  absl::Status Save(absl::string_view name,
                    const QuantizedWeight& weight) const;

  // Deletes the weight's file; OK when there is none. UNAVAILABLE, naming the
  // path, when it cannot be deleted.
  absl::Status Remove(absl::string_view name) const;

  // Reads every <name>.nibble, in file name order, handing each weight to
  // `accept` as soon as it is read, so that only one is held at a time (the
  // file's bytes are freed before `accept` runs), and removes leftover
  // temporary files. Before a file's data is read, `admit` (when set) gets
  // its name and checked header (the weight's spec and the file's size), so
  // that a weight too large for the memory it would take is skipped
  // unread. A file that cannot be read or parsed,
  // that is not a regular file (a FIFO, a device: refused without waiting on
  // it), that is a symbolic link leading outside the directory, whose name
  // disagrees with the weight in it, or that `admit` or `accept` refuses is
  // reported in `problems` and left alone. Other files are
  // ignored. FAILED_PRECONDITION when the directory cannot be listed.
  absl::StatusOr<LoadReport> LoadAll(
      const std::function<absl::Status(WeightFile)>& accept,
      const std::function<absl::Status(absl::string_view name,
                                       const WeightFileHeader& header)>& admit =
          {}) const;

  // <dir>/<name>.nibble.
  std::string FilePath(absl::string_view name) const;

 private:
  std::string path_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_STORAGE_WEIGHT_DIRECTORY_H_
