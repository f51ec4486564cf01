// Tests the data directory: save, load and remove, torn and corrupt files
// skipped and reported, FIFOs, devices and links leading outside refused,
// leftover temporary files removed, unusable directories refused.
#include "server/storage/weight_directory.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_files.h"

namespace nibble::server {
namespace {

using ::nibble::testing::FileNames;
using ::nibble::testing::FreshDirectory;
using ::nibble::testing::ReadFile;
using ::nibble::testing::WriteFile;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// Loads `dir`, collecting the weights by name.
absl::StatusOr<LoadReport> LoadInto(const WeightDirectory& dir,
                                    std::map<std::string, WeightFile>* out) {
  return dir.LoadAll([out](WeightFileReader& file) -> absl::Status {
    absl::StatusOr<QuantizedWeight> weight = file.ReadWhole();
    if (!weight.ok()) return weight.status();
    out->emplace(file.name(), WeightFile{file.name(), *std::move(weight)});
    return absl::OkStatus();
  });
}

TEST(WeightDirectoryTest, SavesLoadsAndRemoves) {
  WeightDirectory dir(FreshDirectory("save") + "/nested/data");
  ASSERT_TRUE(dir.Prepare().ok());
  SCOPED_TRACE("seeds 1, 2");
  const QuantizedWeight a =
      RandomQuantizedWeight({WeightFormat::kU4, 64, 16, 32}, 1);
  const QuantizedWeight b =
      RandomQuantizedWeight({WeightFormat::kFp4, 128, 8, 128}, 2);
  ASSERT_TRUE(dir.Save("a", a).ok());
  ASSERT_TRUE(dir.Save("b.x-1", b).ok());
  EXPECT_THAT(FileNames(dir.path()), ElementsAre("a.nibble", "b.x-1.nibble"));
  EXPECT_EQ(ReadFile(dir.FilePath("a")), SerializeWeightFile("a", a));

  std::map<std::string, WeightFile> loaded;
  absl::StatusOr<LoadReport> report = LoadInto(dir, &loaded);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->weights_loaded, 2);
  EXPECT_THAT(report->problems, IsEmpty());
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded["a"].weight.qweight, a.qweight);
  EXPECT_EQ(loaded["a"].weight.zeros, a.zeros);
  EXPECT_EQ(loaded["b.x-1"].weight.scales, b.scales);

  ASSERT_TRUE(dir.Remove("a").ok());
  EXPECT_THAT(FileNames(dir.path()), ElementsAre("b.x-1.nibble"));
  EXPECT_TRUE(dir.Remove("a").ok()) << "removing a missing file is OK";
}

TEST(WeightDirectoryTest, SaveReplacesAndRefusesUnsafeNames) {
  WeightDirectory dir(FreshDirectory("replace"));
  ASSERT_TRUE(dir.Prepare().ok());
  const QuantizedWeight first =
      RandomQuantizedWeight({WeightFormat::kU4b8, 32, 8, 32}, 3);
  const QuantizedWeight second =
      RandomQuantizedWeight({WeightFormat::kU4b8, 32, 8, 32}, 4);
  SCOPED_TRACE("seeds 3, 4");
  ASSERT_TRUE(dir.Save("w", first).ok());
  ASSERT_TRUE(dir.Save("w", second).ok());
  EXPECT_EQ(ReadFile(dir.FilePath("w")), SerializeWeightFile("w", second));
  for (const char* name : {"../w", "a/b", ".hidden", ""}) {
    EXPECT_EQ(dir.Save(name, first).code(), absl::StatusCode::kInvalidArgument)
        << name;
    EXPECT_EQ(dir.Remove(name).code(), absl::StatusCode::kInvalidArgument)
        << name;
  }
  EXPECT_THAT(FileNames(dir.path()), ElementsAre("w.nibble"));
}

