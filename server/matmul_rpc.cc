#include "server/matmul_rpc.h"

#include <memory>
#include <utility>

#include "kernels/dtype.h"
#include "proto/conversions.h"

namespace nibble::server {

absl::StatusOr<v1::MatmulResponse> RunMatmulRpc(
    const WeightStore& store, const MatmulRunner& runner,
    const v1::MatmulRequest& request) {
  absl::StatusOr<DType> dtype = FromProto(request.dtype());
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      store.Get(request.weight_name());
  if (!weight.ok()) return weight.status();
  absl::StatusOr<MatmulResult> result =
      runner.Run((*weight)->packed, (*weight)->name, request.m(), request.k(),
                 *dtype, request.a());
  if (!result.ok()) return result.status();
  v1::MatmulResponse response;
  response.set_c(std::move(result->c));
  response.set_m(request.m());
  response.set_n((*weight)->packed.spec().n);
  response.set_dtype(request.dtype());
  response.set_kernel(std::move(result->kernel));
  response.set_compute_time_ns(result->compute_time_ns);
  return response;
}

}  // namespace nibble::server
