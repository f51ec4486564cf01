#include "server/operations/metrics_http.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "base/thread_name.h"
#include "server/operations/metrics.h"

namespace nibble::server {
namespace {

// How long accepting pauses when the process is out of file descriptors,
// instead of spinning on a listening socket it cannot accept from.
constexpr absl::Duration kAcceptPause = absl::Milliseconds(100);

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

// A listening, non-blocking socket bound to `address`, and its port; -1 when
// none of the addresses the host resolves to can be bound. SO_REUSEADDR lets
// a restarted nibbled bind at once; without SO_REUSEPORT a second nibbled
// cannot share the port and answer half of the scrapes.
std::pair<int, int> Listen(const HostPort& address) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  if (getaddrinfo(address.host.c_str(), absl::StrCat(address.port).c_str(),
                  &hints, &found) != 0) {
    return {-1, 0};
  }
  int fd = -1;
  for (addrinfo* one = found; one != nullptr && fd < 0; one = one->ai_next) {
    fd = socket(one->ai_family, one->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                one->ai_protocol);
    if (fd < 0) continue;
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (bind(fd, one->ai_addr, one->ai_addrlen) != 0 ||
        listen(fd, SOMAXCONN) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return {-1, 0};
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
  const int port =
      bound.ss_family == AF_INET6
          ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
          : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  return {fd, port};
}

std::string Response(int status, absl::string_view reason,
                     absl::string_view content_type, absl::string_view body,
                     absl::string_view extra_headers = "") {
  return absl::StrCat("HTTP/1.1 ", status, " ", reason,
                      "\r\nContent-Type: ", content_type,
                      "\r\nContent-Length: ", body.size(),
                      "\r\nConnection: close\r\n", extra_headers, "\r\n", body);
}

constexpr absl::string_view kTextType = "text/plain; charset=utf-8";

// One client connection: its request as it arrives, then its answer.
struct Connection {
  int fd = -1;
  absl::Time deadline;
  std::string request;
  // Set once the request head is complete.
  std::string answer;
  size_t written = 0;
};

}  // namespace

std::string MetricsHttpServer::Answer(absl::string_view head) const {
  std::vector<absl::string_view> lines = absl::StrSplit(head, "\r\n");
  std::vector<absl::string_view> request_line =
      absl::StrSplit(lines[0], ' ', absl::SkipEmpty());
  if (request_line.size() != 3 ||
      !absl::StartsWith(request_line[2], "HTTP/1.")) {
    return Response(400, "Bad Request", kTextType,
                    "not an HTTP/1 request line\n");
  }
  const absl::string_view method = request_line[0];
  const absl::string_view path =
      request_line[1].substr(0, request_line[1].find('?'));
  if (method != "GET" || path != "/metrics") {
    return Response(404, "Not Found", kTextType,
                    absl::StrCat("nibbled serves metrics at GET /metrics, not ",
                                 method, " ", path, "\n"));
  }
  if (auth_.has_value()) {
    std::optional<absl::string_view> authorization;
    for (size_t i = 1; i < lines.size(); ++i) {
      const size_t colon = lines[i].find(':');
      if (colon == absl::string_view::npos) continue;
      if (absl::EqualsIgnoreCase(
              absl::StripAsciiWhitespace(lines[i].substr(0, colon)),
              "Authorization")) {
        authorization = absl::StripAsciiWhitespace(lines[i].substr(colon + 1));
      }
    }
    const absl::Status status =
        authorization.has_value()
            ? auth_->CheckBearer(*authorization)
            : absl::UnauthenticatedError(
                  "GET /metrics needs a bearer token: send \"Authorization: "
                  "Bearer TOKEN\" (Prometheus: authorization.credentials_file "
                  "in the scrape config)");
    if (!status.ok()) {
      return Response(401, "Unauthorized", kTextType,
                      absl::StrCat(status.message(), "\n"),
                      "WWW-Authenticate: Bearer\r\n");
    }
  }
  return Response(200, "OK", kPrometheusContentType, render_());
}

absl::StatusOr<std::unique_ptr<MetricsHttpServer>> MetricsHttpServer::Start(
    const std::string& listen, std::function<std::string()> render,
    std::optional<TokenAuthenticator> auth) {
  absl::StatusOr<HostPort> address = ParseHostPort(listen);
  if (!address.ok()) return address.status();
  std::unique_ptr<MetricsHttpServer> server(
      new MetricsHttpServer(std::move(render), std::move(auth)));
  std::tie(server->listen_fd_, server->port_) = Listen(*address);
  if (server->listen_fd_ < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for metrics on ", listen,
                     ": the host is not an address of this machine or the "
                     "port is in use; pick another with --metrics_listen"));
  }
  if (pipe2(server->wake_fds_, O_CLOEXEC) != 0) {
    return absl::InternalError("cannot create the metrics server's pipe");
  }
  server->thread_ = std::thread([raw = server.get()] {
    NameCurrentThread("nibble-metrics");
    raw->Serve();
  });
  return server;
}