TEST(WeightDirectoryTest, SkipsTornAndCorruptFilesAndRemovesTempFiles) {
  WeightDirectory dir(FreshDirectory("corrupt"));
  ASSERT_TRUE(dir.Prepare().ok());
  SCOPED_TRACE("seeds 5, 6, 7");
  const QuantizedWeight good =
      RandomQuantizedWeight({WeightFormat::kU4, 64, 16, 64}, 5);
  ASSERT_TRUE(dir.Save("good", good).ok());
  ASSERT_TRUE(dir.Save("torn", RandomQuantizedWeight(
                                   {WeightFormat::kFp4, 64, 16, 32}, 6))
                  .ok());
  ASSERT_TRUE(dir.Save("flipped", RandomQuantizedWeight(
                                      {WeightFormat::kU4b8, 64, 16, 32}, 7))
                  .ok());
  // A file cut short, one with a flipped byte, one holding another weight's
  // name, a save that never finished (a weight named like a temporary file
  // is not one), and a file that is no weight at all.
  std::string torn = ReadFile(dir.FilePath("torn"));
  WriteFile(dir.FilePath("torn"), torn.substr(0, torn.size() / 2));
  std::string flipped = ReadFile(dir.FilePath("flipped"));
  flipped[flipped.size() / 2] ^= 0x01;
  WriteFile(dir.FilePath("flipped"), flipped);
  WriteFile(dir.FilePath("renamed"), ReadFile(dir.FilePath("good")));
  WriteFile(dir.FilePath("good") + ".tmp-123-0", "half a weight");
  WriteFile(dir.path() + "/.write-probe.nibble.tmp-123-1", "probe");
  ASSERT_TRUE(dir.Save("x.nibble.tmp-1", good).ok());
  WriteFile(dir.FilePath("x.nibble.tmp-1") + ".tmp-9-2", "half a weight");
  WriteFile(dir.path() + "/README", "not a weight");
  // A user's files that merely look like temporary ones stay.
  const std::vector<std::string> users_files = {
      "precious.nibble.tmp-notes", "precious.nibble.tmp-1",
      "precious.nibble.tmp-1-2-3", ".hidden.nibble.tmp-1-2",
      "precious.nibble.tmp--2"};
  for (const std::string& name : users_files) {
    WriteFile(dir.path() + "/" + name, "the user's");
  }

  std::map<std::string, WeightFile> loaded;
  absl::StatusOr<LoadReport> report = LoadInto(dir, &loaded);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->weights_loaded, 2);
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded["good"].weight.qweight, good.qweight);
  EXPECT_EQ(loaded.count("x.nibble.tmp-1"), 1u);

  ASSERT_EQ(report->problems.size(), 3u);
  std::map<std::string, std::string> reasons;
  for (const WeightFileProblem& problem : report->problems) {
    reasons[problem.path] = problem.reason;
  }
  EXPECT_THAT(reasons[dir.FilePath("torn")], HasSubstr("truncated"));
  EXPECT_THAT(reasons[dir.FilePath("flipped")], HasSubstr("checksum"));
  EXPECT_THAT(reasons[dir.FilePath("renamed")],
              HasSubstr("holds weight \"good\""));
  EXPECT_THAT(report->removed_temp_files,
              ElementsAre(dir.path() + "/.write-probe.nibble.tmp-123-1",
                          dir.FilePath("good") + ".tmp-123-0",
                          dir.FilePath("x.nibble.tmp-1") + ".tmp-9-2"));
  // Bad files stay for the operator to look at, and the user's files too;
  // the temporary ones are gone.
  EXPECT_THAT(FileNames(dir.path()),
              ElementsAre(".hidden.nibble.tmp-1-2", "README", "flipped.nibble",
                          "good.nibble", "precious.nibble.tmp--2",
                          "precious.nibble.tmp-1", "precious.nibble.tmp-1-2-3",
                          "precious.nibble.tmp-notes", "renamed.nibble",
                          "torn.nibble", "x.nibble.tmp-1.nibble"));
}

