#include "server/core/checkpoint_loader.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "checkpoint/float_quantizer.h"
#include "checkpoint/fp4_blocks.h"
#include "checkpoint/gptq.h"
#include "checkpoint/import.h"
#include "checkpoint/safetensors.h"
#include "format/fp4_columns.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/packed_weight.h"
#include "server/core/weight_store.h"
#include "tests/checkpoint/producer_layers.h"
#include "tests/integration/test_files.h"
#include "tests/kernels/same_panels.h"

namespace nibble::server {
namespace {

using ::nibble::checkpoint::SafetensorsDtype;
using ::nibble::checkpoint::testing::FloatWeightTensor;
using ::nibble::checkpoint::testing::GptqTensors;
using ::nibble::checkpoint::testing::ProducerWeight;
using ::nibble::checkpoint::testing::RandomProducerWeight;
using ::nibble::checkpoint::testing::SerializeTensors;
using ::nibble::checkpoint::testing::Tensor;
using ::nibble::testing::FreshDirectory;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr int64_t kK = 256;
constexpr uint64_t kSeed = 73;

// The path of `name` in a directory of this test process's own: ctest runs
// the tests of this file side by side.
std::string TestPath(absl::string_view name) {
  static const std::string* const directory = [] {
    auto* path = new std::string(FreshDirectory("checkpoint_loader"));
    std::filesystem::create_directories(*path);
    return path;
  }();
  return absl::StrCat(*directory, "/", name);
}

// Writes `tensors` as the safetensors file `name` (see TestPath); its path.
std::string WriteCheckpoint(absl::string_view name,
                            const std::vector<Tensor>& tensors) {
  const std::string path = TestPath(name);
  std::ofstream(path, std::ios::binary) << SerializeTensors(tensors);
  return path;
}

std::vector<float> RandomFloats(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  return values;
}

ImportOptions Options(std::vector<std::string> layers = {}) {
  absl::StatusOr<ImportOptions> options = ImportOptionsFromFlags(
      std::move(layers), {"model.layers.=L"}, "u4b8:128", "v1");
  EXPECT_TRUE(options.ok()) << options.status();
  return *options;
}

// Puts weights in `store` as nibbled does (reserve, pack, insert), keeping
// what it was given so that tests can compare it with the checkpoint.
class StoreRecorder {
 public:
  explicit StoreRecorder(WeightStore* store) : store_(store) {}

  // The bytes the stored weight holds resident, as nibbled's store answers.
  absl::StatusOr<int64_t> Store(const QuantizedWeight& weight,
                                absl::string_view name) {
    absl::StatusOr<WeightStore::Reservation> reservation = store_->Reserve(
        name,
        PackedResidentBytes(weight.spec, !weight.activation_order.empty()));
    if (!reservation.ok()) return reservation.status();
    absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(weight);
    if (!packed.ok()) return packed.status();
    const int64_t bytes = packed->resident_bytes();
    if (absl::Status status = store_->Insert(
            std::string(name), *std::move(packed), *std::move(reservation));
        !status.ok()) {
      return status;
    }
    stored_.emplace(std::string(name), weight);
    return bytes;
  }

  // Puts panels in `store` as NibbleServiceImpl::StorePacked does.
  absl::StatusOr<int64_t> StorePacked(PackedWeight packed,
                                      absl::string_view name) {
    absl::StatusOr<WeightStore::Reservation> reservation = store_->Reserve(
        name,
        PackedResidentBytes(packed.spec(), !packed.activation_order().empty()));
    if (!reservation.ok()) return reservation.status();
    packed_names_.emplace_back(name);
    const int64_t bytes = packed.resident_bytes();
    if (absl::Status status = store_->Insert(
            std::string(name), std::move(packed), *std::move(reservation));
        !status.ok()) {
      return status;
    }
    return bytes;
  }

  // What LoadCheckpoints takes; it calls Store.
  auto Function() {
    return [this](const QuantizedWeight& weight, absl::string_view name) {
      return Store(weight, name);
    };
  }

