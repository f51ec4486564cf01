// The flags with which nibble's tools reach a server over TLS and with a
// bearer token, shared by `nibble` and `nibble-load`: --tls, --tls_ca,
// --tls_cert, --tls_key and --auth_token_file.
//
// Example:
//   absl::StatusOr<nibble::ConnectionOptions> connection =
//       nibble::ConnectionOptionsFromFlags();
//   auto channel = nibble::CreateChannel(target, *connection);
#ifndef NIBBLE_CLIENT_CONNECTION_FLAGS_H_
#define NIBBLE_CLIENT_CONNECTION_FLAGS_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/nibble_client.h"

namespace nibble {

// Their names, for DescribeFlags.
inline constexpr absl::string_view kConnectionFlagNames[] = {
    "tls", "tls_ca", "tls_cert", "tls_key", "auth_token_file"};

// The files named by the flags, read. InvalidArgument naming the flag and the
// file when one cannot be read, or when --tls_cert and --tls_key are not
// given together. Any of --tls_ca, --tls_cert and --tls_key implies --tls.
absl::StatusOr<ConnectionOptions> ConnectionOptionsFromFlags();

}  // namespace nibble

#endif  // NIBBLE_CLIENT_CONNECTION_FLAGS_H_
