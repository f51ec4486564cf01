// One nibble.v1.MatmulRequest run to its MatmulResponse: the weight looked up
// in the store, the request checked and multiplied by the runner. Matmul,
// MatmulStream and the KServe ModelInfer all go through it.
//
// Example:
//   absl::StatusOr<nibble::v1::MatmulResponse> response =
//       nibble::server::RunMatmulRpc(store, runner, request);
#ifndef NIBBLE_SERVER_MATMUL_RPC_H_
#define NIBBLE_SERVER_MATMUL_RPC_H_

#include "absl/status/statusor.h"
#include "nibble/v1/nibble.pb.h"
#include "server/matmul_runner.h"
#include "server/weight_store.h"

namespace nibble::server {

// NOT_FOUND for an unknown weight, INVALID_ARGUMENT for a bad dtype or shape.
absl::StatusOr<v1::MatmulResponse> RunMatmulRpc(
    const WeightStore& store, const MatmulRunner& runner,
    const v1::MatmulRequest& request);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_MATMUL_RPC_H_