  const std::map<std::string, QuantizedWeight>& stored() const {
    return stored_;
  }
  // The names StorePacked stored, in order.
  const std::vector<std::string>& packed_names() const { return packed_names_; }

 private:
  WeightStore* store_;
  std::map<std::string, QuantizedWeight> stored_;
  std::vector<std::string> packed_names_;
};

// Two files: a GPTQ layer (zero points 8, so u4b8) and a norm in one, an
// fp16 layer in the other.
class CheckpointLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<Tensor> first = GptqTensors(
        "model.layers.0.q_proj", gptq_, checkpoint::GptqZeroConvention::kV1);
    first.push_back({"model.layers.0.norm.weight",
                     SafetensorsDtype::kF16,
                     {kK},
                     std::string(2 * kK, '\x3c')});
    first_ = WriteCheckpoint("first.safetensors", first);
    second_ = WriteCheckpoint(
        "second.safetensors",
        {FloatWeightTensor("model.layers.1.up_proj", SafetensorsDtype::kF16,
                           kFloatN, kK, floats_)});
  }

  static constexpr int64_t kFloatN = 48;
  const ProducerWeight gptq_ = RandomProducerWeight(kSeed, kK, 64, 64, 8, 8);
  const std::vector<float> floats_ = RandomFloats(kFloatN * kK, kSeed + 1);
  std::string first_;
  std::string second_;
};

TEST_F(CheckpointLoaderTest, StoresEveryLayerOfEveryFileAsTheCheckpointHasIt) {
  absl::StatusOr<std::vector<PlannedCheckpoint>> checkpoints =
      PlanCheckpoints({first_, second_}, Options(), {});
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  WeightStore store;
  StoreRecorder recorder(&store);
  absl::StatusOr<CheckpointLoadReport> report =
      LoadCheckpoints(*checkpoints, {.canonical = recorder.Function()});
  ASSERT_TRUE(report.ok()) << report.status();

  std::vector<std::string> names;
  for (const auto& weight : store.List()) names.push_back(weight->name);
  EXPECT_THAT(names, ElementsAre("L0.q_proj", "L1.up_proj"));
  EXPECT_EQ(report->layers, 2);
  EXPECT_EQ(report->resident_bytes, store.resident_bytes());
  EXPECT_GT(report->file_bytes, 0);

  const QuantizedWeight& q = recorder.stored().at("L0.q_proj");
  EXPECT_EQ(q.spec, (WeightSpec{WeightFormat::kU4b8, kK, 64, 64}));
  const std::vector<double> q_values = ReferenceDequantize(q);
  for (int64_t row = 0; row < kK; ++row) {
    for (int64_t col = 0; col < gptq_.n; ++col) {
      ASSERT_EQ(q_values[row * gptq_.n + col], gptq_.Dequantized(row, col))
          << "row " << row << " col " << col;
    }
  }
  // The float layer as `nibble import` quantizes it, by the default
  // --import_quantize.
  absl::StatusOr<checkpoint::SafetensorsFile> second =
      checkpoint::SafetensorsFile::Open(second_);
  ASSERT_TRUE(second.ok()) << second.status();
  absl::StatusOr<QuantizedWeight> want = checkpoint::QuantizeFloatWeight(
      *second, "model.layers.1.up_proj", WeightFormat::kU4b8, 128);
  ASSERT_TRUE(want.ok()) << want.status();
  const QuantizedWeight& up = recorder.stored().at("L1.up_proj");
  EXPECT_EQ(up.spec, want->spec);
  EXPECT_EQ(ReferenceDequantize(up), ReferenceDequantize(*want));
}

