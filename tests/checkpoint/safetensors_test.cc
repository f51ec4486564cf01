// Tests the safetensors reader and writer: round trips of random tensors of
// every dtype, in memory and through a real mapped file, and one test per
// validation error, checking its status code and that the message names the
// tensor and the problem. Truncation (the file ends before its header says)
// is DATA_LOSS; every other malformed header is INVALID_ARGUMENT.
#include "checkpoint/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::checkpoint {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

absl::string_view AsStringView(absl::Span<const uint8_t> bytes) {
  return absl::string_view(reinterpret_cast<const char*>(bytes.data()),
                           bytes.size());
}

// A file with `header` as its JSON verbatim and `data` as its data section,
// for headers that SerializeSafetensors would never write.
std::string FileWithHeader(absl::string_view header, absl::string_view data) {
  std::string file;
  for (int i = 0; i < 8; ++i) {
    file.push_back(static_cast<char>(uint64_t{header.size()} >> 8 * i));
  }
  absl::StrAppend(&file, header, data);
  return file;
}

// A random tensor: shape, dtype and bytes drawn from `rng`.
struct RandomTensor {
  std::string name;
  SafetensorsDtype dtype;
  std::vector<int64_t> shape;
  std::string bytes;
};

RandomTensor MakeRandomTensor(std::mt19937_64& rng, std::string name,
                              SafetensorsDtype dtype) {
  RandomTensor tensor{std::move(name), dtype, {}, {}};
  const int rank = std::uniform_int_distribution<int>(0, 3)(rng);
  int64_t elements = 1;
  for (int i = 0; i < rank; ++i) {
    tensor.shape.push_back(std::uniform_int_distribution<int64_t>(0, 5)(rng));
    elements *= tensor.shape.back();
  }
  tensor.bytes.resize(elements * SafetensorsDtypeBytes(dtype));
  for (char& byte : tensor.bytes) byte = static_cast<char>(rng());
  return tensor;
}

std::vector<NamedTensorBytes> Views(const std::vector<RandomTensor>& tensors) {
  std::vector<NamedTensorBytes> views;
  for (const RandomTensor& tensor : tensors) {
    views.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.bytes});
  }
  return views;
}

// Checks that `file` holds exactly `want` (in any order) and `metadata`.
void ExpectHolds(const SafetensorsFile& file,
                 const std::vector<RandomTensor>& want,
                 const std::map<std::string, std::string>& metadata) {
  ASSERT_EQ(file.tensors().size(), want.size());
  for (const RandomTensor& tensor : want) {
    SCOPED_TRACE(tensor.name);
    const TensorInfo* info = file.Find(tensor.name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->name, tensor.name);
    EXPECT_EQ(info->dtype, tensor.dtype);
    EXPECT_EQ(info->shape, tensor.shape);
    EXPECT_EQ(info->num_bytes(), static_cast<int64_t>(tensor.bytes.size()));
    EXPECT_EQ(AsStringView(file.Data(*info)), tensor.bytes);
  }
  EXPECT_EQ(file.metadata(), metadata);
}

absl::Status ParseError(absl::string_view header, absl::string_view data) {
  return SafetensorsFile::FromBytes(FileWithHeader(header, data), "test.st")
      .status();
}

TEST(SafetensorsDtypeTest, NamesAndSizesRoundTrip) {
  for (SafetensorsDtype dtype : kAllSafetensorsDtypes) {
    const absl::string_view name = SafetensorsDtypeName(dtype);
    SCOPED_TRACE(name);
    EXPECT_EQ(SafetensorsDtypeFromName(name), dtype);
    EXPECT_THAT(SafetensorsDtypeBytes(dtype), ::testing::AnyOf(1, 2, 4, 8));
  }
  EXPECT_EQ(SafetensorsDtypeName(SafetensorsDtype::kBF16), "BF16");
  EXPECT_EQ(SafetensorsDtypeBytes(SafetensorsDtype::kBF16), 2);
  EXPECT_EQ(SafetensorsDtypeBytes(SafetensorsDtype::kF8E4M3), 1);
  EXPECT_EQ(SafetensorsDtypeBytes(SafetensorsDtype::kF64), 8);
  EXPECT_EQ(SafetensorsDtypeFromName("f16"), std::nullopt);
  EXPECT_EQ(SafetensorsDtypeFromName("F4"), std::nullopt);
}

