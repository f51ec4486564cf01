// nibble-gpu-bench: times nibble's CUDA kernels on a grid of shapes, weight
// formats and M against the GPU's copy bandwidth, and writes JSON lines with
// the fields nibble-bench writes. bench/kernels/cuda/torch_baselines.py times
// PyTorch on the same grid and bench/kernels/cuda/gpu_report.py compares the
// two; `make gpu-check` (deploy/gpu-check.sh) runs all three.
//
// How a point is timed: every variant (fused, double_buffered, striped) runs
// kWarmupLaunches launches, the first variant more, for kSteadyStateWarmup at
// the least (the variants follow each other back to back, so all are timed
// at the clocks the GPU holds under sustained load); then, behind a host
// function that holds the stream until they are all enqueued, --repeats
// launches back to back with an event before each and one after the last. A
// launch's time is the time between its two events and the point's time is the
// median, so it is the GPU's time alone, however long the CPU takes to enqueue
// a launch; that CPU time per LaunchGemm call is reported beside it
// (launch_us), since a kernel shorter than it cannot be served back to back. An
// event between two launches costs time of its own (~2 us on an H100) and keeps
// the second from starting before the first ends, which a chain of matmuls (a
// model's layers) does not: the same number of launches is then timed again in
// chains of kChainLaunches with events only around each chain, and
// chain_us is the median over the chains of their mean time per launch.
// In a chain, each launch but the first of a chain starts before the
// previous one ends (programmatic dependent launch,
// cuda::DeviceGemm::overlap_previous_kernel) unless --serialize_launches.
// Each launch reads the next of several uploaded copies of the weight,
// together more than 4x the L2, so that the weight comes from HBM as a
// served weight does. The scheduler's
// pick (the built-in tuning table's rules for this GPU, else
// cuda::PreferredVariant) is the row marked "pick", not timed again. Each
// weight is also read alone by a kernel that does nothing else
// (weight_read.h), timed the same way: read_us, its stream without a
// matmul's math.
// --write_tuning_table writes the fastest variant at each point as tuning
// rules of this GPU's level (bench/kernels/tuning_writer.h).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "base/command_line.h"
#include "base/thread_pool.h"
#include "bench/kernels/bench_flags.h"
#include "bench/kernels/cuda/weight_read.h"
#include "bench/kernels/report.h"
#include "bench/kernels/timing.h"
#include "bench/kernels/tuning_writer.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_gemm.h"
#include "kernels/gemm_kernel.h"
#include "kernels/scheduler.h"
#include "kernels/tuning_table.h"

// Strings, empty when not given, so that ApplyValueFlag parses and checks
// them and names the flag in every mistake. Usage() says more.
ABSL_FLAG(std::string, m, "", "rows of A, comma-separated");
ABSL_FLAG(std::string, shapes, "", "weight shapes, KxN,...");
ABSL_FLAG(std::string, formats, "", "weight formats at group sizes, F:G,...");
ABSL_FLAG(std::string, repeats, "", "timed launches per variant and point");
ABSL_FLAG(bool, quick, false, "two shapes, 50 repeats");
ABSL_FLAG(bool, latency, false,
          "also time the pick one call at a time through the backend");
ABSL_FLAG(bool, serialize_launches, false,
          "in chains, no launch starts before the previous one ends");
ABSL_FLAG(std::string, json, "",
          "JSON lines into this file; alone, JSON lines on stdout");
ABSL_FLAG(std::string, write_tuning_table, "",
          "the fastest variant at each point, as tuning rules, into this file");

