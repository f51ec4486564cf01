#include "tests/integration/nibbled_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace nibble::testing {

absl::StatusOr<std::unique_ptr<NibbledProcess>> NibbledProcess::Start(
    const std::string& path, const std::vector<std::string>& args) {
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return absl::InternalError("pipe failed");
  const pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    dup2(pipe_fds[1], STDOUT_FILENO);
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    // The tests expect the CPU backend's kernels and tuning table, on GPU
    // machines too; tests of --backend pass their own (the last flag wins).
    std::vector<std::string> argv_strings = {path, "--listen=127.0.0.1:0",
                                             "--backend=cpu"};
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  close(pipe_fds[1]);
  // The first line says where it listens: "nibbled: listening on HOST:PORT
  // ...".
  FILE* out = fdopen(pipe_fds[0], "r");
  char line[512] = {};
  const bool got_line = fgets(line, sizeof(line), out) != nullptr;
  fclose(out);
  absl::string_view text(line);
  if (!got_line || !absl::ConsumePrefix(&text, "nibbled: listening on ")) {
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return absl::UnavailableError(
        absl::StrCat("nibbled did not start; it printed: ", line));
  }
  const std::string target(
      std::vector<absl::string_view>(absl::StrSplit(text, ' '))[0]);
  return std::unique_ptr<NibbledProcess>(new NibbledProcess(
      pid, target, std::string(absl::StripTrailingAsciiWhitespace(line))));
}

NibbledProcess::~NibbledProcess() {
  if (pid_ > 0) Stop();
}

bool NibbledProcess::Running() {
  if (pid_ <= 0) return false;
  if (waitpid(pid_, nullptr, WNOHANG) == 0) return true;
  pid_ = -1;  // exited, and now reaped
  return false;
}

int NibbledProcess::Stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

absl::StatusOr<std::unique_ptr<NibbledProcess>> StartNibbledLoggingTo(
    const std::string& path, const std::string& stderr_path,
    const std::vector<std::string>& args) {
  std::fflush(stderr);
  const int saved_stderr = dup(STDERR_FILENO);
  const int file =
      open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  dup2(file, STDERR_FILENO);
  close(file);
  // Shutdown waits for every open connection to close, and a client's idle
  // channel, as a test's is when it calls Stop, reads the server's GOAWAY
  // only at its next backup poll (every 5 s), so the grace is short here;
  // tests of draining give a longer one (the last flag wins).
  std::vector<std::string> all_args = {"--threads=2",
                                       "--shutdown_grace_seconds=0.5"};
  all_args.insert(all_args.end(), args.begin(), args.end());
  absl::StatusOr<std::unique_ptr<NibbledProcess>> server =
      NibbledProcess::Start(path, all_args);
  dup2(saved_stderr, STDERR_FILENO);
  close(saved_stderr);
  return server;
}

int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  output->clear();
  char buffer[4096];
  size_t read = 0;
  while ((read = fread(buffer, 1, sizeof(buffer), pipe)) > 0) {
    output->append(buffer, read);
  }
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

namespace {

// The value of `field` ("VmRSS:", "VmHWM:") in /proc/PID/status, in bytes,
// or -1.
int64_t StatusBytes(pid_t pid, absl::string_view field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    absl::string_view rest = line;
    if (!absl::ConsumePrefix(&rest, field)) continue;
    int64_t kib = 0;
    if (absl::SimpleAtoi(
            absl::StripSuffix(absl::StripAsciiWhitespace(rest), " kB"), &kib)) {
      return kib * 1024;
    }
  }
  return -1;
}

}  // namespace

int64_t ResidentBytes(pid_t pid) { return StatusBytes(pid, "VmRSS:"); }

int64_t PeakResidentBytes(pid_t pid) { return StatusBytes(pid, "VmHWM:"); }

}  // namespace nibble::testing
