// Starts a real nibbled with --import of a checkpoint written by the test:
// the layers are served from the first call, as the checkpoint has them;
// with --data_dir they replace weights of the same name and survive a
// restart; a bad file, or a bad flag, stops nibbled before it listens.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/float_quantizer.h"
#include "checkpoint/gptq.h"
#include "checkpoint/safetensors.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/checkpoint/producer_layers.h"
#include "tests/integration/activations.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"
#include "tests/integration/weight_client.h"

namespace nibble {
namespace {

using ::nibble::checkpoint::SafetensorsDtype;
using ::nibble::checkpoint::testing::FloatWeightTensor;
using ::nibble::checkpoint::testing::GIdxTensor;
using ::nibble::checkpoint::testing::GptqTensors;
using ::nibble::checkpoint::testing::ProducerWeight;
using ::nibble::checkpoint::testing::RandomProducerWeight;
using ::nibble::checkpoint::testing::SerializeTensors;
using ::nibble::checkpoint::testing::Tensor;
using ::nibble::client::ToProto;
using ::nibble::testing::FreshDirectory;
using ::nibble::testing::ReadFile;
using ::nibble::testing::StartNibbledLoggingTo;
using ::nibble::testing::WeightClient;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr int64_t kK = 256;
constexpr int64_t kFloatN = 32;
constexpr int64_t kM = 3;
constexpr uint64_t kSeed = 59;

// A GPTQ layer with zero points of its own (so u4), an fp16 layer and a
// norm, in one checkpoint file; and what each layer must multiply like.
class ImportAtStartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::mt19937_64 rng(kSeed + 1);
    std::normal_distribution<float> normal(0.0f, 0.05f);
    floats_.resize(kFloatN * kK);
    for (float& value : floats_) value = normal(rng);
    std::vector<Tensor> tensors =
        GptqTensors("model.layers.0.self_attn.q_proj", gptq_,
                    checkpoint::GptqZeroConvention::kV1);
    tensors.push_back(FloatWeightTensor("model.layers.0.mlp.down_proj",
                                        SafetensorsDtype::kF16, kFloatN, kK,
                                        floats_));
    tensors.push_back({"model.layers.0.input_layernorm.weight",
                       SafetensorsDtype::kF16,
                       {kK},
                       std::string(2 * kK, '\x3c')});
    dir_ = FreshDirectory(
        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    checkpoint_ = dir_ + "/model.safetensors";
    testing::WriteFile(checkpoint_, SerializeTensors(tensors));

    // The float layer as `nibble import` quantizes it by default.
    absl::StatusOr<checkpoint::SafetensorsFile> file =
        checkpoint::SafetensorsFile::Open(checkpoint_);
    ASSERT_TRUE(file.ok()) << file.status();
    absl::StatusOr<QuantizedWeight> quantized = checkpoint::QuantizeFloatWeight(
        *file, "model.layers.0.mlp.down_proj", WeightFormat::kU4b8, 128);
    ASSERT_TRUE(quantized.ok()) << quantized.status();
    down_proj_ = *std::move(quantized);
  }

  std::vector<std::string> ImportFlags() const {
    return {"--import=" + checkpoint_, "--import_name_map=model.layers.0.=L0."};
  }

  // C of weight `name` [k, n] for random activations, against the float64
  // product with B given element by element.
  void ExpectMultipliesLike(const std::string& target, const std::string& name,
                            int64_t n,
                            const std::function<double(int64_t, int64_t)>& b) {
    SCOPED_TRACE(name);
    const testing::Activations a =
        testing::RandomActivations(kM, kK, DType::kF32, kSeed + 2);
    v1::MatmulRequest request;
    request.set_weight_name(name);
    request.set_m(kM);
    request.set_dtype(ToProto(DType::kF32));
    request.set_a(a.bytes);
    grpc::ClientContext context;
    v1::MatmulResponse response;
    const grpc::Status status =
        v1::NibbleService::NewStub(
            grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))
            ->Matmul(&context, request, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    std::vector<double> want(kM * n, 0.0);
    for (int64_t i = 0; i < kM; ++i) {
      for (int64_t row = 0; row < kK; ++row) {
        for (int64_t col = 0; col < n; ++col) {
          want[i * n + col] += a.values[i * kK + row] * b(row, col);
        }
      }
    }
    EXPECT_LE(MaxRelativeError(testing::OutputValues(response.c(), DType::kF32),
                               want),
              client::ErrorBoundOf(response));
  }

