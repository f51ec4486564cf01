#include "checkpoint/import.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/thread_pool.h"
#include "checkpoint/awq.h"
#include "checkpoint/float_quantizer.h"
#include "checkpoint/fp4_blocks.h"
#include "checkpoint/gptq.h"
#include "checkpoint/safetensors.h"
#include "format/activation_order.h"
#include "format/dtype.h"
#include "format/fp4_columns.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "format/weight_name.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/gemm_kernel.h"
#include "kernels/packed_weight.h"
#include "tests/checkpoint/converter_test_util.h"
#include "tests/checkpoint/producer_layers.h"
#include "tests/kernels/same_panels.h"

namespace nibble {
namespace {

using ::nibble::checkpoint::CheckpointLayout;
using ::nibble::checkpoint::GptqZeroConvention;
using ::nibble::checkpoint::SafetensorsDtype;
using ::nibble::checkpoint::SafetensorsFile;
using ::nibble::checkpoint::testing::AwqTensors;
using ::nibble::checkpoint::testing::Bytes;
using ::nibble::checkpoint::testing::ExpectDequantizesTo;
using ::nibble::checkpoint::testing::FindUnderscored;
using ::nibble::checkpoint::testing::FloatFile;
using ::nibble::checkpoint::testing::FloatWeightTensor;
using ::nibble::checkpoint::testing::Fp4ProducerWeight;
using ::nibble::checkpoint::testing::GIdxTensor;
using ::nibble::checkpoint::testing::GptqTensors;
using ::nibble::checkpoint::testing::kPrefix;
using ::nibble::checkpoint::testing::MakeFile;
using ::nibble::checkpoint::testing::Mxfp4Tensors;
using ::nibble::checkpoint::testing::Nvfp4Tensors;
using ::nibble::checkpoint::testing::ProducerWeight;
using ::nibble::checkpoint::testing::RandomFp4ProducerWeight;
using ::nibble::checkpoint::testing::RandomProducerWeight;
using ::nibble::checkpoint::testing::Tensor;
using ::nibble::checkpoint::testing::ValidMxfp4;
using ::nibble::checkpoint::testing::ValidNvfp4;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr int64_t kK = 128;
constexpr int64_t kN = 16;

// Normal values with a scale that varies by row, so no group is all zeros.
std::vector<float> RandomFloats(uint64_t seed, int64_t count) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> values(count);
  for (float& value : values) value = normal(rng);
  return values;
}

void Append(std::vector<Tensor>& tensors, std::vector<Tensor> more) {
  for (Tensor& tensor : more) tensors.push_back(std::move(tensor));
}

// A small model: a symmetric GPTQ layer, an asymmetric GPTQ layer, an AWQ
// layer, float layers of each float dtype, and tensors that are no layer.
std::vector<Tensor> ModelTensors(uint64_t seed) {
  std::vector<Tensor> tensors;
  Append(tensors, GptqTensors("model.layers.0.self_attn.q_proj",
                              RandomProducerWeight(seed, kK, kN, 32, 8, 8),
                              GptqZeroConvention::kV1));
  Append(tensors, GptqTensors("model.layers.0.self_attn.k_proj",
                              RandomProducerWeight(seed + 1, kK, kN, 64, 1, 15),
                              GptqZeroConvention::kV1));
  Append(tensors,
         AwqTensors("model.layers.0.mlp.up_proj",
                    RandomProducerWeight(seed + 2, kK, kN, 32, 0, 15)));
  tensors.push_back(FloatWeightTensor("model.layers.0.mlp.down_proj",
                                      SafetensorsDtype::kF16, kN, kK,
                                      RandomFloats(seed + 3, kN * kK)));
  tensors.push_back(FloatWeightTensor("model.layers.0.mlp.gate_proj",
                                      SafetensorsDtype::kBF16, kN, kK,
                                      RandomFloats(seed + 4, kN * kK)));
  tensors.push_back(FloatWeightTensor("lm_head", SafetensorsDtype::kF32, kN, kK,
                                      RandomFloats(seed + 5, kN * kK)));
  // No layers: a norm, a bias, an integer matrix and a buffer.
  tensors.push_back({"model.norm.weight",
                     SafetensorsDtype::kF32,
                     {kK},
                     Bytes(RandomFloats(seed + 6, kK))});
  tensors.push_back({"model.layers.0.mlp.up_proj.bias",
                     SafetensorsDtype::kF32,
                     {kN},
                     Bytes(RandomFloats(seed + 7, kN))});
  tensors.push_back({"model.position_ids.weight",
                     SafetensorsDtype::kI32,
                     {1, 4},
                     Bytes(std::vector<int32_t>{0, 1, 2, 3})});
  tensors.push_back({"model.rotary_emb.inv_freq",
                     SafetensorsDtype::kF32,
                     {8},
                     Bytes(RandomFloats(seed + 8, 8))});
  return tensors;
}

std::vector<std::string> Prefixes(const ImportPlan& plan) {
  std::vector<std::string> prefixes;
  for (const ImportLayer& layer : plan.layers) prefixes.push_back(layer.prefix);
  return prefixes;
}

const ImportLayer& FindLayer(const ImportPlan& plan, absl::string_view prefix) {
  for (const ImportLayer& layer : plan.layers) {
    if (layer.prefix == prefix) return layer;
  }
  ADD_FAILURE() << "no layer " << prefix;
  return plan.layers.front();
}

TEST(ParseQuantizeSpecTest, ReadsFormatAndGroup) {
  EXPECT_EQ(ParseQuantizeSpec("u4b8:128").value(),
            (QuantizeSpec{WeightFormat::kU4b8, 128}));
  EXPECT_EQ(ParseQuantizeSpec("u4:32").value(),
            (QuantizeSpec{WeightFormat::kU4, 32}));
  EXPECT_EQ(ParseQuantizeSpec("fp4:64").value(),
            (QuantizeSpec{WeightFormat::kFp4, 64}));
  EXPECT_EQ(ParseQuantizeSpec("u4b8:k").value(),
            (QuantizeSpec{WeightFormat::kU4b8, 0}));
  EXPECT_EQ(ParseQuantizeSpec("fp4:K").value(),
            (QuantizeSpec{WeightFormat::kFp4, 0}));
  EXPECT_EQ(ParseQuantizeSpec("mxfp4:32").value(),
            (QuantizeSpec{WeightFormat::kMxfp4, 32}));
  EXPECT_EQ(ParseQuantizeSpec("nvfp4:16").value(),
            (QuantizeSpec{WeightFormat::kNvfp4, 16}));
  for (absl::string_view text :
       {"u4b8:128", "u4:32", "fp4:k", "mxfp4:32", "nvfp4:16"}) {
    EXPECT_EQ(QuantizeSpecName(ParseQuantizeSpec(text).value()), text);
  }
}

TEST(ParseQuantizeSpecTest, RefusesWhatIsNotFormatColonGroup) {
  for (absl::string_view text :
       {"u4b8", "u5:32", "u4:16", "u4:256", "u4:", ":32", "u4b8:per_channel",
        "u4:32:1", "U4B8:128"}) {
    SCOPED_TRACE(text);
    const absl::Status status = ParseQuantizeSpec(text).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(text), HasSubstr("FORMAT:GROUP"),
                      HasSubstr("e.g. u4b8:128")));
  }
}