TEST_F(CheckpointLoaderTest, PacksFromTheFileWhenTheStoreTakesPanels) {
  const std::string nvfp4_path = WriteCheckpoint(
      "nvfp4.safetensors",
      checkpoint::testing::Nvfp4Tensors(
          "model.layers.2.o_proj",
          checkpoint::testing::RandomFp4ProducerWeight(kSeed + 2, 32, kK, 16)));
  absl::StatusOr<std::vector<PlannedCheckpoint>> checkpoints =
      PlanCheckpoints({first_, nvfp4_path}, Options(), {});
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  WeightStore store;
  StoreRecorder recorder(&store);
  const auto store_packed = [&](PackedWeight packed, absl::string_view name) {
    return recorder.StorePacked(std::move(packed), name);
  };
  absl::StatusOr<CheckpointLoadReport> report = LoadCheckpoints(
      *checkpoints, {.canonical = recorder.Function(), .packed = store_packed});
  ASSERT_TRUE(report.ok()) << report.status();

  // Both the GPTQ and the NVFP4 layer.
  EXPECT_THAT(recorder.packed_names(), ElementsAre("L0.q_proj", "L2.o_proj"));
  EXPECT_TRUE(recorder.stored().empty());
  EXPECT_EQ(report->layers, 2);
  EXPECT_EQ(report->resident_bytes, store.resident_bytes());
  absl::StatusOr<checkpoint::SafetensorsFile> nvfp4 =
      checkpoint::SafetensorsFile::Open(nvfp4_path);
  ASSERT_TRUE(nvfp4.ok()) << nvfp4.status();
  absl::StatusOr<checkpoint::SafetensorsFile> first =
      checkpoint::SafetensorsFile::Open(first_);
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<checkpoint::GptqWeight> gptq =
      checkpoint::ConvertGptqWeight(*first, "model.layers.0.q_proj");
  ASSERT_TRUE(gptq.ok()) << gptq.status();
  const std::pair<std::string, absl::StatusOr<QuantizedWeight>> canonical[] = {
      {"L0.q_proj", gptq->weight},
      {"L2.o_proj",
       checkpoint::ConvertNvfp4Weight(*nvfp4, "model.layers.2.o_proj")}};
  for (const auto& [name, weight] : canonical) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(weight.ok()) << weight.status();
    absl::StatusOr<PackedWeight> want = PackedWeight::Pack(*weight);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<std::shared_ptr<const ResidentWeight>> got = store.Get(name);
    ASSERT_TRUE(got.ok()) << got.status();
    EXPECT_TRUE(nibble::testing::SamePanels((*got)->packed, *want));
  }
}

TEST_F(CheckpointLoaderTest, HandsNvfp4ColumnsOverWhenTheStoreTakesThem) {
  const std::string nvfp4_path = WriteCheckpoint(
      "nvfp4_columns.safetensors",
      checkpoint::testing::Nvfp4Tensors(
          "model.layers.2.o_proj",
          checkpoint::testing::RandomFp4ProducerWeight(kSeed + 3, 32, kK, 16)));
  absl::StatusOr<std::vector<PlannedCheckpoint>> checkpoints =
      PlanCheckpoints({first_, nvfp4_path}, Options(), {});
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  WeightStore store;
  StoreRecorder recorder(&store);
  std::vector<std::string> column_names;
  // As a GPU server's StoreColumns would, here through the canonical weight.
  const auto store_columns = [&](const Fp4Columns& columns,
                                 absl::string_view name) {
    column_names.emplace_back(name);
    return recorder.Store(CanonicalFromColumns(columns), name);
  };
  absl::StatusOr<CheckpointLoadReport> report = LoadCheckpoints(
      *checkpoints,
      {.canonical = recorder.Function(), .columns = store_columns});
  ASSERT_TRUE(report.ok()) << report.status();

  EXPECT_THAT(column_names, ElementsAre("L2.o_proj"));
  EXPECT_TRUE(recorder.stored().contains("L0.q_proj"));
  EXPECT_EQ(report->layers, 2);
  EXPECT_EQ(report->resident_bytes, store.resident_bytes());
  absl::StatusOr<checkpoint::SafetensorsFile> nvfp4 =
      checkpoint::SafetensorsFile::Open(nvfp4_path);
  ASSERT_TRUE(nvfp4.ok()) << nvfp4.status();
  absl::StatusOr<QuantizedWeight> want =
      checkpoint::ConvertNvfp4Weight(*nvfp4, "model.layers.2.o_proj");
  ASSERT_TRUE(want.ok()) << want.status();
  const QuantizedWeight& got = recorder.stored().at("L2.o_proj");
  EXPECT_EQ(got.spec, want->spec);
  EXPECT_EQ(got.qweight, want->qweight);
  EXPECT_EQ(got.scales, want->scales);
}

