// Reads a running nibbled's Prometheus metrics (--metrics_listen), so that a
// test can wait for the server's own account of its state instead of
// guessing from timing.
//
// Example:
//   const int port = MetricsPort((*server)->startup_line());
//   EXPECT_EQ(WaitForSample(port, "nibble_queued_rows", 0, absl::Seconds(10)),
//             0);
#ifndef NIBBLE_TESTS_INTEGRATION_METRICS_SCRAPE_H_
#define NIBBLE_TESTS_INTEGRATION_METRICS_SCRAPE_H_

#include <cstdint>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace nibble::testing {

// The port of GET /metrics from nibbled's startup line, or 0.
int MetricsPort(const std::string& startup_line);

// The value of `sample` (a name with its labels, as in the exposition) on
// the server's /metrics, or -1 when the scrape fails or lacks it.
int64_t ScrapeSample(int port, absl::string_view sample);

// Polls `sample` until it equals `want` or `timeout` passes; its last value.
int64_t WaitForSample(int port, absl::string_view sample, int64_t want,
                      absl::Duration timeout);

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_INTEGRATION_METRICS_SCRAPE_H_
