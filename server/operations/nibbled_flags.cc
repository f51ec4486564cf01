#include "server/operations/nibbled_flags.h"

#include <unistd.h>

#include <cstdint>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "base/file_contents.h"
#include "kernels/gemm_kernel.h"
#include "kernels/tuning_table.h"
#include "server/core/checkpoint_loader.h"
#include "server/core/reply_budget.h"
#include "server/core/weight_store.h"
#include "server/operations/auth.h"
#include "server/operations/environment_flags.h"
#include "server/operations/log.h"
#include "server/operations/memory_limit.h"

ABSL_FLAG(std::string, listen, "0.0.0.0:50051",
          "Address to serve on, HOST:PORT (port 0 picks a free port) or "
          "unix:PATH, a Unix socket (the container's front reaches nibbled "
          "so).");
ABSL_FLAG(std::string, backend, "auto",
          "Where matmuls run: cuda keeps the weights resident in GPU memory "
          "and copies activations in and out per request (shapes its kernels "
          "refuse run on the CPU); cpu; auto: cuda when a GPU is present, "
          "else cpu.");
ABSL_FLAG(std::string, gpus, "all",
          "With --backend=cuda: the GPUs to keep weights on, as device "
          "ordinals (after CUDA_VISIBLE_DEVICES) separated by commas, e.g. "
          "0,1; all for every GPU nibbled sees. They must be of one kind. "
          "Each weight lives whole on one of them: the one with the most "
          "room left under --max_gpu_bytes, unless its upload names one.");
ABSL_FLAG(int, threads, 0, "Kernel threads; 0 means one per hardware thread.");
ABSL_FLAG(int, max_message_bytes, 64 << 20,
          "Largest request or response message in bytes (activations and "
          "outputs travel in one message).");
ABSL_FLAG(int64_t, max_receive_buffer_bytes, 0,
          "Most bytes gRPC may hold for requests still arriving, over all "
          "connections. gRPC checks --max_message_bytes only once a whole "
          "message has arrived, so this is what stops a client from making "
          "nibbled buffer a huge message; past it, calls are reset with "
          "RESOURCE_EXHAUSTED. 0 for 4 times --max_message_bytes; -1 for no "
          "limit.");
ABSL_FLAG(int64_t, max_held_reply_bytes, 0,
          "Most bytes of matmul replies (Matmul, MatmulStream, KServe "
          "ModelInfer) nibbled holds for clients until they are sent, over "
          "all connections; one connection may hold a quarter of it. A "
          "client that never reads its replies holds them; past the budget "
          "new matmuls are refused with RESOURCE_EXHAUSTED before they run. "
          "0 for 4 times --max_message_bytes; -1 for no limit.");
// Room for a header and a small matmul; anything smaller is a mistake.
constexpr int kMinMessageBytes = 4096;
ABSL_FLAG(int64_t, max_weight_bytes, 0,
          "Most bytes of packed weights held resident (the sum of their "
          "resident_bytes) plus those reserved by uploads in progress; an "
          "upload past it fails with RESOURCE_EXHAUSTED and changes nothing. "
          "0 for 3/4 of the memory available to nibbled (the smaller of "
          "physical memory and its cgroup's memory limit); -1 for no limit.");
ABSL_FLAG(int64_t, max_gpu_bytes, 0,
          "With --backend=cuda: most bytes of memory the weights may take on "
          "each GPU of --gpus; an upload that fits on none fails with "
          "RESOURCE_EXHAUSTED and leaves nothing on a GPU. 0 for each GPU's "
          "free memory at start less a margin for staging and workspaces; -1 "
          "for no limit.");
ABSL_FLAG(int64_t, max_weights, 100'000,
          "Most weights held resident plus uploads in progress, so that many "
          "tiny weights cannot exhaust memory the byte budget does not see; "
          "an upload past it fails with RESOURCE_EXHAUSTED. 0 for no limit.");
ABSL_FLAG(int64_t, max_request_rows, 4096,
          "Most rows of A (M) one Matmul or ModelInfer request may have; "
          "larger ones fail with INVALID_ARGUMENT.");