namespace nibble::bench {
namespace {

constexpr int kWarmupLaunches = 20;
// How long the first variant of each point runs before it is timed, at the
// least: until the GPU holds the clocks it keeps under sustained load. An
// H100 80GB HBM3 reached its 700 W cap about 1 s into back-to-back launches
// at M = 1024 on 8192 x 28672, and its SM clock settled from 1980 MHz to
// 1260-1575 MHz by 2 s (2026-11-27); cuBLAS there took 645 us per matmul in
// a short run and 730 us sustained. torch_baselines.py warms its baselines up
// as long, so that both are timed in the same state.
constexpr absl::Duration kSteadyStateWarmup = absl::Seconds(2);
// Launches per chain for chain_us (the file comment).
constexpr int kChainLaunches = 20;
// How long the gate holds a stream at most: far more than enqueueing the
// timed launches takes, unless the launch queue fills up first.
constexpr absl::Duration kGateTimeout = absl::Seconds(2);
constexpr int kMaxRepeats = 100000;
// The bandwidth copy moves 1 GiB each way: 2 GiB of traffic per copy.
constexpr int64_t kCopyBufferBytes = int64_t{1} << 30;
constexpr int kCopyRepeats = 10;
// Weight copies rotated through: their bytes together exceed this many L2s.
constexpr int64_t kL2Multiple = 4;
// Weights smaller than kL2Multiple x L2 / kMaxCopies get fewer copies than
// that and may be partly served from L2.
constexpr int64_t kMaxCopies = 64;

struct GpuBenchOptions {
  std::vector<int64_t> ms = {1, 16, 64, 256, 1024};
  std::vector<Shape> shapes = {
      {4096, 14336}, {14336, 4096}, {8192, 28672}, {28672, 8192}};
  // u4b8 at 128, and the FP4-coded formats side by side at group 32 or
  // their fixed group.
  std::vector<WeightKind> weights = [] {
    std::vector<WeightKind> kinds = {{WeightFormat::kU4b8, 128}};
    for (WeightFormat format : kAllWeightFormats) {
      if (!HasFp4Codes(format)) continue;
      const int64_t fixed = FixedGroupSize(format);
      kinds.push_back({format, fixed != 0 ? fixed : 32});
    }
    return kinds;
  }();
  int repeats = 200;
  bool latency = false;
  bool serialize_launches = false;
  bool json_to_stdout = false;
  std::string json_path;
  std::string write_tuning_table_path;
  bool help = false;
};

std::string Usage() {
  return absl::StrFormat(
      R"(nibble-gpu-bench: times nibble's CUDA kernels (every variant, and the
scheduler's pick) on a grid of problems against the GPU's device-to-device
copy bandwidth. bench/kernels/cuda/torch_baselines.py times the PyTorch baselines.

Usage: nibble-gpu-bench [flags]
  --m=1,16,64,256,1024  rows of A
  --shapes=KxN,...      weight shapes (default 4096x14336,14336x4096,
                        8192x28672,28672x8192); K a multiple of 64
  --formats=F:G,...     weight formats at group sizes (default u4b8:128 and
                        every FP4-coded format at 32 or its fixed group; a
                        format alone means its fixed group (%s), else 128)
  --repeats=N           timed launches per variant and point (default 200)
  --quick               shapes 4096x14336 and 14336x4096, 50 repeats (the
                        flags above still apply)
  --serialize_launches  in chains, no launch starts before the previous one
                        ends (by default, on compute capability 9.0 and up,
                        each starts streaming its weight as the previous
                        ends)
  --latency             also run the scheduler's pick one call at a time
                        through the backend, as nibbled runs a lone request:
                        A and C in host memory, copied through pinned
                        staging; the time of a call and its stages
  --json                JSON lines on stdout instead of the table
  --json=FILE           JSON lines into FILE, the table on stdout
  --write_tuning_table=FILE
                        the fastest variant at each point as tuning rules of
                        this GPU's level and SM count, for nibbled
                        --tuning_table (docs/performance.md)
  --help                this text
)",
      FixedGroupSizesText());
}

absl::StatusOr<std::vector<int64_t>> ParseMs(absl::string_view value) {
  absl::StatusOr<std::vector<int64_t>> ms =
      ParsePositiveList("m", value, kMaxDimension);
  if (!ms.ok()) return ms.status();
  std::sort(ms->begin(), ms->end());
  ms->erase(std::unique(ms->begin(), ms->end()), ms->end());
  return ms;
}

absl::StatusOr<std::vector<WeightKind>> ParseFormats(absl::string_view value) {
  std::vector<WeightKind> weights;
  for (absl::string_view item : absl::StrSplit(value, ',')) {
    const std::vector<absl::string_view> parts = absl::StrSplit(item, ':');
    absl::StatusOr<WeightFormat> format = ParseWeightFormat(parts[0]);
    if (parts.size() > 2 || !format.ok()) {
      return FlagError("formats", value,
                       absl::StrCat("\"", item,
                                    "\" is not FORMAT or FORMAT:GROUP with "
                                    "FORMAT ",
                                    WeightFormatNames(), " (e.g. u4b8:128)"));
    }
    const int64_t fixed_group = FixedGroupSize(*format);
    WeightKind kind{.format = *format,
                    .group_size = fixed_group != 0 ? fixed_group : 128};
    if (parts.size() == 2) {
      absl::StatusOr<int64_t> group =
          ParsePositive("formats", value, parts[1], kMaxDimension);
      if (!group.ok()) return group.status();
      kind.group_size = *group;
    }
    weights.push_back(kind);
  }
  return weights;
}

absl::Status ApplyValueFlag(absl::string_view name, absl::string_view value,
                            GpuBenchOptions& options) {
  if (name == "m") {
    absl::StatusOr<std::vector<int64_t>> ms = ParseMs(value);
    if (!ms.ok()) return ms.status();
    options.ms = *std::move(ms);
  } else if (name == "shapes") {
    absl::StatusOr<std::vector<Shape>> shapes = ParseShapes(value);
    if (!shapes.ok()) return shapes.status();
    options.shapes = *std::move(shapes);
  } else if (name == "formats") {
    absl::StatusOr<std::vector<WeightKind>> weights = ParseFormats(value);
    if (!weights.ok()) return weights.status();
    options.weights = *std::move(weights);
  } else {
    absl::StatusOr<int64_t> repeats =
        ParsePositive(name, value, value, kMaxRepeats);
    if (!repeats.ok()) return repeats.status();
    options.repeats = static_cast<int>(*repeats);
  }
  return absl::OkStatus();
}

// Sets the flags from argv and reads them. --quick is applied first, wherever
// it is, so that the other flags change its grid.
absl::StatusOr<GpuBenchOptions> ParseOptions(int argc, char* argv[]) {
  // The flags ApplyValueFlag reads; the others given are --quick, --json,
  // --write_tuning_table and absl's own (--flagfile, ...).
  static const std::vector<absl::string_view> kValueFlags = {
      "m", "shapes", "formats", "repeats"};
  absl::StatusOr<CommandLine> command_line = ParseBenchFlags(
      "nibble-gpu-bench", argc, argv,
      {.optional_value_flags = {"json"},
       .switch_flags = {"quick", "latency", "serialize_launches"}});
  if (!command_line.ok()) return command_line.status();
  GpuBenchOptions options;
  if (command_line->help_requested) {
    options.help = true;
    return options;
  }
  if (absl::GetFlag(FLAGS_quick)) {
    options.shapes = {{4096, 14336}, {14336, 4096}};
    options.repeats = 50;
  }
  options.latency = absl::GetFlag(FLAGS_latency);
  options.serialize_launches = absl::GetFlag(FLAGS_serialize_launches);
  for (const std::string& name : command_line->flags_given) {
    if (name == "json") {
      options.json_path = absl::GetFlag(FLAGS_json);
      options.json_to_stdout = options.json_path.empty();
    } else if (name == "write_tuning_table") {
      options.write_tuning_table_path = absl::GetFlag(FLAGS_write_tuning_table);
    } else if (std::find(kValueFlags.begin(), kValueFlags.end(), name) !=
               kValueFlags.end()) {
      const std::string value = absl::FindCommandLineFlag(name)->CurrentValue();
      if (absl::Status status = ApplyValueFlag(name, value, options);
          !status.ok()) {
        return status;
      }
    }
  }
  for (const Shape& shape : options.shapes) {
    for (const WeightKind& kind : options.weights) {
      const WeightSpec spec{kind.format, shape.k, shape.n, kind.group_size};
      absl::Status status = spec.Validate();
      if (status.ok() && !cuda::SupportsSpec(spec)) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "the CUDA kernels need K to be a multiple of ", cuda::kKMultiple));
      }
      if (!status.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot time ", spec.DebugString(), ": ",
                         status.message(), "; change --shapes or --formats"));
      }
    }
  }
  return options;
}

