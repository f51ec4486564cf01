#!/usr/bin/env python3
"""PyTorch's timings on nibble-gpu-bench's grid, for bench/kernels/cuda/gpu_report.py.

Times, for each shape (K, N) and M, torch.matmul in fp16 (cuBLAS; A [M, K] @
W [K, N]) and torch._weight_int4pack_mm (PyTorch's int4 kernel: bf16 A,
group 128), plus one large device-to-device copy for the bandwidth, and writes
JSON lines with nibble-bench's fields: backend "torch", kernel "cublas_fp16"
or "torch_int4pack_bf16_g128". Run by deploy/gpu-check.sh with the GPU
machine's python3 (torch with CUDA).

How a point is timed: copies of the weight that together exceed 4x the L2 are
read in turn, one per launch, so that the weight comes from HBM. After
warm-up launches, and more for STEADY_STATE_WARMUP_SECONDS (the clocks of a
GPU under sustained load), a CUDA graph of `batch` back-to-back launches (a
multiple of the copies) is replayed between two events; a launch's time is a
replay's time over `batch`, and the point's time is the median over the
replays. The graph keeps Python's launch overhead, tens of microseconds, out
of kernels that take about ten.

Usage: torch_baselines.py [--m=1,16,64,256,1024] [--shapes=KxN,...]
                          [--repeats=N] [--quick] [--json=FILE]
"""

import argparse
import collections
import json
import math
import statistics
import sys
import time

import torch

DEFAULT_MS = "1,16,64,256,1024"
DEFAULT_SHAPES = "4096x14336,14336x4096,8192x28672,28672x8192"
QUICK_SHAPES = "4096x14336,14336x4096"
WARMUP_LAUNCHES = 20
# How long each baseline runs before it is timed, at the least: until the GPU
# holds the clocks it keeps under sustained load, as nibble-gpu-bench's
# kSteadyStateWarmup (the reasons are there), so that both are timed in the
# same state.
STEADY_STATE_WARMUP_SECONDS = 2.0
# Launches per graph replay, before rounding up to a multiple of the copies.
BATCH = 20
L2_MULTIPLE = 4
MAX_COPIES = 64
# The bandwidth copy moves 1 GiB each way: 2 GiB of traffic per copy.
COPY_BUFFER_BYTES = 1 << 30
COPY_REPEATS = 10
INT4_GROUP = 128
INT4_INNER_K_TILES = 2


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="Times torch.matmul fp16 and torch._weight_int4pack_mm "
        "on nibble-gpu-bench's grid.")
    parser.add_argument("--m", default=DEFAULT_MS, help="rows of A")
    parser.add_argument("--shapes", help="weight shapes KxN (default "
                        f"{DEFAULT_SHAPES}; --quick: {QUICK_SHAPES})")
    parser.add_argument("--repeats", type=int,
                        help="timed launches per baseline and point "
                        "(default 200; --quick: 50)")
    parser.add_argument("--quick", action="store_true",
                        help="two shapes and 50 repeats")
    parser.add_argument("--json", metavar="FILE",
                        help="JSON lines into FILE and a table on stdout "
                        "(default: JSON lines on stdout)")
    args = parser.parse_args(argv)
    try:
        args.ms = sorted({int(m) for m in args.m.split(",")})
        shapes = args.shapes or (QUICK_SHAPES if args.quick else
                                 DEFAULT_SHAPES)
        args.shapes = [tuple(int(side) for side in shape.split("x"))
                       for shape in shapes.split(",")]
    except ValueError:
        parser.error("--m takes integers like 1,16 and --shapes KxN pairs "
                     "like 4096x14336")
    if min(args.ms) <= 0 or any(len(s) != 2 or min(s) <= 0
                                for s in args.shapes):
        parser.error("--m and --shapes take positive numbers, shapes as KxN")
    for k, n in args.shapes:
        if k % INT4_GROUP or n % 8:
            parser.error(f"shape {k}x{n}: the int4 baseline needs K a "
                         f"multiple of {INT4_GROUP} and N of 8")
    if args.repeats is None:
        args.repeats = 50 if args.quick else 200
    if args.repeats <= 0:
        parser.error("--repeats must be positive")
    return args


