// Drives a real nibbled through the `nibble` CLI the way a user would, with
// weights, checkpoints and activations in files, and checks the output file
// against the float64 reference.
#include <algorithm>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/float_quantizer.h"
#include "checkpoint/gptq.h"
#include "checkpoint/safetensors.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/checkpoint/producer_layers.h"
#include "tests/integration/activations.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"

namespace nibble {
namespace {

using ::nibble::checkpoint::testing::AwqTensors;
using ::nibble::checkpoint::testing::FloatWeightTensor;
using ::nibble::checkpoint::testing::Fp4ProducerWeight;
using ::nibble::checkpoint::testing::GIdxTensor;
using ::nibble::checkpoint::testing::GptqTensors;
using ::nibble::checkpoint::testing::Mxfp4Tensors;
using ::nibble::checkpoint::testing::Nvfp4Tensors;
using ::nibble::checkpoint::testing::ProducerWeight;
using ::nibble::checkpoint::testing::RandomFp4ProducerWeight;
using ::nibble::checkpoint::testing::RandomProducerWeight;
using ::nibble::checkpoint::testing::SerializeTensors;
using ::nibble::checkpoint::testing::Tensor;
using ::nibble::testing::ReadFile;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

template <typename T>
void WriteFile(const std::string& path, const std::vector<T>& array) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(array.data()),
             array.size() * sizeof(T));
}

// C [m, N] = A [m, K] · B, B given element by element, in float64.
std::vector<double> Float64Matmul(
    const std::vector<double>& a, int64_t m, int64_t k, int64_t n,
    const std::function<double(int64_t row, int64_t col)>& b) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t row = 0; row < k; ++row) {
      for (int64_t col = 0; col < n; ++col) {
        c[i * n + col] += a[i * k + row] * b(row, col);
      }
    }
  }
  return c;
}

// nibbled multiplies A as sent here, so that C is checked to fp32's bound.
constexpr char kExactProducts[] = "--activation_precision=exact";

class CliTest : public ::testing::TestWithParam<std::tuple<WeightFormat, int>> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH,
                                       {"--threads=2", kExactProducts});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    dir_ = ::testing::TempDir();
  }

  // Runs `nibble <args> --target=...`; its exit code, output in `output_`.
  int Nibble(const std::string& args) {
    return testing::RunCommand(absl::StrCat(NIBBLE_CLI_PATH, " ", args,
                                            " --target=", server_->target()),
                               &output_);
  }

  // C of `nibble matmul` on weight `name` for f32 activations `a` [m, K],
  // through files; empty when the command fails, output_ saying why.
  std::vector<double> MatmulThroughFiles(const std::string& name,
                                         const testing::Activations& a,
                                         int64_t m) {
    const std::string input = absl::StrCat(dir_, "/", name, ".a");
    const std::string output = absl::StrCat(dir_, "/", name, ".c");
    testing::WriteFile(input, a.bytes);
    if (Nibble(absl::StrCat("matmul --name=", name, " --m=", m,
                            " --dtype=f32 --input=", input,
                            " --output=", output)) != 0) {
      return {};
    }
    return testing::OutputValues(ReadFile(output), DType::kF32);
  }

  // Checks C of `nibble matmul` on weight `name` [k, n] for m random f32
  // activations (`seed`) against the float64 product with B given element
  // by element.
  void ExpectMultipliesLike(const std::string& name, int64_t m, int64_t k,
                            int64_t n,
                            const std::function<double(int64_t, int64_t)>& b,
                            uint64_t seed) {
    SCOPED_TRACE(name);
    const testing::Activations a =
        testing::RandomActivations(m, k, DType::kF32, seed);
    const std::vector<double> c = MatmulThroughFiles(name, a, m);
    ASSERT_FALSE(c.empty()) << output_;
    EXPECT_LE(MaxRelativeError(c, Float64Matmul(a.values, m, k, n, b)), 1e-4);
  }

  std::unique_ptr<testing::NibbledProcess> server_;
  std::string dir_;
  std::string output_;
};