// Device memory, events and streams, released with their owner. The release
// calls' errors cannot be returned from a destructor; a failed launch or copy
// before them has already been reported.
struct DeviceFree {
  void operator()(void* memory) const { cudaFree(memory); }
};
struct EventDestroy {
  void operator()(cudaEvent_t event) const { cudaEventDestroy(event); }
};
struct StreamDestroy {
  void operator()(cudaStream_t stream) const { cudaStreamDestroy(stream); }
};
using DeviceMemory = std::unique_ptr<void, DeviceFree>;
using Event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDestroy>;
using Stream =
    std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDestroy>;

std::string Mebibytes(int64_t bytes) {
  return absl::StrFormat("%.0f MiB", static_cast<double>(bytes) / (1 << 20));
}

absl::StatusOr<DeviceMemory> Allocate(int64_t bytes, absl::string_view what) {
  void* data = nullptr;
  if (absl::Status status = cuda::CudaStatus(
          cudaMalloc(&data, bytes),
          absl::StrCat("cudaMalloc of ", Mebibytes(bytes), " for ", what));
      !status.ok()) {
    return status;
  }
  return DeviceMemory(data);
}

absl::StatusOr<std::vector<Event>> CreateEvents(int count) {
  std::vector<Event> events;
  for (int i = 0; i < count; ++i) {
    cudaEvent_t event = nullptr;
    if (absl::Status status =
            cuda::CudaStatus(cudaEventCreate(&event), "cudaEventCreate");
        !status.ok()) {
      return status;
    }
    events.emplace_back(event);
  }
  return events;
}

// Holds a stream from Close() until Open() or kGateTimeout, so that what is
// enqueued meanwhile runs back to back however slowly the CPU enqueues it.
// The destructor opens the gate and waits for the stream, so that the host
// function never outlives it.
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : stream_(stream) {}
  ~StreamGate() {
    Open();
    cudaStreamSynchronize(stream_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  absl::Status Close() {
    return cuda::CudaStatus(cudaLaunchHostFunc(stream_, &Wait, this),
                            "cudaLaunchHostFunc");
  }
  void Open() {
    if (!open_.HasBeenNotified()) open_.Notify();
  }
  // Whether the gate opened by its timeout; known once the stream passed it.
  bool timed_out() const { return timed_out_.load(); }

 private:
  static void Wait(void* gate) {
    StreamGate& self = *static_cast<StreamGate*>(gate);
    self.timed_out_ = !self.open_.WaitForNotificationWithTimeout(kGateTimeout);
  }

  cudaStream_t stream_;
  absl::Notification open_;
  std::atomic<bool> timed_out_ = false;
};

// Once the stream has passed `gate`: a warning where the gate opened by its
// timeout before `launches` launches were enqueued behind it.
void WarnIfGapped(const StreamGate& gate, int launches) {
  if (!gate.timed_out()) return;
  absl::FPrintF(stderr,
                "nibble-gpu-bench: warning: enqueueing %d launches took over "
                "%s (a full launch queue?), so some ran with gaps; use a "
                "smaller --repeats\n",
                launches, absl::FormatDuration(kGateTimeout));
}

struct LaunchTiming {
  Timing timing;         // GPU time per launch
  double launch_us = 0;  // CPU time per launch call
  double chain_us = 0;   // GPU time per launch in chains
};

// The GPU times between consecutive events of `events`, in us.
absl::StatusOr<std::vector<double>> EventIntervals(
    std::span<const Event> events) {
  std::vector<double> micros;
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    float millis = 0;
    if (absl::Status status = cuda::CudaStatus(
            cudaEventElapsedTime(&millis, events[i].get(), events[i + 1].get()),
            "cudaEventElapsedTime");
        !status.ok()) {
      return status;
    }
    micros.push_back(millis * 1e3);
  }
  return micros;
}

