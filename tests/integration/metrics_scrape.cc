#include "tests/integration/metrics_scrape.h"

#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "httplib.h"

namespace nibble::testing {

int MetricsPort(const std::string& startup_line) {
  const std::string marker = "metrics at http://";
  const size_t at = startup_line.find(marker);
  if (at == std::string::npos) return 0;
  const std::string address = startup_line.substr(at + marker.size());
  const size_t colon = address.find(':');
  const size_t slash = address.find('/', colon);
  int port = 0;
  if (colon == std::string::npos || slash == std::string::npos ||
      !absl::SimpleAtoi(address.substr(colon + 1, slash - colon - 1), &port)) {
    return 0;
  }
  return port;
}

int64_t ScrapeSample(int port, absl::string_view sample) {
  httplib::Client http("127.0.0.1", port);
  httplib::Result scrape = http.Get("/metrics");
  if (!scrape || scrape->status != 200) return -1;
  for (absl::string_view line : absl::StrSplit(scrape->body, '\n')) {
    if (!absl::ConsumePrefix(&line, sample) ||
        !absl::ConsumePrefix(&line, " ")) {
      continue;
    }
    int64_t value = 0;
    if (absl::SimpleAtoi(line, &value)) return value;
    double fractional = 0;
    if (absl::SimpleAtod(line, &fractional)) {
      return static_cast<int64_t>(fractional);
    }
  }
  return -1;
}

int64_t WaitForSample(int port, absl::string_view sample, int64_t want,
                      absl::Duration timeout) {
  const absl::Time give_up = absl::Now() + timeout;
  int64_t value = ScrapeSample(port, sample);
  while (value != want && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(20));
    value = ScrapeSample(port, sample);
  }
  return value;
}

}  // namespace nibble::testing
