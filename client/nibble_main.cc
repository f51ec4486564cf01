// nibble: the command-line client of a nibble server. Run `nibble --help` for
// its subcommands.
#include <algorithm>
#include <cstdint>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/command_line.h"
#include "checkpoint/import.h"
#include "checkpoint/safetensors.h"
#include "client/connection_flags.h"
#include "client/matrix_bytes.h"
#include "client/nibble_client.h"
#include "client/proto_conversions.h"
#include "client/weight_files.h"
#include "format/reference.h"
#include "kernels/gemm_kernel.h"

ABSL_FLAG(std::string, target, "localhost:50051",
          "HOST:PORT of the nibble server");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(60),
          "deadline of each request, e.g. 30s or 5m");
ABSL_FLAG(std::optional<std::string>, name, std::nullopt,
          "weight name: 1 to 128 of [A-Za-z0-9._-], not starting with '.'");
ABSL_FLAG(std::optional<std::string>, format, std::nullopt,
          absl::StrCat("weight format: ", nibble::WeightFormatNames()));
ABSL_FLAG(
    std::optional<int64_t>, k, std::nullopt,
    "rows of B (the reduction dimension), a multiple of 8 and of --group");
ABSL_FLAG(std::optional<int64_t>, n, std::nullopt,
          "columns of B (output features)");
ABSL_FLAG(std::optional<int64_t>, group, std::nullopt,
          absl::StrCat("rows sharing a scale: 32, 64, 128, or K for one scale "
                       "per column; formats that fix it (",
                       nibble::FixedGroupSizesText(), ") may leave it out"));
ABSL_FLAG(std::optional<float>, global_scale, std::nullopt,
          absl::StrCat(nibble::WeightFormatNamesWhere(nibble::HasGlobalScale),
                       " only: the weight's fp32 global scale (default 1)"));
ABSL_FLAG(std::optional<std::string>, qweight, std::nullopt,
          "file of the packed codes, [K/8, N] uint32 little-endian");
ABSL_FLAG(std::optional<std::string>, scales, std::nullopt,
          absl::StrCat("file of the scales, [K/group, N] 16-bit little-endian: "
                       "fp16, or for ",
                       nibble::WeightFormatNamesWhere(nibble::HasEightBitScales,
                                                      " and "),
                       " the 8-bit scale code in the low byte"));
ABSL_FLAG(std::optional<std::string>, zeros, std::nullopt,
          "file of the zero points, [K/group, N] uint8 (u4 only)");
ABSL_FLAG(std::optional<uint64_t>, random, std::nullopt,
          "seed of a random weight used instead of files; for matmul --check "
          "the seed the weight was uploaded with");
ABSL_FLAG(std::optional<int>, gpu, std::nullopt,
          "the server's GPU to keep the weight on (its device ordinal, as "
          "`nibble list` shows them); unset lets the server place it");
ABSL_FLAG(std::optional<int64_t>, m, std::nullopt, "rows of A");
ABSL_FLAG(std::optional<std::string>, dtype, std::nullopt,
          "type of A and C: f32, f16 or bf16");
ABSL_FLAG(std::optional<std::string>, activation_precision, std::nullopt,
          "what the server's kernels may make of A: exact, bf16 or int8; the "
          "server's default (nibbled --activation_precision) when not given");
ABSL_FLAG(std::optional<std::string>, input, std::nullopt,
          "file of A [M, K] in --dtype, row-major little-endian");
ABSL_FLAG(std::optional<uint64_t>, random_input, std::nullopt,
          "seed of random activations, uniform in [-1, 1)");
ABSL_FLAG(std::optional<std::string>, output, std::nullopt,
          "file to write C [M, N] to, in --dtype");
ABSL_FLAG(bool, check, false,
          "compare C with a float64 reference computed locally");
ABSL_FLAG(std::optional<std::string>, file, std::nullopt,
          "safetensors checkpoint to import, or the index of a sharded one "
          "(model.safetensors.index.json)");
