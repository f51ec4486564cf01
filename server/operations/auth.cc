#include "server/operations/auth.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "base/file_contents.h"

namespace nibble::server {
namespace {

// The scheme is case-insensitive (RFC 7235, section 2.1): "bearer" and
// "BEARER" are the same scheme as "Bearer".
constexpr absl::string_view kBearerPrefix = "Bearer ";

// Takes as long for every token of one length, so that timing does not tell
// an attacker how much of a guess was right.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  }
  return difference == 0;
}

}  // namespace

absl::StatusOr<TokenAuthenticator> TokenAuthenticator::FromFile(
    absl::string_view path, bool all_rpcs) {
  absl::StatusOr<std::string> text = ReadFileContents(std::string(path));
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read the token file: ", text.status().message()));
  }
  absl::StatusOr<TokenAuthenticator> authenticator = FromText(*text, all_rpcs);
  if (!authenticator.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", authenticator.status().message()));
  }
  return authenticator;
}

absl::StatusOr<TokenAuthenticator> TokenAuthenticator::FromText(
    absl::string_view text, bool all_rpcs) {
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    if (absl::StrContains(line, ' ') || absl::StrContains(line, '\t')) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a token may not contain spaces; put one token per line"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        "no token found; write one token per line ('#' starts a comment)");
  }
  return TokenAuthenticator(std::move(tokens), all_rpcs);
}

absl::Status TokenAuthenticator::Check(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
    RpcAccess access) const {
  if (access == RpcAccess::kReadsOnly && !all_rpcs_) return absl::OkStatus();
  const auto header = metadata.find("authorization");
  if (header == metadata.end()) {
    return absl::UnauthenticatedError(
        "this call needs a bearer token: send the metadata \"authorization: "
        "Bearer TOKEN\" (the nibble tools take --auth_token_file)");
  }
  return CheckBearer(
      absl::string_view(header->second.data(), header->second.size()));
}

absl::Status TokenAuthenticator::CheckBearer(
    absl::string_view authorization) const {
  if (!absl::StartsWithIgnoreCase(authorization, kBearerPrefix)) {
    return absl::UnauthenticatedError(
        "the authorization metadata must read \"Bearer TOKEN\"");
  }
  const absl::string_view token = authorization.substr(kBearerPrefix.size());
  bool accepted = false;
  for (const std::string& known : tokens_) {
    accepted |= ConstantTimeEquals(token, known);
  }
  if (!accepted) {
    return absl::UnauthenticatedError(
        "the bearer token is not one this server accepts");
  }
  return absl::OkStatus();
}

absl::Status Authorize(const TokenAuthenticator* auth,
                       const grpc::ServerContextBase& context,
                       RpcAccess access) {
  if (auth == nullptr) return absl::OkStatus();
  return auth->Check(context.client_metadata(), access);
}

}  // namespace nibble::server
