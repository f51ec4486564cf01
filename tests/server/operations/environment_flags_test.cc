#include "server/operations/environment_flags.h"

#include <cstdint>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, environment_flags_test_dir, "unset", "for the test");
ABSL_FLAG(int64_t, environment_flags_test_rows, 7, "for the test");

namespace nibble::server {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The environment `variables` describe, null-terminated as `environ` is.
class Environment {
 public:
  explicit Environment(std::vector<std::string> variables)
      : variables_(std::move(variables)) {
    for (const std::string& variable : variables_) {
      pointers_.push_back(variable.c_str());
    }
    pointers_.push_back(nullptr);
  }
  const char* const* get() const { return pointers_.data(); }

 private:
  std::vector<std::string> variables_;
  std::vector<const char*> pointers_;
};

class EnvironmentFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_environment_flags_test_dir, "unset");
    absl::SetFlag(&FLAGS_environment_flags_test_rows, 7);
  }
};

TEST_F(EnvironmentFlagsTest, SetsTheFlagsItsPrefixNames) {
  const Environment environment(
      {"PATH=/usr/bin", "TEST_ENVIRONMENT_FLAGS_TEST_DIR=/var/lib/nibble",
       "TEST_ENVIRONMENT_FLAGS_TEST_ROWS=4096"});
  ASSERT_TRUE(ApplyEnvironmentFlags("TEST_", environment.get()).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_environment_flags_test_dir), "/var/lib/nibble");
  EXPECT_EQ(absl::GetFlag(FLAGS_environment_flags_test_rows), 4096);
}

TEST_F(EnvironmentFlagsTest, KeepsEqualsSignsAndEmptyValues) {
  const Environment environment({"TEST_ENVIRONMENT_FLAGS_TEST_DIR=a=b"});
  ASSERT_TRUE(ApplyEnvironmentFlags("TEST_", environment.get()).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_environment_flags_test_dir), "a=b");

  const Environment empty({"TEST_ENVIRONMENT_FLAGS_TEST_DIR="});
  ASSERT_TRUE(ApplyEnvironmentFlags("TEST_", empty.get()).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_environment_flags_test_dir), "");
}

TEST_F(EnvironmentFlagsTest, IgnoresVariablesWithoutThePrefix) {
  const Environment environment(
      {"ENVIRONMENT_FLAGS_TEST_ROWS=1", "OTHER_ENVIRONMENT_FLAGS_TEST_ROWS=2"});
  ASSERT_TRUE(ApplyEnvironmentFlags("TEST_", environment.get()).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_environment_flags_test_rows), 7);
}

TEST_F(EnvironmentFlagsTest, SkipsKubernetesServiceLinks) {
  const Environment environment(
      {"TEST_SERVICE_HOST=10.0.0.1", "TEST_SERVICE_PORT=50051",
       "TEST_SERVICE_PORT_GRPC=50051", "TEST_PORT=tcp://10.0.0.1:50051",
       "TEST_PORT_50051_TCP_ADDR=10.0.0.1"});
  EXPECT_TRUE(ApplyEnvironmentFlags("TEST_", environment.get()).ok());
}

TEST_F(EnvironmentFlagsTest, NamesEveryBadVariableAndAppliesTheRest) {
  const Environment environment({"TEST_NO_SUCH_FLAG=1",
                                 "TEST_ENVIRONMENT_FLAGS_TEST_ROWS=many",
                                 "TEST_ENVIRONMENT_FLAGS_TEST_DIR=/data"});
  const absl::Status status = ApplyEnvironmentFlags("TEST_", environment.get());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("TEST_NO_SUCH_FLAG: there is no flag "
                              "--no_such_flag"),
                    HasSubstr("TEST_ENVIRONMENT_FLAGS_TEST_ROWS=many: ")));
  EXPECT_EQ(absl::GetFlag(FLAGS_environment_flags_test_rows), 7);
  EXPECT_EQ(absl::GetFlag(FLAGS_environment_flags_test_dir), "/data");
}

}  // namespace
}  // namespace nibble::server