ABSL_FLAG(std::vector<std::string>, layer, {},
          "layer prefixes to import, comma-separated, e.g. "
          "model.layers.0.mlp.up_proj; every layer when not given");
ABSL_FLAG(std::vector<std::string>, name_map, {},
          "FROM=TO rules, comma-separated: a layer is named after its prefix "
          "with the first FROM that starts it replaced by TO");
ABSL_FLAG(std::string, quantize, "u4b8:128",
          absl::StrCat(
              "FORMAT:GROUP that float layers are quantized to: "
              "FORMAT ",
              nibble::WeightFormatNamesWhere([](nibble::WeightFormat format) {
                return nibble::FixedGroupSize(format) == 0;
              }),
              ", GROUP 32, 64, 128 or k (one scale per column); or ",
              nibble::FixedGroupSizesText(), ", whose groups are fixed"));
ABSL_FLAG(std::string, gptq_zeros, "v1",
          "how GPTQ layers store their zero points: v1 (AutoGPTQ's and "
          "GPTQModel's gptq format, zero point - 1) or v2 (GPTQModel's "
          "gptq_v2, the zero point); checkpoints do not say which");
ABSL_FLAG(std::optional<double>, tolerance, std::nullopt,
          "largest max relative error --check accepts; when not given, by "
          "what the server's kernel made of A (the reply says): 1e-4 for "
          "f32 A as sent, 1e-2 for f16 and bf16 A and for A rounded to bf16, "
          "5e-2 for A quantized to int8");

namespace nibble {
namespace {

// Every subcommand takes these, besides the flags its synopsis names.
constexpr absl::string_view kConnectionFlags[] = {
    "target",  "timeout",        "tls", "tls_ca", "tls_cert",
    "tls_key", "auth_token_file"};

int UsageError(absl::string_view message) {
  std::cerr << "nibble: " << message << "\n";
  return kExitUsage;
}

int Failure(absl::string_view message) {
  std::cerr << "nibble: " << message << "\n";
  return kExitFailure;
}

int RpcFailure(absl::string_view what, const absl::Status& status) {
  std::string hint;
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      hint =
          absl::StrCat(" (is nibbled running at ", absl::GetFlag(FLAGS_target),
                       "? point --target at it)");
      break;
    case absl::StatusCode::kDeadlineExceeded:
      hint = absl::StrCat(" (no answer within --timeout=",
                          absl::FormatDuration(absl::GetFlag(FLAGS_timeout)),
                          "; raise it if the server is only slow)");
      break;
    default:
      break;
  }
  return Failure(
      absl::StrCat(what, " failed: ", absl::StatusCodeToString(status.code()),
                   ": ", status.message(), hint));
}

template <typename T>
absl::StatusOr<T> Required(const absl::Flag<std::optional<T>>& flag) {
  std::optional<T> value = absl::GetFlag(flag);
  if (value.has_value()) return *std::move(value);
  const absl::CommandLineFlag& reflection = absl::GetFlagReflectionHandle(flag);
  return absl::InvalidArgumentError(absl::StrCat(
      "--", reflection.Name(), " is required: ", reflection.Help()));
}

std::string FormatName(v1::WeightFormat format) {
  absl::StatusOr<WeightFormat> known = client::FromProto(format);
  return known.ok() ? std::string(WeightFormatName(*known))
                    : v1::WeightFormat_Name(format);
}

void PrintWeightInfo(const v1::WeightInfo& info) {
  std::cout << "name:   " << info.name() << "\n"
            << "format: " << FormatName(info.format()) << "\n"
            << "k:      " << info.k() << "\n"
            << "n:      " << info.n() << "\n"
            << "group:  " << info.group_size() << "\n";
  if (absl::StatusOr<WeightFormat> format = client::FromProto(info.format());
      format.ok() && HasGlobalScale(*format)) {
    std::cout << "global: " << info.global_scale() << "\n";
  }
  if (info.activation_order()) {
    std::cout << "order:  activation order (GPTQ act-order; A's columns are "
                 "gathered by it before every matmul)\n";
  }
  std::cout << "bytes:  " << info.canonical_bytes() << " canonical, "
            << info.resident_bytes() << " resident";
  if (info.gpu_bytes() > 0) {
    std::cout << ", " << info.gpu_bytes() << " on GPU " << info.gpu();
  }
  std::cout << "\n";
}

absl::StatusOr<WeightSpec> WeightSpecFromFlags() {
  absl::StatusOr<std::string> format_name = Required(FLAGS_format);
  if (!format_name.ok()) return format_name.status();
  absl::StatusOr<WeightFormat> format = ParseWeightFormat(*format_name);
  if (!format.ok()) return format.status();
  absl::StatusOr<int64_t> k = Required(FLAGS_k);
  if (!k.ok()) return k.status();
  absl::StatusOr<int64_t> n = Required(FLAGS_n);
  if (!n.ok()) return n.status();
  const int64_t fixed_group = FixedGroupSize(*format);
  absl::StatusOr<int64_t> group =
      fixed_group != 0 ? absl::GetFlag(FLAGS_group).value_or(fixed_group)
                       : Required(FLAGS_group);
  if (!group.ok()) return group.status();
  const std::optional<float> global_scale = absl::GetFlag(FLAGS_global_scale);
  if (global_scale && !HasGlobalScale(*format)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--global_scale is only for --format ",
        WeightFormatNamesWhere(HasGlobalScale), ", not ", *format_name));
  }
  const WeightSpec spec{*format, *k, *n, *group, global_scale.value_or(1.0f)};
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  return spec;
}

