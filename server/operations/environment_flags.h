// Flags from environment variables, the convention of container images:
// with the prefix "NIBBLED_", NIBBLED_DATA_DIR=/var/lib/nibble sets
// --data_dir=/var/lib/nibble. Apply them before parsing the command line, so
// that a flag given there wins over the environment.
//
// Example:
//   if (absl::Status status = ApplyEnvironmentFlags("NIBBLED_", environ);
//       !status.ok()) { ... print status.message(), exit 2 ... }
//   absl::ParseCommandLine(argc, argv);
#ifndef NIBBLE_SERVER_OPERATIONS_ENVIRONMENT_FLAGS_H_
#define NIBBLE_SERVER_OPERATIONS_ENVIRONMENT_FLAGS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace nibble::server {

// Sets the flag named by every `environment` entry ("NAME=VALUE", ending with
// a null pointer, as `environ`) whose name starts with `prefix`: the rest of
// the name, lowercased, is the flag, except for the variables Kubernetes
// defines for a Service named like the prefix (PREFIX_SERVICE_HOST,
// PREFIX_PORT, ...), which are skipped. InvalidArgument naming each variable
// that names no flag or holds a value its flag cannot take, one per line;
// the other variables are still applied.
absl::Status ApplyEnvironmentFlags(absl::string_view prefix,
                                   const char* const* environment);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_ENVIRONMENT_FLAGS_H_