  void ExpectServesTheImport(const std::string& target) {
    ExpectMultipliesLike(
        target, "L0.self_attn.q_proj", gptq_.n,
        [&](int64_t row, int64_t col) { return gptq_.Dequantized(row, col); });
    const std::vector<double> down = ReferenceDequantize(down_proj_);
    ExpectMultipliesLike(
        target, "L0.mlp.down_proj", kFloatN,
        [&](int64_t row, int64_t col) { return down[row * kFloatN + col]; });
  }

  // Zero points from 1: AutoGPTQ's v1 files cannot hold a zero point of 0.
  const ProducerWeight gptq_ = RandomProducerWeight(kSeed, kK, 64, 64, 1, 15);
  std::vector<float> floats_;
  QuantizedWeight down_proj_;
  std::string dir_;
  std::string checkpoint_;
};

TEST_F(ImportAtStartTest, ServesTheLayersFromTheFirstCall) {
  const std::string log = dir_ + "/nibbled.stderr";
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, ImportFlags());
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(), HasSubstr(", 2 layers imported"));
  EXPECT_THAT(WeightClient((*server)->target()).List(),
              ElementsAre(AllOf(StartsWith("name: \"L0.mlp.down_proj\""),
                                HasSubstr("format: WEIGHT_FORMAT_U4B8"),
                                HasSubstr("k: 256 n: 32 group_size: 128")),
                          AllOf(StartsWith("name: \"L0.self_attn.q_proj\""),
                                HasSubstr("format: WEIGHT_FORMAT_U4 "),
                                HasSubstr("k: 256 n: 64 group_size: 64"))));
  ExpectServesTheImport((*server)->target());
  EXPECT_EQ((*server)->Stop(), 0);

  const std::string logged = ReadFile(log);
  EXPECT_THAT(
      logged,
      AllOf(HasSubstr(absl::StrCat("msg=\"importing\" file=", checkpoint_,
                                   " layers=2 skipped_tensors=1")),
            HasSubstr("msg=\"layer imported\" file="),
            HasSubstr("layer=1/2 prefix=model.layers.0.mlp.down_proj "
                      "name=L0.mlp.down_proj from=float format=u4b8"),
            HasSubstr("layer=2/2 prefix=model.layers.0.self_attn.q_proj "
                      "name=L0.self_attn.q_proj from=gptq format=u4"),
            HasSubstr("msg=\"import done\" files=1 layers=2"),
            HasSubstr("layers_imported=2")));
  // Every layer is stored before nibbled listens.
  EXPECT_LT(logged.find("msg=\"import done\""),
            logged.find("msg=\"listening\""));
}