TEST(ParseQuantizeSpecTest, Mxfp4AndNvfp4KeepTheirGroups) {
  for (const auto& [text, group] : {std::pair{"mxfp4:16", "32"},
                                    {"mxfp4:128", "32"},
                                    {"mxfp4:k", "32"},
                                    {"nvfp4:32", "16"},
                                    {"nvfp4:k", "16"}}) {
    SCOPED_TRACE(text);
    const absl::Status status = ParseQuantizeSpec(text).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(text),
                      HasSubstr(absl::StrCat("GROUP must be ", group))));
  }
}

TEST(ParseGptqZerosTest, ReadsV1AndV2AndExplainsBoth) {
  EXPECT_EQ(*ParseGptqZeros("v1"), GptqZeroConvention::kV1);
  EXPECT_EQ(*ParseGptqZeros("v2"), GptqZeroConvention::kV2);
  for (const char* text : {"", "V2", "gptq_v2", "2"}) {
    SCOPED_TRACE(text);
    const absl::Status status = ParseGptqZeros(text).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(absl::StrCat("\"", text, "\"")),
                      HasSubstr("zero point - 1"), HasSubstr("gptq_v2")));
  }
}

TEST(NameMapTest, ParsesRulesInOrder) {
  EXPECT_THAT(
      ParseNameMap({"model.layers.=L", "lm_head=head", "x.=", "a=b=c"}).value(),
      ElementsAre(NameMapRule{"model.layers.", "L"},
                  NameMapRule{"lm_head", "head"}, NameMapRule{"x.", ""},
                  NameMapRule{"a", "b=c"}));
  for (const std::string text : {"model.layers.", "=L"}) {
    SCOPED_TRACE(text);
    const absl::Status status = ParseNameMap({text}).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(), AllOf(HasSubstr(text), HasSubstr("FROM=TO")));
  }
}

TEST(NameMapTest, TheFirstMatchingRuleApplies) {
  const std::vector<NameMapRule> rules = {
      {"model.layers.0.", "first."}, {"model.layers.", "L"}, {"model.", "m."}};
  EXPECT_EQ(MapLayerName("model.layers.0.mlp.up_proj", rules),
            "first.mlp.up_proj");
  EXPECT_EQ(MapLayerName("model.layers.1.mlp.up_proj", rules),
            "L1.mlp.up_proj");
  EXPECT_EQ(MapLayerName("model.embed", rules), "m.embed");
  EXPECT_EQ(MapLayerName("lm_head", rules), "lm_head");
  EXPECT_EQ(MapLayerName("lm_head", {}), "lm_head");
}

TEST(PlanImportTest, DiscoversEveryLayerAndListsWhatItSkips) {
  constexpr uint64_t kSeed = 1;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const SafetensorsFile file = MakeFile(ModelTensors(kSeed));
  absl::StatusOr<ImportPlan> plan = PlanImport(file, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(
      Prefixes(*plan),
      ElementsAre("lm_head", "model.layers.0.mlp.down_proj",
                  "model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj",
                  "model.layers.0.self_attn.k_proj",
                  "model.layers.0.self_attn.q_proj"));
  EXPECT_THAT(plan->skipped,
              ElementsAre("model.layers.0.mlp.up_proj.bias (F32 [16])",
                          "model.norm.weight (F32 [128])",
                          "model.position_ids.weight (I32 [1, 4])",
                          "model.rotary_emb.inv_freq (F32 [8])"));

  const ImportLayer& q = FindLayer(*plan, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(q.layout, CheckpointLayout::kGptq);
  EXPECT_EQ(q.name, "model.layers.0.self_attn.q_proj");
  EXPECT_EQ(q.spec, (WeightSpec{WeightFormat::kU4b8, kK, kN, 32}));
  EXPECT_EQ(q.file_bytes, kK / 8 * kN * 4 + 4 * kN / 8 * 4 + 4 * kN * 2);
  const ImportLayer& k = FindLayer(*plan, "model.layers.0.self_attn.k_proj");
  EXPECT_EQ(k.spec, (WeightSpec{WeightFormat::kU4, kK, kN, 64}));
  const ImportLayer& up = FindLayer(*plan, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(up.layout, CheckpointLayout::kAwq);
  EXPECT_EQ(up.spec, (WeightSpec{WeightFormat::kU4, kK, kN, 32}));
  for (absl::string_view prefix : {"lm_head", "model.layers.0.mlp.down_proj",
                                   "model.layers.0.mlp.gate_proj"}) {
    const ImportLayer& layer = FindLayer(*plan, prefix);
    EXPECT_EQ(layer.layout, CheckpointLayout::kFloat) << prefix;
    EXPECT_EQ(layer.spec, (WeightSpec{WeightFormat::kU4b8, kK, kN, 128}))
        << prefix;
  }
}

TEST(PlanImportTest, LayersFlagSelectsInItsOrder) {
  constexpr uint64_t kSeed = 2;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const SafetensorsFile file = MakeFile(ModelTensors(kSeed));
  ImportOptions options;
  options.layers = {"model.layers.0.mlp.up_proj", "lm_head"};
  options.quantize = {WeightFormat::kFp4, 0};
  absl::StatusOr<ImportPlan> plan = PlanImport(file, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_THAT(Prefixes(*plan),
              ElementsAre("model.layers.0.mlp.up_proj", "lm_head"));
  EXPECT_TRUE(plan->skipped.empty());
  EXPECT_EQ(plan->quantize, options.quantize);
  EXPECT_EQ(plan->layers[1].spec, (WeightSpec{WeightFormat::kFp4, kK, kN, kK}));
}

TEST(PlanImportTest, UnknownLayerSuggestsTheNearestOnes) {
  constexpr uint64_t kSeed = 3;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const SafetensorsFile file = MakeFile(ModelTensors(kSeed));
  ImportOptions options;
  options.layers = {"lm_head", "model.layers.0.mlp.fc1"};
  const absl::Status status = PlanImport(file, options).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("no layer \"model.layers.0.mlp.fc1\""),
                    HasSubstr("test.safetensors"),
                    HasSubstr("model.layers.0.mlp.down_proj, "
                              "model.layers.0.mlp.gate_proj, "
                              "model.layers.0.mlp.up_proj"),
                    Not(HasSubstr("self_attn")), Not(HasSubstr(", lm_head"))));

  // A 1-D tensor is no layer even when asked for by name.
  options.layers = {"model.norm"};
  EXPECT_EQ(PlanImport(file, options).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(PlanImportTest, NameMapRenamesLayers) {
  constexpr uint64_t kSeed = 4;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const SafetensorsFile file = MakeFile(ModelTensors(kSeed));
  ImportOptions options;
  options.name_map = ParseNameMap({"model.layers.=L", "lm_head=head"}).value();
  absl::StatusOr<ImportPlan> plan = PlanImport(file, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(FindLayer(*plan, "model.layers.0.mlp.up_proj").name,
            "L0.mlp.up_proj");
  EXPECT_EQ(FindLayer(*plan, "lm_head").name, "head");
}

TEST(PlanImportTest, RefusesInvalidAndSharedNames) {
  constexpr uint64_t kSeed = 5;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const SafetensorsFile file = MakeFile(ModelTensors(kSeed));
  {
    ImportOptions options;
    options.name_map = {{"model.layers.0.", "layers/0/"}};
    const absl::Status status = PlanImport(file, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("layer \"model.layers.0.mlp.down_proj\""),
                      HasSubstr("layers/0/mlp.down_proj"),
                      HasSubstr(kWeightNameRule), HasSubstr("--name_map")));
  }
  {
    ImportOptions options;
    options.name_map = {{"model.layers.0.mlp.", "."}};
    EXPECT_THAT(PlanImport(file, options).status().message(),
                HasSubstr("not starting with '.'"));
  }
  {
    ImportOptions options;
    options.name_map = {{"model.layers.0.mlp.down_proj", "lm_head"}};
    const absl::Status status = PlanImport(file, options).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr("\"lm_head\" and "
                                "\"model.layers.0.mlp.down_proj\""),
                      HasSubstr("both be uploaded as \"lm_head\"")));
  }
  {
    ImportOptions options;
    options.layers = {"lm_head", "lm_head"};
    EXPECT_THAT(PlanImport(file, options).status().message(),
                HasSubstr("\"lm_head\" is listed twice"));
  }
}

// A GPTQ layer as AutoGPTQ writes it with desc_act: its rows, in a random
// order, fill the groups one after the other.
ProducerWeight ActOrderProducerWeight(uint64_t seed) {
  ProducerWeight w = RandomProducerWeight(seed, kK, kN, 32, 1, 15);
  std::vector<int64_t> rows(kK);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), std::mt19937_64(seed));
  for (int64_t i = 0; i < kK; ++i) w.group_of_row[rows[i]] = i / 32;
  return w;
}

