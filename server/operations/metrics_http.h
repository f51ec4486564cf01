// The HTTP endpoint Prometheus scrapes: GET /metrics answers with what
// `render` returns, in the text exposition format, to scrapers with a bearer
// token where tokens are given (--metrics_auth_token_file); every other path
// is 404. Served by cpp-httplib on a thread of its own and a small pool.
//
// Example:
//   absl::StatusOr<std::unique_ptr<nibble::server::MetricsHttpServer>> http =
//       nibble::server::MetricsHttpServer::Start(
//           "0.0.0.0:9464", [&] { return RenderPrometheusText(Snapshot()); });
//   int port = (*http)->port();
//   http->reset();  // stops serving
#ifndef NIBBLE_SERVER_OPERATIONS_METRICS_HTTP_H_
#define NIBBLE_SERVER_OPERATIONS_METRICS_HTTP_H_

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/operations/auth.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace nibble::server {

class MetricsHttpServer {
 public:
  // Listens on `listen`, HOST:PORT ("[::1]:9464" for IPv6; port 0 picks a free
  // one), and serves GET /metrics with `render`, which is called on the
  // server's threads, concurrently when scrapes overlap. INVALID_ARGUMENT for
  // a malformed address; UNAVAILABLE when it cannot be bound. With `auth`, a
  // scrape without one of its tokens in "Authorization: Bearer TOKEN" is
  // answered 401, saying what to send.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::function<std::string()> render,
      std::optional<TokenAuthenticator> auth = std::nullopt);

  // Stops listening, waits for answers in progress and joins the threads.
  ~MetricsHttpServer();
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  int port() const { return port_; }

 private:
  MetricsHttpServer();

  std::unique_ptr<httplib::Server> http_;
  std::thread listener_;
  // Set when the listener's loop has returned, so that the destructor does
  // not wait for it to start.
  std::atomic<bool> listener_done_ = false;
  int port_ = 0;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_METRICS_HTTP_H_
