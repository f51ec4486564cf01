// nibbled's structured log: one logfmt line per event on stderr, so that log
// collectors can parse it and people can still read it:
//   ts=2026-11-22T04:00:00.123Z level=info msg="listening" addr=0.0.0.0:50051
// Values are quoted (with \" \\ \n \t \r and \xNN escapes) only when they
// would otherwise be ambiguous; the message is always quoted. Lines from
// different threads never interleave.
//
// Example:
//   nibble::server::LogInfo("weight uploaded",
//                           {{"name", name}, {"bytes", packed_bytes}});
#ifndef NIBBLE_SERVER_OPERATIONS_LOG_H_
#define NIBBLE_SERVER_OPERATIONS_LOG_H_

#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace nibble::server {

enum class LogLevel { kInfo, kWarning, kError };

// One key=value pair; the key must be a bare word ([A-Za-z0-9_.-]).
struct LogField {
  LogField(absl::string_view key, const absl::AlphaNum& value)
      : key(key), value(value.Piece()) {}

  std::string key;
  std::string value;
};

// The line for one event, without the trailing newline.
std::string FormatLogLine(absl::Time time, LogLevel level,
                          absl::string_view message,
                          absl::Span<const LogField> fields);

// Writes the event, stamped now, to stderr and flushes it.
void Log(LogLevel level, absl::string_view message,
         std::initializer_list<LogField> fields = {});

inline void LogInfo(absl::string_view message,
                    std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kInfo, message, fields);
}
inline void LogWarning(absl::string_view message,
                       std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kWarning, message, fields);
}
inline void LogError(absl::string_view message,
                     std::initializer_list<LogField> fields = {}) {
  Log(LogLevel::kError, message, fields);
}

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_LOG_H_
