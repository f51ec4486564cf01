#include "server/core/checkpoint_loader.h"

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "checkpoint/import.h"
#include "server/operations/log.h"

namespace nibble::server {
namespace {

// Whether `file` holds a layer `prefix`, by the rule PlanImport uses; a
// layer with bad tensors counts, so that PlanImport names what is wrong.
bool HasLayer(const checkpoint::SafetensorsFile& file,
              absl::string_view prefix) {
  return !absl::IsNotFound(checkpoint::DetectLayout(file, prefix).status());
}

// The options for one of several files: the listed layers it has. A listed
// layer no file has is an error here, since PlanImport sees one file at a
// time.
absl::StatusOr<std::vector<ImportOptions>> OptionsPerFile(
    absl::Span<const checkpoint::SafetensorsFile> files,
    const ImportOptions& options) {
  std::vector<ImportOptions> per_file(files.size(), options);
  // One file gets the list as it is, and PlanImport's answer to a layer it
  // lacks, which suggests the layers it has.
  if (options.layers.empty() || files.size() == 1) return per_file;
  for (ImportOptions& file_options : per_file) file_options.layers.clear();
  for (const std::string& prefix : options.layers) {
    bool found = false;
    for (size_t i = 0; i < files.size(); ++i) {
      if (HasLayer(files[i], prefix)) {
        per_file[i].layers.push_back(prefix);
        found = true;
      }
    }
    if (!found) {
      std::vector<std::string> names;
      for (const checkpoint::SafetensorsFile& file : files) {
        names.push_back(file.source_name());
      }
      return absl::NotFoundError(absl::StrCat(
          "--import_layer ", prefix, " is no layer of any --import file (",
          absl::StrJoin(names, ", "), ")"));
    }
  }
  return per_file;
}

// "0.314": milliseconds are what an operator reads in a log.
std::string Seconds(absl::Duration duration) {
  return absl::StrFormat("%.3f", absl::ToDoubleSeconds(duration));
}

// OK when the layers of `checkpoints` fit in `limits` together, counted
// alone: the weights of --data_dir are checked as they load, after them.
absl::Status CheckFitsLimits(absl::Span<const PlannedCheckpoint> checkpoints,
                             const WeightStore::Limits& limits) {
  int64_t layers = 0;
  int64_t bytes = 0;
  for (const PlannedCheckpoint& checkpoint : checkpoints) {
    for (const ImportLayer& layer : checkpoint.plan.layers) {
      ++layers;
      bytes += PackedResidentBytes(layer.spec, layer.has_activation_order);
    }
  }
  if (limits.max_resident_bytes > 0 && bytes > limits.max_resident_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--import: the ", layers, " layers need ", bytes,
        " bytes resident, more than --max_weight_bytes allows (",
        limits.max_resident_bytes,
        "); raise it, or import fewer layers with --import_layer"));
  }
  if (limits.max_weights > 0 && layers > limits.max_weights) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--import: ", layers,
        " layers are more weights than "
        "--max_weights allows (",
        limits.max_weights,
        "); raise it, or import fewer layers with --import_layer"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ImportOptions> ImportOptionsFromFlags(
    std::vector<std::string> layers, absl::Span<const std::string> name_map,
    absl::string_view quantize, absl::string_view gptq_zeros) {
  ImportOptions options;
  options.layers = std::move(layers);
  // nibbled listens only once every layer is stored, so a float layer's bad
  // element may as well be found as it is quantized, saving a read of it.
  options.check_float_values = false;
  absl::StatusOr<std::vector<NameMapRule>> rules = ParseNameMap(name_map);
  if (!rules.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--import_name_map ", rules.status().message()));
  }
  options.name_map = *std::move(rules);
  absl::StatusOr<QuantizeSpec> spec = ParseQuantizeSpec(quantize);
  if (!spec.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--import_quantize ", spec.status().message()));
  }
  options.quantize = *spec;
  absl::StatusOr<checkpoint::GptqZeroConvention> zeros =
      ParseGptqZeros(gptq_zeros);
  if (!zeros.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--import_gptq_zeros ", zeros.status().message()));
  }
  options.gptq_zeros = *zeros;
  return options;
}

absl::StatusOr<std::vector<PlannedCheckpoint>> PlanCheckpoints(
    absl::Span<const std::string> paths, const ImportOptions& options,
    const WeightStore::Limits& limits) {
  std::vector<checkpoint::SafetensorsFile> files;
  for (const std::string& path : paths) {
    absl::StatusOr<checkpoint::SafetensorsFile> file =
        checkpoint::SafetensorsFile::Open(path);
    if (!file.ok()) {
      return absl::Status(file.status().code(),
                          absl::StrCat("--import: ", file.status().message()));
    }
    files.push_back(*std::move(file));
  }
  absl::StatusOr<std::vector<ImportOptions>> per_file =
      OptionsPerFile(files, options);
  if (!per_file.ok()) return per_file.status();

  std::vector<PlannedCheckpoint> checkpoints;
  // Weight name → "layer PREFIX of FILE", to find names two files share.
  std::map<std::string, std::string> layer_of_name;
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string path = files[i].source_name();
    // A file without any of the listed layers contributes nothing, where
    // PlanImport would take every layer of it.
    if (!options.layers.empty() && (*per_file)[i].layers.empty()) {
      LogInfo("import: no listed layer in file", {{"file", path}});
      continue;
    }
    const absl::Time planning_start = absl::Now();
    absl::StatusOr<ImportPlan> plan = PlanImport(files[i], (*per_file)[i]);
    if (!plan.ok()) {
      return absl::Status(
          plan.status().code(),
          absl::StrCat("--import ", path, ": ", plan.status().message()));
    }
    LogInfo("import checked",
            {{"file", path},
             {"layers", plan->layers.size()},
             {"seconds", Seconds(absl::Now() - planning_start)}});
    for (const ImportLayer& layer : plan->layers) {
      std::string where = absl::StrCat("layer ", layer.prefix, " of ", path);
      const auto [existing, inserted] =
          layer_of_name.emplace(layer.name, where);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--import: ", existing->second, " and ", where,
            " would both be weight \"", layer.name,
            "\": tell them apart with --import_name_map FROM=TO, or pick one "
            "with --import_layer"));
      }
    }
    checkpoints.push_back({std::move(files[i]), *std::move(plan)});
  }
  if (absl::Status status = CheckFitsLimits(checkpoints, limits);
      !status.ok()) {
    return status;
  }
  return checkpoints;
}

