// Files for tests that run nibbled and its tools: scratch paths under the
// test's temporary directory, and what the processes wrote there.
//
// Example:
//   const std::string dir = FreshDirectory("restart");  // in a TEST body
//   ... run nibbled with --data_dir=dir, stderr to dir + ".stderr" ...
//   EXPECT_THAT(ReadFile(dir + ".stderr"), HasSubstr("msg=\"stopped\""));
#ifndef NIBBLE_TESTS_INTEGRATION_TEST_FILES_H_
#define NIBBLE_TESTS_INTEGRATION_TEST_FILES_H_

#include <string>
#include <vector>

namespace nibble::testing {

// The bytes of the file at `path`; "" when it cannot be read, so that a
// missing output fails the test's own expectations.
std::string ReadFile(const std::string& path);

// Writes `bytes` to a new or truncated file at `path`.
void WriteFile(const std::string& path, const std::string& bytes);

// The names of the files in `dir`, sorted.
std::vector<std::string> FileNames(const std::string& dir);

// A fresh, empty path under the test's temporary directory, named after the
// running test suite, this process and `name`; nothing is created there.
std::string FreshDirectory(const std::string& name);

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_INTEGRATION_TEST_FILES_H_