TEST_F(CheckpointLoaderTest, AFloatLayerWithNaNFailsTheImportAsItIsQuantized) {
  std::vector<float> values = floats_;
  values[5 * kK + 17] = std::numeric_limits<float>::quiet_NaN();
  const std::string nan_path = WriteCheckpoint(
      "nan.safetensors",
      {FloatWeightTensor("model.layers.3.up_proj", SafetensorsDtype::kF16,
                         kFloatN, kK, values)});
  // Planned without reading the elements, which the conversion reads.
  absl::StatusOr<std::vector<PlannedCheckpoint>> checkpoints =
      PlanCheckpoints({first_, nan_path}, Options(), {});
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  WeightStore store;
  StoreRecorder recorder(&store);
  absl::StatusOr<CheckpointLoadReport> report =
      LoadCheckpoints(*checkpoints, {.canonical = recorder.Function()});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(report.status().message(),
              AllOf(HasSubstr(absl::StrCat("--import ", nan_path)),
                    HasSubstr("model.layers.3.up_proj.weight"),
                    HasSubstr("--import_quantize"),
                    HasSubstr("1 layers stored before it")));
}

TEST_F(CheckpointLoaderTest, ListedLayersComeFromTheFileThatHasThem) {
  absl::StatusOr<std::vector<PlannedCheckpoint>> checkpoints = PlanCheckpoints(
      {first_, second_}, Options({"model.layers.1.up_proj"}), {});
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_EQ(checkpoints->size(), 1);
  EXPECT_EQ((*checkpoints)[0].file.source_name(), second_);
  ASSERT_EQ((*checkpoints)[0].plan.layers.size(), 1);
  EXPECT_EQ((*checkpoints)[0].plan.layers[0].name, "L1.up_proj");

  absl::StatusOr<std::vector<PlannedCheckpoint>> missing = PlanCheckpoints(
      {first_, second_}, Options({"model.layers.0.k_proj"}), {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("--import_layer model.layers.0.k_proj"),
                    HasSubstr(first_), HasSubstr(second_)));
}

TEST_F(CheckpointLoaderTest, AWeightNameTwoFilesShareIsRefused) {
  absl::StatusOr<std::vector<PlannedCheckpoint>> checkpoints =
      PlanCheckpoints({first_, second_, first_}, Options(), {});
  EXPECT_EQ(checkpoints.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(checkpoints.status().message(),
              AllOf(HasSubstr("layer model.layers.0.q_proj of " + first_),
                    HasSubstr("would both be weight \"L0.q_proj\""),
                    HasSubstr("--import_name_map")));
}

TEST_F(CheckpointLoaderTest, AMissingOrForeignFileIsNamed) {
  const std::string absent = TestPath("absent");
  absl::StatusOr<std::vector<PlannedCheckpoint>> missing =
      PlanCheckpoints({first_, absent}, Options(), {});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              AllOf(HasSubstr("--import: "), HasSubstr(absent)));

  const std::string text = TestPath("notes.txt");
  std::ofstream(text) << "these are not tensors, just a few words of text";
  absl::StatusOr<std::vector<PlannedCheckpoint>> foreign =
      PlanCheckpoints({text}, Options(), {});
  EXPECT_FALSE(foreign.ok());
  EXPECT_THAT(foreign.status().message(),
              AllOf(HasSubstr("--import: "), HasSubstr(text)));
}

