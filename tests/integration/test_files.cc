#include "tests/integration/test_files.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "base/file_contents.h"
#include "gtest/gtest.h"

namespace nibble::testing {

std::string ReadFile(const std::string& path) {
  return ReadFileContents(path).value_or("");
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

std::vector<std::string> FileNames(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string FreshDirectory(const std::string& name) {
  const ::testing::TestInfo* test =
      ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string path =
      absl::StrCat(::testing::TempDir(), "/", test->test_suite_name(), "-",
                   getpid(), "-", name);
  std::filesystem::remove_all(path);
  return path;
}

}  // namespace nibble::testing
