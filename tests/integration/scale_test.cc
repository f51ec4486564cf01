// Runs nibbled at the scale its limits are for: a great many tiny weights,
// counted by --max_weights and listed page by page, and a request message
// far past --max_message_bytes, whose buffering --max_receive_buffer_bytes
// bounds. `make test` runs the short forms; `make
// limits` runs the full ones (NIBBLE_FULL_SCALE=1): a million uploads and a
// 2 GB message.
#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/upload_messages.h"
#include "tests/integration/weight_client.h"

namespace nibble {
namespace {

using ::nibble::client::ToProto;
using ::nibble::testing::NibbledProcess;
using ::nibble::testing::ResidentBytes;
using ::nibble::testing::StartNibbledLoggingTo;
using ::nibble::testing::UploadMessages;
using ::nibble::testing::UploadWeight;
using ::nibble::testing::WeightClient;
using ::testing::HasSubstr;

bool FullScale() {
  const char* full = std::getenv("NIBBLE_FULL_SCALE");
  return full != nullptr && std::string(full) == "1";
}

// The smallest weight there is: one column of one group.
constexpr WeightSpec kTinySpec = {WeightFormat::kU4b8, 32, 1, 32};

std::string TinyName(int64_t i) { return absl::StrFormat("tiny-%07d", i); }

// Runs `work(i)` for i in [0, count) on `threads` threads, printing a
// progress line every `report_every`; the number of calls that returned
// false.
template <typename Work>
int64_t RunOnThreads(int64_t count, int threads, int64_t report_every,
                     const std::string& what, Work work) {
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::atomic<int64_t> failed{0};
  const absl::Time start = absl::Now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int64_t i = next++; i < count; i = next++) {
        if (!work(t, i)) ++failed;
        const int64_t finished = ++done;
        if (finished % report_every == 0) {
          std::cout << absl::StreamFormat(
                           "%s: %d of %d in %.1f s", what, finished, count,
                           absl::ToDoubleSeconds(absl::Now() - start))
                    << std::endl;
        }
      }
    });
  }
  for (std::thread& worker : workers) worker.join();
  return failed.load();
}

