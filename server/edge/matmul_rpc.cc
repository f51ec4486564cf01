#include "server/edge/matmul_rpc.h"

#include <memory>
#include <utility>

#include "format/dtype.h"
#include "server/edge/proto_conversions.h"

namespace nibble::server {

RpcCall CallOf(grpc::CallbackServerContext* context) {
  return {.deadline = absl::FromChrono(context->deadline()),
          .is_cancelled = [context] { return context->IsCancelled(); }};
}

void SubmitMatmulRpc(
    const WeightStore& store, MatmulBatcher& batcher, v1::MatmulRequest request,
    RpcCall call,
    std::function<void(absl::StatusOr<v1::MatmulResponse>)> done) {
  absl::StatusOr<DType> dtype = FromProto(request.dtype());
  if (!dtype.ok()) return done(dtype.status());
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      store.Get(request.weight_name());
  if (!weight.ok()) return done(weight.status());
  const int64_t n = (*weight)->packed.spec().n;
  batcher.Submit({.weight = *std::move(weight),
                  .dtype = *dtype,
                  .m = request.m(),
                  .k = request.k(),
                  .a = std::move(*request.mutable_a()),
                  .deadline = call.deadline,
                  .is_cancelled = std::move(call.is_cancelled),
                  .done = [done = std::move(done), m = request.m(), n,
                           proto_dtype = request.dtype()](
                              absl::StatusOr<MatmulResult> result) {
                    if (!result.ok()) return done(result.status());
                    v1::MatmulResponse response;
                    response.set_c(std::move(result->c));
                    response.set_m(m);
                    response.set_n(n);
                    response.set_dtype(proto_dtype);
                    response.set_kernel(std::move(result->kernel));
                    response.set_compute_time_ns(result->compute_time_ns);
                    done(std::move(response));
                  }});
}

}  // namespace nibble::server
