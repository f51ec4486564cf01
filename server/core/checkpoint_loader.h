// nibbled --import: the linear layers of safetensors checkpoints put in the
// weight store at start, through the path uploads take, as `nibble import`
// would upload them. Loading runs in two steps, like `nibble import`:
// PlanCheckpoints opens and checks every file, every layer and the limits
// before anything is stored, so that a bad file costs no start-up time (all
// but float layers' elements, which would cost a read of them: those are
// checked as they are quantized); LoadCheckpoints then converts and stores
// the layers, logging a line per layer and a summary.
//
// Example:
//   absl::StatusOr<ImportOptions> options =
//       ImportOptionsFromFlags({}, {"model.layers.=L"}, "u4b8:128", "v1");
//   absl::StatusOr<std::vector<PlannedCheckpoint>> checkpoints =
//       PlanCheckpoints({"model.safetensors"}, *options,
//                       {.max_resident_bytes = 1 << 30});
//   server_options.initial_weights = [&](const InitialWeightStore& store) {
//     return LoadCheckpoints(*checkpoints, store).status();
//   };
#ifndef NIBBLE_SERVER_CORE_CHECKPOINT_LOADER_H_
#define NIBBLE_SERVER_CORE_CHECKPOINT_LOADER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "checkpoint/import.h"
#include "checkpoint/safetensors.h"
#include "server/core/weight_store.h"

namespace nibble::server {

// --import_layer, --import_name_map, --import_quantize and
// --import_gptq_zeros as ImportOptions, with check_float_values off;
// INVALID_ARGUMENT naming the flag and what it takes otherwise.
absl::StatusOr<ImportOptions> ImportOptionsFromFlags(
    std::vector<std::string> layers, absl::Span<const std::string> name_map,
    absl::string_view quantize, absl::string_view gptq_zeros);

// One --import file, open, and the layers to take from it.
struct PlannedCheckpoint {
  checkpoint::SafetensorsFile file;
  ImportPlan plan;
};

// Opens and plans every file of `paths`, in order, before anything is
// stored. With options.layers, each file imports the listed layers it has,
// in the listed order. Errors name the file and, where it is one layer's
// fault, the layer: SafetensorsFile::Open's and PlanImport's codes; NOT_FOUND
// for a listed layer that no file has; INVALID_ARGUMENT for a weight name
// that layers of two files would share; RESOURCE_EXHAUSTED when the layers
// together would pass `limits`, the resident weights nibbled allows.
absl::StatusOr<std::vector<PlannedCheckpoint>> PlanCheckpoints(
    absl::Span<const std::string> paths, const ImportOptions& options,
    const WeightStore::Limits& limits);

struct CheckpointLoadReport {
  int64_t layers = 0;
  // Resident bytes of the weights stored.
  int64_t resident_bytes = 0;
  // Bytes of the files' tensors read for them.
  int64_t file_bytes = 0;
  absl::Duration elapsed;
};

// Converts and stores the layers of `checkpoints` through `store` (all but
// float and GPTQ act-order layers packed straight from the file's codes when
// it has a `packed` function; layers of a block format (HasColumnLayout) handed
// over in their column layout when it has a `columns` one), logging a line per
// layer ("layer imported") and one at the end ("import done"). The first
// failure stops it and is returned with its code, naming the file, the layer,
// the weight and how many layers were stored before it.
absl::StatusOr<CheckpointLoadReport> LoadCheckpoints(
    absl::Span<const PlannedCheckpoint> checkpoints,
    const InitialWeightStore& store);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_CHECKPOINT_LOADER_H_