// kWarmupLaunches calls of launch(0, false), launch(1, false), ..., more
// until `warmup` has passed, then
// events.size() - 1 timed ones behind a StreamGate, each between two
// consecutive events, then as many in chains of kChainLaunches (at least
// one chain), as the file comment says; launch(i, true) for those that
// follow another launch in their chain.
absl::StatusOr<LaunchTiming> TimeLaunches(
    absl::FunctionRef<absl::Status(int, bool)> launch,
    std::span<const Event> events, cudaStream_t stream, absl::Duration warmup) {
  const absl::Time warm_until = absl::Now() + warmup;
  int warmup_launches = 0;
  do {
    for (int i = 0; i < kWarmupLaunches; ++i) {
      if (absl::Status status = launch(warmup_launches++, false);
          !status.ok()) {
        return status;
      }
    }
    if (absl::Status status = cuda::CudaStatus(cudaStreamSynchronize(stream),
                                               "running the warm-up launches");
        !status.ok()) {
      return status;
    }
  } while (absl::Now() < warm_until);
  const int timed = static_cast<int>(events.size()) - 1;
  StreamGate gate(stream);
  if (absl::Status status = gate.Close(); !status.ok()) return status;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < timed; ++i) {
    if (absl::Status status = cuda::CudaStatus(
            cudaEventRecord(events[i].get(), stream), "cudaEventRecord");
        !status.ok()) {
      return status;
    }
    if (absl::Status status = launch(kWarmupLaunches + i, false);
        !status.ok()) {
      return status;
    }
  }
  const double enqueue_us = std::chrono::duration<double, std::micro>(
                                std::chrono::steady_clock::now() - start)
                                .count();
  gate.Open();
  if (absl::Status status = cuda::CudaStatus(
          cudaEventRecord(events[timed].get(), stream), "cudaEventRecord");
      !status.ok()) {
    return status;
  }
  if (absl::Status status =
          cuda::CudaStatus(cudaEventSynchronize(events[timed].get()),
                           "running the timed launches");
      !status.ok()) {
    return status;
  }
  WarnIfGapped(gate, timed);
  absl::StatusOr<std::vector<double>> micros = EventIntervals(events);
  if (!micros.ok()) return micros.status();
  LaunchTiming timing{
      .timing = {.median_us = Median(*std::move(micros)), .calls = timed},
      .launch_us = enqueue_us / timed};

  const int chains = std::max(1, timed / kChainLaunches);
  StreamGate chain_gate(stream);
  if (absl::Status status = chain_gate.Close(); !status.ok()) return status;
  for (int chain = 0; chain <= chains; ++chain) {
    if (absl::Status status = cuda::CudaStatus(
            cudaEventRecord(events[chain].get(), stream), "cudaEventRecord");
        !status.ok()) {
      return status;
    }
    for (int i = 0; chain < chains && i < kChainLaunches; ++i) {
      if (absl::Status status = launch(
              kWarmupLaunches + timed + chain * kChainLaunches + i, i > 0);
          !status.ok()) {
        return status;
      }
    }
  }
  chain_gate.Open();
  if (absl::Status status =
          cuda::CudaStatus(cudaEventSynchronize(events[chains].get()),
                           "running the chains of launches");
      !status.ok()) {
    return status;
  }
  WarnIfGapped(chain_gate, chains * kChainLaunches);
  absl::StatusOr<std::vector<double>> chain_micros =
      EventIntervals(events.first(chains + 1));
  if (!chain_micros.ok()) return chain_micros.status();
  timing.chain_us = Median(*std::move(chain_micros)) / kChainLaunches;
  return timing;
}

struct CopyBandwidth {
  double gbps = 0;
  int64_t bytes = 0;  // moved by one copy: read plus written
  Timing timing;
};