// nullopt when none of --random, --qweight, --scales and --zeros is given.
absl::StatusOr<std::optional<WeightSource>> WeightSourceFromFlags(
    WeightFormat format) {
  return MakeWeightSource(
      format, absl::GetFlag(FLAGS_random), absl::GetFlag(FLAGS_qweight),
      absl::GetFlag(FLAGS_scales), absl::GetFlag(FLAGS_zeros));
}

int RunUpload(NibbleClient& client) {
  absl::StatusOr<std::string> name = Required(FLAGS_name);
  if (!name.ok()) return UsageError(name.status().message());
  absl::StatusOr<WeightSpec> spec = WeightSpecFromFlags();
  if (!spec.ok()) return UsageError(spec.status().message());
  absl::StatusOr<std::optional<WeightSource>> source =
      WeightSourceFromFlags(spec->format);
  if (!source.ok()) return UsageError(source.status().message());
  if (!source->has_value()) {
    return UsageError(
        absl::StrCat("give the weight's data: ", kWeightSourceHint));
  }
  absl::StatusOr<QuantizedWeight> weight = LoadWeight(*spec, **source);
  if (!weight.ok()) return Failure(weight.status().message());
  absl::StatusOr<v1::WeightInfo> info =
      client.Upload(*weight, *name, absl::GetFlag(FLAGS_gpu));
  if (!info.ok()) {
    return RpcFailure(absl::StrCat("upload of \"", *name, "\""), info.status());
  }
  PrintWeightInfo(*info);
  return kExitOk;
}

