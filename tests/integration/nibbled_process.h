// A real nibbled, started as a child process on a free loopback port for the
// length of a test, and stopped with SIGTERM like an operator would.
//
// Example:
//   absl::StatusOr<std::unique_ptr<NibbledProcess>> server =
//       NibbledProcess::Start(NIBBLED_PATH, {"--threads=2"});
//   auto channel = grpc::CreateChannel((*server)->target(),
//                                      grpc::InsecureChannelCredentials());
//   EXPECT_EQ((*server)->Stop(), 0);
#ifndef NIBBLE_TESTS_INTEGRATION_NIBBLED_PROCESS_H_
#define NIBBLE_TESTS_INTEGRATION_NIBBLED_PROCESS_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace nibble::testing {

class NibbledProcess {
 public:
  // Starts `path --listen=127.0.0.1:0 args...` and waits until it listens.
  static absl::StatusOr<std::unique_ptr<NibbledProcess>> Start(
      const std::string& path, const std::vector<std::string>& args);
  // Stops the server if it still runs.
  ~NibbledProcess();

  // "127.0.0.1:PORT".
  const std::string& target() const { return target_; }
  // For signals such as SIGSTOP; -1 once stopped.
  pid_t pid() const { return pid_; }
  // What nibbled printed first: "nibbled: listening on ...".
  const std::string& startup_line() const { return startup_line_; }
  bool Running();
  // SIGTERM, then waits; the exit code, or -1 when killed by a signal.
  int Stop();

 private:
  NibbledProcess(pid_t pid, std::string target, std::string startup_line)
      : pid_(pid),
        target_(std::move(target)),
        startup_line_(std::move(startup_line)) {}

  pid_t pid_;
  std::string target_;
  std::string startup_line_;
};

// Starts `path` like NibbledProcess::Start, with `--threads=2
// --shutdown_grace_seconds=0.5` before `args`, and with what it prints to
// stderr written to `stderr_path`.
absl::StatusOr<std::unique_ptr<NibbledProcess>> StartNibbledLoggingTo(
    const std::string& path, const std::string& stderr_path,
    const std::vector<std::string>& args);

// Runs a command line through the shell; its exit code, with stdout and
// stderr captured into `output`.
int RunCommand(const std::string& command, std::string* output);

// Resident memory of process `pid` in bytes (VmRSS), or -1.
int64_t ResidentBytes(pid_t pid);

// The most resident memory process `pid` has held so far, in bytes (VmHWM),
// or -1.
int64_t PeakResidentBytes(pid_t pid);

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_INTEGRATION_NIBBLED_PROCESS_H_