ABSL_FLAG(int64_t, keepalive_time_ms, 60'000,
          "How often, in milliseconds, the server pings a connection with no "
          "traffic, to find clients that have vanished.");
ABSL_FLAG(int64_t, keepalive_timeout_ms, 20'000,
          "How long, in milliseconds, the server waits for a ping's answer "
          "before closing the connection.");
ABSL_FLAG(double, upload_idle_seconds, 20.0,
          "An upload that receives no message for this many seconds is "
          "cancelled and its reserved bytes released, so that a client that "
          "sends a header and stalls cannot hold the budget.");
ABSL_FLAG(int, max_uploads_per_connection, 8,
          "Most uploads in progress on one client connection; further ones "
          "fail with RESOURCE_EXHAUSTED. 0 for no limit.");
ABSL_FLAG(int, max_concurrent_streams, 256,
          "Most calls in flight on one client connection; further calls wait "
          "in the client.");

ABSL_FLAG(double, shutdown_grace_seconds, 5.0,
          "On SIGTERM or SIGINT, how long in-flight calls may take to finish.");
ABSL_FLAG(double, drain_delay_seconds, 0.0,
          "On SIGTERM or SIGINT, how long to keep serving with health "
          "NOT_SERVING before refusing new calls, so that load balancers "
          "(e.g. Kubernetes endpoints) stop routing here first.");
ABSL_FLAG(int64_t, max_batch_rows, 64,
          "Most rows of A that concurrent Matmul requests on one weight are "
          "merged into per kernel call; 1 turns merging off.");
// Zero: requests that queue while a batch runs still merge, so batching costs
// no latency at low load and needs no tuning to help at high load.
ABSL_FLAG(int64_t, max_batch_delay_us, 0,
          "How long, in microseconds, a queued Matmul may wait for others on "
          "its weight to join its batch; 0 never waits.");
ABSL_FLAG(std::string, activation_precision, "bf16",
          "What kernels may make of A for requests that name no "
          "activation_precision: exact (fp32 products), bf16 (rounded to bf16 "
          "where that is faster) or int8 (also quantized to int8 per row and "
          "group on CPUs with AVX-512 VNNI; see docs/performance.md).");
ABSL_FLAG(int64_t, max_queue_rows, 4096,
          "Most rows of A that may wait per weight; requests beyond it fail "
          "with RESOURCE_EXHAUSTED.");
// Longer waits would be a misconfiguration: clients time out first.
constexpr int64_t kMaxBatchDelayUs = 1'000'000;
// gRPC takes milliseconds as int; a day is longer than any useful interval.
constexpr int64_t kMaxKeepaliveMs = 24 * 3600 * 1000;

ABSL_FLAG(std::string, data_dir, "",
          "Directory where every uploaded weight is written before the upload "
          "is acknowledged, and reloaded from at start; created when "
          "missing. Empty keeps weights in memory only.");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of the server's certificate chain; serve TLS (with "
          "--tls_key)");
ABSL_FLAG(std::string, tls_key, "", "PEM file of the server's private key");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM file of the CA that must have signed every client's "
          "certificate (mutual TLS; needs --tls_cert)");
ABSL_FLAG(std::string, auth_token_file, "",
          "file of bearer tokens, one per line; every call must carry one "
          "(\"authorization: Bearer TOKEN\"), except health checks, "
          "reflection and KServe ServerLive/ServerReady");
ABSL_FLAG(bool, auth_writes_only, false,
          "with --auth_token_file: only calls that change weights "
          "(UploadWeight, DeleteWeight) need a token, and everyone may run "
          "matmuls and list weights; a matmul with A = I returns the weight, "
          "so use this only where every client may read every weight");
ABSL_FLAG(bool, auth_all, false,
          "deprecated, does nothing: every call needs a token by default now "
          "(see --auth_writes_only); accepted so that existing command lines "
          "keep working");
