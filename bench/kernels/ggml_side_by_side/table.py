#!/usr/bin/env python3
"""The markdown table of run.sh: medians over rounds, ggml against nibble.

  table.py OUT_DIR   (reads OUT_DIR/ggml_r*.jsonl and OUT_DIR/nibble_r*.jsonl)
"""
import glob
import json
import os
import statistics
import sys


def read_lines(pattern):
    rounds = []
    for path in sorted(glob.glob(pattern)):
        with open(path) as file:
            rounds.append([json.loads(line) for line in file if line.strip()])
    return rounds


def short_name(kernel):
    """fused_u4b8_avx512_bf16 -> fused_bf16."""
    return kernel.split("_")[0] + ("_bf16" if kernel.endswith("bf16") else "")


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: table.py OUT_DIR")
    out = sys.argv[1]
    ggml_rounds = read_lines(os.path.join(out, "ggml_r*.jsonl"))
    nibble_rounds = read_lines(os.path.join(out, "nibble_r*.jsonl"))
    if not ggml_rounds or not nibble_rounds:
        sys.exit(f"no ggml_r*.jsonl or nibble_r*.jsonl in {out}")

    ggml = {}  # (m, k, n) -> [ms per round]
    buffer_type = ""
    for lines in ggml_rounds:
        for row in lines:
            ggml.setdefault((row["m"], row["k"], row["n"]), []).append(
                row["median_ms"])
            buffer_type = row["buffer_type"]
    pick, best, int8, floor, kernels, machines = {}, {}, {}, {}, {}, []
    bf16_a = {}  # (m, k, n) -> [ms of the pick on A sent as bf16, per round]
    for round_index, lines in enumerate(nibble_rounds):
        for row in lines:
            if "machine" in row:
                machines.append(row["machine"])
                continue
            if row["backend"] != "cpu":
                continue
            point = (row["m"], row["k"], row["n"])
            ms = row["median_us"] / 1000
            if row.get("a") == "bf16":
                if row["pick"]:
                    bf16_a.setdefault(point, []).append(ms)
                continue
            if row["precision"] == "bf16":
                # The fastest variant of each round, whichever it is.
                times = best.setdefault(point, {})
                if ms < times.get(round_index, (float("inf"), ""))[0]:
                    times[round_index] = (ms, short_name(row["kernel"]))
            if not row["pick"]:
                continue
            floor.setdefault(point, []).append(row["floor_us"] / 1000)
            if row["precision"] == "int8":
                if row["kernel"].endswith("_int8"):
                    int8.setdefault(point, []).append(row["median_us"] / 1000)
            else:
                pick.setdefault(point, []).append(row["median_us"] / 1000)
                kernels.setdefault(point, set()).add(row["kernel"])

    machine = machines[0]
    read = [m["read_gbps"] for m in machines]
    print(f"{machine['cpu']}, {machine['threads']} threads, nibble level "
          f"{machine['kernel_isa']}, ggml weight buffer {buffer_type}; "
          f"{len(ggml_rounds)} interleaved rounds, medians; read bandwidth "
          f"{min(read):.1f}-{max(read):.1f} GB/s over nibble-bench's runs "
          f"(floor = weight bytes / its median)\n")
    print("| M | K×N | ggml Q4_0 ms | nibble u4b8 g128 pick ms | pick / ggml "
          "| nibble best ms | best / ggml | nibble int8 ms | int8 / ggml "
          "| floor ms | pick / floor | nibble, A in bf16, ms "
          "| bf16 A / ggml |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def median(values):
        return statistics.median(values) if values else None

    def cell(value, digits=3):
        return "—" if value is None else f"{value:.{digits}f}"

    for point in sorted(ggml, key=lambda p: (p[0], p[1] * p[2])):
        m, k, n = point
        g = median(ggml[point])
        p = median(pick.get(point, []))
        i = median(int8.get(point, []))
        f = median(floor.get(point, []))
        a = median(bf16_a.get(point, []))
        variant = ", ".join(sorted(short_name(name)
                                   for name in kernels.get(point, [])))
        rounds_best = best.get(point, {}).values()
        b = median([ms for ms, _ in rounds_best])
        best_variants = ", ".join(sorted({name for _, name in rounds_best}))
        print(f"| {m} | {k}×{n} | {cell(g)} | {cell(p)} ({variant}) "
              f"| {cell(p / g if p else None, 2)} "
              f"| {cell(b)} ({best_variants}) "
              f"| {cell(b / g if b else None, 2)} | {cell(i)} "
              f"| {cell(i / g if i else None, 2)} | {cell(f)} "
              f"| {cell(p / f if p and f else None, 2)} | {cell(a)} "
              f"| {cell(a / g if a else None, 2)} |")


if __name__ == "__main__":
    main()
