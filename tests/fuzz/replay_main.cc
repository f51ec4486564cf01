// The main of the fuzz targets' replay binaries (<name>_replay): runs
// LLVMFuzzerTestOneInput once on every file named on the command line or found
// under a directory named there, so that ctest replays the seed corpus and
// every crasher kept as a regression without libFuzzer. A path that does not
// exist is skipped, since a target's regressions directory appears only with
// its first crasher.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <system_error>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

namespace fs = std::filesystem;

void Replay(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)),
                          std::istreambuf_iterator<char>());
  std::printf("replaying %s (%zu bytes)\n", file.c_str(), bytes.size());
  std::fflush(stdout);  // names the input if the target crashes on it
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()),
                         bytes.size());
}

}  // namespace

int main(int argc, char** argv) {
  int replayed = 0;
  for (int i = 1; i < argc; ++i) {
    const fs::path path = argv[i];
    std::error_code error;
    if (!fs::exists(path, error)) {
      std::printf("%s does not exist: skipped\n", path.c_str());
      continue;
    }
    std::vector<fs::path> files;
    if (fs::is_directory(path)) {
      for (const fs::directory_entry& entry :
           fs::recursive_directory_iterator(path)) {
        if (entry.is_regular_file()) files.push_back(entry.path());
      }
    } else {
      files.push_back(path);
    }
    for (const fs::path& file : files) {
      Replay(file);
      ++replayed;
    }
  }
  std::printf("replayed %d inputs\n", replayed);
  // Nothing replayed means the corpus went missing, not that all is well.
  return replayed > 0 ? 0 : 1;
}
