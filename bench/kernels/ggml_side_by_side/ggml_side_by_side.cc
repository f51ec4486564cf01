// ggml_side_by_side: times ggml's CPU backend on the matmuls nibble-bench
// times, so that the two can be run in turns on one machine.
//
// The weight is Q4_0 (blocks of 32 codes with an fp16 scale: ggml's 4-bit
// integer format), K x N, placed in one of the CPU backend's extra buffer
// types so that it is repacked as the backend repacks a model's weights (by
// default the first such type, which is what a llama.cpp model loader picks);
// A is f32, M x K, which the backend quantizes to int8 per block on each call.
// Like nibble-bench, every call reads a different copy of the weight, as many
// copies as fill twice the last-level cache, so that the weight comes from
// DRAM, and the time is the median of the repeats after one warm-up per copy.
//
//   ggml_side_by_side --points=1x4096x4096,16x8192x28672 --threads=2
//   {"engine":"ggml","buffer_type":"CPU_REPACK","m":1,"k":4096,"n":4096,
//    "copies":103,"repeats":200,"median_ms":0.291,"max_rel_error":0.004}
//
// Built apart from nibble against a ggml build (CMakeLists.txt beside it).

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"

namespace {

struct Point {
  int64_t m = 0;
  int64_t k = 0;
  int64_t n = 0;
};

struct Options {
  std::vector<Point> points;
  int threads = 2;
  int max_repeats = 200;
  int min_repeats = 3;
  double max_seconds = 2.0;
  std::string buffer_type;  // empty: the backend's first extra buffer type
};

[[noreturn]] void Fail(const std::string& message) {
  std::fprintf(stderr, "ggml_side_by_side: %s\n", message.c_str());
  std::exit(2);
}

std::vector<std::string> Split(std::string_view text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t end = text.find(separator, start);
    parts.emplace_back(text.substr(start, end - start));
    if (end == std::string_view::npos) return parts;
    start = end + 1;
  }
}

int64_t ParsePositive(const std::string& item, const std::string& flag) {
  char* end = nullptr;
  const long long value = std::strtoll(item.c_str(), &end, 10);
  if (item.empty() || *end != '\0' || value <= 0) {
    Fail("--" + flag + ": \"" + item + "\" is not a positive integer");
  }
  return value;
}

Options ParseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; ++i) {
    const std::string argument = argv[i];
    const size_t equals = argument.find('=');
    if (argument.rfind("--", 0) != 0 || equals == std::string::npos) {
      Fail("arguments are --flag=value; got \"" + argument + "\"");
    }
    const std::string flag = argument.substr(2, equals - 2);
    const std::string value = argument.substr(equals + 1);
    if (flag == "points") {
      for (const std::string& item : Split(value, ',')) {
        const std::vector<std::string> sizes = Split(item, 'x');
        if (sizes.size() != 3) {
          Fail("--points: \"" + item + "\" is not MxKxN, e.g. 1x4096x4096");
        }
        options.points.push_back({ParsePositive(sizes[0], flag),
                                  ParsePositive(sizes[1], flag),
                                  ParsePositive(sizes[2], flag)});
      }
    } else if (flag == "threads") {
      options.threads = static_cast<int>(ParsePositive(value, flag));
    } else if (flag == "repeats") {
      options.max_repeats = static_cast<int>(ParsePositive(value, flag));
    } else if (flag == "buffer_type") {
      options.buffer_type = value;
    } else {
      Fail("unknown flag --" + flag +
           " (known: --points, --threads, --repeats, --buffer_type)");
    }
  }
  if (options.points.empty()) Fail("give --points=MxKxN,...");
  for (const Point& point : options.points) {
    if (point.k % 32 != 0) Fail("K must be a multiple of Q4_0's block of 32");
  }
  return options;
}

// Bytes of the last-level cache, as the kernel reports it.
size_t LastLevelCacheBytes() {
  size_t largest = 0;
  for (int index = 0; index < 8; ++index) {
    std::ifstream file("/sys/devices/system/cpu/cpu0/cache/index" +
                       std::to_string(index) + "/size");
    std::string size;
    if (!(file >> size)) break;
    size_t bytes = std::strtoull(size.c_str(), nullptr, 10);
    if (size.back() == 'K') bytes <<= 10;
    if (size.back() == 'M') bytes <<= 20;
    largest = std::max(largest, bytes);
  }
  return largest > 0 ? largest : size_t{32} << 20;
}

