// Fuzzes the decoding and validation of every RPC's request, without a
// network: the first byte picks the message, the rest is parsed as it, and it
// goes through the checks and conversions its handler applies, against a store
// that holds one small weight. A Matmul the checks accept really runs, on the
// CPU kernels, and its answer must have the shape the request implies.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/thread_pool.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "inference/grpc_predict_v2.pb.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/packed_weight.h"
#include "kernels/scheduler.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/matmul_runner.h"
#include "server/core/weight_store.h"
#include "server/edge/kserve_conversions.h"
#include "server/edge/proto_conversions.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace v1 = nibble::v1;
using nibble::server::ResidentWeight;

constexpr char kResidentWeightName[] = "w";

// What the handlers consult: the store, with one weight small enough that a
// fuzzed Matmul on it runs in microseconds (with an activation order, so that
// every Matmul gathers A too), and the runner the batcher uses.
class FakeServer {
 public:
  FakeServer()
      : pool_(1),
        scheduler_(nibble::cpu::CpuKernels()),
        runner_(&scheduler_, &pool_) {
    nibble::QuantizedWeight weight = nibble::RandomQuantizedWeight(
        {nibble::WeightFormat::kU4, /*k=*/64, /*n=*/8, /*group_size=*/32},
        /*seed=*/1);
    weight.activation_order = nibble::RandomActivationOrder(64, /*seed=*/1);
    absl::StatusOr<nibble::PackedWeight> packed =
        nibble::PackedWeight::Pack(weight);
    FUZZ_CHECK(packed.ok());
    FUZZ_CHECK(store_.Insert(kResidentWeightName, *std::move(packed)).ok());
  }

  // As SubmitMatmulRpc and the batcher answer it.
  absl::StatusOr<v1::MatmulResponse> Matmul(
      const v1::MatmulRequest& request) const {
    absl::StatusOr<nibble::DType> dtype =
        nibble::server::FromProto(request.dtype());
    if (!dtype.ok()) return dtype.status();
    absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
        store_.Get(request.weight_name());
    if (!weight.ok()) return weight.status();
    const nibble::WeightSpec& spec = (*weight)->packed.spec();
    absl::StatusOr<nibble::server::MatmulResult> result =
        runner_.Run((*weight)->packed, (*weight)->name, request.m(),
                    request.k(), *dtype, request.a());
    if (!result.ok()) return result.status();
    FUZZ_CHECK(request.k() == 0 || request.k() == spec.k);
    FUZZ_CHECK(request.a().size() ==
               request.m() * spec.k * nibble::DTypeSize(*dtype));
    FUZZ_CHECK(result->c.size() ==
               request.m() * spec.n * nibble::DTypeSize(*dtype));
    v1::MatmulResponse response;
    response.set_c(std::move(result->c));
    response.set_m(request.m());
    response.set_n(spec.n);
    response.set_dtype(request.dtype());
    response.set_kernel(std::move(result->kernel));
    return response;
  }

  // As KServeServiceImpl::ModelInfer answers it.
  void ModelInfer(const inference::ModelInferRequest& request) const {
    absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
        store_.Get(request.model_name());
    if (!weight.ok()) return;
    if (!nibble::server::CheckKServeModelVersion(request.model_name(),
                                                 request.model_version())
             .ok()) {
      return;
    }
    absl::StatusOr<v1::MatmulRequest> matmul =
        nibble::server::MatmulRequestFromKServe(request,
                                                (*weight)->packed.spec());
    if (!matmul.ok()) return;
    absl::StatusOr<v1::MatmulResponse> result = Matmul(*matmul);
    // MatmulRequestFromKServe checked everything the runner checks.
    FUZZ_CHECK(result.ok());
    const size_t c_bytes = result->c().size();
    inference::ModelInferResponse response;
    nibble::server::FillKServeInferResponse(request, *std::move(result),
                                            &response);
    FUZZ_CHECK(response.raw_output_contents_size() == 1);
    FUZZ_CHECK(response.raw_output_contents(0).size() == c_bytes);
  }

  // As the handlers of GetWeight, DeleteWeight and the KServe model calls
  // look a name up and describe the weight; null for none.
  std::shared_ptr<const ResidentWeight> LookUp(absl::string_view name) const {
    absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
        store_.Get(name);
    if (!weight.ok()) return nullptr;
    v1::WeightInfo info;
    nibble::server::FillWeightInfo(**weight, &info);
    FUZZ_CHECK(nibble::client::WeightSpecFromInfo(info).ok());
    return *std::move(weight);
  }