TEST_F(ImportAtStartTest, ImportsAShardedCheckpointThroughItsIndex) {
  // The checkpoint's tensors dealt over two shards in name order, which
  // splits the GPTQ layer's tensors between them.
  absl::StatusOr<checkpoint::SafetensorsFile> file =
      checkpoint::SafetensorsFile::Open(checkpoint_);
  ASSERT_TRUE(file.ok()) << file.status();
  std::vector<checkpoint::NamedTensorBytes> shards[2];
  std::vector<std::string> weight_map;
  for (size_t i = 0; i < file->tensors().size(); ++i) {
    const checkpoint::TensorInfo& tensor = file->tensors()[i];
    const absl::Span<const uint8_t> bytes = file->Data(tensor);
    shards[i % 2].push_back(
        {tensor.name, tensor.dtype, tensor.shape,
         absl::string_view(reinterpret_cast<const char*>(bytes.data()),
                           bytes.size())});
    weight_map.push_back(absl::StrCat("\"", tensor.name, "\": \"shard-", i % 2,
                                      ".safetensors\""));
  }
  for (int shard = 0; shard < 2; ++shard) {
    absl::StatusOr<std::string> bytes =
        checkpoint::SerializeSafetensors(shards[shard]);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    testing::WriteFile(absl::StrCat(dir_, "/shard-", shard, ".safetensors"),
                       *bytes);
  }
  const std::string index = dir_ + "/model.safetensors.index.json";
  testing::WriteFile(index,
                     absl::StrCat(R"({"weight_map": {)",
                                  absl::StrJoin(weight_map, ", "), "}}"));

  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, dir_ + "/nibbled.stderr",
      {"--import=" + index, "--import_name_map=model.layers.0.=L0."});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(), HasSubstr(", 2 layers imported"));
  ExpectServesTheImport((*server)->target());
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST_F(ImportAtStartTest, WithDataDirItReplacesAWeightOfTheNameAndPersists) {
  const std::string data_dir = "--data_dir=" + dir_ + "/data";
  const std::string log = dir_ + "/nibbled.stderr";
  {
    auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {data_dir});
    ASSERT_TRUE(server.ok()) << server.status();
    WeightClient client((*server)->target());
    // Another weight under an imported name, and one the import leaves be.
    ASSERT_TRUE(
        client
            .Upload("L0.self_attn.q_proj",
                    RandomQuantizedWeight({WeightFormat::kFp4, kK, 16, 32}, 3))
            .ok());
    ASSERT_TRUE(client
                    .Upload("kept", RandomQuantizedWeight(
                                        {WeightFormat::kU4b8, 128, 16, 32}, 4))
                    .ok());
    EXPECT_EQ((*server)->Stop(), 0);
  }
  std::vector<std::string> listed;
  std::string kept_result;
  {
    std::vector<std::string> flags = ImportFlags();
    flags.push_back(data_dir);
    auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, flags);
    ASSERT_TRUE(server.ok()) << server.status();
    // The file of the replaced weight is not counted as loaded.
    EXPECT_THAT((*server)->startup_line(),
                AllOf(HasSubstr(", 2 layers imported"),
                      HasSubstr(", 1 weights loaded from ")));
    WeightClient client((*server)->target());
    listed = client.List();
    EXPECT_THAT(listed, ElementsAre(HasSubstr("L0.mlp.down_proj"),
                                    AllOf(HasSubstr("L0.self_attn.q_proj"),
                                          HasSubstr("WEIGHT_FORMAT_U4 ")),
                                    HasSubstr("kept")));
    ExpectServesTheImport((*server)->target());
    kept_result = client.Matmul("kept", 128);
    EXPECT_EQ((*server)->Stop(), 0);
  }
  // Without --import the imported layers come back from --data_dir.
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {data_dir});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(), HasSubstr(", 3 weights loaded from "));
  WeightClient client((*server)->target());
  EXPECT_EQ(client.List(), listed);
  ExpectServesTheImport((*server)->target());
  EXPECT_EQ(client.Matmul("kept", 128), kept_result);
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST_F(ImportAtStartTest, ServesAnActOrderLayerAndKeepsItsOrderAcrossARestart) {
  // As AutoGPTQ writes desc_act: the rows, in a random order, fill the
  // groups one after the other, so g_idx is not row / group size.
  constexpr uint64_t kActOrderSeed = kSeed + 7;
  SCOPED_TRACE(absl::StrCat("seed=", kActOrderSeed));
  ProducerWeight act_order =
      RandomProducerWeight(kActOrderSeed, kK, 48, 64, 1, 15);
  std::vector<int64_t> rows(kK);
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), std::mt19937_64(kActOrderSeed));
  for (int64_t i = 0; i < kK; ++i) act_order.group_of_row[rows[i]] = i / 64;
  std::vector<Tensor> tensors =
      GptqTensors("model.layers.2.self_attn.o_proj", act_order,
                  checkpoint::GptqZeroConvention::kV1);
  tensors.push_back(GIdxTensor("model.layers.2.self_attn.o_proj", act_order));
  const std::string path = dir_ + "/act_order.safetensors";
  testing::WriteFile(path, SerializeTensors(tensors));

  const std::string data_dir = "--data_dir=" + dir_ + "/data";
  const std::string log = dir_ + "/nibbled.stderr";
  const auto expect_served = [&](const std::string& target) {
    ExpectMultipliesLike(target, "L2.o_proj", act_order.n,
                         [&](int64_t row, int64_t col) {
                           return act_order.Dequantized(row, col);
                         });
    EXPECT_THAT(WeightClient(target).List(),
                ElementsAre(AllOf(StartsWith("name: \"L2.o_proj\""),
                                  HasSubstr("k: 256 n: 48 group_size: 64"),
                                  HasSubstr("activation_order: true"))));
  };
  {
    auto server = StartNibbledLoggingTo(
        NIBBLED_PATH, log,
        {"--import=" + path, "--import_name_map=model.layers.2.self_attn.=L2.",
         data_dir});
    ASSERT_TRUE(server.ok()) << server.status();
    EXPECT_THAT((*server)->startup_line(), HasSubstr(", 1 layers imported"));
    expect_served((*server)->target());
    EXPECT_EQ((*server)->Stop(), 0);
  }
  // From --data_dir alone, the order comes back with the weight.
  auto server = StartNibbledLoggingTo(NIBBLED_PATH, log, {data_dir});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(), HasSubstr(", 1 weights loaded from "));
  expect_served((*server)->target());
  EXPECT_EQ((*server)->Stop(), 0);
}

