// The steps of a load sweep, from a "FROM:TO:STEP" flag value such as
// nibble-load's --sweep_rate=50:200:50 (rates 50, 100, 150 and 200).
//
// Example:
//   absl::StatusOr<nibble::client::SweepRange> range =
//       nibble::client::ParseSweepRange("50:200:50", /*integers=*/false);
//   for (double rate : range->Values()) RunStep(rate);
#ifndef NIBBLE_CLIENT_SWEEP_RANGE_H_
#define NIBBLE_CLIENT_SWEEP_RANGE_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace nibble {
namespace client {

struct SweepRange {
  double from = 0;
  double to = 0;
  double step = 0;

  // from, from + step, ... up to and including `to` when a step lands on it
  // (to within rounding).
  std::vector<double> Values() const;
};

// Parses "FROM:TO:STEP": positive finite numbers with FROM <= TO, and whole
// numbers when `integers`. Errors say which part is wrong.
absl::StatusOr<SweepRange> ParseSweepRange(absl::string_view spec,
                                           bool integers);

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_SWEEP_RANGE_H_