TEST(SafetensorsTest, RoundTripsRandomTensorsOfEveryDtype) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(absl::StrCat("seed=", seed));
    std::mt19937_64 rng(seed);
    std::vector<RandomTensor> tensors;
    for (SafetensorsDtype dtype : kAllSafetensorsDtypes) {
      if (rng() % 2 == 0) continue;
      tensors.push_back(MakeRandomTensor(
          rng, absl::StrCat("layers.", rng() % 100, ".", tensors.size()),
          dtype));
    }
    std::map<std::string, std::string> metadata;
    if (seed % 2 == 0) metadata = {{"format", "pt"}, {"seed", "é"}};

    absl::StatusOr<std::string> bytes =
        SerializeSafetensors(Views(tensors), metadata);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    absl::StatusOr<SafetensorsFile> file =
        SafetensorsFile::FromBytes(*std::move(bytes));
    ASSERT_TRUE(file.ok()) << file.status();
    ExpectHolds(*file, tensors, metadata);
    for (size_t i = 1; i < file->tensors().size(); ++i) {
      EXPECT_LT(file->tensors()[i - 1].name, file->tensors()[i].name);
    }
  }
}

TEST(SafetensorsTest, WriterAlignsDataSectionAndEveryTensor) {
  std::mt19937_64 rng(3);
  std::vector<RandomTensor> tensors = {
      MakeRandomTensor(rng, "a_byte", SafetensorsDtype::kU8),
      MakeRandomTensor(rng, "b_half", SafetensorsDtype::kF16),
      MakeRandomTensor(rng, "c_double", SafetensorsDtype::kF64),
      MakeRandomTensor(rng, "d_float", SafetensorsDtype::kF32)};
  tensors[0].shape = {3};
  tensors[0].bytes = "xyz";
  absl::StatusOr<std::string> bytes = SerializeSafetensors(Views(tensors));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->data_start() % 8, 0);
  for (const TensorInfo& tensor : file->tensors()) {
    SCOPED_TRACE(tensor.name);
    EXPECT_EQ(tensor.begin % SafetensorsDtypeBytes(tensor.dtype), 0);
  }
  ExpectHolds(*file, tensors, {});
}

TEST(SafetensorsTest, ReadsAFileWrittenByHand) {
  // As the reference implementation writes it: data_offsets in any order.
  const std::string data = std::string("\x01\x00\x02\x00", 4) + "AB";
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(
      FileWithHeader(R"({"b":{"dtype":"I16","shape":[2],"data_offsets":[0,4]},)"
                     R"("a":{"dtype":"U8","shape":[1,2],"data_offsets":[4,6]},)"
                     R"("__metadata__":{"format":"pt"}}   )",
                     data));
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_EQ(file->tensors().size(), 2);
  const TensorInfo& a = file->tensors()[0];
  EXPECT_EQ(a, (TensorInfo{"a", SafetensorsDtype::kU8, {1, 2}, 4, 6}));
  EXPECT_EQ(a.num_elements(), 2);
  EXPECT_EQ(AsStringView(file->Data(a)), "AB");
  EXPECT_EQ(file->tensors()[1].name, "b");
  EXPECT_EQ(file->Find("b"), &file->tensors()[1]);
  EXPECT_EQ(file->Find("c"), nullptr);
  EXPECT_EQ(file->metadata().at("format"), "pt");
}

TEST(SafetensorsTest, AcceptsNoTensorsAndEmptyAndScalarTensors) {
  absl::StatusOr<SafetensorsFile> empty =
      SafetensorsFile::FromBytes(FileWithHeader("{}", ""));
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_TRUE(empty->tensors().empty());

  const std::vector<RandomTensor> tensors = {
      {"empty", SafetensorsDtype::kF32, {4, 0}, ""},
      {"also_empty", SafetensorsDtype::kBF16, {0}, ""},
      {"scalar", SafetensorsDtype::kI64, {}, std::string(8, '\x07')}};
  absl::StatusOr<std::string> bytes = SerializeSafetensors(Views(tensors));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<SafetensorsFile> file = SafetensorsFile::FromBytes(*bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectHolds(*file, tensors, {});
  EXPECT_EQ(file->Find("scalar")->num_elements(), 1);
  EXPECT_EQ(file->Find("empty")->num_elements(), 0);
}

class SafetensorsOpenTest : public ::testing::Test {
 protected:
  std::string WriteTempFile(absl::string_view name, absl::string_view bytes) {
    const std::string path = absl::StrCat(::testing::TempDir(), "/", name, "-",
                                          getpid(), ".safetensors");
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size());
    EXPECT_TRUE(out.good()) << path;
    paths_.push_back(path);
    return path;
  }
  void TearDown() override {
    for (const std::string& path : paths_) std::remove(path.c_str());
  }

 private:
  std::vector<std::string> paths_;
};

