#include "client/json_text.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace nibble::client {
namespace {

TEST(JsonStringTest, QuotesAndEscapes) {
  EXPECT_EQ(JsonString("plain"), "\"plain\"");
  EXPECT_EQ(JsonString("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(JsonString("line\nnext\ttab\r"), "\"line\\nnext\\ttab\\r\"");
  EXPECT_EQ(JsonString(absl::string_view("\x01\0", 2)), "\"\\u0001\\u0000\"");
  EXPECT_EQ(JsonString("µs"), "\"µs\"");
}

TEST(JsonNumberTest, WritesFiniteValuesAndNullOtherwise) {
  EXPECT_EQ(JsonNumber(200), "200");
  EXPECT_EQ(JsonNumber(0.5), "0.5");
  EXPECT_EQ(JsonNumber(-3), "-3");
  EXPECT_EQ(JsonNumber(std::nan("")), "null");
  EXPECT_EQ(JsonNumber(std::numeric_limits<double>::infinity()), "null");
}

}  // namespace
}  // namespace nibble::client