TEST(ImportActOrderTest, ImportedWeightMultipliesLikeTheCheckpoint) {
  constexpr uint64_t kSeed = 6;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  constexpr char kLayer[] = "model.layers.1.self_attn.o_proj";
  const ProducerWeight w = ActOrderProducerWeight(kSeed);
  std::vector<Tensor> tensors = ModelTensors(kSeed);
  Append(tensors, GptqTensors(kLayer, w, GptqZeroConvention::kV1));
  tensors.push_back(GIdxTensor(kLayer, w));
  const SafetensorsFile file = MakeFile(tensors);

  ImportOptions options;
  options.layers = {kLayer, "model.layers.0.self_attn.q_proj"};
  absl::StatusOr<ImportPlan> plan = PlanImport(file, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->layers.size(), 2u);
  EXPECT_TRUE(plan->layers[0].has_activation_order);
  EXPECT_FALSE(plan->layers[1].has_activation_order);

  std::vector<QuantizedWeight> uploads;
  std::ostringstream progress;
  const ImportReport report = ExecuteImport(
      file, *plan,
      [&](const QuantizedWeight& weight, absl::string_view) {
        uploads.push_back(weight);
        return absl::OkStatus();
      },
      progress);
  ASSERT_TRUE(report.status.ok()) << report.status;
  ASSERT_EQ(uploads.size(), 2u);
  EXPECT_TRUE(uploads[1].activation_order.empty());
  const QuantizedWeight& weight = uploads[0];
  ASSERT_TRUE(weight.Validate().ok()) << weight.Validate();
  ASSERT_EQ(weight.activation_order.size(), static_cast<size_t>(kK));
  EXPECT_THAT(progress.str(),
              HasSubstr("[1/2] model.layers.1.self_attn.o_proj → "
                        "model.layers.1.self_attn.o_proj (gptq → u4 "
                        "act-order, k=128 n=16 group=32,"));

  // What every CPU kernel computes from A gathered by the order, against
  // the checkpoint's own A · B in float64.
  constexpr int64_t kM = 5;
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> a(kM * kK);
  for (float& value : a) value = uniform(rng);
  std::vector<double> want(kM * kN, 0.0);
  for (int64_t i = 0; i < kM; ++i) {
    for (int64_t row = 0; row < kK; ++row) {
      for (int64_t col = 0; col < kN; ++col) {
        want[i * kN + col] += a[i * kK + row] * w.Dequantized(row, col);
      }
    }
  }
  absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(weight);
  ASSERT_TRUE(packed.ok()) << packed.status();
  std::vector<float> gathered(a.size());
  GatherActivationColumns(DType::kF32, kM, packed->activation_order(), a.data(),
                          gathered.data());
  ThreadPool pool(2);
  const GemmProblem problem = MakeGemmProblem(*packed, kM, DType::kF32, 2);
  int kernels_run = 0;
  for (const GemmKernel* kernel : cpu::CpuKernels()) {
    if (!kernel->Supports(problem) ||
        kernel->RoundsActivationsToBf16(DType::kF32)) {
      continue;
    }
    SCOPED_TRACE(kernel->name());
    std::vector<float> c(kM * kN);
    ASSERT_TRUE(
        kernel
            ->Run(problem,
                  GemmOperands{
                      .b = &*packed, .a = gathered.data(), .c = c.data()},
                  pool)
            .ok());
    EXPECT_LE(MaxRelativeError(std::vector<double>(c.begin(), c.end()), want),
              1e-4);
    ++kernels_run;
  }
  EXPECT_GT(kernels_run, 0);
  // Without the gather the product is wrong: the order matters.
  std::vector<float> c(kM * kN);
  const GemmKernel* reference = cpu::CpuKernels().back();
  ASSERT_TRUE(
      reference
          ->Run(problem,
                GemmOperands{.b = &*packed, .a = a.data(), .c = c.data()}, pool)
          .ok());
  EXPECT_GT(MaxRelativeError(std::vector<double>(c.begin(), c.end()), want),
            0.01);
}

