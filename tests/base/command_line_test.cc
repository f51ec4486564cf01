// Tests ParseCommandLine: values with "=" or in the next argument, bool
// flags, help, usage mistakes as statuses, optional-value and switch flags;
// and DescribeFlags.
#include "base/command_line.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(std::string, name, "", "weight name");
ABSL_FLAG(int, count, 1, "how many");
ABSL_FLAG(bool, check, false, "check the result");
// Not empty by default, so that "--json" alone visibly sets it to "".
ABSL_FLAG(std::string, json, "default.jsonl", "JSON file; alone, stdout");
ABSL_FLAG(bool, quick, false, "the small grid");

namespace nibble {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

const CommandLineOptions kBenchOptions = {.optional_value_flags = {"json"},
                                          .switch_flags = {"quick"}};

// `args` after a program name; the flags keep the values set, for the test
// to read, until its FlagSaver restores them.
absl::StatusOr<CommandLine> Parse(std::vector<std::string> args,
                                  const CommandLineOptions& options = {}) {
  args.insert(args.begin(), "tool");
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data(), options);
}

// The usage mistake `args` make.
std::string Error(const std::vector<std::string>& args,
                  const CommandLineOptions& options = {}) {
  absl::StatusOr<CommandLine> command_line = Parse(args, options);
  if (command_line.ok()) return "ok";
  EXPECT_EQ(command_line.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(command_line.status().message());
}

TEST(ParseCommandLineTest, ValuesAfterEqualsOrInTheNextArgument) {
  absl::FlagSaver saver;
  absl::StatusOr<CommandLine> command_line =
      Parse({"upload", "--name=w1", "--count", "3", "extra"});
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_name), "w1");
  EXPECT_EQ(absl::GetFlag(FLAGS_count), 3);
  EXPECT_THAT(command_line->flags_given, ElementsAre("name", "count"));
  EXPECT_THAT(command_line->positional, ElementsAre("upload", "extra"));
  EXPECT_FALSE(command_line->help_requested);
}

TEST(ParseCommandLineTest, BoolFlagsTakeNoNextArgumentAndNegate) {
  absl::FlagSaver saver;
  absl::StatusOr<CommandLine> command_line = Parse({"-check", "upload"});
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_TRUE(absl::GetFlag(FLAGS_check));
  EXPECT_THAT(command_line->positional, ElementsAre("upload"));

  command_line = Parse({"--nocheck"});
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_FALSE(absl::GetFlag(FLAGS_check));
  EXPECT_THAT(command_line->flags_given, ElementsAre("check"));
}

TEST(ParseCommandLineTest, DoubleDashEndsTheFlags) {
  absl::FlagSaver saver;
  absl::StatusOr<CommandLine> command_line =
      Parse({"--count=2", "--", "--nosuchflag"});
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_THAT(command_line->positional, ElementsAre("--nosuchflag"));
}

TEST(ParseCommandLineTest, HelpStopsTheParsing) {
  absl::FlagSaver saver;
  for (const char* help : {"--help", "-h"}) {
    absl::StatusOr<CommandLine> command_line =
        Parse({"--count=2", help, "--nosuchflag"});
    ASSERT_TRUE(command_line.ok()) << command_line.status();
    EXPECT_TRUE(command_line->help_requested) << help;
  }
}

TEST(ParseCommandLineTest, UsageMistakesNameTheFlag) {
  absl::FlagSaver saver;
  EXPECT_EQ(Error({"--nosuchflag"}), "unknown flag --nosuchflag");
  EXPECT_EQ(Error({"--helpfull"}), "unknown flag --helpfull");
  EXPECT_EQ(Error({"--count"}), "flag --count needs a value");
  EXPECT_EQ(Error({"--count=abc"}),
            "--count does not accept \"abc\": how many");
  EXPECT_EQ(Error({"--nocount"}), "unknown flag --nocount");
}

TEST(ParseCommandLineTest, OptionalValueFlagAlone) {
  absl::FlagSaver saver;
  absl::StatusOr<CommandLine> command_line = Parse({"--json"}, kBenchOptions);
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_json), "");
  EXPECT_THAT(command_line->flags_given, ElementsAre("json"));
}

TEST(ParseCommandLineTest, OptionalValueFlagWithAValue) {
  absl::FlagSaver saver;
  absl::StatusOr<CommandLine> command_line =
      Parse({"--json=out.jsonl"}, kBenchOptions);
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_json), "out.jsonl");
  EXPECT_THAT(command_line->flags_given, ElementsAre("json"));
}

TEST(ParseCommandLineTest, OptionalValueFlagNeverTakesTheNextArgument) {
  absl::FlagSaver saver;
  absl::StatusOr<CommandLine> command_line =
      Parse({"--json", "--count=3"}, kBenchOptions);
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_json), "");
  EXPECT_EQ(absl::GetFlag(FLAGS_count), 3);
  EXPECT_THAT(command_line->flags_given, ElementsAre("json", "count"));

  command_line = Parse({"--json", "out.jsonl"}, kBenchOptions);
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_json), "");
  EXPECT_THAT(command_line->positional, ElementsAre("out.jsonl"));
}

TEST(ParseCommandLineTest, OptionalValueFlagWithAnEmptyValueIsAMistake) {
  absl::FlagSaver saver;
  EXPECT_EQ(Error({"--json="}, kBenchOptions),
            "--json=: give a value, or --json alone");
}

TEST(ParseCommandLineTest, OtherFlagsTakeTheNextArgumentAsBefore) {
  absl::FlagSaver saver;
  // Without the options, --json is a plain string flag.
  absl::StatusOr<CommandLine> command_line = Parse({"--json", "out.jsonl"});
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_EQ(absl::GetFlag(FLAGS_json), "out.jsonl");
  EXPECT_THAT(command_line->positional, IsEmpty());
  EXPECT_EQ(Error({"--json"}), "flag --json needs a value");
  EXPECT_EQ(Error({"--count"}, kBenchOptions), "flag --count needs a value");
}

TEST(ParseCommandLineTest, SwitchesTakeNoValue) {
  absl::FlagSaver saver;
  absl::StatusOr<CommandLine> command_line = Parse({"--quick"}, kBenchOptions);
  ASSERT_TRUE(command_line.ok()) << command_line.status();
  EXPECT_TRUE(absl::GetFlag(FLAGS_quick));
  EXPECT_THAT(command_line->flags_given, ElementsAre("quick"));

  EXPECT_EQ(Error({"--quick=yes"}, kBenchOptions),
            "--quick=yes: --quick takes no value");
  EXPECT_EQ(Error({"--noquick"}, kBenchOptions), "unknown flag --noquick");
  // Without the options, --quick is an ordinary bool flag.
  EXPECT_EQ(Error({"--quick=yes", "--noquick"}), "ok");
}

TEST(DescribeFlagsTest, OneAlignedLinePerFlagWithItsDefault) {
  EXPECT_EQ(DescribeFlags({"count", "name"}),
            "  --count  how many (default: 1)\n"
            "  --name   weight name\n");
  EXPECT_EQ(DescribeFlags({"nosuchflag"}), "");
}

}  // namespace
}  // namespace nibble