int RunMatmul(NibbleClient& client) {
  absl::StatusOr<std::string> name = Required(FLAGS_name);
  if (!name.ok()) return UsageError(name.status().message());
  absl::StatusOr<int64_t> m = Required(FLAGS_m);
  if (!m.ok()) return UsageError(m.status().message());
  if (*m <= 0)
    return UsageError(absl::StrCat("--m must be positive, got ", *m));
  absl::StatusOr<std::string> dtype_name = Required(FLAGS_dtype);
  if (!dtype_name.ok()) return UsageError(dtype_name.status().message());
  absl::StatusOr<DType> dtype = ParseDType(*dtype_name);
  if (!dtype.ok()) return UsageError(dtype.status().message());
  std::optional<ActivationPrecision> precision;
  if (const std::optional<std::string> precision_name =
          absl::GetFlag(FLAGS_activation_precision)) {
    absl::StatusOr<ActivationPrecision> parsed =
        ParseActivationPrecision(*precision_name);
    if (!parsed.ok()) {
      return UsageError(
          absl::StrCat("--activation_precision: ", parsed.status().message()));
    }
    precision = *parsed;
  }
  const std::optional<std::string> input = absl::GetFlag(FLAGS_input);
  const std::optional<uint64_t> input_seed = absl::GetFlag(FLAGS_random_input);
  if (input.has_value() == input_seed.has_value()) {
    return UsageError(
        "give the activations one way: --input FILE or --random_input SEED");
  }
  const bool check = absl::GetFlag(FLAGS_check);
  const std::optional<double> tolerance_flag = absl::GetFlag(FLAGS_tolerance);
  if (!check && (absl::GetFlag(FLAGS_random) || absl::GetFlag(FLAGS_qweight) ||
                 absl::GetFlag(FLAGS_scales) || absl::GetFlag(FLAGS_zeros) ||
                 tolerance_flag)) {
    return UsageError(
        "--random, --qweight, --scales, --zeros and --tolerance only serve "
        "--check: add --check or drop them");
  }
  if (tolerance_flag && *tolerance_flag < 0) {
    return UsageError(absl::StrCat("--tolerance must not be negative, got ",
                                   *tolerance_flag));
  }

  absl::StatusOr<v1::WeightInfo> info = client.GetWeight(*name);
  if (!info.ok()) {
    return RpcFailure(absl::StrCat("looking up weight \"", *name, "\""),
                      info.status());
  }
  absl::StatusOr<WeightSpec> spec = client::WeightSpecFromInfo(*info);
  if (!spec.ok()) {
    return Failure(absl::StrCat("the server describes weight \"", *name,
                                "\" oddly: ", spec.status().message()));
  }

  QuantizedWeight reference_weight;
  if (check && info->activation_order()) {
    return UsageError(absl::StrCat(
        "--check cannot recompute weight \"", *name,
        "\": it gathers A's columns in a GPTQ act-order before every matmul, "
        "and the files --check reads carry no such order; drop --check"));
  }
  if (check) {
    absl::StatusOr<std::optional<WeightSource>> source =
        WeightSourceFromFlags(spec->format);
    if (!source.ok()) return UsageError(source.status().message());
    if (!source->has_value()) {
      return UsageError(absl::StrCat("--check needs the data of weight \"",
                                     *name, "\" (", spec->DebugString(),
                                     "): ", kWeightSourceHint,
                                     " with the seed it was uploaded with"));
    }
    absl::StatusOr<QuantizedWeight> weight = LoadWeight(*spec, **source);
    if (!weight.ok()) return Failure(weight.status().message());
    reference_weight = *std::move(weight);
  }

  std::string a;
  if (input.has_value()) {
    absl::StatusOr<std::string> bytes =
        ReadMatrixFile(*input, *m, spec->k, *dtype);
    if (!bytes.ok()) {
      return Failure(absl::StrCat("--input: ", bytes.status().message(),
                                  " (M from --m, K of weight \"", *name,
                                  "\")"));
    }
    a = *std::move(bytes);
  } else {
    a = RandomMatrixBytes(*m, spec->k, *dtype, *input_seed);
  }

  absl::StatusOr<v1::MatmulResponse> response =
      client.Matmul(*name, *m, *dtype, a, precision);
  if (!response.ok()) {
    return RpcFailure(absl::StrCat("matmul on \"", *name, "\""),
                      response.status());
  }
  const int64_t n = spec->n;
  const auto expected_c_bytes = static_cast<size_t>(*m * n) * DTypeSize(*dtype);
  if (response->c().size() != expected_c_bytes) {
    return Failure(absl::StrCat(
        "the server returned ", response->c().size(), " bytes of C, expected ",
        expected_c_bytes, " for [", *m, ", ", n, "] ", DTypeName(*dtype)));
  }
  std::cout << "kernel:       " << response->kernel() << "\n"
            << "compute time: "
            << absl::StrFormat(
                   "%.1f us",
                   static_cast<double>(response->compute_time_ns()) / 1e3)
            << " (server)\n"
            << "output:       [" << *m << ", " << n << "] " << DTypeName(*dtype)
            << "\n";

  if (const std::optional<std::string> output = absl::GetFlag(FLAGS_output)) {
    if (absl::Status status =
            WriteMatrixFile(*output, *m, n, *dtype, response->c());
        !status.ok()) {
      return Failure(absl::StrCat("--output: ", status.message()));
    }
    std::cout << "wrote C to " << *output << "\n";
  }

  if (check) {
    const double tolerance =
        tolerance_flag.value_or(client::ErrorBoundOf(*response));
    const std::vector<double> want =
        ReferenceMatmul(MatrixBytesToDoubles(*dtype, a), *m, reference_weight);
    const std::vector<double> got = MatrixBytesToDoubles(*dtype, response->c());
    const double error = MaxRelativeError(got, want);
    std::cout << absl::StrFormat("max relative error: %.3g (tolerance %g)\n",
                                 error, tolerance);
    if (!(error <= tolerance)) {
      return Failure(absl::StrCat(
          "C differs from the float64 reference by more than the tolerance; "
          "if the weight data given to --check is not what \"",
          *name, "\" was uploaded with, fix that, else the server is wrong"));
    }
  }
  return kExitOk;
}