TEST_F(CheckpointLoaderTest, LayersPastTheLimitsAreRefusedBeforeStoring) {
  absl::StatusOr<std::vector<PlannedCheckpoint>> fits =
      PlanCheckpoints({first_, second_}, Options(), {});
  ASSERT_TRUE(fits.ok()) << fits.status();
  int64_t bytes = 0;
  for (const PlannedCheckpoint& checkpoint : *fits) {
    for (const ImportLayer& layer : checkpoint.plan.layers) {
      bytes += PackedResidentBytes(layer.spec, layer.has_activation_order);
    }
  }
  EXPECT_TRUE(PlanCheckpoints({first_, second_}, Options(),
                              {.max_resident_bytes = bytes})
                  .ok());
  absl::StatusOr<std::vector<PlannedCheckpoint>> over_bytes = PlanCheckpoints(
      {first_, second_}, Options(), {.max_resident_bytes = bytes - 1});
  EXPECT_EQ(over_bytes.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over_bytes.status().message(),
              AllOf(HasSubstr(absl::StrCat("need ", bytes, " bytes")),
                    HasSubstr("--max_weight_bytes")));
  absl::StatusOr<std::vector<PlannedCheckpoint>> over_count =
      PlanCheckpoints({first_, second_}, Options(), {.max_weights = 1});
  EXPECT_EQ(over_count.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over_count.status().message(), HasSubstr("--max_weights"));
}

TEST_F(CheckpointLoaderTest, AStoreFailureStopsTheImportNamingTheLayer) {
  absl::StatusOr<std::vector<PlannedCheckpoint>> checkpoints =
      PlanCheckpoints({first_, second_}, Options(), {});
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  // Room for the first layer only, as a store that --data_dir filled would
  // leave.
  WeightStore store({.max_weights = 1});
  StoreRecorder recorder(&store);
  absl::StatusOr<CheckpointLoadReport> report =
      LoadCheckpoints(*checkpoints, {.canonical = recorder.Function()});
  EXPECT_EQ(report.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(report.status().message(),
              AllOf(HasSubstr(absl::StrCat("--import ", second_)),
                    HasSubstr("layer \"model.layers.1.up_proj\" as weight "
                              "\"L1.up_proj\" (1 of 1) was not stored"),
                    HasSubstr("--max_weights"),
                    HasSubstr("1 layers stored before it")));
  EXPECT_EQ(recorder.stored().size(), 1);
}

TEST(ImportOptionsFromFlagsTest, BadValuesNameTheirFlag) {
  absl::StatusOr<ImportOptions> options =
      ImportOptionsFromFlags({"a.b"}, {"x=y"}, "u4:32", "v2");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_THAT(options->layers, ElementsAre("a.b"));
  EXPECT_EQ(options->name_map, (std::vector<NameMapRule>{{"x", "y"}}));
  EXPECT_EQ(options->quantize,
            (QuantizeSpec{.format = WeightFormat::kU4, .group_size = 32}));
  EXPECT_EQ(options->gptq_zeros, checkpoint::GptqZeroConvention::kV2);
  EXPECT_FALSE(options->check_float_values);

  absl::StatusOr<ImportOptions> bad_quantize =
      ImportOptionsFromFlags({}, {}, "u4:96", "v1");
  EXPECT_EQ(bad_quantize.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_quantize.status().message(), HasSubstr("--import_quantize"));
  absl::StatusOr<ImportOptions> bad_map =
      ImportOptionsFromFlags({}, {"=L"}, "u4b8:128", "v1");
  EXPECT_EQ(bad_map.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_map.status().message(), HasSubstr("--import_name_map"));
  absl::StatusOr<ImportOptions> bad_zeros =
      ImportOptionsFromFlags({}, {}, "u4b8:128", "gptq_v2");
  EXPECT_EQ(bad_zeros.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad_zeros.status().message(),
              AllOf(HasSubstr("--import_gptq_zeros \"gptq_v2\""),
                    HasSubstr("v2 (GPTQModel's \"gptq_v2\"")));
}

}  // namespace
}  // namespace nibble::server
