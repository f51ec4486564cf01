#include "server/operations/environment_flags.h"

#include <string>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace nibble::server {
namespace {

// Kubernetes (and Docker links) give every pod FOO_SERVICE_HOST, FOO_PORT and
// FOO_PORT_<port>_TCP... for a Service named foo: a Service named like the
// prefix must not stop the server. No flag is named so.
bool IsServiceLink(absl::string_view flag_name) {
  return absl::StartsWith(flag_name, "service_") || flag_name == "port" ||
         absl::StartsWith(flag_name, "port_");
}

}  // namespace

absl::Status ApplyEnvironmentFlags(absl::string_view prefix,
                                   const char* const* environment) {
  std::string problems;
  for (const char* const* entry = environment; *entry != nullptr; ++entry) {
    const absl::string_view variable = *entry;
    if (!absl::StartsWith(variable, prefix)) continue;
    const size_t equals = variable.find('=');
    if (equals == absl::string_view::npos) continue;
    const absl::string_view name = variable.substr(0, equals);
    const absl::string_view value = variable.substr(equals + 1);
    const std::string flag_name =
        absl::AsciiStrToLower(absl::StripPrefix(name, prefix));
    if (IsServiceLink(flag_name)) continue;
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(flag_name);
    if (flag == nullptr) {
      absl::StrAppend(&problems, problems.empty() ? "" : "\n", name,
                      ": there is no flag --", flag_name,
                      "; unset the variable or fix its name");
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      absl::StrAppend(&problems, problems.empty() ? "" : "\n", name, "=", value,
                      ": ", error);
    }
  }
  if (problems.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(problems);
}

}  // namespace nibble::server
