#include "client/arrival_schedule.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace nibble {
namespace client {

absl::StatusOr<ArrivalProcess> ParseArrivalProcess(absl::string_view name) {
  if (name == "constant") return ArrivalProcess::kConstant;
  if (name == "poisson") return ArrivalProcess::kPoisson;
  return absl::InvalidArgumentError(absl::StrCat(
      "--arrival must be constant or poisson, got \"", name, "\""));
}

absl::string_view ArrivalProcessName(ArrivalProcess process) {
  return process == ArrivalProcess::kConstant ? "constant" : "poisson";
}

ArrivalSchedule::ArrivalSchedule(ArrivalProcess process, double rate,
                                 uint64_t seed)
    : process_(process), rate_(rate), rng_(seed), gap_(rate) {}

absl::Duration ArrivalSchedule::Next() {
  if (process_ == ArrivalProcess::kConstant) {
    return absl::Seconds(static_cast<double>(index_++) / rate_);
  }
  // The first request goes after one gap too, so that every gap of the
  // process is exponential.
  poisson_offset_ += gap_(rng_);
  ++index_;
  return absl::Seconds(poisson_offset_);
}

}  // namespace client
}  // namespace nibble
