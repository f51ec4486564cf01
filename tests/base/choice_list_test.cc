// Tests the choice lists of base/choice_list.h.
#include "base/choice_list.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

TEST(JoinListTest, SeparatesTheLastTwoByTheLastSeparator) {
  EXPECT_EQ(JoinList({}), "");
  EXPECT_EQ(JoinList({"a"}), "a");
  EXPECT_EQ(JoinList({"a", "b"}), "a or b");
  EXPECT_EQ(JoinList({"a", "b", "c"}), "a, b or c");
  EXPECT_EQ(JoinList({"a", "b", "c"}, " and "), "a, b and c");
}

TEST(UnsupportedChoiceErrorTest, NamesWhatWasGivenAndWhatWouldDo) {
  const std::vector<std::string> valid = {"X_ONE", "X_TWO"};
  const absl::Status status = UnsupportedChoiceError("thing", "7", valid);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "thing 7 is not supported: use X_ONE or X_TWO");
}

}  // namespace
}  // namespace nibble
