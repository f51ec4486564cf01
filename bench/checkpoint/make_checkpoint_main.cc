// nibble-make-checkpoint: writes a synthetic safetensors checkpoint of about
// --bytes (never more), made of the linear layers of a Llama-7B-like model
// (model.layers.L.self_attn.q_proj ... model.layers.L.mlp.down_proj, K and N
// of 4096 and 11008) as their producers store them: 4-bit GPTQ (AutoGPTQ,
// symmetric, groups of 128 rows, with g_idx), 4-bit AWQ (AutoAWQ's GEMM
// layout, groups of 128 rows), MXFP4 (gpt-oss' PREFIX_blocks and
// PREFIX_scales), NVFP4 (ModelOpt's U8 weight, E4M3 weight_scale and fp32
// weight_scale_2) or BF16 float weights [N, K]. The data is
// random from --seed, so that every run writes the same bytes. --evict drops
// a file from the page cache without root, so that the next read of it comes
// from the disk. --fresh_memory times what storing that many bytes of
// weights costs in memory alone. Used by bench/checkpoint/import_bench.sh
// (`make import-bench`).
//
//   nibble-make-checkpoint --layout=gptq --bytes=1073741824 --out=ckpt.st
//   nibble-make-checkpoint --evict=ckpt.st
//   nibble-make-checkpoint --fresh_memory=1073741824
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/bulk_allocator.h"
#include "base/command_line.h"
#include "checkpoint/gptq.h"
#include "checkpoint/import.h"
#include "checkpoint/safetensors.h"
#include "format/dtype.h"

ABSL_FLAG(std::string, layout, "gptq",
          "what the layers hold: gptq, awq, mxfp4, nvfp4 or float (BF16)");
ABSL_FLAG(int64_t, bytes, int64_t{1} << 30,
          "most bytes of tensors to write: whole projections are added "
          "while the next one still fits");
ABSL_FLAG(std::string, out, "", "safetensors file to write");
ABSL_FLAG(uint64_t, seed, 1, "seed of the random data");
ABSL_FLAG(std::string, evict, "",
          "instead of writing a checkpoint, drop this file from the page "
          "cache");
ABSL_FLAG(int64_t, fresh_memory, 0,
          "instead of writing a checkpoint, time writing this many bytes of "
          "newly allocated memory, allocated as nibble allocates weights "
          "(huge pages advised): the least a process that stores that many "
          "bytes of weights spends on its memory");