ABSL_FLAG(std::string, metrics_listen, "",
          "HOST:PORT to serve Prometheus metrics on, at GET /metrics (e.g. "
          "0.0.0.0:9464; port 0 picks a free one); empty for none.");
ABSL_FLAG(std::string, metrics_auth_token_file, "",
          "with --metrics_listen: file of bearer tokens, one per line; GET "
          "/metrics must carry one (\"Authorization: Bearer TOKEN\"), since "
          "the metrics name every weight. Empty: scrapes need none.");
ABSL_FLAG(bool, metrics_weight_labels, true,
          "whether /metrics has series labelled with weight names "
          "(nibble_weight_bytes, nibble_weight_queued_rows, and "
          "nibble_matmul_requests_total and nibble_matmul_rows_total per "
          "weight); false leaves them out, the two counters summed over all "
          "weights, so that scrapes neither learn the names nor grow with "
          "the weights");
ABSL_FLAG(std::string, tuning_table, "",
          "Which kernel variant wins for which shape: a file written by "
          "nibble-bench --write_tuning_table (CPU) or nibble-gpu-bench "
          "--write_tuning_table (GPU); empty for the built-in table.");
ABSL_FLAG(std::vector<std::string>, import, {},
          "safetensors checkpoints, comma-separated (a sharded one by its "
          "*.index.json), whose linear layers are put in the weight store at "
          "start, before nibbled listens, as "
          "`nibble import` would upload them; any failure stops nibbled "
          "(exit 1) before it listens. With --data_dir they are written "
          "there like uploads, replacing weights of the same name.");
ABSL_FLAG(std::vector<std::string>, import_layer, {},
          "with --import: layer prefixes to import, comma-separated, e.g. "
          "model.layers.0.mlp.up_proj; every layer when not given");
ABSL_FLAG(std::vector<std::string>, import_name_map, {},
          "with --import: FROM=TO rules, comma-separated: a layer is named "
          "after its prefix with the first FROM that starts it replaced by "
          "TO");
ABSL_FLAG(std::string, import_quantize, "u4b8:128",
          "with --import: FORMAT:GROUP that float layers are quantized to: "
          "FORMAT fp4, u4b8 or u4, GROUP 32, 64, 128 or k (one scale per "
          "column)");
ABSL_FLAG(std::string, import_gptq_zeros, "v1",
          "with --import: how GPTQ layers store their zero points, as "
          "nibble import --gptq_zeros: v1 (zero point - 1) or v2 (gptq_v2, "
          "the zero point)");

namespace nibble::server {
namespace {

// What --max_receive_buffer_bytes and --max_held_reply_bytes of 0 stand
// for, in messages of --max_message_bytes.
constexpr int kMessagesPerBuffer = 4;

// The bytes a buffer flag's value stands for: 0 for kMessagesPerBuffer
// messages of `max_message_bytes`, -1 for no limit (0).
int64_t BufferBytesFromFlag(int64_t flag, int max_message_bytes) {
  if (flag == 0) return int64_t{kMessagesPerBuffer} * max_message_bytes;
  return flag == -1 ? 0 : flag;
}

// --gpus: device ordinals, or empty for "all".
absl::StatusOr<std::vector<int>> ParseGpus(absl::string_view text) {
  std::vector<int> gpus;
  if (text == "all") return gpus;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int gpu = 0;
    if (!absl::SimpleAtoi(part, &gpu) || gpu < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus=", text, ": \"", part,
          "\" is not a device ordinal: give ordinals separated by commas, "
          "e.g. 0,1, or all"));
    }
    gpus.push_back(gpu);
  }
  return gpus;
}

// NIBBLED_FLAG_NAME in the environment sets --flag_name.
constexpr absl::string_view kEnvironmentPrefix = "NIBBLED_";