TEST_F(SafetensorsOpenTest, MapsARealFileAndSurvivesMoves) {
  std::mt19937_64 rng(11);
  const std::vector<RandomTensor> tensors = {
      MakeRandomTensor(rng, "embed", SafetensorsDtype::kBF16),
      MakeRandomTensor(rng, "norm", SafetensorsDtype::kF32),
      {"big", SafetensorsDtype::kU8, {70000}, std::string(70000, 'q')}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  absl::StatusOr<std::string> bytes =
      SerializeSafetensors(Views(tensors), metadata);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string path = WriteTempFile("mapped", *bytes);

  absl::StatusOr<SafetensorsFile> opened = SafetensorsFile::Open(path);
  ASSERT_TRUE(opened.ok()) << opened.status();
  EXPECT_EQ(opened->source_name(), path);
  EXPECT_EQ(AsStringView(opened->bytes()), *bytes);
  // The spans are into the mapping, which a move hands over.
  SafetensorsFile file = *std::move(opened);
  ExpectHolds(file, tensors, metadata);
  // Prefetching is a hint: tensors at unaligned offsets read the same after.
  for (const TensorInfo& tensor : file.tensors()) file.Prefetch(tensor);
  ExpectHolds(file, tensors, metadata);
  SafetensorsFile other =
      *SafetensorsFile::FromBytes(FileWithHeader("{}", ""), "x");
  other = std::move(file);
  ExpectHolds(other, tensors, metadata);
}

// A sharded checkpoint in a directory of its own: shard files and an index.
class ShardedCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/sharded-", getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(absl::string_view name, absl::string_view bytes) {
    const std::string path = absl::StrCat(dir_, "/", name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), bytes.size());
    EXPECT_TRUE(out.good()) << path;
    return path;
  }
  void WriteShard(absl::string_view name,
                  const std::vector<RandomTensor>& tensors) {
    absl::StatusOr<std::string> bytes = SerializeSafetensors(Views(tensors));
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    Write(name, *bytes);
  }
  absl::Status OpenIndex(absl::string_view json) {
    return SafetensorsFile::Open(Write("model.safetensors.index.json", json))
        .status();
  }

  std::string dir_;
};

TEST_F(ShardedCheckpointTest, OpensEveryShardThroughTheIndex) {
  std::mt19937_64 rng(23);
  // Names interleave across the shards, as a layer split over two would.
  const std::vector<RandomTensor> first = {
      MakeRandomTensor(rng, "layer.a.qweight", SafetensorsDtype::kI32),
      MakeRandomTensor(rng, "layer.b.qweight", SafetensorsDtype::kI32)};
  const std::vector<RandomTensor> second = {
      MakeRandomTensor(rng, "layer.a.scales", SafetensorsDtype::kF16),
      MakeRandomTensor(rng, "layer.b.scales", SafetensorsDtype::kF16),
      MakeRandomTensor(rng, "norm", SafetensorsDtype::kBF16)};
  WriteShard("model-00002-of-00002.safetensors", second);
  WriteShard("model-00001-of-00002.safetensors", first);
  const std::string index = Write("model.safetensors.index.json", R"({
    "metadata": {"total_size": 1234, "format": "pt"},
    "weight_map": {
      "layer.a.qweight": "model-00001-of-00002.safetensors",
      "layer.a.scales": "model-00002-of-00002.safetensors",
      "layer.b.qweight": "model-00001-of-00002.safetensors",
      "layer.b.scales": "model-00002-of-00002.safetensors",
      "norm": "model-00002-of-00002.safetensors"}})");

  absl::StatusOr<SafetensorsFile> opened = SafetensorsFile::Open(index);
  ASSERT_TRUE(opened.ok()) << opened.status();
  SafetensorsFile checkpoint = *std::move(opened);
  std::vector<RandomTensor> all = first;
  all.insert(all.end(), second.begin(), second.end());
  const std::map<std::string, std::string> metadata = {{"total_size", "1234"},
                                                       {"format", "pt"}};
  ExpectHolds(checkpoint, all, metadata);
  EXPECT_EQ(checkpoint.source_name(), index);
  EXPECT_TRUE(checkpoint.bytes().empty());
  ASSERT_EQ(checkpoint.shards().size(), 2u);
  EXPECT_THAT(checkpoint.shards()[0].source_name(),
              ::testing::EndsWith("/model-00001-of-00002.safetensors"));
  EXPECT_EQ(checkpoint.Find("layer.a.qweight")->shard, 0);
  EXPECT_EQ(checkpoint.Find("layer.a.scales")->shard, 1);
  for (size_t i = 1; i < checkpoint.tensors().size(); ++i) {
    EXPECT_LT(checkpoint.tensors()[i - 1].name, checkpoint.tensors()[i].name);
  }
  for (const TensorInfo& tensor : checkpoint.tensors()) {
    checkpoint.Prefetch(tensor);
  }
  SafetensorsFile moved = std::move(checkpoint);
  ExpectHolds(moved, all, metadata);
}

