# nibble's two front doors: `make demo` and `make test`. Both install missing
# dependencies (deploy/install-deps.sh) and build first.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_FLAGS ?=

.PHONY: all deps configure build test demo bench load-bench kernels clean format

all: build

deps:
	@deploy/install-deps.sh

configure: deps
	@cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DNIBBLE_BUILD_SERVICE=ON $(CMAKE_FLAGS) > /dev/null

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

# The gpu-labelled tests run only where nvidia-smi lists a GPU.
GPU_PRESENT := $(shell nvidia-smi -L 2>/dev/null | grep -c GPU)
CTEST_GPU_FILTER := $(if $(filter-out 0,$(GPU_PRESENT)),,-LE gpu)

# The tests' scratch files (gtest's TempDir()) go to a folder of the build,
# emptied before each run, instead of piling up in /tmp.
TEST_SCRATCH := $(abspath $(BUILD_DIR))/test-scratch

test: build
	rm -rf $(TEST_SCRATCH) && mkdir -p $(TEST_SCRATCH)
	TEST_TMPDIR=$(TEST_SCRATCH) ctest --test-dir $(BUILD_DIR) -j $(JOBS) \
	  --output-on-failure --timeout 300 $(CTEST_GPU_FILTER)

demo: build
	deploy/demo.sh $(BUILD_DIR)/bin

# The kernels on the default grid against the machine's limits and OpenBLAS:
# the table on stdout, the JSON lines in $(BUILD_DIR)/bench/results.jsonl.
bench: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target nibble-bench
	@mkdir -p $(BUILD_DIR)/bench
	$(BUILD_DIR)/bin/nibble-bench --json=$(BUILD_DIR)/bench/results.jsonl

# nibble-load's rate and stall targets against a nibbled on loopback, and
# the cost of the HAProxy front (deploy/haproxy/).
load-bench: build
	bench/server/load_rate.sh $(BUILD_DIR)/bin

# The kernels alone, their tests and benchmark: no gRPC needed (GPU machines).
kernels:
	cmake -S . -B $(BUILD_DIR)-kernels -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DNIBBLE_BUILD_SERVICE=OFF $(CMAKE_FLAGS)
	cmake --build $(BUILD_DIR)-kernels -j $(JOBS)
	ctest --test-dir $(BUILD_DIR)-kernels -j $(JOBS) --output-on-failure

clean:
	rm -rf $(BUILD_DIR) $(BUILD_DIR)-kernels

format:
	git ls-files '*.h' '*.cc' | xargs clang-format -i

# Dynamic batching's target: 64 clients of M = 1 on a 4096x4096 u4b8 weight,
# nibbled with batching on and off (--max_batch_rows=1), and the ratio.
.PHONY: batching-bench
batching-bench: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target nibbled nibble nibble-load \
	  nibble-bench
	bench/server/batching_bench.sh $(BUILD_DIR)/bin

# The unary latency target: Matmul M = 1 at concurrency 1 on a 4096x4096 u4b8
# weight against the kernel time plus twice the health Check RPC's p50.
.PHONY: latency-bench
latency-bench: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target nibbled nibble nibble-load \
	  nibble-bench
	bench/server/latency_bench.sh $(BUILD_DIR)/bin

# The GPU serving benchmark (issue 26), on the GPU machine: Check and Matmul
# on tiny, 4096x4096 and 8192x28672 u4b8 weights at concurrency 1, 64 and
# 256, batching on and off, unary and MatmulStream, beside nibble-gpu-bench's
# kernel times, and on a machine with several GPUs the 8192x28672 weight once
# per GPU against all of it on GPU 0; JSON and a markdown table in
# $(BUILD_DIR)-gpu/gpu-serve-bench.
# nibbled, nibble and nibble-load come from the portable bundle in
# PORTABLE_DIR (unpacked from PORTABLE_DIR.tar.xz when only that is there),
# which `make portable-bundle` makes on a machine with gRPC and nvcc;
# nibble-gpu-bench is built there, as by gpu-check. GPU_SERVE_STEPS=build,
# test or bench runs one step (bench/server/gpu_serve_check.sh).
PORTABLE_DIR ?= $(BUILD_DIR)/portable
.PHONY: gpu-serve-bench portable-bundle
gpu-serve-bench:
	JOBS=$(JOBS) bench/server/gpu_serve_check.sh $(PORTABLE_DIR) $(BUILD_DIR)-gpu

