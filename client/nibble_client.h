// A synchronous client for nibble's NibbleService and the server's standard
// health service, reporting every failure as an absl::Status that carries the
// RPC's own code and message.
//
// Example:
//   nibble::NibbleClient client(nibble::CreateChannel("localhost:50051"),
//                               /*timeout=*/absl::Seconds(30));
//   nibble::WeightSpec spec{nibble::WeightFormat::kU4b8, 4096, 4096, 128};
//   absl::StatusOr<nibble::v1::WeightInfo> info =
//       client.Upload(nibble::RandomQuantizedWeight(spec, 1), "layer0");
//   absl::StatusOr<nibble::v1::MatmulResponse> c =
//       client.Matmul("layer0", /*m=*/1, nibble::DType::kF32, a_bytes);
#ifndef NIBBLE_CLIENT_NIBBLE_CLIENT_H_
#define NIBBLE_CLIENT_NIBBLE_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/channel.h"
#include "grpcpp/client_context.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/channel_arguments.h"
#include "kernels/gemm_kernel.h"
#include "nibble/v1/nibble.grpc.pb.h"

namespace nibble {

// Upload sends each tensor in slices of at most this many bytes, well below
// gRPC's default 4 MiB message limit.
inline constexpr size_t kMaxUploadChunkBytes = size_t{1} << 20;

// Arguments for channels to a nibble server: received messages are unlimited
// in size, since an output C [M, N] easily exceeds gRPC's default 4 MiB.
grpc::ChannelArguments DefaultChannelArguments();

// How to reach a server beyond its address: TLS, and a bearer token.
struct ConnectionOptions {
  bool tls = false;
  // PEM. Empty: the system's roots.
  std::string tls_ca;
  // PEM: the client's certificate and key, for servers that require one.
  std::string tls_cert;
  std::string tls_key;
  // Sent as "authorization: Bearer TOKEN" on every call when not empty.
  std::string auth_token;
};

// A channel to `target` (HOST:PORT, or any gRPC name); it connects on first
// use. Plain unless `connection.tls`.
std::shared_ptr<grpc::Channel> CreateChannel(
    absl::string_view target, const ConnectionOptions& connection = {},
    const grpc::ChannelArguments& arguments = DefaultChannelArguments());

// `count` channels to `target`, each over a connection of its own (a local
// subchannel pool), since channels with the same target and arguments would
// otherwise share one.
std::vector<std::shared_ptr<grpc::Channel>> CreateChannels(
    absl::string_view target, const ConnectionOptions& connection, int count);

// Thread-safe: calls may run concurrently from several threads.
class NibbleClient {
 public:
  // Every call fails with DEADLINE_EXCEEDED once `timeout` has passed.
  explicit NibbleClient(std::shared_ptr<grpc::Channel> channel,
                        absl::Duration timeout = absl::InfiniteDuration());
  // Uploads go over the channel that carries the fewest at the time, other
  // calls over the first. For uploads from several threads at once: all of a
  // connection's bytes pass through one thread at either end (nibble_main's
  // kUploadsAtOnce says what more connections gained).
  NibbleClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
               absl::Duration timeout);

  // Streams the header, then qweight, scales and zeros in slices of at most
  // kMaxUploadChunkBytes. Fails with InvalidArgument before sending anything
  // when the weight does not match its spec. `gpu` keeps the weight on that
  // GPU of the server's (WeightHeader.gpu); unset lets the server place it.
  absl::StatusOr<v1::WeightInfo> Upload(const QuantizedWeight& weight,
                                        absl::string_view name,
                                        std::optional<int> gpu = std::nullopt);
  // Upload for a weight's tensors as bytes, in the canonical layout or, for
  // formats with HasColumnLayout, the column layout (CODE_LAYOUT_COLUMNS): a
  // checkpoint's bytes go out as the file holds them, without a copy or a
  // transpose. Fails with InvalidArgument before sending anything when a
  // tensor's size or the layout does not suit the spec; the server checks the
  // values.
  absl::StatusOr<v1::WeightInfo> UploadBytes(
      const WeightBytes& weight, absl::string_view name,
      std::optional<int> gpu = std::nullopt);

  // C = A · dequant(B) on the resident weight `name`; `a` holds A [m, K]
  // row-major as little-endian `dtype` elements. `precision` is the
  // lossiest treatment of A accepted; empty for the server's default.
  absl::StatusOr<v1::MatmulResponse> Matmul(
      absl::string_view name, int64_t m, DType dtype, absl::string_view a,
      std::optional<ActivationPrecision> precision = std::nullopt);

  absl::StatusOr<v1::WeightInfo> GetWeight(absl::string_view name);
  // Every weight, sorted by name, fetched page by page.
  absl::StatusOr<std::vector<v1::WeightInfo>> ListWeights();
  absl::Status DeleteWeight(absl::string_view name);

  // The serving status of `service`, or of the server as a whole when empty.
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus>
  CheckHealth(absl::string_view service = "");

 private:
  // Sets the deadline of a new call.
  void PrepareContext(grpc::ClientContext& context) const;
  // Streams `header`, then each of `tensors` in order in chunks, from the
  // caller's memory, over the least busy connection; again over another when
  // the connection failed before the header went out.
  absl::StatusOr<v1::WeightInfo> SendUpload(
      const v1::UploadWeightRequest& header,
      absl::Span<const std::pair<v1::WeightTensor, absl::string_view>> tensors);
  // SendUpload over `stub`; `header_sent` says whether the header reached
  // gRPC's transport, after which the server may have seen the upload.
  absl::StatusOr<v1::WeightInfo> SendUploadOver(
      grpc::GenericStub& stub, const v1::UploadWeightRequest& header,
      absl::Span<const std::pair<v1::WeightTensor, absl::string_view>> tensors,
      bool& header_sent);

  // The index of the upload stub with the fewest uploads in flight of those
  // not `tried` (one entry per stub, not all true), now counted as carrying
  // one more; EndUpload counts it down.
  size_t StartUpload(const std::vector<bool>& tried);
  void EndUpload(size_t stub);

  std::unique_ptr<v1::NibbleService::Stub> nibble_stub_;
  std::unique_ptr<grpc::health::v1::Health::Stub> health_stub_;
  // Upload's calls, whose chunks it serializes itself (upload_message.h):
  // one stub per channel.
  std::vector<std::unique_ptr<grpc::GenericStub>> upload_stubs_;
  absl::Mutex upload_mutex_;
  std::vector<int> uploads_in_flight_ ABSL_GUARDED_BY(upload_mutex_);
  absl::Duration timeout_;
};

}  // namespace nibble

#endif  // NIBBLE_CLIENT_NIBBLE_CLIENT_H_
