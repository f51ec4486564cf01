// nibbled's flags, each of which the environment may also set
// (NIBBLED_DATA_DIR=/x is --data_dir=/x), and their translation into the
// options nibbled starts with. Built into nibbled alone, so that no test or
// other program defines its flags.
//
// Example:
//   if (absl::Status s = nibble::server::ParseNibbledFlags(argc, argv);
//       !s.ok()) { ... print s.message(), exit 2 ... }
//   absl::StatusOr<nibble::server::NibbledOptions> options =
//       nibble::server::OptionsFromFlags();
#ifndef NIBBLE_SERVER_OPERATIONS_NIBBLED_FLAGS_H_
#define NIBBLE_SERVER_OPERATIONS_NIBBLED_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/import.h"
#include "server/edge/nibble_server.h"

namespace nibble::server {

struct NibbledOptions {
  // All but initial_weights, which the --import checkpoints set once planned.
  ServerOptions server;
  // Where server.max_weight_bytes came from, for the start-up log:
  // "--max_weight_bytes", "3/4 of <memory source>", ...
  std::string max_weight_bytes_source;
  // --tuning_table; empty for the built-in table.
  std::string tuning_table_path;
  // --import, and the --import_* flags as ImportOptions.
  std::vector<std::string> import_paths;
  ImportOptions import;
  // On SIGTERM or SIGINT (--drain_delay_seconds, --shutdown_grace_seconds).
  double drain_delay_seconds = 0;
  double shutdown_grace_seconds = 0;
};

// Sets the usage message, then the flags from the environment, then those of
// the command line, which win. ApplyEnvironmentFlags' error, before the
// command line is read; --help and bad command-line flags exit as
// absl::ParseCommandLine has them.
absl::Status ParseNibbledFlags(int argc, char** argv);

// The parsed flags as options; INVALID_ARGUMENT with what to print after
// "nibbled: " when a value cannot work: every such flag one line each, or the
// --tuning_table, --import_* or --tls_* and --auth_* file or value at fault.
// Reads the files those flags name and, for --max_weight_bytes=0, the
// memory available.
absl::StatusOr<NibbledOptions> OptionsFromFlags();

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_NIBBLED_FLAGS_H_