// Only regular files are read, and symbolic links only where they stay in
// the directory: a FIFO or a device is refused without waiting on it, a link
// to a weight file outside is refused, and a link to a file inside loads.
TEST(WeightDirectoryTest, LoadsOnlyRegularFilesInsideTheDirectory) {
  const std::string root = FreshDirectory("hygiene");
  WeightDirectory dir(root + "/data");
  ASSERT_TRUE(dir.Prepare().ok());
  WeightDirectory elsewhere(root + "/elsewhere");
  ASSERT_TRUE(elsewhere.Prepare().ok());
  SCOPED_TRACE("seeds 11, 12, 13");
  const WeightSpec spec{WeightFormat::kU4b8, 64, 16, 32};
  ASSERT_TRUE(dir.Save("plain", RandomQuantizedWeight(spec, 11)).ok());
  ASSERT_TRUE(elsewhere.Save("outside", RandomQuantizedWeight(spec, 12)).ok());
  ASSERT_TRUE(elsewhere.Save("kept", RandomQuantizedWeight(spec, 13)).ok());
  // "kept" is moved under the data directory, out of LoadAll's sight, and
  // reached through a link; "outside" only through a link.
  std::filesystem::create_directory(dir.path() + "/store");
  std::filesystem::rename(elsewhere.FilePath("kept"),
                          dir.path() + "/store/kept.bin");
  std::filesystem::create_symlink("store/kept.bin", dir.FilePath("kept"));
  std::filesystem::create_symlink(elsewhere.FilePath("outside"),
                                  dir.FilePath("outside"));
  std::filesystem::create_symlink("/dev/zero", dir.FilePath("zero"));
  ASSERT_EQ(mkfifo(dir.FilePath("fifo").c_str(), 0600), 0);

  std::map<std::string, WeightFile> loaded;
  absl::StatusOr<LoadReport> report = LoadInto(dir, &loaded);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->weights_loaded, 2);
  EXPECT_EQ(loaded.count("plain"), 1u);
  EXPECT_EQ(loaded.count("kept"), 1u);
  std::map<std::string, std::string> reasons;
  for (const WeightFileProblem& problem : report->problems) {
    reasons[problem.path] = problem.reason;
  }
  EXPECT_EQ(reasons.size(), 3u);
  EXPECT_THAT(reasons[dir.FilePath("fifo")],
              HasSubstr("not a regular file but a FIFO"));
  EXPECT_THAT(
      reasons[dir.FilePath("outside")],
      HasSubstr(
          "is a symbolic link to " +
          std::filesystem::canonical(elsewhere.FilePath("outside")).string() +
          ", outside the data directory"));
  EXPECT_THAT(reasons[dir.FilePath("zero")],
              HasSubstr("is a symbolic link to /dev/zero, outside"));
}