// Every flag value that cannot work, one line each; empty when all can.
std::string FlagProblems() {
  std::string problems;
  if (absl::StatusOr<Backend> backend =
          ParseBackend(absl::GetFlag(FLAGS_backend));
      !backend.ok()) {
    absl::StrAppend(&problems, "--backend: ", backend.status().message(), "\n");
  }
  if (absl::StatusOr<std::vector<int>> gpus =
          ParseGpus(absl::GetFlag(FLAGS_gpus));
      !gpus.ok()) {
    absl::StrAppend(&problems, gpus.status().message(), "\n");
  }
  if (absl::GetFlag(FLAGS_threads) < 0) {
    absl::StrAppend(&problems, "--threads=", absl::GetFlag(FLAGS_threads),
                    " is negative: give a count, or 0 for one per core\n");
  }
  if (absl::GetFlag(FLAGS_max_message_bytes) < kMinMessageBytes) {
    absl::StrAppend(
        &problems,
        "--max_message_bytes=", absl::GetFlag(FLAGS_max_message_bytes),
        " is below the least useful size, ", kMinMessageBytes, "\n");
  }
  const int64_t max_batch_rows = absl::GetFlag(FLAGS_max_batch_rows);
  if (max_batch_rows < 1) {
    absl::StrAppend(&problems, "--max_batch_rows=", max_batch_rows,
                    " must be at least 1 (1 turns merging off)\n");
  }
  const int64_t max_batch_delay_us = absl::GetFlag(FLAGS_max_batch_delay_us);
  if (max_batch_delay_us < 0 || max_batch_delay_us > kMaxBatchDelayUs) {
    absl::StrAppend(&problems, "--max_batch_delay_us=", max_batch_delay_us,
                    " must be from 0 to ", kMaxBatchDelayUs, "\n");
  }
  if (absl::StatusOr<ActivationPrecision> precision =
          ParseActivationPrecision(absl::GetFlag(FLAGS_activation_precision));
      !precision.ok()) {
    absl::StrAppend(&problems,
                    "--activation_precision: ", precision.status().message(),
                    "\n");
  }
  if (absl::GetFlag(FLAGS_max_queue_rows) < max_batch_rows) {
    absl::StrAppend(&problems,
                    "--max_queue_rows=", absl::GetFlag(FLAGS_max_queue_rows),
                    " must be at least --max_batch_rows=", max_batch_rows,
                    ", or batches could never fill\n");
  }
  if (!(absl::GetFlag(FLAGS_shutdown_grace_seconds) >= 0)) {
    absl::StrAppend(&problems,
                    "--shutdown_grace_seconds must not be negative\n");
  }
  if (!(absl::GetFlag(FLAGS_drain_delay_seconds) >= 0)) {
    absl::StrAppend(&problems, "--drain_delay_seconds must not be negative\n");
  }
  if (absl::GetFlag(FLAGS_max_weight_bytes) < -1) {
    absl::StrAppend(
        &problems, "--max_weight_bytes=", absl::GetFlag(FLAGS_max_weight_bytes),
        " is below -1: give a byte count, 0 for 3/4 of the "
        "available memory, or -1 for no limit\n");
  }
  const int64_t max_receive_buffer_bytes =
      absl::GetFlag(FLAGS_max_receive_buffer_bytes);
  if (max_receive_buffer_bytes < -1 ||
      (max_receive_buffer_bytes > 0 &&
       max_receive_buffer_bytes < absl::GetFlag(FLAGS_max_message_bytes))) {
    absl::StrAppend(&problems,
                    "--max_receive_buffer_bytes=", max_receive_buffer_bytes,
                    " must be at least --max_message_bytes, 0 for ",
                    kMessagesPerBuffer, " times that, or -1 for no limit\n");
  }
  const int64_t max_held_reply_bytes =
      absl::GetFlag(FLAGS_max_held_reply_bytes);
  if (max_held_reply_bytes < -1 ||
      (max_held_reply_bytes > 0 &&
       max_held_reply_bytes < int64_t{ReplyBudget::kConnectionShares} *
                                  absl::GetFlag(FLAGS_max_message_bytes))) {
    absl::StrAppend(
        &problems, "--max_held_reply_bytes=", max_held_reply_bytes,
        " must be at least ", ReplyBudget::kConnectionShares,
        " times --max_message_bytes (a connection may hold 1/",
        ReplyBudget::kConnectionShares,
        " of it, and at least one reply of the largest size), 0 for ",
        kMessagesPerBuffer, " times, or -1 for no limit\n");
  }
  if (absl::GetFlag(FLAGS_max_gpu_bytes) < -1) {
    absl::StrAppend(
        &problems, "--max_gpu_bytes=", absl::GetFlag(FLAGS_max_gpu_bytes),
        " is negative: give bytes, 0 for the GPU's free memory less a margin, "
        "or -1 for no limit\n");
  }
  if (absl::GetFlag(FLAGS_max_weights) < 0) {
    absl::StrAppend(&problems,
                    "--max_weights=", absl::GetFlag(FLAGS_max_weights),
                    " is negative: give a count, or 0 for no limit\n");
  }
  const int64_t max_request_rows = absl::GetFlag(FLAGS_max_request_rows);
  if (max_request_rows < 1) {
    absl::StrAppend(&problems, "--max_request_rows=", max_request_rows,
                    " must be at least 1\n");
  } else if (max_request_rows > absl::GetFlag(FLAGS_max_queue_rows)) {
    absl::StrAppend(&problems, "--max_request_rows=", max_request_rows,
                    " must be at most --max_queue_rows=",
                    absl::GetFlag(FLAGS_max_queue_rows),
                    ", or such requests could never be queued\n");
  }
  for (auto [flag, value] :
       {std::pair("keepalive_time_ms", absl::GetFlag(FLAGS_keepalive_time_ms)),
        std::pair("keepalive_timeout_ms",
                  absl::GetFlag(FLAGS_keepalive_timeout_ms))}) {
    if (value < 1 || value > kMaxKeepaliveMs) {
      absl::StrAppend(&problems, "--", flag, "=", value, " must be from 1 to ",
                      kMaxKeepaliveMs, "\n");
    }
  }
  if (absl::GetFlag(FLAGS_max_uploads_per_connection) < 0) {
    absl::StrAppend(&problems, "--max_uploads_per_connection=",
                    absl::GetFlag(FLAGS_max_uploads_per_connection),
                    " is negative: give a count, or 0 for no limit\n");
  }
  if (!(absl::GetFlag(FLAGS_upload_idle_seconds) > 0)) {
    absl::StrAppend(&problems, "--upload_idle_seconds must be positive\n");
  }
  if (absl::GetFlag(FLAGS_max_concurrent_streams) < 1) {
    absl::StrAppend(&problems, "--max_concurrent_streams=",
                    absl::GetFlag(FLAGS_max_concurrent_streams),
                    " must be at least 1\n");
  }
  if (absl::GetFlag(FLAGS_import).empty()) {
    for (auto [flag, given] :
         {std::pair("import_layer", !absl::GetFlag(FLAGS_import_layer).empty()),
          std::pair("import_name_map",
                    !absl::GetFlag(FLAGS_import_name_map).empty())}) {
      if (given) {
        absl::StrAppend(&problems, "--", flag,
                        " applies to --import: add the checkpoint files\n");
      }
    }
  }
  return problems;
}