int RunList(NibbleClient& client) {
  absl::StatusOr<std::vector<v1::WeightInfo>> weights = client.ListWeights();
  if (!weights.ok()) return RpcFailure("listing weights", weights.status());
  std::vector<std::vector<std::string>> rows = {
      {"NAME", "FORMAT", "K", "N", "GROUP", "BYTES", "RESIDENT", "GPU_BYTES",
       "ON", "ACT_ORDER"}};
  for (const v1::WeightInfo& info : *weights) {
    rows.push_back(
        {info.name(), FormatName(info.format()), absl::StrCat(info.k()),
         absl::StrCat(info.n()), absl::StrCat(info.group_size()),
         absl::StrCat(info.canonical_bytes()),
         absl::StrCat(info.resident_bytes()), absl::StrCat(info.gpu_bytes()),
         info.gpu_bytes() > 0 ? absl::StrCat("gpu", info.gpu()) : "cpu",
         info.activation_order() ? "yes" : "no"});
  }
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const std::vector<std::string>& row : rows) {
    for (size_t i = 0; i < row.size(); ++i) {
      widths[i] = std::max(widths[i], row[i].size());
    }
  }
  for (const std::vector<std::string>& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      absl::StrAppendFormat(&line, "%-*s  ", widths[i], row[i]);
    }
    std::cout << absl::StripTrailingAsciiWhitespace(line) << "\n";
  }
  return kExitOk;
}

int RunGet(NibbleClient& client) {
  absl::StatusOr<std::string> name = Required(FLAGS_name);
  if (!name.ok()) return UsageError(name.status().message());
  absl::StatusOr<v1::WeightInfo> info = client.GetWeight(*name);
  if (!info.ok()) {
    return RpcFailure(absl::StrCat("getting weight \"", *name, "\""),
                      info.status());
  }
  PrintWeightInfo(*info);
  return kExitOk;
}

int RunDelete(NibbleClient& client) {
  absl::StatusOr<std::string> name = Required(FLAGS_name);
  if (!name.ok()) return UsageError(name.status().message());
  if (absl::Status status = client.DeleteWeight(*name); !status.ok()) {
    return RpcFailure(absl::StrCat("deleting weight \"", *name, "\""), status);
  }
  std::cout << "deleted " << *name << "\n";
  return kExitOk;
}