absl::StatusOr<CheckpointLoadReport> LoadCheckpoints(
    absl::Span<const PlannedCheckpoint> checkpoints,
    const InitialWeightStore& store) {
  CheckpointLoadReport report;
  const absl::Time start = absl::Now();
  for (const PlannedCheckpoint& checkpoint : checkpoints) {
    const std::string& path = checkpoint.file.source_name();
    const ImportPlan& plan = checkpoint.plan;
    LogInfo("importing",
            {{"file", path},
             {"layers", plan.layers.size()},
             {"skipped_tensors", plan.skipped.size()},
             {"float_layers_as", QuantizeSpecName(plan.quantize)}});
    absl::flat_hash_map<absl::string_view, size_t> index_of_name;
    for (size_t i = 0; i < plan.layers.size(); ++i) {
      index_of_name.emplace(plan.layers[i].name, i);
    }
    absl::Mutex log_mutex;
    absl::Time layer_start = absl::Now();
    // Logs layer `name` once stored, holding `bytes` resident, with the time
    // since the one before (layers stored at once may finish out of order);
    // the store's failure as it is.
    const auto log_stored = [&](absl::string_view name,
                                absl::StatusOr<int64_t> bytes) {
      if (!bytes.ok()) return bytes.status();
      const size_t index = index_of_name.at(name);
      const ImportLayer& layer = plan.layers[index];
      absl::MutexLock lock(&log_mutex);
      report.resident_bytes += *bytes;
      const absl::Time now = absl::Now();
      LogInfo("layer imported",
              {{"file", path},
               {"layer", absl::StrCat(index + 1, "/", plan.layers.size())},
               {"prefix", layer.prefix},
               {"name", name},
               {"from", checkpoint::CheckpointLayoutName(layer.layout)},
               {"format", WeightFormatName(layer.spec.format)},
               {"k", layer.spec.k},
               {"n", layer.spec.n},
               {"group", layer.spec.group_size},
               {"bytes", *bytes},
               {"seconds", Seconds(now - layer_start)}});
      layer_start = now;
      return absl::OkStatus();
    };
    const auto upload = [&](const QuantizedWeight& weight,
                            absl::string_view name) {
      return log_stored(name, store.canonical(weight, name));
    };
    const auto upload_packed = [&](PackedWeight packed,
                                   absl::string_view name) {
      return log_stored(name, (*store.packed)(std::move(packed), name));
    };
    const auto upload_columns = [&](const Fp4Columns& columns,
                                    absl::string_view name) {
      return log_stored(name, (*store.columns)(columns, name));
    };
    // The log lines replace ExecuteImport's text progress.
    std::ostream no_progress(nullptr);
    // Storing a canonical weight packs it and, on the GPU, copies it there:
    // two at once keep the cores busy while the next layers convert.
    constexpr int kLayersStoredAtOnce = 2;
    const ImportReport imported =
        store.packed.has_value() ? ExecuteImport(checkpoint.file, plan, upload,
                                                 upload_packed, no_progress)
        : store.columns.has_value()
            ? ExecuteImport(checkpoint.file, plan, upload, upload_columns,
                            no_progress, kLayersStoredAtOnce)
            : ExecuteImport(checkpoint.file, plan, upload, no_progress,
                            kLayersStoredAtOnce);
    report.layers += static_cast<int64_t>(imported.uploaded.size());
    report.file_bytes += imported.file_bytes;
    if (!imported.status.ok()) {
      const ImportLayer& failed = plan.layers[imported.failed_layer];
      LogError("import failed", {{"file", path},
                                 {"prefix", failed.prefix},
                                 {"name", failed.name},
                                 {"layers_stored", report.layers},
                                 {"error", imported.status.message()}});
      return absl::Status(
          imported.status.code(),
          absl::StrCat("--import ", path, ": layer \"", failed.prefix,
                       "\" as weight \"", failed.name, "\" (",
                       imported.failed_layer + 1, " of ", plan.layers.size(),
                       ") was not stored: ", imported.status.message(), " (",
                       report.layers,
                       " layers stored before it; nibbled "
                       "does not serve an import in part)"));
    }
  }
  report.elapsed = absl::Now() - start;
  const double seconds = absl::ToDoubleSeconds(report.elapsed);
  const double mb_per_second =
      seconds > 0 ? static_cast<double>(report.file_bytes) / 1e6 / seconds
                  : 0.0;
  LogInfo("import done",
          {{"files", checkpoints.size()},
           {"layers", report.layers},
           {"resident_bytes", report.resident_bytes},
           {"file_bytes", report.file_bytes},
           {"seconds", Seconds(report.elapsed)},
           {"mb_per_second", absl::StrFormat("%.1f", mb_per_second)}});
  return report;
}

}  // namespace nibble::server
