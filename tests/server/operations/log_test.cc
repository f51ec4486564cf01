// Tests the logfmt lines of nibbled's structured log: timestamp, level,
// quoting and escaping, so that every line parses back into its fields.
#include "server/operations/log.h"

#include <cstdint>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

const absl::Time kNoonAndABit =
    absl::FromUnixMillis(int64_t{1795608000} * 1000 + 123);

TEST(FormatLogLineTest, StampsTimeLevelAndMessage) {
  EXPECT_EQ(FormatLogLine(kNoonAndABit, LogLevel::kInfo, "listening",
                          {{"addr", "0.0.0.0:50051"}, {"threads", 2}}),
            "ts=2026-11-25T12:00:00.123Z level=info msg=\"listening\" "
            "addr=0.0.0.0:50051 threads=2");
  EXPECT_THAT(FormatLogLine(kNoonAndABit, LogLevel::kWarning, "m", {}),
              HasSubstr(" level=warning msg=\"m\""));
  EXPECT_THAT(FormatLogLine(kNoonAndABit, LogLevel::kError, "m", {}),
              HasSubstr(" level=error "));
}

TEST(FormatLogLineTest, QuotesOnlyValuesThatNeedIt) {
  const std::string line = FormatLogLine(kNoonAndABit, LogLevel::kInfo, "m",
                                         {{"bare", "u4b8"},
                                          {"empty", ""},
                                          {"space", "a b"},
                                          {"equals", "k=v"},
                                          {"negative", int64_t{-5}},
                                          {"ratio", 0.5}});
  EXPECT_THAT(line, HasSubstr(" bare=u4b8 "));
  EXPECT_THAT(line, HasSubstr(" empty=\"\" "));
  EXPECT_THAT(line, HasSubstr(" space=\"a b\" "));
  EXPECT_THAT(line, HasSubstr(" equals=\"k=v\" "));
  EXPECT_THAT(line, HasSubstr(" negative=-5 "));
  EXPECT_THAT(line, HasSubstr(" ratio=0.5"));
}

TEST(FormatLogLineTest, EscapesWhatWouldBreakTheLine) {
  const std::string line =
      FormatLogLine(kNoonAndABit, LogLevel::kInfo, "say \"hi\"\n",
                    {{"path", "C:\\dir"},
                     {"reason", "bad\tfile\r"},
                     {"bell", std::string("a\x07z")},
                     {"nul", std::string("a\0z", 3)},
                     {"utf8", "naïve"}});
  EXPECT_THAT(line, HasSubstr(" msg=\"say \\\"hi\\\"\\n\" "));
  EXPECT_THAT(line, HasSubstr(" path=\"C:\\\\dir\" "));
  EXPECT_THAT(line, HasSubstr(" reason=\"bad\\tfile\\r\" "));
  EXPECT_THAT(line, HasSubstr(" bell=\"a\\x07z\" "));
  EXPECT_THAT(line, HasSubstr(" nul=\"a\\x00z\" "));
  EXPECT_THAT(line, HasSubstr(" utf8=\"naïve\""));
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace nibble::server