TEST_F(ShardedCheckpointTest, RefusesAnIndexThatDisagreesWithItsShards) {
  std::mt19937_64 rng(29);
  WriteShard("a.safetensors",
             {MakeRandomTensor(rng, "x", SafetensorsDtype::kU8),
              MakeRandomTensor(rng, "y", SafetensorsDtype::kU8)});
  WriteShard("b.safetensors",
             {MakeRandomTensor(rng, "y", SafetensorsDtype::kU8)});
  struct Case {
    const char* json;
    absl::StatusCode code;
    std::vector<std::string> message_parts;
  };
  const Case cases[] = {
      {"{", absl::StatusCode::kInvalidArgument, {"not valid JSON"}},
      {"[]", absl::StatusCode::kInvalidArgument, {"no \"weight_map\""}},
      {R"({"weight_map": ["a.safetensors"]})",
       absl::StatusCode::kInvalidArgument,
       {"no \"weight_map\""}},
      {R"({"weight_map": {"x": 7}})",
       absl::StatusCode::kInvalidArgument,
       {"entry \"x\" is a number, not a file name"}},
      {R"({"weight_map": {"x": "../a.safetensors"}})",
       absl::StatusCode::kInvalidArgument,
       {"\"../a.safetensors\"", "beside the index"}},
      {R"({"weight_map": {"x": "missing.safetensors"}})",
       absl::StatusCode::kNotFound,
       {"shard missing.safetensors", "/missing.safetensors"}},
      {R"({"weight_map": {"x": "a.safetensors", "z": "a.safetensors"}})",
       absl::StatusCode::kInvalidArgument,
       {"puts tensor \"z\" in a.safetensors, which has no such tensor"}},
      {R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})",
       absl::StatusCode::kInvalidArgument,
       {"tensor \"y\" is in both a.safetensors and b.safetensors"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.json);
    const absl::Status status = OpenIndex(c.json);
    EXPECT_EQ(status.code(), c.code) << status;
    EXPECT_THAT(status.message(), HasSubstr("model.safetensors.index.json"));
    for (const std::string& part : c.message_parts) {
      EXPECT_THAT(status.message(), HasSubstr(part));
    }
  }
  WriteShard("c.safetensors",
             {MakeRandomTensor(rng, "w", SafetensorsDtype::kU8)});
  const absl::Status misplaced = OpenIndex(
      R"({"weight_map": {"x": "a.safetensors", "w": "a.safetensors",
                         "z": "c.safetensors"}})");
  EXPECT_THAT(misplaced.message(),
              HasSubstr("puts tensor \"w\" in a.safetensors, which has no such "
                        "tensor (c.safetensors has it)"));
}

TEST_F(SafetensorsOpenTest, ReportsMissingAndUnreadableFiles) {
  const absl::Status missing =
      SafetensorsFile::Open("/nonexistent/model.safetensors").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr("/nonexistent/model.safetensors"));

  const absl::Status directory =
      SafetensorsFile::Open(::testing::TempDir()).status();
  EXPECT_EQ(directory.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(directory.message(), HasSubstr("not a regular file"));
}

// A FIFO named like a checkpoint is refused at once: opening it for reading
// must not wait for a writer that never comes.
TEST_F(SafetensorsOpenTest, RefusesAFifoWithoutWaitingForAWriter) {
  const std::string fifo =
      absl::StrCat(::testing::TempDir(), "/fifo-", getpid(), ".safetensors");
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0) << fifo;
  const absl::Status status = SafetensorsFile::Open(fifo).status();
  std::remove(fifo.c_str());
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(fifo), HasSubstr("not a regular file")));
}

