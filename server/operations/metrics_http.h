// The HTTP endpoint Prometheus scrapes: GET /metrics answers with what
// `render` returns, in the text exposition format, to scrapers with a bearer
// token where tokens are given (--metrics_auth_token_file); every other path
// is 404. One thread serves every connection from a poll loop, so that slow
// or idle clients delay no scrape: each connection has kExchangeTime for its
// request and answer, a request head may be kMaxRequestHeadBytes long, and
// past kMaxConnections open ones the oldest is closed for each new one.
//
// Example:
//   absl::StatusOr<std::unique_ptr<nibble::server::MetricsHttpServer>> http =
//       nibble::server::MetricsHttpServer::Start(
//           "0.0.0.0:9464", [&] { return RenderPrometheusText(Snapshot()); });
//   int port = (*http)->port();
//   http->reset();  // stops serving
#ifndef NIBBLE_SERVER_OPERATIONS_METRICS_HTTP_H_
#define NIBBLE_SERVER_OPERATIONS_METRICS_HTTP_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/operations/auth.h"

namespace nibble::server {

class MetricsHttpServer {
 public:
  // How long one connection may take to send its request and read the
  // answer; it is closed then, whatever it has done.
  static constexpr absl::Duration kExchangeTime = absl::Seconds(5);
  // The longest request line and headers taken; longer ones get 431.
  static constexpr size_t kMaxRequestHeadBytes = 8192;
  // Open connections; one more closes the oldest.
  static constexpr int kMaxConnections = 64;

  // Listens on `listen`, HOST:PORT ("[::1]:9464" for IPv6; port 0 picks a free
  // one), and serves GET /metrics with `render`, which is called on the
  // server's thread. INVALID_ARGUMENT for a malformed address; UNAVAILABLE
  // when it cannot be bound. With `auth`, a scrape without one of its tokens
  // in "Authorization: Bearer TOKEN" is answered 401, saying what to send.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::function<std::string()> render,
      std::optional<TokenAuthenticator> auth = std::nullopt);

  // Stops listening, closes every connection and joins the thread.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer(std::function<std::string()> render,
                    std::optional<TokenAuthenticator> auth)
      : render_(std::move(render)), auth_(std::move(auth)) {}

  // The poll loop; returns once the wake pipe is written.
  void Serve();
  // The whole answer to the request head `head` (without its blank line).
  std::string Answer(absl::string_view head) const;

  const std::function<std::string()> render_;
  const std::optional<TokenAuthenticator> auth_;
  int listen_fd_ = -1;
  // Written by the destructor to end Serve.
  int wake_fds_[2] = {-1, -1};
  int port_ = 0;
  std::thread thread_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_METRICS_HTTP_H_