namespace nibble::bench {
namespace {

using ::nibble::checkpoint::CheckpointLayout;
using ::nibble::checkpoint::NamedTensorBytes;
using ::nibble::checkpoint::SafetensorsDtype;

// One linear projection of a decoder layer, as B = weight^T [K, N].
struct Projection {
  absl::string_view name;  // after "model.layers.L."
  int64_t k = 0;
  int64_t n = 0;
};

// Llama-2-7B's, in the order its checkpoints list them.
constexpr Projection kLlamaProjections[] = {
    {"self_attn.q_proj", 4096, 4096}, {"self_attn.k_proj", 4096, 4096},
    {"self_attn.v_proj", 4096, 4096}, {"self_attn.o_proj", 4096, 4096},
    {"mlp.gate_proj", 4096, 11008},   {"mlp.up_proj", 4096, 11008},
    {"mlp.down_proj", 11008, 4096},
};

// What GPTQ and AWQ checkpoints are almost always quantized with.
constexpr int64_t kGroupSize = 128;

// GPTQ's symmetric zero point 8 as AutoGPTQ stores it (minus 1, see
// checkpoint::GptqZeroConvention::kV1) in all eight nibbles of a word.
constexpr uint32_t kGptqSymmetricZeros = 0x77777777u;

struct OwnedTensor {
  std::string name;
  SafetensorsDtype dtype = SafetensorsDtype::kF32;
  std::vector<int64_t> shape;
  std::string bytes;
};

// Random bytes: any 32-bit word is a valid word of packed 4-bit codes, in
// GPTQ's layout and AWQ's alike, so the packed tensors need no packing.
std::string RandomBytes(std::mt19937_64& rng, int64_t count) {
  std::string bytes(count, '\0');
  for (int64_t i = 0; i < count; i += 8) {
    const uint64_t word = rng();
    std::memcpy(bytes.data() + i, &word, std::min<int64_t>(8, count - i));
  }
  return bytes;
}

// `count` fp16 scales in [2^-8, 2^-4), the range real 4-bit layers have.
std::string RandomScales(std::mt19937_64& rng, int64_t count) {
  std::uniform_real_distribution<float> scale(0x1p-8f, 0x1p-4f);
  std::vector<uint16_t> halves(count);
  for (uint16_t& half : halves) half = FloatToHalf(scale(rng));
  return std::string(reinterpret_cast<const char*>(halves.data()),
                     halves.size() * sizeof(uint16_t));
}

// BF16 weights uniform in [-0.05, 0.05), about what a trained linear layer
// holds; converted a row at a time to keep the float copy small.
std::string RandomBf16Weight(std::mt19937_64& rng, int64_t n, int64_t k) {
  std::uniform_real_distribution<float> value(-0.05f, 0.05f);
  std::string bytes(n * k * sizeof(uint16_t), '\0');
  std::vector<float> row(k);
  for (int64_t r = 0; r < n; ++r) {
    for (float& v : row) v = value(rng);
    ConvertFromFloat(DType::kBF16, row.data(), k,
                     bytes.data() + r * k * sizeof(uint16_t));
  }
  return bytes;
}

// `count` 8-bit scale codes, uniform in [lo, hi].
std::string RandomScaleCodes(std::mt19937_64& rng, int64_t count, int lo,
                             int hi) {
  std::uniform_int_distribution<int> code(lo, hi);
  std::string bytes(count, '\0');
  for (char& byte : bytes) byte = static_cast<char>(code(rng));
  return bytes;
}

std::string FloatBytes(float value) {
  return std::string(reinterpret_cast<const char*>(&value), sizeof(value));
}

std::string WordsBytes(const std::vector<uint32_t>& words) {
  return std::string(reinterpret_cast<const char*>(words.data()),
                     words.size() * sizeof(uint32_t));
}

// The tensors of one projection under `prefix`, as the layout's producer
// names and shapes them (checkpoint/gptq.h, awq.h and fp4_blocks.h describe
// each).
std::vector<OwnedTensor> ProjectionTensors(CheckpointLayout layout,
                                           const std::string& prefix,
                                           const Projection& projection,
                                           std::mt19937_64& rng) {
  const int64_t k = projection.k;
  const int64_t n = projection.n;
  const int64_t groups = k / kGroupSize;
  switch (layout) {
    case CheckpointLayout::kGptq: {
      std::vector<uint32_t> group_of_row(k);
      for (int64_t row = 0; row < k; ++row) {
        group_of_row[row] = row / kGroupSize;
      }
      return {
          {absl::StrCat(prefix, ".qweight"),
           SafetensorsDtype::kI32,
           {k / 8, n},
           RandomBytes(rng, k / 8 * n * 4)},
          {absl::StrCat(prefix, ".qzeros"),
           SafetensorsDtype::kI32,
           {groups, n / 8},
           WordsBytes(
               std::vector<uint32_t>(groups * n / 8, kGptqSymmetricZeros))},
          {absl::StrCat(prefix, ".scales"),
           SafetensorsDtype::kF16,
           {groups, n},
           RandomScales(rng, groups * n)},
          {absl::StrCat(prefix, ".g_idx"),
           SafetensorsDtype::kI32,
           {k},
           WordsBytes(group_of_row)},
      };
    }
    case CheckpointLayout::kAwq:
      return {
          {absl::StrCat(prefix, ".qweight"),
           SafetensorsDtype::kI32,
           {k, n / 8},
           RandomBytes(rng, k * n / 8 * 4)},
          // Asymmetric: every zero point in 0..15 is valid.
          {absl::StrCat(prefix, ".qzeros"),
           SafetensorsDtype::kI32,
           {groups, n / 8},
           RandomBytes(rng, groups * n / 8 * 4)},
          {absl::StrCat(prefix, ".scales"),
           SafetensorsDtype::kF16,
           {groups, n},
           RandomScales(rng, groups * n)},
      };
    case CheckpointLayout::kFloat:
      return {{absl::StrCat(prefix, ".weight"),
               SafetensorsDtype::kBF16,
               {n, k},
               RandomBf16Weight(rng, n, k)}};
    case CheckpointLayout::kMxfp4:
      return {{absl::StrCat(prefix, "_blocks"),
               SafetensorsDtype::kU8,
               {n, k / 32, 16},
               RandomBytes(rng, k * n / 2)},
              // Exponents 2^-9 .. 2^-2, never 0xff (NaN).
              {absl::StrCat(prefix, "_scales"),
               SafetensorsDtype::kU8,
               {n, k / 32},
               RandomScaleCodes(rng, k / 32 * n, 118, 125)}};
    case CheckpointLayout::kNvfp4:
      return {{absl::StrCat(prefix, ".weight"),
               SafetensorsDtype::kU8,
               {n, k / 2},
               RandomBytes(rng, k * n / 2)},
              // E4M3 0.25 .. 240, never 0x7f (NaN).
              {absl::StrCat(prefix, ".weight_scale"),
               SafetensorsDtype::kF8E4M3,
               {n, k / 16},
               RandomScaleCodes(rng, k / 16 * n, 0x28, 0x77)},
              {absl::StrCat(prefix, ".weight_scale_2"),
               SafetensorsDtype::kF32,
               {},
               FloatBytes(1e-3f)},
              {absl::StrCat(prefix, ".input_scale"),
               SafetensorsDtype::kF32,
               {},
               FloatBytes(0.5f)}};
  }
  return {};
}

// The bytes ProjectionTensors writes, without making them.
int64_t ProjectionBytes(CheckpointLayout layout, const Projection& projection) {
  const int64_t k = projection.k;
  const int64_t n = projection.n;
  const int64_t groups = k / kGroupSize;
  switch (layout) {
    case CheckpointLayout::kGptq:
      return k * n / 2 + groups * n / 2 + groups * n * 2 + k * 4;
    case CheckpointLayout::kAwq:
      return k * n / 2 + groups * n / 2 + groups * n * 2;
    case CheckpointLayout::kFloat:
      return k * n * 2;
    case CheckpointLayout::kMxfp4:
      return k * n / 2 + k / 32 * n;
    case CheckpointLayout::kNvfp4:
      return k * n / 2 + k / 16 * n + 8;
  }
  return 0;
}

absl::StatusOr<CheckpointLayout> ParseLayout(absl::string_view name) {
  for (CheckpointLayout layout :
       {CheckpointLayout::kGptq, CheckpointLayout::kAwq,
        CheckpointLayout::kMxfp4, CheckpointLayout::kNvfp4,
        CheckpointLayout::kFloat}) {
    if (name == checkpoint::CheckpointLayoutName(layout)) return layout;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--layout=", name, ": expected gptq, awq, mxfp4, nvfp4 or float"));
}

int WriteCheckpoint(CheckpointLayout layout, int64_t max_bytes,
                    const std::string& out, uint64_t seed) {
  constexpr int kPerLayer = std::size(kLlamaProjections);
  std::mt19937_64 rng(seed);
  std::vector<OwnedTensor> tensors;
  int64_t tensor_bytes = 0;
  int projections = 0;
  // Whole projections in model order, at least one, while they fit.
  while (true) {
    const Projection& projection = kLlamaProjections[projections % kPerLayer];
    const int64_t bytes = ProjectionBytes(layout, projection);
    if (projections > 0 && tensor_bytes + bytes > max_bytes) break;
    const std::string prefix = absl::StrCat(
        "model.layers.", projections / kPerLayer, ".", projection.name);
    for (OwnedTensor& tensor :
         ProjectionTensors(layout, prefix, projection, rng)) {
      tensors.push_back(std::move(tensor));
    }
    tensor_bytes += bytes;
    ++projections;
  }
  const int layers = (projections + kPerLayer - 1) / kPerLayer;

  std::vector<NamedTensorBytes> views;
  for (const OwnedTensor& tensor : tensors) {
    views.push_back({tensor.name, tensor.dtype, tensor.shape, tensor.bytes});
  }
  absl::StatusOr<std::string> file =
      checkpoint::SerializeSafetensors(views, {{"format", "pt"}});
  if (!file.ok()) {
    absl::FPrintF(stderr, "nibble-make-checkpoint: %s\n",
                  file.status().message());
    return kExitFailure;
  }
  tensors.clear();
  std::ofstream stream(out, std::ios::binary | std::ios::trunc);
  stream.write(file->data(), static_cast<std::streamsize>(file->size()));
  stream.close();
  if (!stream) {
    absl::FPrintF(stderr, "nibble-make-checkpoint: cannot write %s: %s\n", out,
                  std::strerror(errno));
    return kExitFailure;
  }
  absl::PrintF(
      "wrote %s: %s, %d projections in %d layer%s (model.layers.0 to "
      "model.layers.%d), %d bytes of tensors, %d bytes in all\n",
      out, checkpoint::CheckpointLayoutName(layout), projections, layers,
      layers == 1 ? "" : "s", layers - 1, tensor_bytes, file->size());
  return kExitOk;
}

// posix_fadvise drops only clean pages, so the file's dirty ones are written
// back first; mincore then says how many stayed (those another process maps
// or reads meanwhile).
int Evict(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY);
  if (fd < 0) {
    absl::FPrintF(stderr, "nibble-make-checkpoint: cannot open %s: %s\n", path,
                  std::strerror(errno));
    return kExitFailure;
  }
  const off_t size = lseek(fd, 0, SEEK_END);
  const int advice_error =
      fdatasync(fd) != 0 ? errno : posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  if (size < 0 || advice_error != 0) {
    absl::FPrintF(stderr, "nibble-make-checkpoint: cannot evict %s: %s\n", path,
                  std::strerror(size < 0 ? errno : advice_error));
    close(fd);
    return kExitFailure;
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t pages = (size + page - 1) / page;
  int64_t cached = 0;
  if (size > 0) {
    void* map = mmap(nullptr, size, PROT_READ, MAP_SHARED, fd, 0);
    std::vector<unsigned char> resident(pages);
    if (map == MAP_FAILED || mincore(map, size, resident.data()) != 0) {
      absl::FPrintF(stderr, "nibble-make-checkpoint: cannot inspect %s: %s\n",
                    path, std::strerror(errno));
      if (map != MAP_FAILED) munmap(map, size);
      close(fd);
      return kExitFailure;
    }
    munmap(map, size);
    for (unsigned char flags : resident) cached += flags & 1;
  }
  close(fd);
  absl::PrintF("evicted %s: %d of %d pages still cached\n", path, cached,
               pages);
  return kExitOk;
}

int TimeFreshMemory(int64_t bytes) {
  const absl::Time start = absl::Now();
  void* memory = AllocateBulk(bytes);
  std::memset(memory, 0x5a, bytes);
  // Keeps the compiler from dropping a store that nothing reads.
  asm volatile("" : : "r"(memory) : "memory");
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  FreeBulk(memory, bytes);
  absl::PrintF("wrote %d bytes of fresh memory in %.3f s (%.2f GB/s)\n", bytes,
               seconds, static_cast<double>(bytes) / 1e9 / seconds);
  return kExitOk;
}

int Main(int argc, char* argv[]) {
  absl::SetProgramUsageMessage(
      "Writes a synthetic Llama-like safetensors checkpoint, drops a file "
      "from the page cache, or times writing fresh memory.\n"
      "Usage: nibble-make-checkpoint --layout=gptq|awq|float [--bytes=N] "
      "--out=FILE [--seed=S]\n"
      "       nibble-make-checkpoint --evict=FILE\n"
      "       nibble-make-checkpoint --fresh_memory=BYTES");
  // --help lists the flags of files named after the program, which this
  // file (make_checkpoint_main.cc, for nibble-make-checkpoint) is not.
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = [](absl::string_view file) {
    return absl::EndsWith(file, "make_checkpoint_main.cc");
  };
  absl::SetFlagsUsageConfig(usage_config);
  // absl's own parser, as nibbled's: nibble::ParseCommandLine would change
  // the exit code of a bad flag (1 to 2), its message and --help.
  const std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  const auto usage_error = [](absl::string_view message) {
    absl::FPrintF(stderr,
                  "nibble-make-checkpoint: %s (`nibble-make-checkpoint "
                  "--help` lists the flags)\n",
                  message);
    return kExitUsage;
  };
  if (positional.size() > 1) {
    return usage_error(absl::StrCat("unexpected argument \"", positional[1],
                                    "\": every value goes with a flag"));
  }
  if (const std::string path = absl::GetFlag(FLAGS_evict); !path.empty()) {
    return Evict(path);
  }
  if (const int64_t fresh = absl::GetFlag(FLAGS_fresh_memory); fresh != 0) {
    if (fresh < 0) return usage_error("--fresh_memory must be positive");
    return TimeFreshMemory(fresh);
  }
  absl::StatusOr<CheckpointLayout> layout =
      ParseLayout(absl::GetFlag(FLAGS_layout));
  if (!layout.ok()) return usage_error(layout.status().message());
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  if (bytes <= 0) return usage_error("--bytes must be positive");
  const std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) return usage_error("--out=FILE is required");
  return WriteCheckpoint(*layout, bytes, out, absl::GetFlag(FLAGS_seed));
}

}  // namespace
}  // namespace nibble::bench

int main(int argc, char* argv[]) { return nibble::bench::Main(argc, argv); }
