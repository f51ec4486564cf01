#include "client/connection_flags.h"

#include <optional>
#include <string>
#include <tuple>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "base/file_contents.h"

ABSL_FLAG(bool, tls, false,
          "connect with TLS, trusting the system's root certificates unless "
          "--tls_ca is given");
ABSL_FLAG(std::optional<std::string>, tls_ca, std::nullopt,
          "PEM file of the CA that signed the server's certificate; implies "
          "--tls");
ABSL_FLAG(std::optional<std::string>, tls_cert, std::nullopt,
          "PEM file of this client's certificate, for a server that requires "
          "one (mutual TLS); with --tls_key");
ABSL_FLAG(std::optional<std::string>, tls_key, std::nullopt,
          "PEM file of this client's private key; with --tls_cert");
ABSL_FLAG(std::optional<std::string>, auth_token_file, std::nullopt,
          "file whose first line is the bearer token to send");

namespace nibble {
namespace {

// The contents of the file named by --`flag`, if given.
absl::StatusOr<std::optional<std::string>> ReadFlagFile(
    absl::string_view flag, const std::optional<std::string>& path) {
  if (!path.has_value()) return std::nullopt;
  absl::StatusOr<std::string> contents = ReadFileContents(*path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", contents.status().message()));
  }
  return *std::move(contents);
}

}  // namespace

absl::StatusOr<ConnectionOptions> ConnectionOptionsFromFlags() {
  ConnectionOptions connection;
  const std::optional<std::string> ca_path = absl::GetFlag(FLAGS_tls_ca);
  const std::optional<std::string> cert_path = absl::GetFlag(FLAGS_tls_cert);
  const std::optional<std::string> key_path = absl::GetFlag(FLAGS_tls_key);
  if (cert_path.has_value() != key_path.has_value()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both or neither");
  }
  connection.tls = absl::GetFlag(FLAGS_tls) || ca_path || cert_path;
  for (auto [flag, path, pem] :
       {std::tuple("tls_ca", &ca_path, &connection.tls_ca),
        std::tuple("tls_cert", &cert_path, &connection.tls_cert),
        std::tuple("tls_key", &key_path, &connection.tls_key)}) {
    absl::StatusOr<std::optional<std::string>> contents =
        ReadFlagFile(flag, *path);
    if (!contents.ok()) return contents.status();
    if (contents->has_value()) *pem = **contents;
  }
  absl::StatusOr<std::optional<std::string>> token =
      ReadFlagFile("auth_token_file", absl::GetFlag(FLAGS_auth_token_file));
  if (!token.ok()) return token.status();
  if (token->has_value()) {
    const std::string& text = **token;
    connection.auth_token = std::string(
        absl::StripAsciiWhitespace(text.substr(0, text.find('\n'))));
    if (connection.auth_token.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--auth_token_file: ", *absl::GetFlag(FLAGS_auth_token_file),
          " has no token on its first line"));
    }
  }
  return connection;
}

}  // namespace nibble
