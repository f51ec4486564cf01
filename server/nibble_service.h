// The gRPC face of nibble.v1.NibbleService: it decodes requests, hands them to
// the weight store and the matmul runner, and turns their absl::Status into
// gRPC status at the edge. It holds no state of its own. Matmul and
// MatmulStream use the callback API, so that a request runs on the thread that
// received it instead of being handed to a synchronous worker.
//
// Example:
//   nibble::server::NibbleServiceImpl service(&store, &runner);
//   grpc::ServerBuilder builder;
//   builder.RegisterService(&service);
#ifndef NIBBLE_SERVER_NIBBLE_SERVICE_H_
#define NIBBLE_SERVER_NIBBLE_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "server/matmul_runner.h"
#include "server/weight_store.h"

namespace nibble::server {

class NibbleServiceImpl final
    : public v1::NibbleService::WithCallbackMethod_Matmul<
          v1::NibbleService::WithCallbackMethod_MatmulStream<
              v1::NibbleService::Service>> {
 public:
  // Both must outlive the service.
  NibbleServiceImpl(WeightStore* store, const MatmulRunner* runner);

  grpc::Status UploadWeight(grpc::ServerContext* context,
                            grpc::ServerReader<v1::UploadWeightRequest>* reader,
                            v1::WeightInfo* response) override;
  grpc::Status GetWeight(grpc::ServerContext* context,
                         const v1::GetWeightRequest* request,
                         v1::WeightInfo* response) override;
  grpc::Status ListWeights(grpc::ServerContext* context,
                           const v1::ListWeightsRequest* request,
                           v1::ListWeightsResponse* response) override;
  grpc::Status DeleteWeight(grpc::ServerContext* context,
                            const v1::DeleteWeightRequest* request,
                            v1::DeleteWeightResponse* response) override;
  grpc::ServerUnaryReactor* Matmul(grpc::CallbackServerContext* context,
                                   const v1::MatmulRequest* request,
                                   v1::MatmulResponse* response) override;
  grpc::ServerBidiReactor<v1::MatmulStreamRequest, v1::MatmulStreamResponse>*
  MatmulStream(grpc::CallbackServerContext* context) override;

 private:
  absl::Status Upload(grpc::ServerContext* context,
                      grpc::ServerReader<v1::UploadWeightRequest>* reader,
                      v1::WeightInfo* response);

  WeightStore* store_;
  const MatmulRunner* runner_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_NIBBLE_SERVICE_H_