ggml_backend_buffer_type_t ChooseBufferType(const std::string& wanted) {
  ggml_backend_reg_t registry = ggml_backend_cpu_reg();
  ggml_backend_dev_t device = ggml_backend_reg_dev_get(registry, 0);
  auto extra_buffer_types =
      reinterpret_cast<ggml_backend_dev_get_extra_bufts_t>(
          ggml_backend_reg_get_proc_address(
              registry, "ggml_backend_dev_get_extra_bufts"));
  if (extra_buffer_types == nullptr) {
    Fail("this ggml's CPU backend offers no extra buffer types");
  }
  std::string listed;
  for (ggml_backend_buffer_type_t* type = extra_buffer_types(device);
       *type != nullptr; ++type) {
    const std::string name = ggml_backend_buft_name(*type);
    if (wanted.empty() || wanted == name) return *type;
    listed += " " + name;
  }
  Fail("no extra buffer type \"" + wanted + "\"; this build has:" + listed);
}

// Q4_0 codes of a K x N weight (N rows of K in ggml's terms) from values
// uniform in [-1, 1), and the same weight dequantized, row after row.
struct QuantizedWeight {
  std::vector<uint8_t> codes;
  std::vector<float> values;
};

QuantizedWeight MakeWeight(const Point& point, std::mt19937& random) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  QuantizedWeight weight;
  const size_t row_bytes = ggml_row_size(GGML_TYPE_Q4_0, point.k);
  weight.codes.resize(row_bytes * point.n);
  weight.values.resize(point.k * point.n);
  for (float& value : weight.values) value = uniform(random);
  ggml_quantize_chunk(GGML_TYPE_Q4_0, weight.values.data(), weight.codes.data(),
                      0, point.n, point.k, nullptr);
  ggml_get_type_traits(GGML_TYPE_Q4_0)
      ->to_float(weight.codes.data(), weight.values.data(), point.k * point.n);
  return weight;
}

// The largest |C - C_ref| over the largest |C_ref| on a sample of columns,
// C_ref in float64 from the dequantized weight and the f32 activations.
double MaxRelativeError(const Point& point, const std::vector<float>& a,
                        const std::vector<float>& weight_values,
                        const std::vector<float>& c) {
  double largest_error = 0.0;
  double largest_value = 0.0;
  const int64_t column_step = std::max<int64_t>(1, point.n / 61);
  for (int64_t column = 0; column < point.n; column += column_step) {
    const float* w = &weight_values[column * point.k];
    for (int64_t row = 0; row < point.m; ++row) {
      const float* x = &a[row * point.k];
      double sum = 0.0;
      for (int64_t i = 0; i < point.k; ++i) sum += double{x[i]} * w[i];
      largest_value = std::max(largest_value, std::fabs(sum));
      largest_error = std::max(
          largest_error, std::fabs(sum - double{c[row * point.n + column]}));
    }
  }
  return largest_error / largest_value;
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t half = values.size() / 2;
  return values.size() % 2 ? values[half]
                           : (values[half - 1] + values[half]) / 2.0;
}

