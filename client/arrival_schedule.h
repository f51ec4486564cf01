// When an open-loop load generator sends each request: at a constant rate, or
// as a Poisson process (exponential gaps) drawn from a seeded RNG so that a
// run can be repeated exactly.
//
// Example:
//   absl::StatusOr<nibble::client::ArrivalProcess> process =
//       nibble::client::ParseArrivalProcess("poisson");
//   nibble::client::ArrivalSchedule schedule(*process, /*rate=*/200,
//                                            /*seed=*/1);
//   absl::Duration first = schedule.Next();   // 0 for constant arrivals.
//   absl::Duration second = schedule.Next();  // About 5ms after the start.
#ifndef NIBBLE_CLIENT_ARRIVAL_SCHEDULE_H_
#define NIBBLE_CLIENT_ARRIVAL_SCHEDULE_H_

#include <cstdint>
#include <random>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace nibble {
namespace client {

enum class ArrivalProcess { kConstant, kPoisson };

// "constant" or "poisson"; InvalidArgument names both for anything else.
absl::StatusOr<ArrivalProcess> ParseArrivalProcess(absl::string_view name);
absl::string_view ArrivalProcessName(ArrivalProcess process);

// Send times as offsets from the start of the run, in increasing order.
class ArrivalSchedule {
 public:
  // `rate` is in requests per second and must be positive.
  ArrivalSchedule(ArrivalProcess process, double rate, uint64_t seed);

  // The offset of the next request. Constant arrivals are i / rate exactly,
  // computed from the index so that rounding never accumulates.
  absl::Duration Next();

 private:
  ArrivalProcess process_;
  double rate_;
  int64_t index_ = 0;
  // Seconds; the running sum of exponential gaps for Poisson arrivals.
  double poisson_offset_ = 0;
  std::mt19937_64 rng_;
  std::exponential_distribution<double> gap_;
};

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_ARRIVAL_SCHEDULE_H_