# The soak (tests/soak/soak.sh) on the GPU machine with --backend=cuda, the
# portable bundle's binaries, GPU memory bounded as RSS is: GPU_SOAK_SECONDS
# (120); results in $(BUILD_DIR)-gpu/gpu-soak.
.PHONY: gpu-soak
gpu-soak:
	GPU_SERVE_STEPS=soak bench/server/gpu_serve_check.sh $(PORTABLE_DIR) \
	  $(BUILD_DIR)-gpu

# The portable bundle, and the same as one .tar.xz to carry (about 10 MB).
portable-bundle: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target nibbled nibble nibble-load \
	  nibble-make-checkpoint
	deploy/portable-bundle.sh $(BUILD_DIR)/bin $(PORTABLE_DIR)
	tar -C $(dir $(PORTABLE_DIR)) -cJf $(PORTABLE_DIR).tar.xz $(notdir $(PORTABLE_DIR))

# The import target: `nibble import` of a 1 GiB safetensors checkpoint (GPTQ,
# AWQ, and BF16 quantized as u4b8:128; synthetic, nibble-make-checkpoint)
# into a nibbled on loopback within twice the time to read the file, both
# from a cold page cache. Checkpoints (one at a time, ~1 GiB), logs and
# results.jsonl in $(BUILD_DIR)/bench/import.
.PHONY: import-bench
import-bench: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS) --target nibbled nibble \
	  nibble-make-checkpoint
	bench/checkpoint/import_bench.sh $(BUILD_DIR)/bin

# On the GPU machine: the kernels-only CUDA build, the GPU tests (also under
# compute-sanitizer), nibble-gpu-bench against PyTorch, and the targets'
# report; logs and results in $(BUILD_DIR)-gpu/gpu-check. Knobs:
# GPU_CHECK_QUICK=1, BENCH_REPEATS, SANITIZER_GTEST_FILTER (deploy/gpu-check.sh).
.PHONY: gpu-check
gpu-check:
	JOBS=$(JOBS) deploy/gpu-check.sh $(BUILD_DIR)-gpu

# On this (Debian) machine, for a GPU machine that has no abseil: Debian's
# abseil headers, shared libraries and CMake package under .gpu-deps/usr with
# their relative layout, which gpu-check finds there.
ABSL_LIBDIR := /usr/lib/x86_64-linux-gnu
.PHONY: gpu-deps
gpu-deps:
	@test -f $(ABSL_LIBDIR)/cmake/absl/abslConfig.cmake || { echo \
	  "gpu-deps: no abseil CMake package in $(ABSL_LIBDIR); install" \
	  "libabsl-dev (make deps)"; exit 1; }
	rm -rf .gpu-deps
	mkdir -p .gpu-deps/usr/include .gpu-deps/usr/lib/x86_64-linux-gnu/cmake
	cp -a /usr/include/absl .gpu-deps/usr/include/
	cp -a $(ABSL_LIBDIR)/libabsl_*.so* .gpu-deps/usr/lib/x86_64-linux-gnu/
	cp -a $(ABSL_LIBDIR)/cmake/absl .gpu-deps/usr/lib/x86_64-linux-gnu/cmake/
	@size=$$(du -sm .gpu-deps | cut -f1); \
	  echo "gpu-deps: .gpu-deps holds $$size MB"; \
	  test $$size -lt 60 || { echo "gpu-deps: over 60 MB, too much to" \
	  "carry to the GPU machine"; exit 1; }

# The container image built with podman and run for real: health, upload,
# nibble-load with --verify, the short forms of the hostile-client scenarios
# its front is for, and a restart on the same volume.
.PHONY: container-test
container-test:
	@deploy/install-deps.sh container test
	deploy/container-test.sh

# The scale tests at full size (tests/integration/scale_test.cc; make test
# runs them small): a million tiny weights uploaded, listed page by page and
# deleted, and a 2 GB Matmul refused while the server serves on.
.PHONY: limits
limits: build
	NIBBLE_FULL_SCALE=1 $(BUILD_DIR)/bin/nibble_integration_test \
	  --gtest_filter='ScaleTest.*'

# Every hostile-client scenario at full size against a nibbled of its own
# (tests/hostile/hostile_test.py; make test runs their short forms): alive,
# bystander p99 within 50 ms of its p99 alone before the attack (twice
# that), RSS within budget + margin, nothing lost.
.PHONY: hostile
hostile: build
	tests/hostile/hostile_test.py --full --bin_dir=$(BUILD_DIR)/bin \
	  --proto_py=$(BUILD_DIR)/tests/hostile/proto_py \
	  --scratch=$(abspath $(BUILD_DIR))/hostile