// The device-to-device copy of kCopyBufferBytes, timed like a kernel.
absl::StatusOr<CopyBandwidth> MeasureCopyBandwidth(
    std::span<const Event> events, cudaStream_t stream) {
  absl::StatusOr<DeviceMemory> source =
      Allocate(kCopyBufferBytes, "the bandwidth copy's source");
  if (!source.ok()) return source.status();
  absl::StatusOr<DeviceMemory> destination =
      Allocate(kCopyBufferBytes, "the bandwidth copy's destination");
  if (!destination.ok()) return destination.status();
  if (absl::Status status = cuda::CudaStatus(
          cudaMemsetAsync(source->get(), 0x5a, kCopyBufferBytes, stream),
          "cudaMemsetAsync of the bandwidth copy's source");
      !status.ok()) {
    return status;
  }
  absl::StatusOr<LaunchTiming> timing = TimeLaunches(
      [&](int, bool) {
        return cuda::CudaStatus(
            cudaMemcpyAsync(destination->get(), source->get(), kCopyBufferBytes,
                            cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync device to device");
      },
      events.first(kCopyRepeats + 1), stream, absl::ZeroDuration());
  if (!timing.ok()) return timing.status();
  CopyBandwidth copy{.bytes = 2 * kCopyBufferBytes, .timing = timing->timing};
  copy.gbps = GigabytesPerSecond(copy.bytes, copy.timing.median_us);
  return copy;
}

struct VariantTiming {
  KernelVariant variant = KernelVariant::kFused;
  std::string kernel;  // e.g. "fused_u4b8_sm90"
  Timing timing;
  double launch_us = 0;  // CPU time of one LaunchGemm call
  double chain_us = 0;   // GPU time per launch in chains
};

// The pick run one call at a time through its GemmKernel::Run, with A and C
// in host memory (--latency): the wall time of a call, and the means of its
// stages (cuda::RunStages) per call.
struct BackendLatency {
  Timing timing;  // of a whole call
  double p90_us = 0;
  double gather_us = 0;
  double device_us = 0;  // copy in, kernel, copy out, until the wait returns
  double scatter_us = 0;
};

// Everything timed at one grid point.
struct GpuPoint {
  WeightKind weight;
  Shape shape;
  int64_t m = 0;
  // What one launch reads of the weight: the spec's codes, scales and zeros.
  int64_t weight_bytes = 0;
  double read_us = 0;        // the weight read alone (WeightReader), per launch
  double read_chain_us = 0;  // the same in chains
  KernelVariant pick = KernelVariant::kFused;
  std::vector<VariantTiming> variants;  // in kFastVariants order
  std::optional<BackendLatency> latency;
};

std::string PointName(const WeightKind& kind, const Shape& shape, int64_t m) {
  return absl::StrCat(WeightFormatName(kind.format), " g", kind.group_size, " ",
                      shape.k, "x", shape.n, " m=", m);
}

// Random fp16 values in [-1, 1) on the device.
absl::StatusOr<DeviceMemory> RandomHalves(int64_t count, uint64_t seed,
                                          absl::string_view what) {
  const std::vector<float> values = RandomFloats(count, seed);
  std::vector<uint16_t> halves(count);
  ConvertFromFloat(DType::kF16, values.data(), count, halves.data());
  absl::StatusOr<DeviceMemory> memory = Allocate(count * 2, what);
  if (!memory.ok()) return memory.status();
  if (absl::Status status =
          cuda::CudaStatus(cudaMemcpy(memory->get(), halves.data(), count * 2,
                                      cudaMemcpyHostToDevice),
                           absl::StrCat("cudaMemcpy of ", what));
      !status.ok()) {
    return status;
  }
  return memory;
}

// Uploads one random weight, then copies it on the GPU as many times as
// kL2Multiple x L2 takes (the host layout is the slow part).
absl::StatusOr<std::vector<std::unique_ptr<cuda::CudaWeight>>> UploadCopies(
    const WeightSpec& spec, const cuda::DeviceInfo& device) {
  absl::StatusOr<std::unique_ptr<cuda::CudaWeight>> first =
      cuda::CudaWeight::Upload(RandomQuantizedWeight(spec, /*seed=*/1));
  if (!first.ok()) return first.status();
  const int64_t wanted = std::min(
      kMaxCopies, kL2Multiple * device.l2_bytes / (*first)->device_bytes() + 1);
  std::vector<std::unique_ptr<cuda::CudaWeight>> copies;
  copies.push_back(*std::move(first));
  while (static_cast<int64_t>(copies.size()) < wanted) {
    absl::StatusOr<std::unique_ptr<cuda::CudaWeight>> copy = copies[0]->Copy();
    if (!copy.ok()) return copy.status();
    copies.push_back(*std::move(copy));
  }
  return copies;
}

// Runs `kernel` on `problem` one call at a time, after kWarmupLaunches, as
// nibbled runs a lone request: host A in f16, host C, `pool` for the copies
// into and out of the pinned staging; call i on weights[i % size], so that
// the weight is not in L2, as for the launch timings.
absl::StatusOr<BackendLatency> TimeBackendCalls(
    const GemmKernel& kernel, const GemmProblem& problem,
    std::span<const std::unique_ptr<cuda::CudaWeight>> weights, int repeats,
    ThreadPool& pool) {
  const std::vector<float> values =
      RandomFloats(problem.m * problem.k, /*seed=*/3);
  std::vector<uint16_t> a(values.size());
  ConvertFromFloat(DType::kF16, values.data(), values.size(), a.data());
  std::vector<uint16_t> c(problem.m * problem.n);
  const auto run = [&](int call) {
    const GemmOperands operands{.a = a.data(),
                                .c = c.data(),
                                .device = weights[call % weights.size()].get()};
    return kernel.Run(problem, operands, pool);
  };
  for (int call = 0; call < kWarmupLaunches; ++call) {
    if (absl::Status status = run(call); !status.ok()) return status;
  }
  const cuda::RunStageTimes before = cuda::RunStages();
  std::vector<double> micros;
  for (int call = 0; call < repeats; ++call) {
    const auto start = std::chrono::steady_clock::now();
    if (absl::Status status = run(call); !status.ok()) return status;
    micros.push_back(std::chrono::duration<double, std::micro>(
                         std::chrono::steady_clock::now() - start)
                         .count());
  }
  const cuda::RunStageTimes after = cuda::RunStages();
  const auto per_call = [&](int64_t before_ns, int64_t after_ns) {
    return static_cast<double>(after_ns - before_ns) / 1e3 / repeats;
  };
  BackendLatency latency;
  latency.p90_us = Percentile(micros, 0.9);
  latency.timing = {.median_us = Median(std::move(micros)), .calls = repeats};
  latency.gather_us = per_call(before.gather_ns, after.gather_ns);
  latency.device_us = per_call(before.device_ns, after.device_ns);
  latency.scatter_us = per_call(before.scatter_ns, after.scatter_ns);
  return latency;
}

// Times every variant at each M on one weight.
absl::Status TimeWeight(const WeightKind& kind, const Shape& shape,
                        const GpuBenchOptions& options,
                        const cuda::DeviceInfo& device,
                        const Scheduler& scheduler, const WeightReader& reader,
                        std::span<const Event> events,
                        cuda::Workspace& workspace, cudaStream_t stream,
                        ThreadPool& pool, int& step, int total,
                        std::vector<GpuPoint>& points) {
  const WeightSpec spec{kind.format, shape.k, shape.n, kind.group_size};
  absl::StatusOr<std::vector<std::unique_ptr<cuda::CudaWeight>>> copies =
      UploadCopies(spec, device);
  if (!copies.ok()) return copies.status();
  absl::FPrintF(stderr, "uploaded %d copies of %s (%s)\n", copies->size(),
                spec.DebugString(),
                Mebibytes(copies->size() * (*copies)[0]->device_bytes()));
  const int64_t max_m = options.ms.back();
  absl::StatusOr<DeviceMemory> a =
      RandomHalves(max_m * shape.k, /*seed=*/2, "A");
  if (!a.ok()) return a.status();
  absl::StatusOr<DeviceMemory> c = Allocate(max_m * shape.n * 2, "C");
  if (!c.ok()) return c.status();
  absl::StatusOr<LaunchTiming> read = TimeLaunches(
      [&](int launch, bool chained) {
        return reader.Launch(*(*copies)[launch % copies->size()], stream,
                             chained && !options.serialize_launches);
      },
      events.first(options.repeats + 1), stream, absl::ZeroDuration());
  if (!read.ok()) {
    return absl::Status(read.status().code(),
                        absl::StrCat("reading ", spec.DebugString(),
                                     " alone: ", read.status().message()));
  }

  for (const int64_t m : options.ms) {
    absl::FPrintF(stderr, "[%d/%d] %s\n", ++step, total,
                  PointName(kind, shape, m));
    const GemmProblem problem{.m = m,
                              .n = shape.n,
                              .k = shape.k,
                              .format = kind.format,
                              .group_size = kind.group_size,
                              .dtype = DType::kF16};
    GpuPoint point{.weight = kind,
                   .shape = shape,
                   .m = m,
                   .weight_bytes = spec.qweight_bytes() + spec.scales_bytes() +
                                   spec.zeros_bytes(),
                   .read_us = read->timing.median_us,
                   .read_chain_us = read->chain_us,
                   .pick = scheduler.PreferredVariant(problem),
                   .variants = {},
                   .latency = std::nullopt};
    for (const KernelVariant variant : kFastVariants) {
      absl::StatusOr<LaunchTiming> timing = TimeLaunches(
          [&](int launch, bool chained) {
            const cuda::DeviceGemm gemm{
                .variant = variant,
                .b = (*copies)[launch % copies->size()].get(),
                .a = a->get(),
                .a_dtype = DType::kF16,
                .c = c->get(),
                .c_dtype = DType::kF16,
                .m = m,
                .overlap_previous_kernel =
                    chained && !options.serialize_launches};
            return cuda::LaunchGemm(gemm, workspace, stream);
          },
          events.first(options.repeats + 1), stream,
          variant == kFastVariants[0] ? kSteadyStateWarmup
                                      : absl::ZeroDuration());
      if (!timing.ok()) {
        return absl::Status(timing.status().code(),
                            absl::StrCat(KernelVariantName(variant), " at ",
                                         PointName(kind, shape, m), ": ",
                                         timing.status().message()));
      }
      point.variants.push_back(
          {.variant = variant,
           .kernel = cuda::LaunchedKernelName(variant, kind.format,
                                              device.compute_capability, m),
           .timing = timing->timing,
           .launch_us = timing->launch_us,
           .chain_us = timing->chain_us});
    }
    if (options.latency) {
      absl::StatusOr<const GemmKernel*> kernel = scheduler.Pick(problem);
      if (!kernel.ok()) return kernel.status();
      absl::StatusOr<BackendLatency> latency =
          TimeBackendCalls(**kernel, problem, *copies, options.repeats, pool);
      if (!latency.ok()) {
        return absl::Status(
            latency.status().code(),
            absl::StrCat("one call at a time at ", PointName(kind, shape, m),
                         ": ", latency.status().message()));
      }
      point.latency = *latency;
    }
    points.push_back(std::move(point));
  }
  return absl::OkStatus();
}

std::string Number(double value) { return absl::StrFormat("%.3f", value); }

// The time reading `bytes` takes at the copy bandwidth. The copy's GB/s counts
// the bytes it reads and those it writes, since HBM shares its throughput
// between the two; a matmul of small M reads the weight and writes next to
// nothing, so at best it reads at that rate, and only the weight's bytes
// (codes, scales, zero points) count.
double FloorMicros(int64_t bytes, double copy_gbps) {
  return static_cast<double>(bytes) / (copy_gbps * 1e3);
}

std::string MachineJson(const cuda::DeviceInfo& device,
                        const CopyBandwidth& copy,
                        const GpuBenchOptions& options) {
  return absl::StrCat(
      "{\"machine\":{\"gpu\":", JsonString(device.name),
      ",\"sms\":", device.sm_count,
      ",\"compute_capability\":", device.compute_capability,
      ",\"l2_bytes\":", device.l2_bytes,
      ",\"memory_bytes\":", device.memory_bytes,
      ",\"copy_gbps\":", Number(copy.gbps), ",\"copy_bytes\":", copy.bytes,
      ",\"repeats\":", options.repeats, ",\"warmup\":", kWarmupLaunches,
      ",\"steady_state_warmup_s\":",
      Number(absl::ToDoubleSeconds(kSteadyStateWarmup)),
      ",\"chain_launches\":", kChainLaunches,
      ",\"overlap_launches\":", options.serialize_launches ? "false" : "true",
      "}}");
}

// With --latency, the fields of the pick's row that say what a call through
// the backend took (BackendLatency); empty otherwise.
std::string LatencyJson(const GpuPoint& point, const VariantTiming& variant) {
  if (!point.latency.has_value() || variant.variant != point.pick) return "";
  const BackendLatency& latency = *point.latency;
  return absl::StrCat(",\"call_us\":", Number(latency.timing.median_us),
                      ",\"call_p90_us\":", Number(latency.p90_us),
                      ",\"gather_us\":", Number(latency.gather_us),
                      ",\"device_us\":", Number(latency.device_us),
                      ",\"scatter_us\":", Number(latency.scatter_us));
}

// nibble-bench's row fields, in its order, then chain_us and read_chain_us,
// then with --latency LatencyJson's; "threads" is the GPU's SM count.
std::string RowJson(const GpuPoint& point, const VariantTiming& variant,
                    const cuda::DeviceInfo& device, double copy_gbps) {
  const double us = variant.timing.median_us;
  const int64_t bytes = point.weight_bytes;
  return absl::StrCat(
      "{\"backend\":\"cuda\",\"kernel\":", JsonString(variant.kernel),
      ",\"variant\":", JsonString(KernelVariantName(variant.variant)),
      ",\"pick\":", variant.variant == point.pick ? "true" : "false",
      ",\"format\":", JsonString(WeightFormatName(point.weight.format)),
      ",\"group\":", point.weight.group_size, ",\"m\":", point.m,
      ",\"k\":", point.shape.k, ",\"n\":", point.shape.n,
      ",\"threads\":", device.sm_count, ",\"median_us\":", Number(us),
      ",\"calls\":", variant.timing.calls, ",\"bytes\":", bytes,
      ",\"gbps\":", Number(GigabytesPerSecond(bytes, us)),
      ",\"gflops\":", Number(Gflops(point.m, point.shape.k, point.shape.n, us)),
      ",\"floor_us\":", Number(FloorMicros(bytes, copy_gbps)),
      ",\"read_us\":", Number(point.read_us),
      ",\"chain_us\":", Number(variant.chain_us),
      ",\"read_chain_us\":", Number(point.read_chain_us),
      LatencyJson(point, variant), "}");
}

// The points as nibble-bench's, for its tuning table writer; threads is the
// GPU's SM count.
std::vector<PointResult> AsPointResults(const std::vector<GpuPoint>& points,
                                        const cuda::DeviceInfo& device) {
  std::vector<PointResult> results;
  for (const GpuPoint& point : points) {
    PointResult result;
    result.weight = point.weight;
    result.shape = point.shape;
    result.m = point.m;
    result.threads = device.sm_count;
    result.weight_bytes = point.weight_bytes;
    for (const VariantTiming& variant : point.variants) {
      result.kernels.push_back({.kernel = variant.kernel,
                                .variant = variant.variant,
                                .pick = variant.variant == point.pick,
                                .timing = variant.timing});
    }
    results.push_back(std::move(result));
  }
  return results;
}

std::string FormatTable(const std::vector<GpuPoint>& points,
                        const cuda::DeviceInfo& device,
                        const CopyBandwidth& copy, int repeats,
                        bool serialize_launches) {
  std::string table = absl::StrFormat(
      "nibble-gpu-bench: %s, %d SMs, sm_%d, L2 %s\n", device.name,
      device.sm_count, device.compute_capability, Mebibytes(device.l2_bytes));
  absl::StrAppendFormat(
      &table,
      "  copy bandwidth  %.1f GB/s (device-to-device copy of %s, bytes read "
      "plus written, median of %d)\n",
      copy.gbps, Mebibytes(copy.bytes / 2), copy.timing.calls);
  absl::StrAppendFormat(
      &table,
      "  times           median us of %d back-to-back launches after %d "
      "warm-up (%s of them at least before each point, for the clocks of "
      "sustained load), fp16 A and C, weight copies rotated out of L2; GPU "
      "time, the launches queued before the first starts; in chains, "
      "launches %s\n",
      repeats, kWarmupLaunches, absl::FormatDuration(kSteadyStateWarmup),
      serialize_launches ? "serialized (--serialize_launches)"
                         : "start before the previous one ends where the "
                           "GPU allows");
  absl::StrAppendFormat(
      &table,
      "  columns         pick = the scheduler's variant, x best = its time "
      "over the best, x floor = its time over floor_us (weight bytes at the "
      "copy bandwidth), x read = its time over read_us (a kernel that only "
      "reads the weight, timed the same way); chain_us = the pick's time per "
      "launch in chains of %d with no events between, ch/floor = it over "
      "floor_us; GB/s and TFLOP/s of the pick; cpu_us = the CPU time "
      "of one LaunchGemm call for the pick, * where it exceeds the GPU "
      "time\n\n",
      kChainLaunches);
  absl::StrAppendFormat(&table,
                        "%-6s %5s %5s %6s %6s %9s %9s %9s  %-16s %6s %9s "
                        "%7s %8s %7s %8s %8s %7s %7s %8s\n",
                        "format", "group", "m", "k", "n", "fused", "dbl_buf",
                        "striped", "pick", "x best", "floor_us", "x floor",
                        "read_us", "x read", "chain_us", "ch/floor", "GB/s",
                        "TFLOP/s", "cpu_us");
  for (size_t i = 0; i < points.size(); ++i) {
    const GpuPoint& point = points[i];
    if (i > 0 && (points[i - 1].weight != point.weight ||
                  points[i - 1].shape != point.shape)) {
      table += "\n";
    }
    absl::StrAppendFormat(
        &table, "%-6s %5d %5d %6d %6d", WeightFormatName(point.weight.format),
        point.weight.group_size, point.m, point.shape.k, point.shape.n);
    const VariantTiming* best = nullptr;
    const VariantTiming* pick = nullptr;
    for (const VariantTiming& variant : point.variants) {
      absl::StrAppendFormat(&table, " %9.1f", variant.timing.median_us);
      if (best == nullptr ||
          variant.timing.median_us < best->timing.median_us) {
        best = &variant;
      }
      if (variant.variant == point.pick) pick = &variant;
    }
    const double floor_us = FloorMicros(point.weight_bytes, copy.gbps);
    if (pick == nullptr) {
      absl::StrAppendFormat(
          &table, "  %-16s %6s %9.1f %7s %8.1f %7s %8s %8s %7s %7s %8s\n",
          KernelVariantName(point.pick), "-", floor_us, "-", point.read_us, "-",
          "-", "-", "-", "-", "-");
      continue;
    }
    const double us = pick->timing.median_us;
    absl::StrAppendFormat(
        &table,
        "  %-16s %6.2f %9.1f %7.2f %8.1f %7.2f %8.1f %8.2f %7.1f %7.1f "
        "%7.1f%s\n",
        KernelVariantName(pick->variant), us / best->timing.median_us, floor_us,
        us / floor_us, point.read_us, us / point.read_us, pick->chain_us,
        pick->chain_us / floor_us, GigabytesPerSecond(point.weight_bytes, us),
        Gflops(point.m, point.shape.k, point.shape.n, us) / 1e3,
        pick->launch_us, pick->launch_us > us ? "*" : " ");
  }
  return table;
}

// The --latency table: the pick through the backend, one call at a time.
std::string FormatLatencyTable(const std::vector<GpuPoint>& points,
                               int repeats) {
  std::string table = absl::StrFormat(
      "\none call at a time through the backend (--latency): the pick's "
      "GemmKernel::Run with fp16 A and C in host memory, copied through "
      "pinned staging, as nibbled runs a lone request; median and p90 of %d "
      "calls after %d warm-up; gather, device (copy in, kernel, copy out, "
      "until the wait returns) and scatter are means per call; kernel_us is "
      "the pick's launch time above\n\n",
      repeats, kWarmupLaunches);
  absl::StrAppendFormat(&table,
                        "%-6s %5s %5s %6s %6s  %-16s %9s %9s %9s %9s %9s "
                        "%10s\n",
                        "format", "group", "m", "k", "n", "pick", "kernel_us",
                        "call_us", "p90_us", "gather_us", "device_us",
                        "scatter_us");
  for (const GpuPoint& point : points) {
    if (!point.latency.has_value()) continue;
    const BackendLatency& latency = *point.latency;
    double kernel_us = 0;
    for (const VariantTiming& variant : point.variants) {
      if (variant.variant == point.pick) kernel_us = variant.timing.median_us;
    }
    absl::StrAppendFormat(
        &table,
        "%-6s %5d %5d %6d %6d  %-16s %9.1f %9.1f %9.1f %9.1f %9.1f %10.1f\n",
        WeightFormatName(point.weight.format), point.weight.group_size, point.m,
        point.shape.k, point.shape.n, KernelVariantName(point.pick), kernel_us,
        latency.timing.median_us, latency.p90_us, latency.gather_us,
        latency.device_us, latency.scatter_us);
  }
  return table;
}

int Run(const GpuBenchOptions& options) {
  std::ofstream json_file;
  std::ofstream tuning_file;
  if ((!options.json_path.empty() &&
       !OpenOutput("nibble-gpu-bench", options.json_path, json_file)) ||
      (!options.write_tuning_table_path.empty() &&
       !OpenOutput("nibble-gpu-bench", options.write_tuning_table_path,
                   tuning_file))) {
    return kExitUsage;
  }
  absl::StatusOr<cuda::DeviceInfo> device = cuda::CurrentDevice();
  if (!device.ok()) {
    absl::FPrintF(stderr, "nibble-gpu-bench: %s\n", device.status().message());
    return kExitFailure;
  }
  const auto fail = [](const absl::Status& status) {
    absl::FPrintF(stderr, "nibble-gpu-bench: %s\n", status.message());
    return kExitFailure;
  };
  cudaStream_t raw_stream = nullptr;
  if (absl::Status status = cuda::CudaStatus(
          cudaStreamCreateWithFlags(&raw_stream, cudaStreamNonBlocking),
          "cudaStreamCreateWithFlags");
      !status.ok()) {
    return fail(status);
  }
  const Stream stream(raw_stream);
  absl::StatusOr<std::vector<Event>> events =
      CreateEvents(std::max(options.repeats, kCopyRepeats) + 1);
  if (!events.ok()) return fail(events.status());

  absl::FPrintF(stderr, "%s: measuring the copy bandwidth\n", device->name);
  absl::StatusOr<CopyBandwidth> copy =
      MeasureCopyBandwidth(*events, stream.get());
  if (!copy.ok()) return fail(copy.status());

  // GPU 0, where the weights and operands below live.
  const Scheduler scheduler(cuda::CudaKernels(),
                            cuda::ForGpu(TuningTable::Default(), 0),
                            [](const GemmProblem& problem) {
                              return cuda::PreferredVariant(problem, 0);
                            });
  absl::StatusOr<WeightReader> reader = WeightReader::Create();
  if (!reader.ok()) return fail(reader.status());
  cuda::Workspace workspace;
  // For --latency, as nibbled's default: one thread per hardware thread.
  ThreadPool pool;
  std::vector<GpuPoint> points;
  const int total = static_cast<int>(
      options.shapes.size() * options.weights.size() * options.ms.size());
  int step = 0;
  for (const Shape& shape : options.shapes) {
    for (const WeightKind& kind : options.weights) {
      if (absl::Status status = TimeWeight(
              kind, shape, options, *device, scheduler, *reader, *events,
              workspace, stream.get(), pool, step, total, points);
          !status.ok()) {
        return fail(status);
      }
    }
  }

  if (options.json_to_stdout || json_file.is_open()) {
    std::ostream& out = options.json_to_stdout ? std::cout : json_file;
    out << MachineJson(*device, *copy, options) << "\n";
    for (const GpuPoint& point : points) {
      for (const VariantTiming& variant : point.variants) {
        out << RowJson(point, variant, *device, copy->gbps) << "\n";
      }
    }
  }
  if (!options.json_to_stdout) {
    std::cout << FormatTable(points, *device, *copy, options.repeats,
                             options.serialize_launches);
    if (options.latency) {
      std::cout << FormatLatencyTable(points, options.repeats);
    }
  }
  const std::string level = cuda::GpuLevelName(device->compute_capability);
  const TuningTable measured =
      MeasuredTuningTable(AsPointResults(points, *device), level, kGpuNearTie);
  if (tuning_file.is_open()) {
    tuning_file << absl::StrFormat("# nibble-gpu-bench on %s, %d SMs\n",
                                   device->name, device->sm_count)
                << measured.Serialize();
  }
  std::cout.flush();
  for (std::ofstream* file : {&json_file, &tuning_file}) {
    if (file->is_open()) file->close();
  }
  if (!std::cout || json_file.fail() || tuning_file.fail()) {
    absl::FPrintF(stderr, "nibble-gpu-bench: writing the results failed\n");
    return kExitFailure;
  }
  if (!options.write_tuning_table_path.empty()) {
    absl::FPrintF(stderr, "nibble-gpu-bench: wrote %d %s tuning rules to %s\n",
                  measured.rules().size(), level,
                  options.write_tuning_table_path);
  }
  return kExitOk;
}

}  // namespace
}  // namespace nibble::bench

int main(int argc, char** argv) {
  const absl::StatusOr<nibble::bench::GpuBenchOptions> options =
      nibble::bench::ParseOptions(argc, argv);
  if (!options.ok()) {
    absl::FPrintF(
        stderr,
        "nibble-gpu-bench: %s\n(`nibble-gpu-bench --help` lists the flags)\n",
        options.status().message());
    return nibble::kExitUsage;
  }
  if (options->help) {
    std::cout << nibble::bench::Usage();
    return nibble::kExitOk;
  }
  return nibble::bench::Run(*options);
}
