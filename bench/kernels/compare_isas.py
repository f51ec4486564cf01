#!/usr/bin/env python3
"""nibble's CPU kernels at several ISA levels side by side, on one machine.

Runs nibble-bench --json once per level (NIBBLE_ISA caps the level) in each of
--rounds interleaved rounds, so that the load of a shared machine falls on
every level alike, and prints per grid point and variant the median µs over
the rounds at each level and each level's time over the first level's. The
fp32 FMA peak and the read bandwidth are the medians of every run's; %peak
is the fastest variant's GFLOP/s over that peak, x floor its time over the
weight's bytes at that bandwidth. The load average is printed before and
after.

Usage: compare_isas.py [--bench BIN] [--isas LEVELS] [--rounds N]
                       [--markdown] [-- NIBBLE_BENCH_FLAGS...]
e.g.   bench/kernels/compare_isas.py --isas=avx512,avx512_bf16 --rounds=3 \\
           -- --m=16,64 --shapes=8192x28672 --formats=u4b8
"""

import argparse
import json
import os
import statistics
import subprocess
import sys


def run_bench(bench, isa, flags):
    env = dict(os.environ, NIBBLE_ISA=isa)
    out = subprocess.run([bench, "--json"] + flags, env=env, check=True,
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                         text=True).stdout
    machine, rows = None, []
    for line in out.splitlines():
        record = json.loads(line)
        if "machine" in record:
            machine = record["machine"]
        elif record.get("backend") == "cpu":
            rows.append(record)
    return machine, rows


def load_average():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    parser.add_argument("--bench", default="build/bin/nibble-bench")
    parser.add_argument("--isas", default="avx512,avx512_bf16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("flags", nargs="*")
    args = parser.parse_args()
    isas = args.isas.split(",")

    print(f"load average before: {load_average()}")
    times = {}  # (point, variant) -> isa -> [µs per round]
    points = {}  # point -> (bytes, m, k, n)
    peaks, bandwidths = [], []
    for round_index in range(args.rounds):
        for isa in isas:
            print(f"round {round_index + 1}/{args.rounds}: {isa}",
                  file=sys.stderr)
            machine, rows = run_bench(args.bench, isa, args.flags)
            peaks.append(machine["fma_peak_gflops"])
            bandwidths.append(machine["read_gbps"])
            for row in rows:
                point = (row["format"], row["group"], row["k"], row["n"],
                         row["m"])
                points[point] = (row["bytes"], row["m"], row["k"], row["n"])
                key = (point, row["variant"])
                times.setdefault(key, {}).setdefault(isa, []).append(
                    row["median_us"])
    print(f"load average after: {load_average()}")
    peak = statistics.median(peaks)
    bandwidth = statistics.median(bandwidths)
    print(f"fp32 FMA peak {peak:.1f} GFLOP/s (runs: "
          f"{min(peaks):.1f}-{max(peaks):.1f}), read {bandwidth:.1f} GB/s "
          f"(runs: {min(bandwidths):.1f}-{max(bandwidths):.1f}), "
          f"{args.rounds} rounds")

    header = ["format", "group", "m", "k x n", "variant"]
    header += [f"{isa} µs" for isa in isas]
    header += [f"{isa} / {isas[0]}" for isa in isas[1:]]
    header += [f"{isa} %peak" for isa in isas] + ["x floor (best)"]
    lines = []
    for point in sorted(points, key=lambda p: (p[0], p[1], p[2], p[3], p[4])):
        bytes_, m, k, n = points[point]
        best = None
        for variant in ("fused", "double_buffered", "striped"):
            per_isa = times.get((point, variant))
            if not per_isa:
                continue
            medians = {isa: statistics.median(per_isa[isa])
                       for isa in isas if isa in per_isa}
            fastest = min(medians.values())
            best = fastest if best is None else min(best, fastest)
            row = [point[0], str(point[1]), str(m), f"{k}x{n}", variant]
            row += [f"{medians[isa]:.1f}" if isa in medians else "-"
                    for isa in isas]
            row += [f"{medians[isa] / medians[isas[0]]:.2f}"
                    if isa in medians and isas[0] in medians else "-"
                    for isa in isas[1:]]
            row += [f"{2 * m * k * n / medians[isa] / 1e3 / peak * 100:.0f}%"
                    if isa in medians else "-" for isa in isas]
            row.append("")
            lines.append(row)
        floor_us = bytes_ / bandwidth / 1e3
        lines[-1][-1] = f"{best / floor_us:.2f}"

    if args.markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for row in lines:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(r[i]) for r in lines + [header])
                  for i in range(len(header))]
        for row in [header] + lines:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths)))


if __name__ == "__main__":
    main()