// `accept` sees each file's header before its data is read: a file whose
// header claims a 2 GiB weight, sparse on disk, is skipped unread when
// `accept` refuses it; a 10 GiB sparse file of zeros is refused for its
// header alone; the weights `accept` takes load as before.
TEST(WeightDirectoryTest, AcceptRefusesAWeightBeforeItsDataIsRead) {
  WeightDirectory dir(FreshDirectory("admit"));
  ASSERT_TRUE(dir.Prepare().ok());
  SCOPED_TRACE("seed 5");
  const QuantizedWeight small =
      RandomQuantizedWeight({WeightFormat::kU4b8, 64, 16, 32}, 5);
  ASSERT_TRUE(dir.Save("small", small).ok());
  // The header of a 65536 x 65536 u4b8 weight, the file as long as it says.
  const WeightSpec huge_spec{WeightFormat::kU4b8, 65536, 65536, 128};
  std::string huge_header =
      SerializeWeightFile("huge", small).substr(0, kWeightFileHeaderBytes);
  const uint64_t dimensions[] = {65536,
                                 65536,
                                 128,
                                 uint64_t(huge_spec.qweight_bytes()),
                                 uint64_t(huge_spec.scales_bytes()),
                                 0};
  std::memcpy(huge_header.data() + 16, dimensions, sizeof(dimensions));
  const std::string huge = dir.FilePath("huge");
  WriteFile(huge, huge_header + "huge");
  absl::StatusOr<WeightFileHeader> parsed = ParseWeightFileHeader(huge_header);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(truncate(huge.c_str(), parsed->file_bytes), 0);
  const std::string zeros = dir.FilePath("zeros");
  WriteFile(zeros, "");
  ASSERT_EQ(truncate(zeros.c_str(), int64_t{10} << 30), 0);

  std::map<std::string, WeightSpec> admitted;
  std::map<std::string, WeightFile> loaded;
  absl::StatusOr<LoadReport> report = dir.LoadAll([&](WeightFileReader& file)
                                                      -> absl::Status {
    admitted.emplace(file.name(), file.header().spec);
    if (file.header().spec.canonical_bytes() > (1 << 20)) {
      return absl::ResourceExhaustedError("too large to load");
    }
    absl::StatusOr<QuantizedWeight> weight = file.ReadWhole();
    if (!weight.ok()) return weight.status();
    loaded.emplace(file.name(), WeightFile{file.name(), *std::move(weight)});
    return absl::OkStatus();
  });
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(admitted.at("huge").k, 65536);
  EXPECT_EQ(admitted.at("small").n, 16);
  EXPECT_FALSE(admitted.contains("zeros"));
  EXPECT_EQ(report->weights_loaded, 1);
  ASSERT_EQ(report->problems.size(), 2u);
  EXPECT_EQ(report->problems[0].path, huge);
  EXPECT_EQ(report->problems[0].reason, "too large to load");
  EXPECT_EQ(report->problems[1].path, zeros);
  EXPECT_THAT(report->problems[1].reason, HasSubstr("NIBWEIGH"));
  EXPECT_EQ(loaded["small"].weight.qweight, small.qweight);
}

TEST(WeightDirectoryTest, RefusedWeightsAreReported) {
  WeightDirectory dir(FreshDirectory("refused"));
  ASSERT_TRUE(dir.Prepare().ok());
  ASSERT_TRUE(
      dir.Save("w", RandomQuantizedWeight({WeightFormat::kU4, 32, 8, 32}, 8))
          .ok());
  absl::StatusOr<LoadReport> report = dir.LoadAll([](WeightFileReader&) {
    return absl::AlreadyExistsError("a weight named \"w\" already exists");
  });
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(report->weights_loaded, 0);
  ASSERT_EQ(report->problems.size(), 1u);
  EXPECT_THAT(report->problems[0].reason, HasSubstr("already exists"));
}

TEST(WeightDirectoryTest, PrepareRefusesWhatIsNotADirectory) {
  const std::string base = FreshDirectory("not-a-dir");
  std::filesystem::create_directories(base);
  WriteFile(base + "/file", "x");
  absl::Status status = WeightDirectory(base + "/file").Prepare();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr(base + "/file"));
  status = WeightDirectory(base + "/file/sub").Prepare();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("cannot create data directory"));
  // Prepare leaves nothing behind in a directory it accepts.
  ASSERT_TRUE(WeightDirectory(base + "/ok").Prepare().ok());
  EXPECT_THAT(FileNames(base + "/ok"), IsEmpty());
}

TEST(WeightDirectoryTest, FailedSaveSaysWhyAndLeavesNothingBehind) {
  WeightDirectory dir(FreshDirectory("vanished"));
  ASSERT_TRUE(dir.Prepare().ok());
  std::filesystem::remove_all(dir.path());
  const absl::Status status =
      dir.Save("w", RandomQuantizedWeight({WeightFormat::kU4b8, 32, 8, 32}, 9));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat("cannot create ", dir.FilePath("w"),
                                     ".tmp-", getpid(), "-")));
  EXPECT_THAT(status.message(), HasSubstr("No such file or directory"));
  EXPECT_FALSE(std::filesystem::exists(dir.path()));
}