def median_of_events(pairs):
    return statistics.median(start.elapsed_time(end) * 1e3
                             for start, end in pairs)


def keep_running(step, seconds):
    """Calls step() and waits for the GPU, again, until `seconds` passed."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        step()
        torch.cuda.synchronize()


def time_eagerly(launch, repeats, warmup_seconds=0.0):
    """Median us of `repeats` launches, each between two events, after
    WARMUP_LAUNCHES and then more for `warmup_seconds`."""
    for i in range(WARMUP_LAUNCHES):
        launch(i)
    keep_running(lambda: [launch(i) for i in range(WARMUP_LAUNCHES)],
                 warmup_seconds)
    pairs = [(torch.cuda.Event(enable_timing=True),
              torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for i, (start, end) in enumerate(pairs):
        start.record()
        launch(WARMUP_LAUNCHES + i)
        end.record()
    torch.cuda.synchronize()
    return median_of_events(pairs), repeats


def time_graph(launch, copies, repeats):
    """Median us per launch over replays of a graph of back-to-back launches,
    as the module docstring says; the launch count it timed."""
    batch = copies * math.ceil(BATCH / copies)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warms up cuBLAS outside the capture
        for i in range(WARMUP_LAUNCHES):
            launch(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(batch):
            launch(i)
    graph.replay()
    keep_running(graph.replay, STEADY_STATE_WARMUP_SECONDS)
    replays = max(3, math.ceil(repeats / batch))
    events = [torch.cuda.Event(enable_timing=True)
              for _ in range(replays + 1)]
    events[0].record()
    for i in range(replays):
        graph.replay()
        events[i + 1].record()
    torch.cuda.synchronize()
    return median_of_events(zip(events, events[1:])) / batch, replays * batch


def copies_for(nbytes, l2_bytes):
    """How many copies of `nbytes` exceed L2_MULTIPLE x the L2 together."""
    return min(MAX_COPIES, L2_MULTIPLE * l2_bytes // nbytes + 1)


def measure_copy():
    source = torch.full((COPY_BUFFER_BYTES,), 0x5a, dtype=torch.uint8,
                        device="cuda")
    destination = torch.empty_like(source)
    us, _ = time_eagerly(lambda _: destination.copy_(source), COPY_REPEATS)
    moved = 2 * COPY_BUFFER_BYTES
    return moved / (us * 1e3), moved


def cublas_operands(k, n, l2_bytes):
    weight = (torch.rand(k, n, device="cuda") * 0.04 - 0.02).half()
    copies = [weight] + [weight.clone() for _ in range(
        copies_for(weight.numel() * 2, l2_bytes) - 1)]
    return copies, k * n * 2


def int4_operands(k, n, l2_bytes):
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8, device="cuda")
    packed_bytes = (codes[:, 0::2] << 4) | codes[:, 1::2]  # [N, K/2]
    packed = torch._convert_weight_to_int4pack(packed_bytes,
                                               INT4_INNER_K_TILES)
    groups = k // INT4_GROUP
    scales = torch.rand(groups, n, device="cuda") * (2**-4 - 2**-8) + 2**-8
    zeros = (torch.rand(groups, n, device="cuda") - 0.5) * 2**-4
    scales_and_zeros = torch.stack([scales, zeros], dim=2).to(torch.bfloat16)
    nbytes = k * n // 2 + scales_and_zeros.numel() * 2
    copies = [(packed, scales_and_zeros)] + [
        (packed.clone(), scales_and_zeros.clone())
        for _ in range(copies_for(nbytes, l2_bytes) - 1)]
    return copies, nbytes


def time_baseline(operands, run, repeats):
    def launch(i):
        run(operands[i % len(operands)])
    try:
        return time_graph(launch, len(operands), repeats)
    except RuntimeError as error:
        print(f"torch_baselines: CUDA graph capture failed ({error}); timing "
              "eager launches, which include Python's launch overhead",
              file=sys.stderr)
        torch.cuda.synchronize()
        return time_eagerly(launch, repeats, STEADY_STATE_WARMUP_SECONDS)


# A baseline's row fields, how it makes its weight copies (and their bytes)
# for a shape, the dtype of its A, and one launch run(a, weight copy).
Baseline = collections.namedtuple(
    "Baseline", "kernel variant format group make dtype run")
BASELINES = [
    Baseline("cublas_fp16", "matmul", "f16", 0, cublas_operands,
             torch.float16, torch.matmul),
    Baseline("torch_int4pack_bf16_g128", "weight_int4pack_mm", "int4pack",
             INT4_GROUP, int4_operands, torch.bfloat16,
             lambda a, w: torch._weight_int4pack_mm(a, w[0], INT4_GROUP,
                                                    w[1])),
]


def row(baseline, m, k, n, sms, us, calls, nbytes, copy_gbps):
    return {"backend": "torch", "kernel": baseline.kernel,
            "variant": baseline.variant, "pick": False,
            "format": baseline.format, "group": baseline.group, "m": m,
            "k": k, "n": n, "threads": sms, "median_us": round(us, 3),
            "calls": calls, "bytes": nbytes,
            "gbps": round(nbytes / (us * 1e3), 3),
            "gflops": round(2 * m * k * n / (us * 1e3), 3),
            "floor_us": round(nbytes / (copy_gbps * 1e3), 3)}


def main(argv):
    args = parse_args(argv)
    try:  # a bad path is found before the long run
        out = open(args.json, "w") if args.json else sys.stdout
    except OSError as error:
        print(f"torch_baselines: cannot write --json: {error}",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("torch_baselines: torch sees no CUDA device; run it on the GPU "
              "machine with a CUDA build of torch", file=sys.stderr)
        return 1
    torch.manual_seed(1)
    props = torch.cuda.get_device_properties(0)
    l2_bytes = getattr(props, "L2_cache_size", 0) or 64 << 20
    sms = props.multi_processor_count
    print(f"{props.name}: measuring the copy bandwidth", file=sys.stderr)
    copy_gbps, copy_bytes = measure_copy()
    rows = []
    failures = []
    total = len(args.shapes) * len(args.ms)
    step = 0
    for k, n in args.shapes:
        prepared = []
        for baseline in BASELINES:
            try:
                prepared.append((baseline,) + baseline.make(k, n, l2_bytes))
            except RuntimeError as error:
                failures.append(f"{baseline.kernel} {k}x{n}: {error}")
        for m in args.ms:
            step += 1
            print(f"[{step}/{total}] torch {k}x{n} m={m}", file=sys.stderr)
            for baseline, operands, nbytes in prepared:
                a = (torch.rand(m, k, device="cuda") * 2 - 1).to(
                    baseline.dtype)
                try:
                    us, calls = time_baseline(
                        operands, lambda w, a=a, run=baseline.run: run(a, w),
                        args.repeats)
                except RuntimeError as error:
                    failures.append(f"{baseline.kernel} {k}x{n} m={m}: "
                                    f"{error}")
                    continue
                rows.append(row(baseline, m, k, n, sms, us, calls, nbytes,
                                copy_gbps))
        del prepared
        torch.cuda.empty_cache()

    machine = {"machine": {
        "gpu": props.name, "sms": sms,
        "compute_capability": props.major * 10 + props.minor,
        "l2_bytes": l2_bytes, "memory_bytes": props.total_memory,
        "copy_gbps": round(copy_gbps, 3), "copy_bytes": copy_bytes,
        "repeats": args.repeats, "warmup": WARMUP_LAUNCHES,
        "steady_state_warmup_s": STEADY_STATE_WARMUP_SECONDS,
        "torch": torch.__version__, "cuda": torch.version.cuda}}
    lines = [json.dumps(obj, separators=(",", ":")) for obj in
             [machine] + rows]
    out.write("\n".join(lines) + "\n")
    if args.json:
        out.close()
        print(f"torch {torch.__version__} on {props.name}: copy "
              f"{copy_gbps:.1f} GB/s")
        print(f"{'kernel':<26} {'m':>5} {'k':>6} {'n':>6} {'us':>10} "
              f"{'GB/s':>8} {'TFLOP/s':>8}")
        for r in rows:
            print(f"{r['kernel']:<26} {r['m']:>5} {r['k']:>6} {r['n']:>6} "
                  f"{r['median_us']:>10.1f} {r['gbps']:>8.1f} "
                  f"{r['gflops'] / 1e3:>8.1f}")
    for failure in failures:
        print(f"torch_baselines: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
