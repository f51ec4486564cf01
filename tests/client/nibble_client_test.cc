// NibbleClient against a fake server that records the connection each upload
// arrived on.
#include "client/nibble_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nibble/v1/nibble.grpc.pb.h"

namespace nibble {
namespace {

// Reads each upload whole, then holds it until `uploads_at_once` are in
// progress together, so that the client must carry them all at the same
// time; records the peer (the client's address and port) of each.
class PeerRecordingService final : public v1::NibbleService::Service {
 public:
  explicit PeerRecordingService(int uploads_at_once)
      : uploads_at_once_(uploads_at_once) {}

  grpc::Status UploadWeight(grpc::ServerContext* context,
                            grpc::ServerReader<v1::UploadWeightRequest>* reader,
                            v1::WeightInfo* response) override {
    v1::UploadWeightRequest request;
    while (reader->Read(&request)) {
      if (request.has_header()) response->set_name(request.header().name());
    }
    absl::MutexLock lock(&mutex_);
    peers_.insert(context->peer());
    ++arrived_;
    const auto all_arrived = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
      return arrived_ >= uploads_at_once_;
    };
    if (!mutex_.AwaitWithTimeout(absl::Condition(&all_arrived),
                                 absl::Seconds(20))) {
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          absl::StrCat("only ", arrived_, " of ",
                                       uploads_at_once_, " uploads arrived"));
    }
    return grpc::Status::OK;
  }

  std::set<std::string> peers() {
    absl::MutexLock lock(&mutex_);
    return peers_;
  }

 private:
  const int uploads_at_once_;
  absl::Mutex mutex_;
  int arrived_ ABSL_GUARDED_BY(mutex_) = 0;
  std::set<std::string> peers_ ABSL_GUARDED_BY(mutex_);
};

// A loopback address where nothing listens: a port just bound and let go.
std::string AddressWithoutServer() {
  const int socket_fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address = {};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  EXPECT_EQ(bind(socket_fd, reinterpret_cast<sockaddr*>(&address), length), 0);
  EXPECT_EQ(
      getsockname(socket_fd, reinterpret_cast<sockaddr*>(&address), &length),
      0);
  close(socket_fd);
  return absl::StrCat("127.0.0.1:", ntohs(address.sin_port));
}

// The distinct peers that `uploads` uploads at once, one per thread, arrived
// from, over `channels` channels of which the first `dead_channels` lead
// nowhere.
std::set<std::string> PeersOfUploadsAtOnce(int uploads, int channels,
                                           int dead_channels = 0) {
  PeerRecordingService service(uploads);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  EXPECT_NE(server, nullptr);
  if (server == nullptr) return {};
  std::vector<std::shared_ptr<grpc::Channel>> all =
      CreateChannels(AddressWithoutServer(), {}, dead_channels);
  for (const std::shared_ptr<grpc::Channel>& live : CreateChannels(
           absl::StrCat("127.0.0.1:", port), {}, channels - dead_channels)) {
    all.push_back(live);
  }
  NibbleClient client(all, absl::Seconds(30));
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 64, 16, 32}, /*seed=*/5);
  std::vector<std::thread> threads;
  for (int i = 0; i < uploads; ++i) {
    threads.emplace_back([&client, &weight, i] {
      const std::string name = absl::StrCat("w", i);
      absl::StatusOr<v1::WeightInfo> info = client.Upload(weight, name);
      ASSERT_TRUE(info.ok()) << info.status();
      EXPECT_EQ(info->name(), name);
    });
  }
  for (std::thread& thread : threads) thread.join();
  server->Shutdown();
  return service.peers();
}

TEST(NibbleClientTest, UploadsAtOnceGoOverConnectionsOfTheirOwn) {
  EXPECT_EQ(PeersOfUploadsAtOnce(/*uploads=*/4, /*channels=*/4).size(), 4u);
}

TEST(NibbleClientTest, OneChannelCarriesEveryUploadOverOneConnection) {
  EXPECT_EQ(PeersOfUploadsAtOnce(/*uploads=*/3, /*channels=*/1).size(), 1u);
}

TEST(NibbleClientTest, MoreUploadsThanChannelsShareThem) {
  EXPECT_EQ(PeersOfUploadsAtOnce(/*uploads=*/4, /*channels=*/2).size(), 2u);
}

// An upload whose connection cannot be opened goes over another, since the
// server never saw it.
TEST(NibbleClientTest, UploadsOfAConnectionThatFailsToOpenGoOverTheOthers) {
  EXPECT_EQ(PeersOfUploadsAtOnce(/*uploads=*/3, /*channels=*/3,
                                 /*dead_channels=*/1)
                .size(),
            2u);
}

TEST(NibbleClientTest, UploadFailsWhenNoConnectionOpens) {
  NibbleClient client(CreateChannels(AddressWithoutServer(), {}, 3),
                      absl::Seconds(30));
  absl::StatusOr<v1::WeightInfo> info = client.Upload(
      RandomQuantizedWeight({WeightFormat::kU4b8, 64, 16, 32}, /*seed=*/6),
      "w");
  EXPECT_EQ(info.status().code(), absl::StatusCode::kUnavailable)
      << info.status();
}

}  // namespace
}  // namespace nibble