void TimePoint(const Point& point, const Options& options,
               ggml_backend_t backend, ggml_backend_buffer_type_t weight_type) {
  std::mt19937 random(20261126);
  const QuantizedWeight weight = MakeWeight(point, random);
  const size_t copies = std::max<size_t>(
      1, (2 * LastLevelCacheBytes() + weight.codes.size() - 1) /
             weight.codes.size());

  // Weights in their buffer type; A, the outputs and the graphs in another.
  ggml_init_params weight_params = {copies * ggml_tensor_overhead(), nullptr,
                                    /*no_alloc=*/true};
  ggml_context* weight_context = ggml_init(weight_params);
  ggml_init_params compute_params = {
      (copies + 1) * ggml_tensor_overhead() +
          copies * ggml_graph_overhead_custom(4, false),
      nullptr, /*no_alloc=*/true};
  ggml_context* compute_context = ggml_init(compute_params);
  ggml_tensor* a =
      ggml_new_tensor_2d(compute_context, GGML_TYPE_F32, point.k, point.m);
  std::vector<ggml_tensor*> weights;
  std::vector<ggml_tensor*> outputs;
  std::vector<ggml_cgraph*> graphs;
  for (size_t copy = 0; copy < copies; ++copy) {
    weights.push_back(
        ggml_new_tensor_2d(weight_context, GGML_TYPE_Q4_0, point.k, point.n));
    outputs.push_back(ggml_mul_mat(compute_context, weights.back(), a));
    graphs.push_back(ggml_new_graph_custom(compute_context, 4, false));
    ggml_build_forward_expand(graphs.back(), outputs.back());
  }
  ggml_backend_buffer_t weight_buffer =
      ggml_backend_alloc_ctx_tensors_from_buft(weight_context, weight_type);
  ggml_backend_buffer_t compute_buffer =
      ggml_backend_alloc_ctx_tensors(compute_context, backend);
  if (weight_buffer == nullptr || compute_buffer == nullptr) {
    Fail("could not allocate the buffers");
  }
  for (ggml_tensor* copy : weights) {
    // The buffer type repacks the codes as they are set.
    ggml_backend_tensor_set(copy, weight.codes.data(), 0, weight.codes.size());
  }
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> a_values(point.m * point.k);
  for (float& value : a_values) value = uniform(random);
  ggml_backend_tensor_set(a, a_values.data(), 0, ggml_nbytes(a));

  if (!ggml_backend_supports_op(backend, outputs[0])) {
    Fail("the CPU backend does not run this mul_mat");
  }
  for (ggml_cgraph* graph : graphs) {  // one warm-up per copy
    if (ggml_backend_graph_compute(backend, graph) != GGML_STATUS_SUCCESS) {
      Fail("graph compute failed");
    }
  }
  std::vector<float> c(point.m * point.n);
  ggml_backend_tensor_get(outputs[0], c.data(), 0, ggml_nbytes(outputs[0]));
  const double error = MaxRelativeError(point, a_values, weight.values, c);

  std::vector<double> times_ms;
  const auto start = std::chrono::steady_clock::now();
  for (int repeat = 0; repeat < options.max_repeats; ++repeat) {
    const auto before = std::chrono::steady_clock::now();
    ggml_backend_graph_compute(backend, graphs[repeat % copies]);
    const auto after = std::chrono::steady_clock::now();
    times_ms.push_back(
        std::chrono::duration<double, std::milli>(after - before).count());
    const double elapsed = std::chrono::duration<double>(after - start).count();
    if (repeat + 1 >= options.min_repeats && elapsed > options.max_seconds) {
      break;
    }
  }
  std::printf(
      "{\"engine\":\"ggml\",\"buffer_type\":\"%s\",\"weight_buffer\":\"%s\","
      "\"threads\":%d,\"m\":%lld,\"k\":%lld,\"n\":%lld,\"copies\":%zu,"
      "\"repeats\":%zu,\"median_ms\":%.4f,\"min_ms\":%.4f,"
      "\"max_rel_error\":%.2e}\n",
      ggml_backend_buft_name(weight_type),
      ggml_backend_buffer_name(weights[0]->buffer), options.threads,
      static_cast<long long>(point.m), static_cast<long long>(point.k),
      static_cast<long long>(point.n), copies, times_ms.size(),
      Median(times_ms), *std::min_element(times_ms.begin(), times_ms.end()),
      error);
  std::fflush(stdout);
  // A wrong result would make the timing meaningless.
  if (error > 0.05) Fail("the result is off the float64 reference");

  ggml_backend_buffer_free(weight_buffer);
  ggml_backend_buffer_free(compute_buffer);
  ggml_free(weight_context);
  ggml_free(compute_context);
}

// Drops ggml's progress lines (a line per repacked tensor); keeps warnings.
void QuietLog(ggml_log_level level, const char* text, void*) {
  if (level == GGML_LOG_LEVEL_WARN || level == GGML_LOG_LEVEL_ERROR) {
    std::fputs(text, stderr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  const Options options = ParseOptions(argc, argv);
  ggml_log_set(QuietLog, nullptr);
  ggml_backend_t backend = ggml_backend_cpu_init();
  // A persistent pool, as llama.cpp's tools attach one; without it every
  // graph would start and join its threads.
  ggml_threadpool_params pool_params =
      ggml_threadpool_params_default(options.threads);
  ggml_threadpool_t pool = ggml_threadpool_new(&pool_params);
  ggml_backend_cpu_set_n_threads(backend, options.threads);
  ggml_backend_cpu_set_threadpool(backend, pool);
  const ggml_backend_buffer_type_t weight_type =
      ChooseBufferType(options.buffer_type);
  for (const Point& point : options.points) {
    TimePoint(point, options, backend, weight_type);
  }
  ggml_threadpool_free(pool);
  ggml_backend_free(backend);
  return 0;
}