  // As ListWeights answers: a page no longer than asked for, in order.
  void List(const nibble::server::ListPageRequest& page) const {
    FUZZ_CHECK(page.size >= 1 && page.size <= nibble::server::kMaxListPageSize);
    nibble::server::WeightStore::Page listed =
        store_.List(page.after, page.size);
    FUZZ_CHECK(static_cast<int64_t>(listed.weights.size()) <= page.size);
    for (const auto& weight : listed.weights)
      FUZZ_CHECK(weight->name > page.after);
  }

 private:
  nibble::server::WeightStore store_;
  nibble::ThreadPool pool_;
  nibble::Scheduler scheduler_;
  nibble::server::MatmulRunner runner_;
};

// The messages a client sends, in the order the first byte picks them.
enum class Message {
  kMatmul,
  kMatmulStream,
  kUploadWeight,
  kGetWeight,
  kDeleteWeight,
  kModelInfer,
  kModelReady,
  kModelMetadata,
  kListWeights,
  kCount,
};

void Decode(Message message, const uint8_t* data, size_t size) {
  static const FakeServer* const server = new FakeServer;
  switch (message) {
    case Message::kMatmul: {
      v1::MatmulRequest request;
      if (request.ParseFromArray(data, size))
        server->Matmul(request).IgnoreError();
      return;
    }
    case Message::kMatmulStream: {
      v1::MatmulStreamRequest request;
      if (request.ParseFromArray(data, size)) {
        server->Matmul(request.request()).IgnoreError();
      }
      return;
    }
    case Message::kUploadWeight: {
      v1::UploadWeightRequest request;
      if (!request.ParseFromArray(data, size)) return;
      if (request.has_header()) {
        absl::StatusOr<nibble::WeightSpec> spec =
            nibble::server::FromProto(request.header());
        if (spec.ok() && spec->Validate().ok()) {
          // Validate bounds every dimension, so no byte count overflows.
          FUZZ_CHECK(spec->canonical_bytes() > 0);
        }
        absl::StatusOr<std::vector<int32_t>> order =
            nibble::server::ActivationOrderFromProto(request.header());
        if (spec.ok() && order.ok()) {
          nibble::ValidateActivationOrder(*order, spec->k).IgnoreError();
        }
        nibble::ValidateWeightName(request.header().name()).IgnoreError();
      } else if (request.has_chunk()) {
        nibble::server::TensorFromProto(request.chunk().tensor()).IgnoreError();
      }
      return;
    }
    case Message::kGetWeight: {
      v1::GetWeightRequest request;
      if (request.ParseFromArray(data, size)) server->LookUp(request.name());
      return;
    }
    case Message::kDeleteWeight: {
      v1::DeleteWeightRequest request;
      if (request.ParseFromArray(data, size)) {
        nibble::ValidateWeightName(request.name()).IgnoreError();
        server->LookUp(request.name());
      }
      return;
    }
    case Message::kModelInfer: {
      inference::ModelInferRequest request;
      if (request.ParseFromArray(data, size)) server->ModelInfer(request);
      return;
    }
    case Message::kModelReady: {
      inference::ModelReadyRequest request;
      if (request.ParseFromArray(data, size)) {
        server->LookUp(request.name());
        nibble::server::CheckKServeModelVersion(request.name(),
                                                request.version())
            .IgnoreError();
      }
      return;
    }
    case Message::kModelMetadata: {
      inference::ModelMetadataRequest request;
      if (!request.ParseFromArray(data, size)) return;
      std::shared_ptr<const ResidentWeight> weight =
          server->LookUp(request.name());
      if (weight != nullptr && nibble::server::CheckKServeModelVersion(
                                   request.name(), request.version())
                                   .ok()) {
        inference::ModelMetadataResponse response;
        nibble::server::FillKServeModelMetadata(
            request.name(), weight->packed.spec(), &response);
      }
      return;
    }
    case Message::kListWeights: {
      v1::ListWeightsRequest request;
      if (!request.ParseFromArray(data, size)) return;
      absl::StatusOr<nibble::server::ListPageRequest> page =
          nibble::server::ListPageFromProto(request);
      if (page.ok()) server->List(*page);
      return;
    }
    case Message::kCount:
      return;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto message =
      static_cast<Message>(data[0] % static_cast<int>(Message::kCount));
  Decode(message, data + 1, size - 1);
  return 0;
}