TEST(WeightDirectoryTest, WritesAFileAsItsTensorsArrive) {
  WeightDirectory dir(FreshDirectory("pending"));
  ASSERT_TRUE(dir.Prepare().ok());
  constexpr uint64_t kSeed = 14;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4, 64, 16, 32}, kSeed);
  weight.activation_order = RandomActivationOrder(64, kSeed);
  const std::string tensors = absl::StrCat(
      BytesOf(weight).qweight, BytesOf(weight).scales, BytesOf(weight).zeros);
  absl::StatusOr<WeightDirectory::PendingSave> save =
      dir.StartSave("w", weight.spec, weight.activation_order);
  ASSERT_TRUE(save.ok()) << save.status();
  // Pieces of 1..97 bytes, ending inside tensors and words.
  std::mt19937_64 rng(kSeed);
  for (size_t offset = 0; offset < tensors.size();) {
    const size_t size =
        std::min<size_t>(tensors.size() - offset, 1 + rng() % 97);
    ASSERT_TRUE(
        save->Append(absl::string_view(tensors).substr(offset, size)).ok());
    offset += size;
  }
  EXPECT_EQ(save->Append("x").code(), absl::StatusCode::kInvalidArgument);
  // Under the weight's name only once committed.
  EXPECT_FALSE(std::filesystem::exists(dir.FilePath("w")));
  ASSERT_EQ(FileNames(dir.path()).size(), 1u);
  ASSERT_TRUE(save->Commit().ok());
  EXPECT_THAT(FileNames(dir.path()), ElementsAre("w.nibble"));
  EXPECT_EQ(ReadFile(dir.FilePath("w")), SerializeWeightFile("w", weight));
}

TEST(WeightDirectoryTest, AbandonedOrIncompleteSaveLeavesNothingBehind) {
  WeightDirectory dir(FreshDirectory("abandoned"));
  ASSERT_TRUE(dir.Prepare().ok());
  SCOPED_TRACE("seed 15");
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 32, 8, 32}, 15);
  {
    absl::StatusOr<WeightDirectory::PendingSave> save =
        dir.StartSave("w", weight.spec, {});
    ASSERT_TRUE(save.ok()) << save.status();
    ASSERT_TRUE(save->Append(BytesOf(weight).qweight).ok());
    EXPECT_EQ(FileNames(dir.path()).size(), 1u);
  }
  EXPECT_THAT(FileNames(dir.path()), IsEmpty());
  absl::StatusOr<WeightDirectory::PendingSave> save =
      dir.StartSave("w", weight.spec, {});
  ASSERT_TRUE(save.ok()) << save.status();
  ASSERT_TRUE(save->Append(BytesOf(weight).qweight).ok());
  const absl::Status status = save->Commit();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("finished after"));
  EXPECT_THAT(FileNames(dir.path()), IsEmpty());
}

TEST(WeightDirectoryTest, FailedSaveInAReadOnlyDirectoryLeavesNothingBehind) {
  if (geteuid() == 0) {
    GTEST_SKIP() << "root writes into read-only directories";
  }
  WeightDirectory dir(FreshDirectory("readonly"));
  ASSERT_TRUE(dir.Prepare().ok());
  std::filesystem::permissions(
      dir.path(),
      std::filesystem::perms::owner_read | std::filesystem::perms::owner_exec);
  const absl::Status status = dir.Save(
      "w", RandomQuantizedWeight({WeightFormat::kU4b8, 32, 8, 32}, 10));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(status.message(), HasSubstr(dir.path()));
  EXPECT_EQ(dir.Prepare().code(), absl::StatusCode::kFailedPrecondition);
  std::filesystem::permissions(dir.path(), std::filesystem::perms::owner_all);
  EXPECT_THAT(FileNames(dir.path()), IsEmpty());
}

}  // namespace
}  // namespace nibble::server