TEST(PlanImportTest, RefusesAFloatLayerThatTheGroupDoesNotFit) {
  constexpr uint64_t kSeed = 7;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  std::vector<Tensor> tensors = ModelTensors(kSeed);
  tensors.push_back(FloatWeightTensor("model.odd", SafetensorsDtype::kF32, kN,
                                      96, RandomFloats(kSeed, kN * 96)));
  const SafetensorsFile file = MakeFile(tensors);
  const absl::Status status = PlanImport(file, {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("model.odd.weight"), HasSubstr("u4b8:128"),
                    HasSubstr("--quantize")));

  ImportOptions options;
  options.quantize = {WeightFormat::kU4, 32};
  EXPECT_TRUE(PlanImport(file, options).ok());
}

TEST(PlanImportTest, WithoutCheckingFloatValuesTheLayerFailsAsItQuantizes) {
  constexpr uint64_t kSeed = 14;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  std::vector<Tensor> tensors = ModelTensors(kSeed);
  std::vector<float> values = RandomFloats(kSeed, kN * kK);
  values[3 * kK + 70] = std::numeric_limits<float>::quiet_NaN();
  tensors.push_back(
      FloatWeightTensor("model.nan", SafetensorsDtype::kF32, kN, kK, values));
  const SafetensorsFile file = MakeFile(tensors);
  ImportOptions checked;
  checked.layers = {"model.layers.0.mlp.gate_proj", "model.nan"};
  const absl::Status refused = PlanImport(file, checked).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("model.nan.weight"));

  ImportOptions unchecked = checked;
  unchecked.check_float_values = false;
  absl::StatusOr<ImportPlan> plan = PlanImport(file, unchecked);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->layers.size(), 2u);
  EXPECT_EQ(plan->layers[1].spec,
            (WeightSpec{WeightFormat::kU4b8, kK, kN, 128}));

  std::vector<std::string> uploaded;
  std::ostringstream progress;
  const ImportReport report = ExecuteImport(
      file, *plan,
      [&](const QuantizedWeight& weight, absl::string_view name) {
        EXPECT_TRUE(weight.Validate().ok()) << name;
        uploaded.emplace_back(name);
        return absl::OkStatus();
      },
      progress);
  EXPECT_THAT(uploaded, ElementsAre("model.layers.0.mlp.gate_proj"));
  EXPECT_EQ(report.failed_layer, 1);
  EXPECT_EQ(report.status, refused);
}