# The Kubernetes manifests rendered with kustomize and checked against the
# Kubernetes API schemas.
.PHONY: k8s-check
k8s-check:
	@deploy/install-deps.sh k8s
	deploy/k8s/check.sh

# libFuzzer on every target of tests/fuzz for FUZZ_SECONDS each, built with
# clang, ASan and UBSan in build-fuzz; the scratch corpora, logs and any
# crashers stay there (tests/fuzz/run_fuzzers.sh).
FUZZ_SECONDS ?= 60
FUZZ_TARGETS := weight_file_fuzzer tuning_table_fuzzer upload_fuzzer \
  rpc_messages_fuzzer safetensors_fuzzer shard_index_fuzzer
.PHONY: fuzz
fuzz:
	@deploy/install-deps.sh build test fuzz
	@CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNIBBLE_FUZZ=ON -DNIBBLE_CUDA=OFF \
	  > /dev/null
	@cmake --build build-fuzz -j $(JOBS) --target $(FUZZ_TARGETS)
	tests/fuzz/run_fuzzers.sh build-fuzz $(FUZZ_SECONDS) $(FUZZ_TARGETS)

# The CPU kernels' tests (every kernel against the float64 reference) under
# ASan and UBSan, in the soak's build-asan: a kernel that reads past a
# weight's panels passes the plain tests whenever the next page happens to be
# mapped, and fails here every time.
.PHONY: kernels-asan
kernels-asan:
	@deploy/install-deps.sh build
	@cmake -S . -B $(SOAK_BUILD_address) -G Ninja \
	  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DNIBBLE_CUDA=OFF \
	  -DNIBBLE_BUILD_TESTS=ON -DNIBBLE_SANITIZE=address > /dev/null
	@cmake --build $(SOAK_BUILD_address) -j $(JOBS) --target nibble_kernels_test
	$(SOAK_BUILD_address)/bin/nibble_kernels_test --gtest_brief=1

# The soak (tests/soak/soak.sh): nibbled built with ASan and UBSan
# (SOAK_SANITIZER=address, in build-asan), with TSan (thread, in build-tsan,
# on an abseil built with TSan by deploy/tsan-deps.sh in build-tsan-deps, with
# tests/soak/tsan.supp for gRPC's uninstrumented hand-offs) or with none
# (none, in build-soak: the memory curve without a sanitizer's own growth)
# under SOAK_RATE requests/s of verified open-loop load, with uploads and
# deletes beside it, for SOAK_SECONDS; rss.csv, rss.svg, the load's JSON and
# any sanitizer report in $(SOAK_BUILD)/soak. g++ brings the sanitizer
# runtimes (libasan8, libubsan1, libtsan2 come with libgcc-12-dev).
SOAK_SECONDS ?= 600
SOAK_SANITIZER ?= address
SOAK_RATE ?= 200
SOAK_BUILD_address := build-asan
SOAK_BUILD_thread := build-tsan
SOAK_BUILD_none := build-soak
SOAK_BUILD := $(SOAK_BUILD_$(SOAK_SANITIZER))
# Without a sanitizer's own bookkeeping, memory must stay flat: 4 MiB of room.
SOAK_RSS_SLACK_MIB ?= $(if $(filter none,$(SOAK_SANITIZER)),4,32)
SOAK_TSAN_DEPS := build-tsan-deps
.PHONY: soak
soak:
	@case "$(SOAK_SANITIZER)" in address|thread|none) ;; *) echo "soak:" \
	  "SOAK_SANITIZER is address, thread or none, not '$(SOAK_SANITIZER)'"; \
	  exit 2;; esac
	@deploy/install-deps.sh build
	$(if $(filter thread,$(SOAK_SANITIZER)),@deploy/tsan-deps.sh $(SOAK_TSAN_DEPS))
	@cmake -S . -B $(SOAK_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DNIBBLE_CUDA=OFF -DNIBBLE_BUILD_TESTS=OFF \
	  -DNIBBLE_SANITIZE=$(filter-out none,$(SOAK_SANITIZER)) > /dev/null
	@cmake --build $(SOAK_BUILD) -j $(JOBS) --target nibbled nibble nibble-load
	SOAK_RATE=$(SOAK_RATE) SOAK_OUT=$(SOAK_BUILD)/soak \
	  SOAK_RSS_SLACK_MIB=$(SOAK_RSS_SLACK_MIB) \
	  $(if $(filter thread,$(SOAK_SANITIZER)),LD_LIBRARY_PATH=$(CURDIR)/$(SOAK_TSAN_DEPS)/lib) \
	  tests/soak/soak.sh $(SOAK_BUILD)/bin $(SOAK_SECONDS)