TEST_F(SafetensorsOpenTest, NamesThePathOfAnInvalidFile) {
  const std::string empty = WriteTempFile("empty", "");
  const absl::Status too_short = SafetensorsFile::Open(empty).status();
  EXPECT_EQ(too_short.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(too_short.message(),
              AllOf(HasSubstr(empty), HasSubstr("0 bytes")));

  const std::string bad =
      WriteTempFile("bad", FileWithHeader(R"({"w":{"dtype":"F99","shape":[],)"
                                          R"("data_offsets":[0,0]}})",
                                          ""));
  const absl::Status unknown = SafetensorsFile::Open(bad).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.message(), AllOf(HasSubstr(bad), HasSubstr("F99")));
}

TEST(SafetensorsErrorTest, FileShorterThanLengthPrefix) {
  const absl::Status status =
      SafetensorsFile::FromBytes("abc", "test.st").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("test.st"), HasSubstr("3 bytes"),
                    HasSubstr("shorter than the 8-byte header length")));
}

TEST(SafetensorsErrorTest, HeaderLengthPastEndOfFile) {
  std::string bytes = FileWithHeader("{}", "");
  bytes[0] = 3;  // one more than the 2 bytes present
  const absl::Status status =
      SafetensorsFile::FromBytes(bytes, "test.st").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("header length is 3 bytes"),
                                      HasSubstr("only 2 follow")));
}

TEST(SafetensorsErrorTest, HeaderLengthOverLimit) {
  std::string bytes = FileWithHeader("{}", "");
  const uint64_t length = kMaxSafetensorsHeaderBytes + 1;
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>(length >> 8 * i);
  const absl::Status status =
      SafetensorsFile::FromBytes(bytes, "test.st").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("test.st"), HasSubstr("100 MiB")));
}

TEST(SafetensorsErrorTest, EveryTruncationIsRefused) {
  const std::vector<RandomTensor> tensors = {
      {"w", SafetensorsDtype::kF16, {2, 2}, "abcdefgh"}};
  absl::StatusOr<std::string> bytes = SerializeSafetensors(Views(tensors));
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  for (size_t size = 0; size < bytes->size(); ++size) {
    SCOPED_TRACE(absl::StrCat("size=", size));
    const absl::Status status =
        SafetensorsFile::FromBytes(bytes->substr(0, size)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << status;
  }
}

TEST(SafetensorsErrorTest, HeaderNotJson) {
  const absl::Status status = ParseError(R"({"w": {"dtype": )", "");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("test.st"), HasSubstr("not valid JSON")));
}

TEST(SafetensorsErrorTest, HeaderNotUtf8) {
  const absl::Status status = ParseError("{\"w\xff\": 1}", "");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("not valid JSON"));
}

TEST(SafetensorsErrorTest, HeaderNotAnObject) {
  const absl::Status status = ParseError("[1, 2]", "");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("must be a JSON object"), HasSubstr("array")));
}

TEST(SafetensorsErrorTest, TensorEntryNotAnObject) {
  const absl::Status status = ParseError(R"({"w": [1]})", "");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("not a array")));
}

TEST(SafetensorsErrorTest, MissingField) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "\"dtype\""},
      {R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "\"shape\""},
      {R"({"w":{"dtype":"F32","shape":[1]}})", "\"data_offsets\""}};
  for (const auto& [header, field] : cases) {
    SCOPED_TRACE(header);
    const absl::Status status = ParseError(header, "abcd");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("tensor \"w\""),
                      HasSubstr(absl::StrCat("missing field ", field))));
  }
}

TEST(SafetensorsErrorTest, FieldOfWrongType) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"w":{"dtype":4,"shape":[1],"data_offsets":[0,4]}})",
       "\"dtype\" must be a string"},
      {R"({"w":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})",
       "\"shape\" must be an array of integers, not a string"},
      {R"({"w":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})",
       "\"shape\" must be an array of integers, but holds 1.0"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})",
       "\"data_offsets\" must be [begin, end]"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-1,3]}})",
       "\"data_offsets\" must be [begin, end]"},
      {R"({"w":{"dtype":"F32","shape":[1],"data_offsets":{"a":1}}})",
       "\"data_offsets\" must be [begin, end]"}};
  for (const auto& [header, problem] : cases) {
    SCOPED_TRACE(header);
    const absl::Status status = ParseError(header, "abcd");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("tensor \"w\""), HasSubstr(problem)));
  }
}

TEST(SafetensorsErrorTest, UnknownDtype) {
  const absl::Status status = ParseError(
      R"({"w":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}})", "a");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"w\""),
                    HasSubstr("unsupported dtype \"F4\""), HasSubstr("BF16")));
}