// A TCP socket listening on a free loopback port, for as long as it lives.
class HeldPort {
 public:
  HeldPort() : fd_(socket(AF_INET, SOCK_STREAM, 0)) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), length), 0);
    EXPECT_EQ(listen(fd_, 1), 0);
    EXPECT_EQ(getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length),
              0);
    port_ = ntohs(address.sin_port);
  }
  ~HeldPort() { close(fd_); }

  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

TEST_F(ImportAtStartTest, AFailedImportStopsNibbledBeforeItListens) {
  // nibbled would fail with "cannot listen" had it tried to listen first.
  const HeldPort port;
  const std::string nibbled = absl::StrCat(
      NIBBLED_PATH, " --threads=1 --listen=127.0.0.1:", port.port(), " ");
  const std::string notes = dir_ + "/notes.txt";
  testing::WriteFile(notes, "not tensors, only a few words of plain text");
  struct Case {
    std::string flags;
    std::string message;
  };
  const Case cases[] = {
      {"--import=" + notes, "nibbled: --import: " + notes},
      {absl::StrCat("--import=", dir_, "/absent.safetensors"),
       absl::StrCat("nibbled: --import: cannot open ", dir_,
                    "/absent.safetensors")},
      {absl::StrCat("--import=", checkpoint_,
                    " --import_layer=model.layers.0.mlp.gate_proj"),
       absl::StrCat("no layer \"model.layers.0.mlp.gate_proj\" in ",
                    checkpoint_)},
      {absl::StrCat("--import=", checkpoint_, " --max_weight_bytes=4096"),
       "more than --max_weight_bytes allows (4096)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    std::string output;
    EXPECT_EQ(testing::RunCommand(nibbled + c.flags, &output), 1);
    EXPECT_THAT(output,
                AllOf(HasSubstr(c.message), Not(HasSubstr("cannot listen on")),
                      Not(HasSubstr("msg=\"listening\""))));
  }
}

TEST_F(ImportAtStartTest, BadImportFlagsAreUsageErrors) {
  const std::string nibbled = absl::StrCat(NIBBLED_PATH, " --threads=1 ");
  struct Case {
    std::string flags;
    std::string message;
  };
  const Case cases[] = {
      {absl::StrCat("--import=", checkpoint_, " --import_quantize=u4:96"),
       "--import_quantize \"u4:96\": group \"96\""},
      {absl::StrCat("--import=", checkpoint_, " --import_name_map=L"),
       "--import_name_map rule \"L\": expected FROM=TO"},
      {"--import_layer=model.layers.0.mlp.down_proj",
       "--import_layer applies to --import"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flags);
    std::string output;
    EXPECT_EQ(testing::RunCommand(nibbled + c.flags, &output), 2);
    EXPECT_THAT(output, HasSubstr(c.message));
  }
}

}  // namespace
}  // namespace nibble