// --max_weight_bytes resolved: the budget in bytes, 0 for none, and where it
// came from, for the startup log.
struct WeightBudget {
  int64_t bytes = 0;
  std::string source;
};

WeightBudget WeightBudgetFromFlag(int64_t flag) {
  if (flag == -1) return {.bytes = 0, .source = "--max_weight_bytes=-1"};
  if (flag > 0) return {.bytes = flag, .source = "--max_weight_bytes"};
  const MemoryLimit available =
      AvailableMemory(PhysicalMemoryBytes(), "/sys/fs/cgroup");
  // Without a known size there is nothing to take a share of.
  if (available.bytes <= 0) {
    return {.bytes = 0, .source = "unknown memory size"};
  }
  // A quarter stays for requests, gRPC's buffers and uploads being packed.
  return {.bytes = available.bytes / 4 * 3,
          .source = absl::StrCat("3/4 of ", available.source)};
}

// The PEM file named by --`flag`; empty when the flag is.
absl::StatusOr<std::string> ReadPemFlag(absl::string_view flag,
                                        const std::string& path) {
  if (path.empty()) return std::string();
  absl::StatusOr<std::string> contents = ReadFileContents(path);
  if (!contents.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, ": ", contents.status().message()));
  }
  return *std::move(contents);
}