TEST(PlanImportTest, FileWithoutLayers) {
  const SafetensorsFile file = MakeFile({{"norm.weight",
                                          SafetensorsDtype::kF32,
                                          {4},
                                          Bytes(RandomFloats(8, 4))}});
  const absl::Status status = PlanImport(file, {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("has no layers to import"));
}

// Four layers of ModelTensors, the third of them lm_head, which the
// ExecuteImport tests' uploads refuse.
ImportOptions FourLayersWithLmHead() {
  ImportOptions options;
  options.layers = {"model.layers.0.self_attn.q_proj",
                    "model.layers.0.mlp.up_proj", "lm_head",
                    "model.layers.0.mlp.down_proj"};
  options.name_map = {{"model.layers.0.", "L0."}};
  return options;
}

TEST(ExecuteImportTest, UploadsLayerByLayerAndStopsAtTheFirstFailure) {
  constexpr uint64_t kSeed = 8;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const SafetensorsFile file = MakeFile(ModelTensors(kSeed));
  absl::StatusOr<ImportPlan> plan = PlanImport(file, FourLayersWithLmHead());
  ASSERT_TRUE(plan.ok()) << plan.status();

  std::vector<std::pair<std::string, QuantizedWeight>> uploads;
  std::ostringstream progress;
  const ImportReport report = ExecuteImport(
      file, *plan,
      [&](const QuantizedWeight& weight, absl::string_view name) {
        if (name == "lm_head") {
          return absl::AlreadyExistsError("a weight named \"lm_head\" exists");
        }
        uploads.emplace_back(name, weight);
        return absl::OkStatus();
      },
      progress);

  EXPECT_EQ(report.status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(report.failed_layer, 2);
  EXPECT_EQ(report.not_tried, 1);
  EXPECT_THAT(report.uploaded,
              ElementsAre("L0.self_attn.q_proj", "L0.mlp.up_proj"));
  ASSERT_EQ(uploads.size(), 2u);
  EXPECT_EQ(uploads[0].second.spec, plan->layers[0].spec);
  EXPECT_EQ(
      uploads[0].second.qweight,
      checkpoint::ConvertGptqWeight(file, "model.layers.0.self_attn.q_proj")
          ->weight.qweight);
  EXPECT_EQ(
      uploads[1].second.zeros,
      checkpoint::ConvertAwqWeight(file, "model.layers.0.mlp.up_proj")->zeros);
  EXPECT_EQ(report.uploaded_bytes, plan->layers[0].spec.canonical_bytes() +
                                       plan->layers[1].spec.canonical_bytes());
  EXPECT_EQ(report.file_bytes,
            plan->layers[0].file_bytes + plan->layers[1].file_bytes);
  EXPECT_THAT(
      progress.str(),
      AllOf(HasSubstr("[1/4] model.layers.0.self_attn.q_proj → "
                      "L0.self_attn.q_proj (gptq → u4b8, k=128 n=16 group=32, "
                      "0.0 MB) "),
            HasSubstr("[2/4] model.layers.0.mlp.up_proj → L0.mlp.up_proj "
                      "(awq → u4, k=128 n=16 group=32, 0.0 MB) "),
            Not(HasSubstr("[3/4]"))));
}

TEST(ExecuteImportTest, UploadsTwoAtOnceAndReportsInPlanOrder) {
  constexpr uint64_t kSeed = 9;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const SafetensorsFile file = MakeFile(ModelTensors(kSeed));
  absl::StatusOr<ImportPlan> plan = PlanImport(file, FourLayersWithLmHead());
  ASSERT_TRUE(plan.ok()) << plan.status();

  // std::mutex rather than absl::Mutex: ThreadSanitizer sees it, and the
  // system's abseil is not built for ThreadSanitizer.
  std::mutex mutex;
  std::vector<std::string> uploads;
  absl::Notification second_started;
  bool overlapped = false;
  std::ostringstream progress;
  const ImportReport report = ExecuteImport(
      file, *plan,
      [&](const QuantizedWeight&, absl::string_view name) {
        if (name == "L0.mlp.up_proj") second_started.Notify();
        if (name == "L0.self_attn.q_proj") {
          // Two at once: the second upload starts before the first ends.
          overlapped =
              second_started.WaitForNotificationWithTimeout(absl::Seconds(30));
        }
        if (name == "lm_head") {
          return absl::AlreadyExistsError("a weight named \"lm_head\" exists");
        }
        std::lock_guard lock(mutex);
        uploads.emplace_back(name);
        return absl::OkStatus();
      },
      progress, /*uploads_at_once=*/2);

  EXPECT_TRUE(overlapped);
  EXPECT_EQ(report.status.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(report.failed_layer, 2);
  // The last layer was under way when lm_head failed, and was uploaded.
  EXPECT_THAT(
      report.uploaded,
      ElementsAre("L0.self_attn.q_proj", "L0.mlp.up_proj", "L0.mlp.down_proj"));
  EXPECT_EQ(report.not_tried, 0);
  EXPECT_THAT(uploads, ::testing::UnorderedElementsAreArray(report.uploaded));
  const std::string lines = progress.str();
  EXPECT_LT(lines.find("[1/4]"), lines.find("[2/4]"));
  EXPECT_LT(lines.find("[2/4]"), lines.find("[4/4]"));
  EXPECT_THAT(lines, Not(HasSubstr("[3/4]")));
}

TEST(ExecuteImportTest, QuantizesFloatLayersAsPlanned) {
  struct Case {
    uint64_t seed;
    std::string layer;
    QuantizeSpec quantize;
    int64_t group_size;
    std::string progress;
  };
  const Case cases[] = {
      {9,
       "model.layers.0.mlp.gate_proj",
       {WeightFormat::kU4, 0},
       kK,
       "(float → u4, k=128 n=16 group=128,"},
      {12,
       "lm_head",
       {WeightFormat::kNvfp4, 16},
       16,
       "(float → nvfp4, k=128 n=16 group=16,"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(absl::StrCat(c.layer, " as ", QuantizeSpecName(c.quantize),
                              " seed=", c.seed));
    const SafetensorsFile file = MakeFile(ModelTensors(c.seed));
    ImportOptions options;
    options.layers = {c.layer};
    options.quantize = c.quantize;
    absl::StatusOr<ImportPlan> plan = PlanImport(file, options);
    ASSERT_TRUE(plan.ok()) << plan.status();
    QuantizedWeight uploaded;
    std::ostringstream progress;
    const ImportReport report = ExecuteImport(
        file, *plan,
        [&](const QuantizedWeight& weight, absl::string_view) {
          uploaded = weight;
          return absl::OkStatus();
        },
        progress);
    ASSERT_TRUE(report.status.ok()) << report.status;
    EXPECT_EQ(report.failed_layer, -1);
    const QuantizedWeight want =
        checkpoint::QuantizeFloatWeight(file, c.layer, c.quantize.format,
                                        c.group_size)
            .value();
    EXPECT_EQ(plan->layers[0].spec, want.spec);
    // nvfp4's global scale is the layer's own, not the default.
    EXPECT_EQ(want.spec.global_scale == 1.0f,
              c.quantize.format != WeightFormat::kNvfp4);
    EXPECT_EQ(uploaded.spec, want.spec);
    EXPECT_EQ(uploaded.qweight, want.qweight);
    EXPECT_EQ(uploaded.scales, want.scales);
    EXPECT_EQ(uploaded.zeros, want.zeros);
    EXPECT_THAT(progress.str(), HasSubstr(c.progress));
  }
}

// A file with MXFP4 experts (Hugging Face's names), a single MXFP4 weight
// (gpt-oss' original names) and an NVFP4 layer, besides ModelTensors.
struct Fp4Model {
  static constexpr absl::string_view kExperts =
      "model.layers.1.mlp.experts.gate_up_proj";
  static constexpr absl::string_view kOriginal = "block.0.mlp.mlp1_weight";
  static constexpr absl::string_view kNvfp4 = "model.layers.1.self_attn.q_proj";

  explicit Fp4Model(uint64_t seed) {
    for (uint64_t e = 0; e < 3; ++e) {
      experts.push_back(RandomFp4ProducerWeight(seed + e, kN, 64, 32));
    }
    original = RandomFp4ProducerWeight(seed + 3, 8, kK, 32);
    nvfp4 = RandomFp4ProducerWeight(seed + 4, kN, kK, 16);
    tensors = ModelTensors(seed);
    Append(tensors, Mxfp4Tensors(kExperts, experts));
    Append(tensors, Mxfp4Tensors(kOriginal, {original}, ".", false));
    Append(tensors, Nvfp4Tensors(kNvfp4, nvfp4));
  }

  std::vector<Fp4ProducerWeight> experts;
  Fp4ProducerWeight original;
  Fp4ProducerWeight nvfp4;
  std::vector<Tensor> tensors;
};

TEST(PlanImportTest, ImportsMxfp4ExpertsAndNvfp4LayersExactly) {
  constexpr uint64_t kSeed = 10;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const Fp4Model model(kSeed);
  const SafetensorsFile file = MakeFile(model.tensors);
  ImportOptions options;
  options.name_map = {{"model.layers.1.", "L1."}};
  absl::StatusOr<ImportPlan> plan = PlanImport(file, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The scale tensors and input_scale belong to their layers.
  EXPECT_THAT(plan->skipped,
              ElementsAre("model.layers.0.mlp.up_proj.bias (F32 [16])",
                          "model.norm.weight (F32 [128])",
                          "model.position_ids.weight (I32 [1, 4])",
                          "model.rotary_emb.inv_freq (F32 [8])"));
  std::vector<std::string> names;
  for (const ImportLayer& layer : plan->layers) names.push_back(layer.name);
  EXPECT_THAT(names, ::testing::IsSupersetOf(
                         {"block.0.mlp.mlp1_weight", "L1.self_attn.q_proj",
                          "L1.mlp.experts.gate_up_proj.0",
                          "L1.mlp.experts.gate_up_proj.1",
                          "L1.mlp.experts.gate_up_proj.2"}));
  EXPECT_EQ(plan->layers.size(), 6u + 5u);
  const ImportLayer& nvfp4 = FindLayer(*plan, Fp4Model::kNvfp4);
  EXPECT_EQ(nvfp4.layout, CheckpointLayout::kNvfp4);
  EXPECT_EQ(nvfp4.spec, (WeightSpec{WeightFormat::kNvfp4, kK, kN, 16,
                                    model.nvfp4.global_scale}));
  EXPECT_EQ(nvfp4.file_bytes, kN * kK / 2 + kN * kK / 16 + 4 + 4);
  const ImportLayer& original = FindLayer(*plan, Fp4Model::kOriginal);
  EXPECT_EQ(original.layout, CheckpointLayout::kMxfp4);
  EXPECT_EQ(original.expert, -1);
  EXPECT_EQ(original.spec, (WeightSpec{WeightFormat::kMxfp4, kK, 8, 32}));

  std::map<std::string, QuantizedWeight> uploads;
  std::ostringstream progress;
  const ImportReport report = ExecuteImport(
      file, *plan,
      [&](const QuantizedWeight& weight, absl::string_view name) {
        uploads.emplace(name, weight);
        return absl::OkStatus();
      },
      progress);
  ASSERT_TRUE(report.status.ok()) << report.status;
  ASSERT_EQ(uploads.size(), plan->layers.size());
  for (int e = 0; e < 3; ++e) {
    SCOPED_TRACE(absl::StrCat("expert ", e));
    const QuantizedWeight& got =
        uploads.at(absl::StrCat("L1.mlp.experts.gate_up_proj.", e));
    EXPECT_EQ(got.spec, (WeightSpec{WeightFormat::kMxfp4, 64, kN, 32}));
    ExpectDequantizesTo(got, model.experts[e]);
  }
  ExpectDequantizesTo(uploads.at("block.0.mlp.mlp1_weight"), model.original);
  ExpectDequantizesTo(uploads.at("L1.self_attn.q_proj"), model.nvfp4);
  EXPECT_THAT(progress.str(),
              AllOf(HasSubstr("model.layers.1.mlp.experts.gate_up_proj[2] → "
                              "L1.mlp.experts.gate_up_proj.2 (mxfp4 → mxfp4, "
                              "k=64 n=16 group=32,"),
                    HasSubstr("model.layers.1.self_attn.q_proj → "
                              "L1.self_attn.q_proj (nvfp4 → nvfp4, k=128 n=16 "
                              "group=16,")));
}

// The canonical weight that `weight`'s bytes hold, in either layout.
QuantizedWeight CanonicalOf(const WeightBytes& weight) {
  const auto* qweight = reinterpret_cast<const uint8_t*>(weight.qweight.data());
  const auto* scales = reinterpret_cast<const uint8_t*>(weight.scales.data());
  if (weight.layout == CodeLayout::kColumns) {
    return CanonicalFromColumns({weight.spec, qweight, scales});
  }
  QuantizedWeight canonical;
  canonical.spec = weight.spec;
  canonical.qweight.resize(weight.qweight.size() / sizeof(uint32_t));
  std::memcpy(canonical.qweight.data(), qweight, weight.qweight.size());
  canonical.scales.resize(weight.scales.size() / sizeof(uint16_t));
  std::memcpy(canonical.scales.data(), scales, weight.scales.size());
  canonical.zeros.assign(weight.zeros.begin(), weight.zeros.end());
  return canonical;
}

bool IsFp4Layer(const ImportLayer& layer) {
  return layer.layout == CheckpointLayout::kMxfp4 ||
         layer.layout == CheckpointLayout::kNvfp4;
}

// Checks that ExecuteImport handed the plan's layers for which `apart` holds
// (`apart_count` of them) to the function that `handed_apart` records, each
// other layer to the one that `canonical` records, and all of them in plan
// order (`order`).
template <typename Weights>
void ExpectLayersHandedApart(
    const ImportPlan& plan, bool (*apart)(const ImportLayer&),
    size_t apart_count, const Weights& handed_apart,
    const std::map<std::string, QuantizedWeight>& canonical,
    const std::vector<std::string>& order) {
  std::vector<std::string> planned;
  for (const ImportLayer& layer : plan.layers) {
    planned.push_back(layer.name);
    EXPECT_EQ(handed_apart.contains(layer.name), apart(layer)) << layer.name;
    EXPECT_EQ(canonical.contains(layer.name), !apart(layer)) << layer.name;
  }
  EXPECT_EQ(order, planned);
  EXPECT_EQ(handed_apart.size(), apart_count);
}

// The canonical weight of an MXFP4 or NVFP4 layer of the plan.
absl::StatusOr<QuantizedWeight> ConvertFp4Layer(const SafetensorsFile& file,
                                                const ImportLayer& layer) {
  return layer.layout == CheckpointLayout::kMxfp4
             ? checkpoint::ConvertMxfp4Weight(
                   file, layer.prefix, std::max<int64_t>(layer.expert, 0))
             : checkpoint::ConvertNvfp4Weight(file, layer.prefix);
}

// The layers ExecuteImport packs from the file's codes for `upload_packed`.
bool IsPackedFromFile(const ImportLayer& layer) {
  return IsFp4Layer(layer) || layer.layout == CheckpointLayout::kAwq ||
         (layer.layout == CheckpointLayout::kGptq &&
          !layer.has_activation_order);
}

TEST(ExecuteImportTest, HandsLayersPackedFromTheFileToUploadPacked) {
  constexpr uint64_t kSeed = 12;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const Fp4Model model(kSeed);
  // An act-order layer, whose rows regroup in its canonical weight.
  constexpr char kActOrder[] = "model.layers.1.self_attn.o_proj";
  const ProducerWeight act_order = ActOrderProducerWeight(kSeed);
  std::vector<Tensor> tensors = model.tensors;
  Append(tensors, GptqTensors(kActOrder, act_order, GptqZeroConvention::kV1));
  tensors.push_back(GIdxTensor(kActOrder, act_order));
  // K = 96: 12 rows of words, more than PackFromFile repacks at once and not
  // a multiple of it.
  Append(tensors,
         AwqTensors("model.layers.1.mlp.down_proj",
                    RandomProducerWeight(kSeed + 5, 96, 24, 32, 0, 15)));
  const SafetensorsFile file = MakeFile(tensors);
  absl::StatusOr<ImportPlan> plan = PlanImport(file, {});
  ASSERT_TRUE(plan.ok()) << plan.status();

  std::map<std::string, QuantizedWeight> canonical;
  std::map<std::string, PackedWeight> packed;
  std::vector<std::string> order;
  std::ostringstream progress;
  const ImportReport report = ExecuteImport(
      file, *plan,
      [&](const QuantizedWeight& weight, absl::string_view name) {
        canonical.emplace(name, weight);
        order.emplace_back(name);
        return absl::OkStatus();
      },
      [&](PackedWeight weight, absl::string_view name) {
        packed.emplace(name, std::move(weight));
        order.emplace_back(name);
        return absl::OkStatus();
      },
      progress);
  ASSERT_TRUE(report.status.ok()) << report.status;

  // 5 FP4 layers, 2 GPTQ ones and 2 AWQ ones; the act-order and float
  // layers are canonical.
  ExpectLayersHandedApart(*plan, IsPackedFromFile, 9, packed, canonical, order);
  EXPECT_TRUE(canonical.contains(kActOrder));
  for (const ImportLayer& layer : plan->layers) {
    if (!IsPackedFromFile(layer)) continue;
    SCOPED_TRACE(layer.name);
    absl::StatusOr<QuantizedWeight> converted;
    if (IsFp4Layer(layer)) {
      converted = ConvertFp4Layer(file, layer);
    } else if (layer.layout == CheckpointLayout::kAwq) {
      converted = checkpoint::ConvertAwqWeight(file, layer.prefix);
    } else {
      absl::StatusOr<checkpoint::GptqWeight> gptq =
          checkpoint::ConvertGptqWeight(file, layer.prefix);
      ASSERT_TRUE(gptq.ok()) << gptq.status();
      converted = std::move(gptq->weight);
    }
    ASSERT_TRUE(converted.ok()) << converted.status();
    const absl::StatusOr<PackedWeight> want = PackedWeight::Pack(*converted);
    ASSERT_TRUE(want.ok()) << want.status();
    EXPECT_TRUE(testing::SamePanels(packed.at(layer.name), *want));
  }
}

TEST(ExecuteImportTest, HandsFileBytesToUploadBytes) {
  constexpr uint64_t kSeed = 13;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const Fp4Model model(kSeed);
  const SafetensorsFile file = MakeFile(model.tensors);
  absl::StatusOr<ImportPlan> plan = PlanImport(file, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  // The codes handed over must be the file's own bytes.
  const absl::string_view file_bytes(
      reinterpret_cast<const char*>(file.bytes().data()), file.bytes().size());

  std::map<std::string, QuantizedWeight> canonical;
  std::map<std::string, QuantizedWeight> from_bytes;
  std::vector<std::string> order;
  std::ostringstream progress;
  const ImportReport report = ExecuteImport(
      file, *plan,
      [&](const QuantizedWeight& weight, absl::string_view name) {
        canonical.emplace(name, weight);
        order.emplace_back(name);
        return absl::OkStatus();
      },
      [&](const WeightBytes& weight, absl::string_view name) {
        EXPECT_TRUE(weight.CheckSizes().ok()) << name << weight.CheckSizes();
        EXPECT_GE(weight.qweight.data(), file_bytes.data()) << name;
        EXPECT_LE(weight.qweight.data() + weight.qweight.size(),
                  file_bytes.data() + file_bytes.size())
            << name;
        from_bytes.emplace(name, CanonicalOf(weight));
        order.emplace_back(name);
        return absl::OkStatus();
      },
      progress);
  ASSERT_TRUE(report.status.ok()) << report.status;

  const auto from_file = [](const ImportLayer& layer) {
    return IsFp4Layer(layer) || layer.layout == CheckpointLayout::kGptq;
  };
  // 5 FP4 layers and 2 GPTQ ones.
  ExpectLayersHandedApart(*plan, +from_file, 7, from_bytes, canonical, order);
  for (const ImportLayer& layer : plan->layers) {
    if (!from_file(layer)) continue;
    SCOPED_TRACE(layer.name);
    absl::StatusOr<QuantizedWeight> want;
    if (IsFp4Layer(layer)) {
      want = ConvertFp4Layer(file, layer);
    } else {
      absl::StatusOr<checkpoint::GptqWeight> gptq =
          checkpoint::ConvertGptqWeight(file, layer.prefix);
      ASSERT_TRUE(gptq.ok()) << gptq.status();
      want = std::move(gptq->weight);
    }
    ASSERT_TRUE(want.ok()) << want.status();
    const QuantizedWeight& got = from_bytes.at(layer.name);
    EXPECT_EQ(got.spec, want->spec);
    EXPECT_EQ(got.qweight, want->qweight);
    EXPECT_EQ(got.scales, want->scales);
    EXPECT_EQ(got.zeros, want->zeros);
  }
}

TEST(ExecuteImportTest, HandsFp4ColumnsToUploadColumns) {
  constexpr uint64_t kSeed = 15;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const Fp4Model model(kSeed);
  const SafetensorsFile file = MakeFile(model.tensors);
  absl::StatusOr<ImportPlan> plan = PlanImport(file, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const uint8_t* const file_begin = file.bytes().data();
  const uint8_t* const file_end = file_begin + file.bytes().size();

  std::map<std::string, QuantizedWeight> canonical;
  std::map<std::string, QuantizedWeight> from_columns;
  std::vector<std::string> order;
  std::mutex mutex;
  std::ostringstream progress;
  const ImportReport report = ExecuteImport(
      file, *plan,
      [&](const QuantizedWeight& weight, absl::string_view name) {
        std::lock_guard<std::mutex> lock(mutex);
        canonical.emplace(name, weight);
        order.emplace_back(name);
        return absl::OkStatus();
      },
      [&](const Fp4Columns& columns, absl::string_view name) {
        // The codes straight from the file, not a copy.
        EXPECT_GE(columns.codes, file_begin) << name;
        EXPECT_LE(columns.codes + columns.code_bytes(), file_end) << name;
        std::lock_guard<std::mutex> lock(mutex);
        from_columns.emplace(name, CanonicalFromColumns(columns));
        order.emplace_back(name);
        return absl::OkStatus();
      },
      progress, /*uploads_at_once=*/1);
  ASSERT_TRUE(report.status.ok()) << report.status;

  ExpectLayersHandedApart(*plan, IsFp4Layer, 5, from_columns, canonical, order);
  for (const ImportLayer& layer : plan->layers) {
    if (!IsFp4Layer(layer)) continue;
    SCOPED_TRACE(layer.name);
    const absl::StatusOr<QuantizedWeight> want = ConvertFp4Layer(file, layer);
    ASSERT_TRUE(want.ok()) << want.status();
    const QuantizedWeight& got = from_columns.at(layer.name);
    EXPECT_EQ(got.spec, want->spec);
    EXPECT_EQ(got.qweight, want->qweight);
    EXPECT_EQ(got.scales, want->scales);
  }
}

TEST(ImportGptqZerosTest, AGptqV2LayerImportsWithItsOptionAndIsRefusedWithout) {
  constexpr uint64_t kSeed = 19;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  constexpr absl::string_view kLayer = "model.layers.0.mlp.up_proj";
  // Zero points over the whole 4-bit range, 0 and 15 among them.
  const ProducerWeight w = RandomProducerWeight(kSeed, kK, kN, 32, 0, 15);
  ASSERT_NE(std::find(w.zeros.begin(), w.zeros.end(), 15), w.zeros.end());
  const SafetensorsFile file =
      MakeFile(GptqTensors(kLayer, w, GptqZeroConvention::kV2));

  // Read as v1, a stored 15 is zero point 16: refused, saying what to do.
  const absl::Status as_v1 = PlanImport(file, {}).status();
  EXPECT_EQ(as_v1.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(as_v1.message(), HasSubstr("nibble import --gptq_zeros=v2"));

  ImportOptions options;
  options.gptq_zeros = GptqZeroConvention::kV2;
  absl::StatusOr<ImportPlan> plan = PlanImport(file, options);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->layers.size(), 1u);
  EXPECT_EQ(plan->layers[0].spec.format, WeightFormat::kU4);
  // Both ways a GPTQ layer leaves: converted, and as the file's codes.
  std::vector<QuantizedWeight> imported;
  std::ostringstream progress;
  const auto keep = [&](const QuantizedWeight& weight, absl::string_view) {
    imported.push_back(weight);
    return absl::OkStatus();
  };
  ASSERT_TRUE(ExecuteImport(file, *plan, keep, progress).status.ok());
  ASSERT_TRUE(ExecuteImport(
                  file, *plan, keep,
                  [&](const WeightBytes& weight, absl::string_view name) {
                    return keep(CanonicalOf(weight), name);
                  },
                  progress)
                  .status.ok());
  ASSERT_EQ(imported.size(), 2u);
  for (const QuantizedWeight& weight : imported) {
    const std::vector<double> b = ReferenceDequantize(weight);
    for (int64_t row = 0; row < kK; ++row) {
      for (int64_t col = 0; col < kN; ++col) {
        ASSERT_EQ(b[row * kN + col], w.Dequantized(row, col))
            << "row " << row << " column " << col;
      }
    }
  }
}

TEST(PlanImportTest, RefusesABadNvfp4LayerBeforeUploading) {
  constexpr uint64_t kSeed = 11;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  Fp4Model model(kSeed);
  for (Tensor& tensor : model.tensors) {
    if (tensor.name == absl::StrCat(Fp4Model::kNvfp4, ".weight_scale")) {
      tensor.bytes[5] = '\xff';  // E4M3 NaN
    }
  }
  const absl::Status status = PlanImport(MakeFile(model.tensors), {}).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("model.layers.1.self_attn.q_proj.weight_scale[0, "
                              "5] is NaN")));
}

// --- DetectLayout and CheckLayer.

// CheckLayer gives the spec that converting gives, and refuses what it
// refuses, for every layout.
TEST(CheckLayerTest, AgreesWithTheConverters) {
  constexpr uint64_t kSeed = 60;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const auto check = [](const SafetensorsFile& file, CheckpointLayout layout,
                        WeightFormat format = WeightFormat::kU4b8,
                        int64_t group_size = 32, int64_t expert = 0) {
    return checkpoint::CheckLayer(file, kPrefix, layout, format, group_size,
                                  expert);
  };
  {
    const SafetensorsFile file = MakeFile(
        AwqTensors(kPrefix, RandomProducerWeight(kSeed, 128, 16, 32, 0, 15)));
    EXPECT_EQ(check(file, CheckpointLayout::kAwq)->spec,
              checkpoint::ConvertAwqWeight(file, kPrefix)->spec);
  }
  {
    const SafetensorsFile file = MakeFile(ValidMxfp4());
    EXPECT_EQ(
        check(file, CheckpointLayout::kMxfp4, WeightFormat::kU4b8, 32, 1)->spec,
        checkpoint::ConvertMxfp4Weight(file, kPrefix, 1)->spec);
    std::vector<Tensor> tensors = ValidMxfp4();
    FindUnderscored(tensors, "scales").bytes[8] = '\xff';
    const SafetensorsFile bad = MakeFile(tensors);
    EXPECT_EQ(check(bad, CheckpointLayout::kMxfp4, WeightFormat::kU4b8, 32, 1)
                  .status(),
              checkpoint::ConvertMxfp4Weight(bad, kPrefix, 1).status());
    EXPECT_TRUE(check(bad, CheckpointLayout::kMxfp4).ok());  // expert 0 is fine
  }
  {
    const SafetensorsFile file = MakeFile(ValidNvfp4());
    EXPECT_EQ(check(file, CheckpointLayout::kNvfp4)->spec,
              checkpoint::ConvertNvfp4Weight(file, kPrefix)->spec);
  }
  std::vector<float> values(4 * 64);
  std::mt19937_64 rng(kSeed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : values) v = normal(rng);
  for (WeightFormat format : kAllWeightFormats) {
    SCOPED_TRACE(WeightFormatName(format));
    const int64_t group_size =
        FixedGroupSize(format) != 0 ? FixedGroupSize(format) : 32;
    const SafetensorsFile file =
        FloatFile(SafetensorsDtype::kBF16, 4, 64, values);
    EXPECT_EQ(check(file, CheckpointLayout::kFloat, format, group_size)->spec,
              checkpoint::QuantizeFloatWeight(file, kPrefix, format, group_size)
                  ->spec);
  }
  for (float bad : {std::nanf(""), 1e6f}) {
    std::vector<float> with_bad = values;
    with_bad[100] = bad;
    const SafetensorsFile file =
        FloatFile(SafetensorsDtype::kF32, 4, 64, with_bad);
    const absl::Status status =
        check(file, CheckpointLayout::kFloat, WeightFormat::kU4b8, 32).status();
    EXPECT_FALSE(status.ok());
    EXPECT_EQ(status, checkpoint::QuantizeFloatWeight(file, kPrefix,
                                                      WeightFormat::kU4b8, 32)
                          .status());
  }
}

TEST(ConvertErrorTest, NoLayerUnderThePrefix) {
  const SafetensorsFile file =
      FloatFile(SafetensorsDtype::kF32, 1, 32, std::vector<float>(32, 1));
  const absl::Status status =
      checkpoint::DetectLayout(file, "model.layers.1.mlp.down_proj").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("model.layers.1.mlp.down_proj.qweight"),
                    HasSubstr("model.layers.1.mlp.down_proj_blocks"),
                    HasSubstr("model.layers.1.mlp.down_proj.weight"),
                    HasSubstr("test.safetensors")));
  EXPECT_EQ(checkpoint::DetectLayout(file, kPrefix).value(),
            CheckpointLayout::kFloat);
}

}  // namespace
}  // namespace nibble