MetricsHttpServer::~MetricsHttpServer() {
  if (thread_.joinable()) {
    const char stop = 0;
    while (write(wake_fds_[1], &stop, 1) < 0 && errno == EINTR) {
    }
    thread_.join();
  }
  for (int fd : {listen_fd_, wake_fds_[0], wake_fds_[1]}) {
    if (fd >= 0) close(fd);
  }
}

void MetricsHttpServer::Serve() {
  std::deque<Connection> connections;  // oldest first
  std::vector<pollfd> polled;
  absl::Time accept_paused_until = absl::InfinitePast();
  for (;;) {
    absl::Time now = absl::Now();
    polled.clear();
    polled.push_back({wake_fds_[0], POLLIN, 0});
    // A negative descriptor is skipped by poll.
    polled.push_back({now < accept_paused_until ? -1 : listen_fd_, POLLIN, 0});
    absl::Time wake_at = now < accept_paused_until ? accept_paused_until
                                                   : absl::InfiniteFuture();
    for (const Connection& connection : connections) {
      polled.push_back(
          {connection.fd,
           static_cast<short>(connection.answer.empty() ? POLLIN : POLLOUT),
           0});
      wake_at = std::min(wake_at, connection.deadline);
    }
    const int timeout_ms =
        wake_at == absl::InfiniteFuture()
            ? -1
            : static_cast<int>(std::max<int64_t>(
                  0, absl::ToInt64Milliseconds(wake_at - now) + 1));
    if (poll(polled.data(), polled.size(), timeout_ms) < 0 && errno != EINTR) {
      continue;
    }
    if (polled[0].revents != 0) break;
    now = absl::Now();
    for (size_t i = 0; i < connections.size(); ++i) {
      Connection& connection = connections[i];
      const short events = polled[i + 2].revents;
      bool done = false;
      if (connection.answer.empty() && events != 0) {
        char buffer[4096];
        const ssize_t got = recv(connection.fd, buffer, sizeof(buffer), 0);
        if (got > 0) {
          connection.request.append(buffer, got);
          const size_t end = connection.request.find("\r\n\r\n");
          if (end != std::string::npos) {
            connection.answer =
                Answer(absl::string_view(connection.request).substr(0, end));
          } else if (connection.request.size() > kMaxRequestHeadBytes) {
            connection.answer =
                Response(431, "Request Header Fields Too Large", kTextType,
                         "the request head is too long\n");
          }
        } else {
          done = got == 0 || (errno != EAGAIN && errno != EINTR);
        }
      } else if (!connection.answer.empty() && events != 0) {
        const ssize_t sent =
            send(connection.fd, connection.answer.data() + connection.written,
                 connection.answer.size() - connection.written, MSG_NOSIGNAL);
        if (sent > 0) {
          connection.written += sent;
          done = connection.written == connection.answer.size();
        } else {
          done = errno != EAGAIN && errno != EINTR;
        }
      }
      if (done || now >= connection.deadline) {
        close(connection.fd);
        connection.fd = -1;
      }
    }
    std::erase_if(connections, [](const Connection& connection) {
      return connection.fd < 0;
    });
    if (polled[1].revents == 0) continue;
    for (;;) {
      const int fd =
          accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
            errno == ENOMEM) {
          accept_paused_until = now + kAcceptPause;
        }
        break;
      }
      if (static_cast<int>(connections.size()) >= kMaxConnections) {
        close(connections.front().fd);
        connections.pop_front();
      }
      Connection& connection = connections.emplace_back();
      connection.fd = fd;
      connection.deadline = now + kExchangeTime;
    }
  }
  for (const Connection& connection : connections) close(connection.fd);
}

}  // namespace nibble::server