// --metrics_auth_token_file into `options`; InvalidArgument saying what to
// fix.
absl::Status MetricsAuthFromFlags(ServerOptions& options) {
  const std::string tokens = absl::GetFlag(FLAGS_metrics_auth_token_file);
  if (tokens.empty()) return absl::OkStatus();
  if (absl::GetFlag(FLAGS_metrics_listen).empty()) {
    return absl::InvalidArgumentError(
        "--metrics_auth_token_file applies to --metrics_listen: add it");
  }
  absl::StatusOr<TokenAuthenticator> auth =
      TokenAuthenticator::FromFile(tokens, /*all_rpcs=*/true);
  if (!auth.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics_auth_token_file: ", auth.status().message()));
  }
  options.metrics_auth = *std::move(auth);
  return absl::OkStatus();
}

// --tls_* and --auth_* into `options`; InvalidArgument saying what to fix.
absl::Status SecurityFromFlags(ServerOptions& options) {
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const std::string client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  if (cert.empty() != key.empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: give both or neither");
  }
  if (!client_ca.empty() && cert.empty()) {
    return absl::InvalidArgumentError(
        "--tls_client_ca needs TLS: add --tls_cert and --tls_key");
  }
  for (auto [flag, path, pem] :
       {std::tuple("tls_cert", &cert, &options.tls_cert),
        std::tuple("tls_key", &key, &options.tls_key),
        std::tuple("tls_client_ca", &client_ca, &options.tls_client_ca)}) {
    absl::StatusOr<std::string> contents = ReadPemFlag(flag, *path);
    if (!contents.ok()) return contents.status();
    *pem = *std::move(contents);
  }
  const std::string tokens = absl::GetFlag(FLAGS_auth_token_file);
  const bool auth_all = absl::GetFlag(FLAGS_auth_all);
  const bool writes_only = absl::GetFlag(FLAGS_auth_writes_only);
  if (tokens.empty()) {
    for (auto [flag, given] : {std::pair("auth_all", auth_all),
                               std::pair("auth_writes_only", writes_only)}) {
      if (given) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag, " needs the tokens: add --auth_token_file"));
      }
    }
    return absl::OkStatus();
  }
  if (auth_all && writes_only) {
    return absl::InvalidArgumentError(
        "--auth_all and --auth_writes_only contradict each other: drop "
        "--auth_all, which is the default now");
  }
  if (auth_all) {
    LogWarning(
        "--auth_all is deprecated and does nothing: every call needs "
        "a token by default now; drop the flag");
  }
  absl::StatusOr<TokenAuthenticator> auth =
      TokenAuthenticator::FromFile(tokens, /*all_rpcs=*/!writes_only);
  if (!auth.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file: ", auth.status().message()));
  }
  options.auth = *std::move(auth);
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseNibbledFlags(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Serves 4-bit quantized matrix multiplication over gRPC.\n"
      "Usage: nibbled [--listen=HOST:PORT] [--threads=N] ...\n"
      "Each flag can also come from the environment: NIBBLED_DATA_DIR=/x is "
      "--data_dir=/x; the command line wins.");
  // absl's --help, --helpshort and --helppackage list the flags of the file
  // named after the program (nibbled_main.cc), which these are not in.
  const auto in_this_file = [](absl::string_view file) {
    return absl::EndsWith(file, "nibbled_flags.cc");
  };
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_helpshort_flags = in_this_file;
  usage_config.contains_help_flags = in_this_file;
  usage_config.contains_helppackage_flags = in_this_file;
  absl::SetFlagsUsageConfig(usage_config);
  if (absl::Status status = ApplyEnvironmentFlags(kEnvironmentPrefix, environ);
      !status.ok()) {
    return status;
  }
  // absl's own parser, not nibble::ParseCommandLine, which would change what
  // nibbled prints and returns for a bad flag (exit 2, other messages), for
  // --help and for -h.
  absl::ParseCommandLine(argc, argv);
  return absl::OkStatus();
}