int RunHealth(NibbleClient& client) {
  absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus> status =
      client.CheckHealth();
  if (!status.ok()) return RpcFailure("health check", status.status());
  std::cout << grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                   *status)
            << "\n";
  return *status == grpc::health::v1::HealthCheckResponse::SERVING
             ? kExitOk
             : kExitFailure;
}

// Layers nibble import uploads at once, so that the server stores some while
// others arrive, each over a connection of its own (one connection's bytes
// pass through one thread at either end). Eight measured fastest on the
// 16-core GPU machine and cost about as much as four on 2 cores
// (docs/checkpoints.md has the import figures).
constexpr int kUploadsAtOnce = 8;

int RunImport(NibbleClient& client) {
  absl::StatusOr<std::string> path = Required(FLAGS_file);
  if (!path.ok()) return UsageError(path.status().message());
  ImportOptions options;
  options.layers = absl::GetFlag(FLAGS_layer);
  absl::StatusOr<std::vector<NameMapRule>> name_map =
      ParseNameMap(absl::GetFlag(FLAGS_name_map));
  if (!name_map.ok()) {
    return UsageError(absl::StrCat("--name_map ", name_map.status().message()));
  }
  options.name_map = *std::move(name_map);
  absl::StatusOr<QuantizeSpec> quantize =
      ParseQuantizeSpec(absl::GetFlag(FLAGS_quantize));
  if (!quantize.ok()) {
    return UsageError(absl::StrCat("--quantize ", quantize.status().message()));
  }
  options.quantize = *quantize;
  absl::StatusOr<checkpoint::GptqZeroConvention> gptq_zeros =
      ParseGptqZeros(absl::GetFlag(FLAGS_gptq_zeros));
  if (!gptq_zeros.ok()) {
    return UsageError(
        absl::StrCat("--gptq_zeros ", gptq_zeros.status().message()));
  }
  options.gptq_zeros = *gptq_zeros;

  absl::StatusOr<checkpoint::SafetensorsFile> file =
      checkpoint::SafetensorsFile::Open(*path);
  if (!file.ok()) {
    return Failure(absl::StrCat("--file: ", file.status().message()));
  }
  const absl::Time planning_start = absl::Now();
  absl::StatusOr<ImportPlan> plan = PlanImport(*file, options);
  if (!plan.ok()) {
    return Failure(
        absl::StrCat(plan.status().message(), " (nothing was uploaded)"));
  }
  if (!plan->skipped.empty()) {
    std::cerr << "skipping " << plan->skipped.size()
              << " tensors that are no layer:\n";
    for (const std::string& tensor : plan->skipped) {
      std::cerr << "  " << tensor << "\n";
    }
  }
  std::cerr << absl::StrFormat(
      "checked %d layers in %.2f s (float layers as %s); uploading\n",
      plan->layers.size(), absl::ToDoubleSeconds(absl::Now() - planning_start),
      QuantizeSpecName(plan->quantize));

  const ImportReport report = ExecuteImport(
      *file, *plan,
      [&](const QuantizedWeight& weight, absl::string_view name) {
        return client.Upload(weight, name).status();
      },
      [&](const WeightBytes& weight, absl::string_view name) {
        return client.UploadBytes(weight, name).status();
      },
      std::cerr, kUploadsAtOnce);
  const size_t total = plan->layers.size();
  if (!report.status.ok()) {
    const ImportLayer& failed = plan->layers[report.failed_layer];
    const int exit_code =
        RpcFailure(absl::StrCat("import of layer \"", failed.prefix, "\" as \"",
                                failed.name, "\" (", report.failed_layer + 1,
                                " of ", total, ")"),
                   report.status);
    std::cerr << "nibble: "
              << (report.uploaded.empty()
                      ? std::string("no layer was uploaded")
                      : absl::StrCat("uploaded: ",
                                     absl::StrJoin(report.uploaded, ", ")))
              << "; not tried: " << report.not_tried << " of " << total
              << " layers\n";
    return exit_code;
  }
  const double seconds = absl::ToDoubleSeconds(report.elapsed);
  std::cout << "imported: " << report.uploaded.size() << " layers from "
            << *path << "\n"
            << "bytes:    " << report.uploaded_bytes << " uploaded, "
            << report.file_bytes << " read\n"
            << absl::StrFormat("time:     %.2f s\n", seconds)
            << absl::StrFormat(
                   "speed:    %.1f MB/s read from the file\n",
                   seconds > 0
                       ? static_cast<double>(report.file_bytes) / 1e6 / seconds
                       : 0.0);
  return kExitOk;
}