TEST(ScaleTest, TinyWeightsFillMaxWeightsAndListPageByPage) {
  const int64_t count = FullScale() ? 1'000'000 : 3'000;
  constexpr int kThreads = 4;
  const uint64_t seed = 20261122;
  SCOPED_TRACE(::testing::Message()
               << "seed " << seed << ", " << count << " weights");
  // A million uploads log a million lines: those go nowhere.
  absl::StatusOr<std::unique_ptr<NibbledProcess>> server =
      StartNibbledLoggingTo(NIBBLED_PATH, "/dev/null",
                            {absl::StrCat("--max_weights=", count)});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string& target = (*server)->target();
  const pid_t pid = (*server)->pid();

  const QuantizedWeight tiny = RandomQuantizedWeight(kTinySpec, seed);
  const std::vector<v1::UploadWeightRequest> messages =
      UploadMessages("", tiny);
  WeightClient client(target);
  ASSERT_TRUE(client.Upload(TinyName(0), tiny).ok());
  const std::string first_result = client.Matmul(TinyName(0), kTinySpec.k);
  ASSERT_THAT(first_result, ::testing::Not(HasSubstr("error")));
  const int64_t rss_before = ResidentBytes(pid);

  std::vector<std::unique_ptr<v1::NibbleService::Stub>> stubs;
  for (int t = 0; t < kThreads; ++t) {
    stubs.push_back(v1::NibbleService::NewStub(
        grpc::CreateChannel(target, grpc::InsecureChannelCredentials())));
  }
  const int64_t failed_uploads = RunOnThreads(
      count - 1, kThreads, count / 10, "uploaded", [&](int t, int64_t i) {
        std::vector<v1::UploadWeightRequest> own = messages;
        own[0].mutable_header()->set_name(TinyName(i + 1));
        const grpc::Status status = UploadWeight(*stubs[t], own);
        EXPECT_TRUE(status.ok())
            << TinyName(i + 1) << ": " << status.error_message();
        return status.ok();
      });
  ASSERT_EQ(failed_uploads, 0);
  const int64_t rss_full = ResidentBytes(pid);
  const double bytes_per_weight =
      static_cast<double>(rss_full - rss_before) / (count - 1);
  std::cout << absl::StreamFormat(
                   "%d tiny weights: VmRSS %d -> %d MiB, %.0f bytes each",
                   count, rss_before >> 20, rss_full >> 20, bytes_per_weight)
            << std::endl;
  // Each holds 288 bytes packed; the rest is the store's, the batcher's and
  // the allocator's bookkeeping, which --max_weights bounds.
  EXPECT_LT(bytes_per_weight, 4096);

  const grpc::Status one_more = client.Upload("one-more", tiny);
  EXPECT_EQ(one_more.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(one_more.error_message(),
              HasSubstr(absl::StrCat("the ", count,
                                     " weights allowed by --max_weights")));

  // A small page, and its continuation from the token.
  v1::ListWeightsRequest request;
  request.set_page_size(7);
  v1::ListWeightsResponse page;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stubs[0]->ListWeights(&context, request, &page).ok());
  }
  ASSERT_EQ(page.weights_size(), 7);
  EXPECT_EQ(page.weights(6).name(), TinyName(6));
  EXPECT_EQ(page.next_page_token(), TinyName(6));
  request.set_page_token(page.next_page_token());
  {
    grpc::ClientContext context;
    ASSERT_TRUE(stubs[0]->ListWeights(&context, request, &page).ok());
  }
  EXPECT_EQ(page.weights(0).name(), TinyName(7));

  // Every weight, once, in order, through the default pages.
  const std::vector<std::string> listed = client.List();
  ASSERT_EQ(static_cast<int64_t>(listed.size()), count);
  for (int64_t i : {int64_t{0}, count / 2, count - 1}) {
    EXPECT_THAT(listed[i], HasSubstr(absl::StrCat("\"", TinyName(i), "\"")));
  }
  EXPECT_EQ(client.Matmul(TinyName(count - 1), kTinySpec.k), first_result);

  const int64_t failed_deletes = RunOnThreads(
      count, kThreads, count / 10, "deleted", [&](int t, int64_t i) {
        grpc::ClientContext context;
        v1::DeleteWeightRequest request;
        request.set_name(TinyName(i));
        v1::DeleteWeightResponse response;
        return stubs[t]->DeleteWeight(&context, request, &response).ok();
      });
  EXPECT_EQ(failed_deletes, 0);
  EXPECT_TRUE(client.List().empty());
  std::cout << "VmRSS after deleting them all: " << (ResidentBytes(pid) >> 20)
            << " MiB" << std::endl;
  EXPECT_TRUE(client.Upload("one-more", tiny).ok());
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST(ScaleTest, MessageFarPastTheLimitIsRefusedAndTheServerServesOn) {
  const int64_t bytes = FullScale() ? 2'000'000'000 : int64_t{256} << 20;
  SCOPED_TRACE(::testing::Message() << bytes << " bytes");
  absl::StatusOr<std::unique_ptr<NibbledProcess>> server =
      StartNibbledLoggingTo(NIBBLED_PATH, "/dev/null", {});
  ASSERT_TRUE(server.ok()) << server.status();
  const WeightSpec spec = {WeightFormat::kU4b8, 1024, 64, 128};
  WeightClient client((*server)->target());
  ASSERT_TRUE(client.Upload("w", RandomQuantizedWeight(spec, 77)).ok());
  const std::string result = client.Matmul("w", spec.k);
  const int64_t rss_before = ResidentBytes((*server)->pid());

  grpc::ChannelArguments unlimited;
  unlimited.SetMaxSendMessageSize(-1);
  auto stub = v1::NibbleService::NewStub(grpc::CreateCustomChannel(
      (*server)->target(), grpc::InsecureChannelCredentials(), unlimited));
  v1::MatmulRequest request;
  request.set_weight_name("w");
  const int64_t row_bytes = spec.k * 4;
  request.set_m(bytes / row_bytes);
  request.set_dtype(ToProto(DType::kF32));
  // 1.5f in every element: what the bytes say does not matter, only their
  // count.
  request.mutable_a()->assign(bytes / row_bytes * row_bytes, '\0');
  for (int64_t i = 2; i < static_cast<int64_t>(request.a().size()); i += 4) {
    (*request.mutable_a())[i] = '\xc0';
    (*request.mutable_a())[i + 1] = '\x3f';
  }
  grpc::ClientContext context;
  v1::MatmulResponse response;
  const absl::Time start = absl::Now();
  const grpc::Status status = stub->Matmul(&context, request, &response);
  const int64_t rss_after = ResidentBytes((*server)->pid());
  std::cout << absl::StreamFormat(
                   "a %d-byte Matmul: %s in %.1f s; nibbled VmRSS %d -> %d "
                   "MiB",
                   request.ByteSizeLong(), status.error_message(),
                   absl::ToDoubleSeconds(absl::Now() - start), rss_before >> 20,
                   rss_after >> 20)
            << std::endl;
  // gRPC's words: "Received message larger than max" when the message fits
  // the receive buffers, a reset stream when it outgrows them first.
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << status.error_message();
  // What nibbled buffered is bounded by --max_receive_buffer_bytes (4 times
  // the 64 MiB message limit by default), not by the message's size.
  EXPECT_LT(rss_after - rss_before, (int64_t{4} * 64 + 64) << 20);
  EXPECT_EQ(client.Matmul("w", spec.k), result);
  EXPECT_EQ((*server)->Stop(), 0);
}

}  // namespace
}  // namespace nibble