TEST(SafetensorsErrorTest, NegativeDimension) {
  const absl::Status status = ParseError(
      R"({"w":{"dtype":"U8","shape":[2,-3],"data_offsets":[0,0]}})", "");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("tensor \"w\""),
                                      HasSubstr("negative dimension -3")));
}

TEST(SafetensorsErrorTest, SizeOverflows) {
  const absl::Status status =
      ParseError(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296],)"
                 R"("data_offsets":[0,0]}})",
                 "");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("overflows")));
}

TEST(SafetensorsErrorTest, SizeDisagreesWithShapeAndDtype) {
  const absl::Status status =
      ParseError(R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,12]}})",
                 std::string(12, 'x'));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("needs 24 bytes"),
                    HasSubstr("hold 12")));
}

TEST(SafetensorsErrorTest, OffsetsPastDataSection) {
  const absl::Status status = ParseError(
      R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", "1234567");
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"w\""),
                    HasSubstr("past the end of the 7-byte data section")));
}

TEST(SafetensorsErrorTest, BeginAfterEnd) {
  const absl::Status status = ParseError(
      R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", "1234");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("[4, 0]"),
                    HasSubstr("begin after they end")));
}

TEST(SafetensorsErrorTest, OverlappingTensors) {
  const absl::Status status =
      ParseError(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                 "1234");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("\"a\" [0, 4)"), HasSubstr("\"b\" [2, 4)"),
                    HasSubstr("overlap")));
}

TEST(SafetensorsErrorTest, EmptyTensorInsideAnother) {
  const absl::Status status =
      ParseError(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},)"
                 R"("b":{"dtype":"U8","shape":[0],"data_offsets":[2,2]}})",
                 "1234");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("\"a\""), HasSubstr("\"b\""),
                                      HasSubstr("overlap")));
}

TEST(SafetensorsErrorTest, HoleBetweenTensors) {
  const absl::Status status =
      ParseError(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                 R"("b":{"dtype":"U8","shape":[1],"data_offsets":[3,4]}})",
                 "1234");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("bytes [2, 3)"), HasSubstr("tensor \"b\""),
                    HasSubstr("without holes")));
}

TEST(SafetensorsErrorTest, BytesAfterLastTensor) {
  const absl::Status status = ParseError(
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "1234");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("bytes [2, 4)"), HasSubstr("without holes")));
}

TEST(SafetensorsErrorTest, DuplicateTensorName) {
  const absl::Status status =
      ParseError(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
                 R"("a":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}})",
                 "1234");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("names \"a\" more than once"));
}

TEST(SafetensorsErrorTest, MetadataNotStrings) {
  const absl::Status not_object = ParseError(R"({"__metadata__":[1]})", "");
  EXPECT_EQ(not_object.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_object.message(),
              HasSubstr("\"__metadata__\" must be an object of strings"));

  const absl::Status not_string =
      ParseError(R"({"__metadata__":{"epoch":3}})", "");
  EXPECT_EQ(not_string.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(not_string.message(), AllOf(HasSubstr("entry \"epoch\""),
                                          HasSubstr("must be a string")));
}

TEST(SerializeSafetensorsTest, RefusesInconsistentTensors) {
  const struct {
    NamedTensorBytes tensor;
    const char* problem;
  } cases[] = {
      {{"w", SafetensorsDtype::kF32, {3}, "12345678"}, "needs 12 bytes"},
      {{"w", SafetensorsDtype::kU8, {-1}, ""}, "negative dimension"},
      {{"__metadata__", SafetensorsDtype::kU8, {}, "x"}, "reserved"},
      {{"w\xff", SafetensorsDtype::kU8, {}, "x"}, "not valid UTF-8"}};
  for (const auto& [tensor, problem] : cases) {
    SCOPED_TRACE(problem);
    const absl::Status status = SerializeSafetensors({tensor}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), HasSubstr(problem));
  }

  const NamedTensorBytes twice[] = {{"w", SafetensorsDtype::kU8, {}, "x"},
                                    {"w", SafetensorsDtype::kU8, {}, "y"}};
  const absl::Status duplicate = SerializeSafetensors(twice).status();
  EXPECT_EQ(duplicate.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(duplicate.message(),
              AllOf(HasSubstr("tensor \"w\""), HasSubstr("more than once")));
}

}  // namespace
}  // namespace nibble::checkpoint