TEST_P(CliTest, MatmulOnFilesMatchesTheFloat64Reference) {
  const auto [format, group] = GetParam();
  const int64_t k = 256;
  const WeightSpec spec{format, k, 40, group == 0 ? k : group};
  const uint64_t seed = 500 + static_cast<int>(format) * 7 + group;
  SCOPED_TRACE(::testing::Message() << spec.DebugString() << " seed " << seed);
  const QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
  const std::string prefix = absl::StrCat(dir_, "/w", seed);
  WriteFile(prefix + ".qweight", weight.qweight);
  WriteFile(prefix + ".scales", weight.scales);
  std::string zeros_flag;
  if (HasZeros(format)) {
    WriteFile(prefix + ".zeros", weight.zeros);
    zeros_flag = absl::StrCat(" --zeros=", prefix, ".zeros");
  }
  ASSERT_EQ(
      Nibble(absl::StrCat("upload --name=w --format=", WeightFormatName(format),
                          " --k=", spec.k, " --n=", spec.n,
                          " --group=", spec.group_size, " --qweight=", prefix,
                          ".qweight --scales=", prefix, ".scales", zeros_flag)),
      0)
      << output_;

  const int64_t m = 3;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<float> a(m * k);
    for (float& value : a) value = uniform(rng);
    std::string a_bytes(a.size() * DTypeSize(dtype), '\0');
    ConvertFromFloat(dtype, a.data(), a.size(), a_bytes.data());
    ConvertToFloat(dtype, a_bytes.data(), a.size(), a.data());
    const std::string input = absl::StrCat(prefix, ".a.", DTypeName(dtype));
    const std::string output = absl::StrCat(prefix, ".c.", DTypeName(dtype));
    std::ofstream(input, std::ios::binary) << a_bytes;

    ASSERT_EQ(Nibble(absl::StrCat("matmul --name=w --m=", m,
                                  " --dtype=", DTypeName(dtype),
                                  " --input=", input, " --output=", output)),
              0)
        << output_;
    const std::string c_bytes = ReadFile(output);
    ASSERT_EQ(c_bytes.size(), m * spec.n * DTypeSize(dtype));
    std::vector<float> c(m * spec.n);
    ConvertToFloat(dtype, c_bytes.data(), c.size(), c.data());
    const double error = MaxRelativeError(
        std::vector<double>(c.begin(), c.end()),
        ReferenceMatmul(std::vector<double>(a.begin(), a.end()), m, weight));
    EXPECT_LE(error, dtype == DType::kF32 ? 1e-4 : 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryFormatAndGroup, CliTest,
    ::testing::Combine(::testing::Values(WeightFormat::kFp4,
                                         WeightFormat::kU4b8,
                                         WeightFormat::kU4),
                       ::testing::Values(32, 64, 128, 0)),
    [](const auto& info) {
      const int group = std::get<1>(info.param);
      return absl::StrCat(WeightFormatName(std::get<0>(info.param)), "_g",
                          group == 0 ? "K" : absl::StrCat(group));
    });

class CliWorkflowTest : public CliTest {};

TEST_F(CliWorkflowTest, RandomUploadCheckListDelete) {
  ASSERT_EQ(Nibble("upload --name=r --format=u4 --k=128 --n=24 --group=64 "
                   "--random=9"),
            0)
      << output_;
  ASSERT_EQ(Nibble("matmul --name=r --m=2 --dtype=f16 --random_input=3 "
                   "--check --random=9"),
            0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("max relative error"));
  ASSERT_EQ(Nibble("list"), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("r"));
  ASSERT_EQ(Nibble("delete --name=r"), 0) << output_;
  EXPECT_NE(Nibble("get --name=r"), 0);
  EXPECT_THAT(output_, HasSubstr("no weight named \"r\""));
}

TEST_F(CliWorkflowTest, Fp4BlockFormatsNeedNoGroupAndCheckWithTheGlobalScale) {
  ASSERT_EQ(Nibble("upload --name=nv --format=nvfp4 --k=128 --n=24 "
                   "--global_scale=0.0123 --random=4"),
            0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("group:  16"));
  EXPECT_THAT(output_, HasSubstr("global: 0.0123"));
  ASSERT_EQ(Nibble("matmul --name=nv --m=3 --dtype=bf16 --random_input=5 "
                   "--check --random=4"),
            0)
      << output_;
  ASSERT_EQ(Nibble("upload --name=mx --format=mxfp4 --k=128 --n=24 "
                   "--random=6"),
            0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("group:  32"));
  ASSERT_EQ(Nibble("matmul --name=mx --m=2 --dtype=f32 --random_input=7 "
                   "--check --random=6"),
            0)
      << output_;
  EXPECT_EQ(Nibble("upload --name=x --format=fp4 --k=64 --n=16 --group=32 "
                   "--global_scale=2 --random=1"),
            2);
  EXPECT_THAT(output_, HasSubstr("--global_scale is only for --format nvfp4"));
  EXPECT_EQ(Nibble("upload --name=x --format=mxfp4 --k=64 --n=16 --group=64 "
                   "--random=1"),
            2);
  EXPECT_THAT(output_, HasSubstr("group size must be 32"));
}

// With the server's default precision, --check takes the bound of what the
// kernel made of A, which the reply says: 20 rows of f32 A are rounded to
// bf16 on CPUs with bf16 kernels (AMX too), and multiplied as sent elsewhere.
TEST_F(CliWorkflowTest, CheckTakesTheBoundOfWhatTheKernelMadeOfA) {
  server_.reset();
  absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
      testing::NibbledProcess::Start(NIBBLED_PATH, {"--threads=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  server_ = *std::move(server);
  ASSERT_EQ(Nibble("upload --name=r --format=u4b8 --k=256 --n=48 --group=64 "
                   "--random=5"),
            0)
      << output_;
  ASSERT_EQ(Nibble("matmul --name=r --m=20 --dtype=f32 --random_input=6 "
                   "--check --random=5"),
            0)
      << output_;
  if (cuda::DeviceCount() == 0) {
    EXPECT_THAT(output_, HasSubstr(cpu::DetectIsa() >= cpu::Isa::kAvx512Bf16
                                       ? "(tolerance 0.01)"
                                       : "(tolerance 0.0001)"));
  }
}

TEST_F(CliWorkflowTest, CheckFailsAgainstTheWrongWeight) {
  ASSERT_EQ(Nibble("upload --name=r --format=fp4 --k=64 --n=16 --group=32 "
                   "--random=1"),
            0)
      << output_;
  EXPECT_EQ(Nibble("matmul --name=r --m=1 --dtype=f32 --random_input=3 "
                   "--check --random=2"),
            1)
      << output_;
}

TEST_F(CliWorkflowTest, MissingFileIsAClearError) {
  EXPECT_NE(Nibble(absl::StrCat("upload --name=x --format=u4b8 --k=64 --n=16 "
                                "--group=32 --qweight=",
                                dir_, "/absent.qweight --scales=", dir_,
                                "/absent.scales")),
            0);
  EXPECT_THAT(output_, HasSubstr("absent.qweight"));
}

TEST_F(CliWorkflowTest, ImportMultipliesLikeTheCheckpoint) {
  constexpr uint64_t kSeed = 41;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  constexpr int64_t kK = 256;
  // Zero points of 8 make the GPTQ layer u4b8; AWQ layers are always u4.
  const ProducerWeight gptq = RandomProducerWeight(kSeed, kK, 64, 64, 8, 8);
  const ProducerWeight awq = RandomProducerWeight(kSeed + 1, kK, 48, 32, 0, 15);
  constexpr int64_t kFloatN = 32;
  std::mt19937_64 rng(kSeed + 2);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> floats(kFloatN * kK);
  for (float& value : floats) value = normal(rng);
  std::vector<Tensor> tensors =
      GptqTensors("model.layers.0.self_attn.q_proj", gptq,
                  checkpoint::GptqZeroConvention::kV1);
  for (Tensor& tensor : AwqTensors("model.layers.0.mlp.up_proj", awq)) {
    tensors.push_back(std::move(tensor));
  }
  tensors.push_back(FloatWeightTensor("model.layers.0.mlp.down_proj",
                                      checkpoint::SafetensorsDtype::kF16,
                                      kFloatN, kK, floats));
  int64_t layer_bytes = 0;
  for (const Tensor& tensor : tensors) layer_bytes += tensor.bytes.size();
  tensors.push_back({"model.layers.0.input_layernorm.weight",
                     checkpoint::SafetensorsDtype::kF16,
                     {kK},
                     std::string(2 * kK, '\x3c')});
  const std::string path = absl::StrCat(dir_, "/import.safetensors");
  testing::WriteFile(path, SerializeTensors(tensors));

  const std::string import =
      absl::StrCat("import --file=", path, " --name_map=model.layers.0.=L0.");
  ASSERT_EQ(Nibble(import), 0) << output_;
  // What the float layer must have become: u4b8 with groups of 128, the
  // default of --quantize.
  absl::StatusOr<checkpoint::SafetensorsFile> file =
      checkpoint::SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<QuantizedWeight> quantized = checkpoint::QuantizeFloatWeight(
      *file, "model.layers.0.mlp.down_proj", WeightFormat::kU4b8, 128);
  ASSERT_TRUE(quantized.ok()) << quantized.status();
  const int64_t uploaded_bytes =
      WeightSpec{WeightFormat::kU4b8, kK, 64, 64}.canonical_bytes() +
      WeightSpec{WeightFormat::kU4, kK, 48, 32}.canonical_bytes() +
      quantized->spec.canonical_bytes();
  EXPECT_THAT(
      output_,
      AllOf(HasSubstr("model.layers.0.input_layernorm.weight (F16 [256])"),
            HasSubstr("[1/3] model.layers.0.mlp.down_proj → L0.mlp.down_proj "
                      "(float → u4b8, k=256 n=32 group=128,"),
            HasSubstr("[2/3] model.layers.0.mlp.up_proj → L0.mlp.up_proj "
                      "(awq → u4, k=256 n=48 group=32,"),
            HasSubstr("[3/3] model.layers.0.self_attn.q_proj → "
                      "L0.self_attn.q_proj (gptq → u4b8, k=256 n=64 group=64,"),
            HasSubstr("imported: 3 layers from "),
            HasSubstr(absl::StrCat("bytes:    ", uploaded_bytes, " uploaded, ",
                                   layer_bytes, " read\n")),
            HasSubstr(" MB/s read from the file\n")));

  struct Imported {
    std::string name;
    int64_t n;
    std::function<double(int64_t, int64_t)> b;
  };
  const std::vector<double> float_b = ReferenceDequantize(*quantized);
  const Imported imported[] = {
      {"L0.self_attn.q_proj", gptq.n,
       [&](int64_t row, int64_t col) { return gptq.Dequantized(row, col); }},
      {"L0.mlp.up_proj", awq.n,
       [&](int64_t row, int64_t col) { return awq.Dequantized(row, col); }},
      {"L0.mlp.down_proj", kFloatN,
       [&](int64_t row, int64_t col) { return float_b[row * kFloatN + col]; }},
  };
  constexpr int64_t kM = 3;
  for (const Imported& weight : imported) {
    SCOPED_TRACE(weight.name);
    const testing::Activations a =
        testing::RandomActivations(kM, kK, DType::kF32, kSeed + 3);
    const std::vector<double> c = MatmulThroughFiles(weight.name, a, kM);
    ASSERT_FALSE(c.empty()) << output_;
    EXPECT_LE(MaxRelativeError(
                  c, Float64Matmul(a.values, kM, kK, weight.n, weight.b)),
              1e-4);
    if (weight.name == "L0.mlp.down_proj") {
      // Quantizing moves C only a little from that of the weight as stored
      // [N, K], which a transposed or mislabelled upload would not.
      const std::vector<double> want = Float64Matmul(
          a.values, kM, kK, kFloatN, [&](int64_t row, int64_t col) {
            return static_cast<double>(
                HalfToFloat(FloatToHalf(floats[col * kK + row])));
          });
      EXPECT_LE(MaxRelativeError(c, want), 0.3);
    }
  }

  // Importing again stops at the first weight, which exists, and adds none.
  ASSERT_EQ(Nibble("list"), 0) << output_;
  const std::string listed = output_;
  EXPECT_EQ(Nibble(import), 1) << output_;
  EXPECT_THAT(
      output_,
      AllOf(HasSubstr("import of layer \"model.layers.0.mlp.down_proj\" "
                      "as \"L0.mlp.down_proj\" (1 of 3) failed: "
                      "ALREADY_EXISTS"),
            HasSubstr("a weight named \"L0.mlp.down_proj\" already "
                      "exists"),
            HasSubstr("no layer was uploaded"), Not(HasSubstr("imported:"))));
  ASSERT_EQ(Nibble("list"), 0) << output_;
  EXPECT_EQ(output_, listed);
}

TEST_F(CliWorkflowTest, ImportsAnActOrderLayerThatMultipliesLikeTheCheckpoint) {
  constexpr uint64_t kSeed = 43;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  constexpr int64_t kK = 256;
  // As AutoGPTQ writes desc_act: the rows, in a random order, fill the
  // groups one after the other.
  ProducerWeight gptq = RandomProducerWeight(kSeed, kK, 40, 32, 1, 15);
  std::vector<int64_t> rows(kK);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), std::mt19937_64(kSeed));
  for (int64_t i = 0; i < kK; ++i) gptq.group_of_row[rows[i]] = i / 32;
  std::vector<Tensor> tensors =
      GptqTensors("model.layers.0.mlp.down_proj", gptq,
                  checkpoint::GptqZeroConvention::kV1);
  tensors.push_back(GIdxTensor("model.layers.0.mlp.down_proj", gptq));
  const std::string path = absl::StrCat(dir_, "/act_order.safetensors");
  testing::WriteFile(path, SerializeTensors(tensors));

  ASSERT_EQ(Nibble(absl::StrCat("import --file=", path)), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("(gptq → u4 act-order, k=256 n=40 group=32,"));
  ASSERT_EQ(Nibble("get --name=model.layers.0.mlp.down_proj"), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("order:  activation order"));

  constexpr int64_t kM = 4;
  const testing::Activations a =
      testing::RandomActivations(kM, kK, DType::kF32, kSeed + 1);
  const std::string input = absl::StrCat(dir_, "/act_order.a");
  const std::string output = absl::StrCat(dir_, "/act_order.c");
  testing::WriteFile(input, a.bytes);
  ASSERT_EQ(Nibble(absl::StrCat("matmul --name=model.layers.0.mlp.down_proj "
                                "--m=",
                                kM, " --dtype=f32 --input=", input,
                                " --output=", output)),
            0)
      << output_;
  EXPECT_LE(
      MaxRelativeError(testing::OutputValues(ReadFile(output), DType::kF32),
                       Float64Matmul(a.values, kM, kK, gptq.n,
                                     [&](int64_t row, int64_t col) {
                                       return gptq.Dequantized(row, col);
                                     })),
      1e-4);
  // --check's raw weight files carry no order, so it refuses rather than
  // report a false mismatch.
  EXPECT_EQ(Nibble(absl::StrCat("matmul --name=model.layers.0.mlp.down_proj "
                                "--m=",
                                kM, " --dtype=f32 --input=", input,
                                " --check --random=1")),
            2)
      << output_;
  EXPECT_THAT(output_, HasSubstr("act-order"));
}

TEST_F(CliWorkflowTest,
       ImportsMxfp4AndNvfp4LayersThatMultiplyLikeTheCheckpoint) {
  constexpr uint64_t kSeed = 47;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const std::vector<Fp4ProducerWeight> experts = {
      RandomFp4ProducerWeight(kSeed, 24, 128, 32),
      RandomFp4ProducerWeight(kSeed + 1, 24, 128, 32)};
  // K = 80: 10 words a column, not a whole number of 4-word runs.
  const Fp4ProducerWeight nvfp4 =
      RandomFp4ProducerWeight(kSeed + 2, 37, 80, 16);
  std::vector<Tensor> tensors =
      Mxfp4Tensors("model.layers.0.mlp.experts.down_proj", experts);
  for (Tensor& tensor :
       Nvfp4Tensors("model.layers.0.self_attn.o_proj", nvfp4)) {
    tensors.push_back(std::move(tensor));
  }
  const std::string path = absl::StrCat(dir_, "/fp4.safetensors");
  testing::WriteFile(path, SerializeTensors(tensors));
  const std::pair<std::string, const Fp4ProducerWeight*> imported[] = {
      {"model.layers.0.mlp.experts.down_proj.0", &experts[0]},
      {"model.layers.0.mlp.experts.down_proj.1", &experts[1]},
      {"model.layers.0.self_attn.o_proj", &nvfp4}};

  // The columns go to a server that packs them as they arrive, then to one
  // that keeps canonical weights (--data_dir) and transposes them.
  for (const bool keeps_canonical : {false, true}) {
    SCOPED_TRACE(keeps_canonical ? "with --data_dir" : "without --data_dir");
    if (keeps_canonical) {
      server_.reset();
      absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
          testing::NibbledProcess::Start(
              NIBBLED_PATH,
              {"--threads=2", kExactProducts,
               "--data_dir=" + testing::FreshDirectory("fp4_import")});
      ASSERT_TRUE(server.ok()) << server.status();
      server_ = *std::move(server);
    }
    ASSERT_EQ(Nibble(absl::StrCat("import --file=", path)), 0) << output_;
    EXPECT_THAT(output_,
                AllOf(HasSubstr("(mxfp4 → mxfp4, k=128 n=24 group=32,"),
                      HasSubstr("(nvfp4 → nvfp4, k=80 n=37 group=16,"),
                      HasSubstr("imported: 3 layers from ")));
    for (const auto& [name, weight] : imported) {
      ExpectMultipliesLike(
          name, /*m=*/3, weight->k, weight->n,
          [&](int64_t row, int64_t col) {
            return weight->Dequantized(row, col);
          },
          kSeed + 3);
    }
  }
}

TEST_F(CliWorkflowTest, ImportsAShardedCheckpointWhoseLayersSpanItsShards) {
  constexpr uint64_t kSeed = 53;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const ProducerWeight gptq = RandomProducerWeight(kSeed, 128, 40, 32, 8, 8);
  const Fp4ProducerWeight nvfp4 =
      RandomFp4ProducerWeight(kSeed + 1, 24, 64, 16);
  std::vector<Tensor> tensors = GptqTensors(
      "model.layers.3.mlp.up_proj", gptq, checkpoint::GptqZeroConvention::kV1);
  for (Tensor& tensor : Nvfp4Tensors("model.layers.3.mlp.down_proj", nvfp4)) {
    tensors.push_back(std::move(tensor));
  }
  // As save_pretrained splits at tensor boundaries: each layer's codes in the
  // first shard, the rest of it in the second.
  std::vector<Tensor> shards[2];
  std::vector<std::string> weight_map;
  for (Tensor& tensor : tensors) {
    const bool codes = tensor.name.ends_with(".qweight") ||
                       tensor.name.ends_with("down_proj.weight");
    const std::string file =
        absl::StrCat("model-0000", codes ? 1 : 2, "-of-00002.safetensors");
    weight_map.push_back(absl::StrCat("\"", tensor.name, "\": \"", file, "\""));
    shards[codes ? 0 : 1].push_back(std::move(tensor));
  }
  ASSERT_FALSE(shards[0].empty());
  ASSERT_FALSE(shards[1].empty());
  testing::WriteFile(absl::StrCat(dir_, "/model-00001-of-00002.safetensors"),
                     SerializeTensors(shards[0]));
  testing::WriteFile(absl::StrCat(dir_, "/model-00002-of-00002.safetensors"),
                     SerializeTensors(shards[1]));
  const std::string index = absl::StrCat(dir_, "/model.safetensors.index.json");
  testing::WriteFile(
      index,
      absl::StrCat(R"({"metadata": {"total_size": 1},)", R"( "weight_map": {)",
                   absl::StrJoin(weight_map, ", "), "}}"));

  ASSERT_EQ(Nibble(absl::StrCat("import --file=", index)), 0) << output_;
  EXPECT_THAT(output_, AllOf(HasSubstr("(nvfp4 → nvfp4, k=64 n=24 group=16,"),
                             HasSubstr("(gptq → u4b8, k=128 n=40 group=32,"),
                             HasSubstr("imported: 2 layers from ")));
  ExpectMultipliesLike(
      "model.layers.3.mlp.up_proj", /*m=*/2, gptq.k, gptq.n,
      [&](int64_t row, int64_t col) { return gptq.Dequantized(row, col); },
      kSeed + 2);
  ExpectMultipliesLike(
      "model.layers.3.mlp.down_proj", /*m=*/2, nvfp4.k, nvfp4.n,
      [&](int64_t row, int64_t col) { return nvfp4.Dequantized(row, col); },
      kSeed + 2);
}

TEST_F(CliWorkflowTest, GptqZerosV2ImportsAGptqV2Layer) {
  constexpr uint64_t kSeed = 61;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const ProducerWeight w = RandomProducerWeight(kSeed, 128, 24, 32, 0, 15);
  const std::string path = absl::StrCat(dir_, "/gptq_v2.safetensors");
  testing::WriteFile(
      path, SerializeTensors(GptqTensors("model.layers.0.mlp.up_proj", w,
                                         checkpoint::GptqZeroConvention::kV2)));

  EXPECT_EQ(Nibble(absl::StrCat("import --file=", path, " --gptq_zeros=v3")),
            2);
  EXPECT_THAT(output_, HasSubstr("--gptq_zeros \"v3\" is neither v1"));
  ASSERT_EQ(Nibble(absl::StrCat("import --file=", path, " --gptq_zeros=v2")), 0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("(gptq → u4, k=128 n=24 group=32,"));
  ExpectMultipliesLike(
      "model.layers.0.mlp.up_proj", /*m=*/2, w.k, w.n,
      [&](int64_t row, int64_t col) { return w.Dequantized(row, col); },
      kSeed + 1);
}

TEST_F(CliWorkflowTest, HealthIsServing) {
  EXPECT_EQ(Nibble("health"), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("SERVING"));
}

}  // namespace
}  // namespace nibble
