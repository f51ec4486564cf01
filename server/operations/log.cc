#include "server/operations/log.h"

#include <cstdio>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace nibble::server {
namespace {

absl::string_view LevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kError:
      return "error";
  }
  return "unknown";
}

// Whether `value` must be quoted to read back as one value: empty, or
// holding a separator, a quote, a backslash or a byte that is not printable
// ASCII.
bool NeedsQuotes(absl::string_view value) {
  if (value.empty()) return true;
  for (unsigned char c : value) {
    if (c <= ' ' || c >= 0x7f || c == '=' || c == '"' || c == '\\') {
      return true;
    }
  }
  return false;
}

void AppendQuoted(std::string& line, absl::string_view value) {
  line += '"';
  for (unsigned char c : value) {
    switch (c) {
      case '"':
        line += "\\\"";
        break;
      case '\\':
        line += "\\\\";
        break;
      case '\n':
        line += "\\n";
        break;
      case '\t':
        line += "\\t";
        break;
      case '\r':
        line += "\\r";
        break;
      default:
        // UTF-8 passes through; other control bytes would break the line.
        if (c < ' ' || c == 0x7f) {
          constexpr char kHex[] = "0123456789abcdef";
          line += "\\x";
          line += kHex[c >> 4];
          line += kHex[c & 0xf];
        } else {
          line += static_cast<char>(c);
        }
    }
  }
  line += '"';
}

void AppendValue(std::string& line, absl::string_view value) {
  if (NeedsQuotes(value)) {
    AppendQuoted(line, value);
  } else {
    line.append(value.data(), value.size());
  }
}

ABSL_CONST_INIT absl::Mutex stderr_mutex(absl::kConstInit);

}  // namespace

std::string FormatLogLine(absl::Time time, LogLevel level,
                          absl::string_view message,
                          absl::Span<const LogField> fields) {
  std::string line = absl::StrCat(
      "ts=",
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", time, absl::UTCTimeZone()),
      " level=", LevelName(level), " msg=");
  AppendQuoted(line, message);
  for (const LogField& field : fields) {
    absl::StrAppend(&line, " ", field.key, "=");
    AppendValue(line, field.value);
  }
  return line;
}

void Log(LogLevel level, absl::string_view message,
         std::initializer_list<LogField> fields) {
  const std::string line =
      absl::StrCat(FormatLogLine(absl::Now(), level, message, fields), "\n");
  absl::MutexLock lock(&stderr_mutex);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

}  // namespace nibble::server