struct Subcommand {
  absl::string_view name;
  absl::string_view summary;
  // Lines of the flags it takes besides kConnectionFlags; it accepts exactly
  // the flags named here.
  absl::string_view synopsis;
  int (*run)(NibbleClient& client);
  // Connections the client opens: more for a subcommand that makes several
  // calls at once, since one connection's bytes pass through one thread.
  int connections = 1;
};

constexpr Subcommand kSubcommands[] = {
    {"upload", "Upload a weight from its canonical files, or a random one.",
     "--name NAME --format FORMAT --k K --n N --group G\n"
     "[--global_scale S] (--qweight FILE --scales FILE [--zeros FILE] |\n"
     "--random SEED) [--gpu N]",
     RunUpload},
    {"matmul",
     "Compute C = A * dequant(B) on a resident weight; --check compares C\n"
     "with a local float64 reference, given the weight's data again.",
     "--name NAME --m M --dtype f32|f16|bf16\n"
     "[--activation_precision exact|bf16|int8]\n"
     "(--input FILE | --random_input SEED) [--output FILE]\n"
     "[--check [--tolerance X]\n"
     " (--qweight FILE --scales FILE [--zeros FILE] | --random SEED)]",
     RunMatmul},
    {"import",
     "Upload the linear layers of a safetensors checkpoint: GPTQ, AWQ,\n"
     "MXFP4 (gpt-oss) and NVFP4 (ModelOpt) layers as they are, float [N, K]\n"
     "layers quantized with --quantize. Every layer is checked before the\n"
     "first upload; GPTQ act-order (desc_act) layers keep their activation\n"
     "order, which the server applies to A before every matmul. A layer is\n"
     "a prefix P with a tensor P.qweight, P_blocks or P.blocks (MXFP4; one\n"
     "weight P.<e> per expert e), a U8 P.weight (NVFP4) or a 2-D float\n"
     "P.weight, and is named P after --name_map. FILE may be the\n"
     "model.safetensors.index.json of a sharded checkpoint.",
     "--file FILE [--layer PREFIX[,PREFIX...]]\n"
     "[--name_map FROM=TO[,FROM=TO...]] [--quantize FORMAT:GROUP]\n"
     "[--gptq_zeros v1|v2]",
     RunImport, kUploadsAtOnce},
    {"list", "Show the resident weights.", "", RunList},
    {"get", "Show one resident weight.", "--name NAME", RunGet},
    {"delete", "Delete a resident weight.", "--name NAME", RunDelete},
    {"health", "Print SERVING or NOT_SERVING; exit 0 only when SERVING.", "",
     RunHealth},
};

// The flag names "--name" in `synopsis`, in order.
std::vector<std::string> FlagsNamedIn(absl::string_view synopsis) {
  std::vector<std::string> names;
  for (absl::string_view word : absl::StrSplit(
           synopsis, absl::ByAnyChar(" \n[]()|"), absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&word, "--")) names.emplace_back(word);
  }
  return names;
}

bool Accepts(const Subcommand& subcommand, absl::string_view flag) {
  for (absl::string_view name : kConnectionFlags) {
    if (flag == name) return true;
  }
  for (const std::string& name : FlagsNamedIn(subcommand.synopsis)) {
    if (flag == name) return true;
  }
  return false;
}

std::string Indent(absl::string_view text, absl::string_view indent) {
  return absl::StrCat(indent, absl::StrJoin(absl::StrSplit(text, '\n'),
                                            absl::StrCat("\n", indent)));
}

