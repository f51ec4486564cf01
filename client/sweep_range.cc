#include "client/sweep_range.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace nibble {
namespace client {

std::vector<double> SweepRange::Values() const {
  std::vector<double> values;
  // Multiplying rather than adding keeps 0.1 steps from drifting, and the
  // slack lets a step that lands on `to` through rounding count.
  const double slack = 1e-9 * std::max(std::abs(to), step);
  for (int64_t i = 0;; ++i) {
    const double value = from + static_cast<double>(i) * step;
    if (value > to + slack) break;
    values.push_back(std::min(value, to));
  }
  return values;
}

absl::StatusOr<SweepRange> ParseSweepRange(absl::string_view spec,
                                           bool integers) {
  const std::vector<absl::string_view> parts = absl::StrSplit(spec, ':');
  if (parts.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected FROM:TO:STEP, e.g. 50:200:50, got \"", spec, "\""));
  }
  constexpr absl::string_view kNames[] = {"FROM", "TO", "STEP"};
  double numbers[3];
  for (int i = 0; i < 3; ++i) {
    const bool parsed = absl::SimpleAtod(parts[i], &numbers[i]);
    if (!parsed || !std::isfinite(numbers[i]) || !(numbers[i] > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat(kNames[i], " in \"", spec,
                       "\" must be a positive number, got \"", parts[i], "\""));
    }
    if (integers && numbers[i] != std::floor(numbers[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat(kNames[i], " in \"", spec,
                       "\" must be a whole number, got \"", parts[i], "\""));
    }
  }
  const SweepRange range{numbers[0], numbers[1], numbers[2]};
  if (range.from > range.to) {
    return absl::InvalidArgumentError(absl::StrCat(
        "FROM must not exceed TO in \"", spec, "\"; the sweep goes upwards"));
  }
  return range;
}

}  // namespace client
}  // namespace nibble
