#include "server/operations/metrics_http.h"

#include <sys/socket.h>

#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "httplib.h"
#include "server/operations/metrics.h"

namespace nibble::server {
namespace {

// Scrapes are rare and cheap; two threads let one slow client not block the
// next scrape without taking a thread per core from the kernels.
constexpr size_t kHttpThreads = 2;

struct HostPort {
  std::string host;
  int port = 0;
};

absl::StatusOr<HostPort> ParseHostPort(absl::string_view listen) {
  const size_t colon = listen.rfind(':');
  absl::string_view host =
      colon == absl::string_view::npos ? "" : listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  int port = 0;
  if (host.empty() || !absl::SimpleAtoi(listen.substr(colon + 1), &port) ||
      port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "metrics address \"", listen,
        "\" is not HOST:PORT (e.g. 0.0.0.0:9464, [::1]:9464, or port 0 for "
        "any free port)"));
  }
  return HostPort{.host = std::string(host), .port = port};
}

}  // namespace

MetricsHttpServer::MetricsHttpServer()
    : http_(std::make_unique<httplib::Server>()) {}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::function<std::string()> render,
    std::optional<TokenAuthenticator> auth) {
  absl::StatusOr<HostPort> address = ParseHostPort(listen);
  if (!address.ok()) return address.status();
  std::unique_ptr<MetricsHttpServer> server(new MetricsHttpServer());
  httplib::Server& http = *server->http_;
  http.new_task_queue = [] { return new httplib::ThreadPool(kHttpThreads); };
  // httplib's default sets SO_REUSEPORT, which would let a second nibbled
  // share the port and answer half of the scrapes; SO_REUSEADDR alone still
  // lets a restarted one bind at once.
  http.set_socket_options([](socket_t socket) {
    const int yes = 1;
    setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  http.Get("/metrics", [render = std::move(render), auth = std::move(auth)](
                           const httplib::Request& req,
                           httplib::Response& res) {
    if (auth.has_value()) {
      const absl::Status status =
          req.has_header("Authorization")
              ? auth->CheckBearer(req.get_header_value("Authorization"))
              : absl::UnauthenticatedError(
                    "GET /metrics needs a bearer token: send \"Authorization: "
                    "Bearer TOKEN\" (Prometheus: "
                    "authorization.credentials_file "
                    "in the scrape config)");
      if (!status.ok()) {
        res.status = 401;
        res.set_header("WWW-Authenticate", "Bearer");
        res.set_content(absl::StrCat(status.message(), "\n"),
                        "text/plain; charset=utf-8");
        return;
      }
    }
    res.set_content(render(), kPrometheusContentType);
  });
  http.set_error_handler([](const httplib::Request& req,
                            httplib::Response& res) {
    if (res.status != 404) return;
    res.set_content(absl::StrCat("nibbled serves metrics at GET /metrics, not ",
                                 req.method, " ", req.path, "\n"),
                    "text/plain; charset=utf-8");
  });
  server->port_ =
      address->port == 0
          ? http.bind_to_any_port(address->host)
          : (http.bind_to_port(address->host, address->port) ? address->port
                                                             : -1);
  if (server->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ", listen,
                     ": the host is not an address of this machine or the "
                     "port is in use; pick another with --metrics_listen"));
  }
  server->listener_ = std::thread([raw = server.get()] {
    raw->http_->listen_after_bind();
    raw->listener_done_ = true;
  });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (listener_.joinable()) {
    // httplib's stop() does nothing until its loop runs.
    while (!http_->is_running() && !listener_done_) std::this_thread::yield();
    http_->stop();
    listener_.join();
  }
}

}  // namespace nibble::server