absl::StatusOr<NibbledOptions> OptionsFromFlags() {
  if (std::string problem = FlagProblems(); !problem.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(problem, "(`nibbled --help` lists the flags)"));
  }
  NibbledOptions options;
  options.tuning_table_path = absl::GetFlag(FLAGS_tuning_table);
  if (!options.tuning_table_path.empty()) {
    absl::StatusOr<TuningTable> loaded =
        TuningTable::Load(options.tuning_table_path);
    if (!loaded.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tuning_table: ", loaded.status().message()));
    }
    options.server.tuning_table = *std::move(loaded);
  }
  absl::StatusOr<ImportOptions> import = ImportOptionsFromFlags(
      absl::GetFlag(FLAGS_import_layer), absl::GetFlag(FLAGS_import_name_map),
      absl::GetFlag(FLAGS_import_quantize),
      absl::GetFlag(FLAGS_import_gptq_zeros));
  if (!import.ok()) return import.status();
  options.import = *std::move(import);
  options.import_paths = absl::GetFlag(FLAGS_import);

  ServerOptions& server = options.server;
  server.backend = *ParseBackend(absl::GetFlag(FLAGS_backend));
  server.gpus = *ParseGpus(absl::GetFlag(FLAGS_gpus));
  server.listen = absl::GetFlag(FLAGS_listen);
  server.threads = absl::GetFlag(FLAGS_threads);
  server.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  server.max_receive_buffer_bytes = BufferBytesFromFlag(
      absl::GetFlag(FLAGS_max_receive_buffer_bytes), server.max_message_bytes);
  server.max_held_reply_bytes = BufferBytesFromFlag(
      absl::GetFlag(FLAGS_max_held_reply_bytes), server.max_message_bytes);
  const WeightBudget budget =
      WeightBudgetFromFlag(absl::GetFlag(FLAGS_max_weight_bytes));
  server.max_weight_bytes = budget.bytes;
  options.max_weight_bytes_source = budget.source;
  server.max_weights = absl::GetFlag(FLAGS_max_weights);
  server.max_gpu_bytes = absl::GetFlag(FLAGS_max_gpu_bytes);
  server.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  server.metrics_weight_labels = absl::GetFlag(FLAGS_metrics_weight_labels);
  server.keepalive_time =
      absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_time_ms));
  server.keepalive_timeout =
      absl::Milliseconds(absl::GetFlag(FLAGS_keepalive_timeout_ms));
  server.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  server.uploads = {
      .idle = absl::Seconds(absl::GetFlag(FLAGS_upload_idle_seconds)),
      .max_per_connection = absl::GetFlag(FLAGS_max_uploads_per_connection)};
  server.batching = {
      .max_batch_rows = absl::GetFlag(FLAGS_max_batch_rows),
      .max_batch_delay =
          absl::Microseconds(absl::GetFlag(FLAGS_max_batch_delay_us)),
      .max_queue_rows = absl::GetFlag(FLAGS_max_queue_rows),
      .max_request_rows = absl::GetFlag(FLAGS_max_request_rows),
      .activation_precision =
          *ParseActivationPrecision(absl::GetFlag(FLAGS_activation_precision))};
  server.data_dir = absl::GetFlag(FLAGS_data_dir);
  if (absl::Status status = SecurityFromFlags(server); !status.ok()) {
    return status;
  }
  if (absl::Status status = MetricsAuthFromFlags(server); !status.ok()) {
    return status;
  }
  options.drain_delay_seconds = absl::GetFlag(FLAGS_drain_delay_seconds);
  options.shutdown_grace_seconds = absl::GetFlag(FLAGS_shutdown_grace_seconds);
  return options;
}

}  // namespace nibble::server
