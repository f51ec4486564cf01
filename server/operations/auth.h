// Bearer-token authentication for nibbled: the tokens in --auth_token_file,
// required on every RPC of nibble's and the KServe service (all_rpcs), or
// only on those that change weights (--auth_writes_only). Health checks,
// reflection and KServe ServerLive/ServerReady stay open, so that probes and
// tools work without a token.
//
// Example:
//   absl::StatusOr<nibble::server::TokenAuthenticator> auth =
//       nibble::server::TokenAuthenticator::FromFile("/etc/nibble/tokens",
//                                                    /*all_rpcs=*/true);
//   // In a handler:
//   absl::Status status = auth->Check(context->client_metadata(),
//                                     nibble::server::RpcAccess::kChangesWeights);
#ifndef NIBBLE_SERVER_OPERATIONS_AUTH_H_
#define NIBBLE_SERVER_OPERATIONS_AUTH_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/string_ref.h"

namespace nibble::server {

enum class RpcAccess { kReadsOnly, kChangesWeights };

class TokenAuthenticator final {
 public:
  // One token per line; blank lines and lines starting with '#' are skipped,
  // and surrounding spaces trimmed. InvalidArgument, naming the file, when it
  // cannot be read or holds no token.
  static absl::StatusOr<TokenAuthenticator> FromFile(absl::string_view path,
                                                     bool all_rpcs);
  static absl::StatusOr<TokenAuthenticator> FromText(absl::string_view text,
                                                     bool all_rpcs);

  // OK when the call needs no token or carries an accepted one in
  // "authorization: Bearer TOKEN"; UNAUTHENTICATED, saying which, when the
  // header is missing, malformed or names an unknown token.
  absl::Status Check(
      const std::multimap<grpc::string_ref, grpc::string_ref>& metadata,
      RpcAccess access) const;

  // OK when `authorization`, the value of an Authorization header, is
  // "Bearer TOKEN" (the scheme in any case) with an accepted token;
  // UNAUTHENTICATED saying what is wrong otherwise. For callers that are not
  // gRPC (GET /metrics).
  absl::Status CheckBearer(absl::string_view authorization) const;

 private:
  TokenAuthenticator(std::vector<std::string> tokens, bool all_rpcs)
      : tokens_(std::move(tokens)), all_rpcs_(all_rpcs) {}

  std::vector<std::string> tokens_;
  bool all_rpcs_;
};

// OK when `auth` is null (no --auth_token_file) or accepts the call.
absl::Status Authorize(const TokenAuthenticator* auth,
                       const grpc::ServerContextBase& context,
                       RpcAccess access);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_AUTH_H_