std::string Usage() {
  std::string usage =
      "usage: nibble <subcommand> [--target HOST:PORT] [--timeout DURATION] "
      "[flags]\n"
      "              [--tls | --tls_ca FILE] [--tls_cert FILE --tls_key FILE] "
      "[--auth_token_file FILE]\n\nsubcommands:\n";
  std::vector<std::string> flag_names(std::begin(kConnectionFlags),
                                      std::end(kConnectionFlags));
  for (const Subcommand& subcommand : kSubcommands) {
    absl::StrAppend(&usage, "  ", subcommand.name, "\n",
                    Indent(subcommand.summary, "      "), "\n");
    if (!subcommand.synopsis.empty()) {
      absl::StrAppend(&usage, Indent(subcommand.synopsis, "      "), "\n");
    }
    for (std::string& name : FlagsNamedIn(subcommand.synopsis)) {
      if (std::find(flag_names.begin(), flag_names.end(), name) ==
          flag_names.end()) {
        flag_names.push_back(std::move(name));
      }
    }
  }
  const std::vector<absl::string_view> flag_views(flag_names.begin(),
                                                  flag_names.end());
  absl::StrAppend(&usage, "\nflags:\n", DescribeFlags(flag_views),
                  "\nExit status: 0 on success, 1 when a request or check "
                  "fails, 2 on usage errors.\n");
  return usage;
}

int Main(int argc, char* argv[]) {
  absl::StatusOr<CommandLine> command_line = ParseCommandLine(argc, argv);
  if (!command_line.ok()) {
    return UsageError(absl::StrCat(
        command_line.status().message(),
        "\n(`nibble --help` lists the subcommands and their flags)"));
  }
  if (command_line->help_requested) {
    std::cout << Usage();
    return kExitOk;
  }
  if (command_line->positional.empty()) {
    std::cerr << "nibble: no subcommand given\n\n" << Usage();
    return kExitUsage;
  }
  const std::string& name = command_line->positional[0];
  const Subcommand* subcommand = nullptr;
  for (const Subcommand& candidate : kSubcommands) {
    if (candidate.name == name) subcommand = &candidate;
  }
  if (subcommand == nullptr) {
    std::cerr << "nibble: unknown subcommand \"" << name << "\"\n\n" << Usage();
    return kExitUsage;
  }
  std::string usage_line = absl::StrCat("usage: nibble ", name);
  if (!subcommand->synopsis.empty()) {
    absl::StrAppend(
        &usage_line, " ",
        absl::StrReplaceAll(subcommand->synopsis, {{"\n ", " "}, {"\n", " "}}));
  }
  if (command_line->positional.size() > 1) {
    UsageError(absl::StrCat("unexpected argument \"",
                            command_line->positional[1],
                            "\": every value goes with a flag, e.g. --name "
                            "NAME"));
    std::cerr << usage_line << "\n";
    return kExitUsage;
  }
  for (const std::string& flag : command_line->flags_given) {
    if (!Accepts(*subcommand, flag)) {
      UsageError(absl::StrCat("nibble ", name, " does not take --", flag));
      std::cerr << usage_line << "\n";
      return kExitUsage;
    }
  }
  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (timeout <= absl::ZeroDuration()) {
    return UsageError(absl::StrCat("--timeout must be positive, got ",
                                   absl::FormatDuration(timeout)));
  }
  absl::StatusOr<ConnectionOptions> connection = ConnectionOptionsFromFlags();
  if (!connection.ok()) return UsageError(connection.status().message());
  NibbleClient client(CreateChannels(absl::GetFlag(FLAGS_target), *connection,
                                     subcommand->connections),
                      timeout);
  const int exit_code = subcommand->run(client);
  if (exit_code == kExitUsage) std::cerr << usage_line << "\n";
  return exit_code;
}

}  // namespace
}  // namespace nibble

int main(int argc, char* argv[]) { return nibble::Main(argc, argv); }
