#!/usr/bin/env python3
"""The report of bench/server/gpu_serve_bench.sh: reads the nibble-load JSON
of every run (listed in runs.tsv) and nibble-gpu-bench's JSON lines, writes
all of it as one JSON document and a markdown table with issue 26's targets,
each PASS or FAIL (or MISSING when a run has no result); with --multi_gpu,
also the multi-GPU runs (multi_gpu.tsv) and issue 30's throughput target.

  gpu_serve_report.py --runs=runs.tsv --kernels=kernels.jsonl \
      --json=results.json --markdown=report.md \
      [--multi_gpu=multi_gpu.tsv --gpus=2]
"""

import argparse
import json
import os
import sys

# The weights of gpu_serve_bench.sh, by name: (K, N).
SHAPES = {"tiny": (128, 256), "mid": (4096, 4096), "big": (8192, 28672)}


def read_runs(path):
    runs = []
    with open(path) as tsv:
        for line in tsv:
            batching, name, api, concurrency, json_path = line.rstrip("\n").split("\t")
            with open(json_path) as f:
                load = json.load(f)
            runs.append({"batching": batching, "weight": name, "api": api,
                         "concurrency": int(concurrency),
                         "requests_per_second": load["throughput_rps"],
                         "p50_us": load["latency_us"]["p50"],
                         "p99_us": load["latency_us"]["p99"],
                         "errors": load["errors"],
                         "verified": load.get("verified", 0),
                         "kernels": load.get("kernels"),
                         "nibble_load": load})
    return runs


def read_kernels(path):
    """The scheduler's pick's median per (k, n, m), in microseconds, and with
    nibble-gpu-bench --latency that of one call through the backend."""
    kernels = {}
    if not os.path.exists(path):
        return kernels
    with open(path) as jsonl:
        for line in jsonl:
            row = json.loads(line)
            if row.get("pick") and "median_us" in row:
                kernels[(row["k"], row["n"], row["m"])] = {
                    "kernel": row["kernel"], "median_us": row["median_us"],
                    "call_us": row.get("call_us")}
    return kernels


def find(runs, batching, weight, api, concurrency):
    for run in runs:
        if (run["batching"], run["weight"], run["api"],
                run["concurrency"]) == (batching, weight, api, concurrency):
            return run
    return None


def targets(runs, kernels):
    """(target, measured, verdict) for each of issue 26's targets."""
    rows = []

    def add(what, measured, passed):
        verdict = "MISSING" if passed is None else ("PASS" if passed else "FAIL")
        rows.append((what, measured, verdict))

    big_k, big_n = SHAPES["big"]
    kernel = kernels.get((big_k, big_n, 1))
    check = find(runs, "on", "check", "Check", 1)
    unary = find(runs, "on", "big", "Matmul", 1)
    if kernel and check and unary:
        bound = kernel["median_us"] + 1.3 * check["p50_us"]
        add("c=1 big p50 <= kernel + 1.3 x Check p50",
            f"{unary['p50_us']:.0f} us vs {bound:.0f} us", unary["p50_us"] <= bound)
    else:
        add("c=1 big p50 <= kernel + 1.3 x Check p50", "-", None)
    big64 = find(runs, "on", "big", "Matmul", 64)
    tiny64 = find(runs, "on", "tiny", "Matmul", 64)
    if big64 and tiny64:
        ratio = big64["requests_per_second"] / tiny64["requests_per_second"]
        add("c=64 big req/s >= 80 % of tiny's", f"{100 * ratio:.0f} %", ratio >= 0.8)
    else:
        add("c=64 big req/s >= 80 % of tiny's", "-", None)
    big256 = find(runs, "on", "big", "Matmul", 256)
    if big64 and big256:
        add("c=256 big req/s >= c=64's",
            f"{big256['requests_per_second']:.0f} vs {big64['requests_per_second']:.0f}",
            big256["requests_per_second"] >= big64["requests_per_second"])
    else:
        add("c=256 big req/s >= c=64's", "-", None)
    off64 = find(runs, "off", "big", "Matmul", 64)
    if big64 and off64:
        gain = big64["requests_per_second"] / off64["requests_per_second"]
        add("c=64 big: batching >= 4 x --max_batch_rows=1", f"{gain:.1f} x", gain >= 4)
    else:
        add("c=64 big: batching >= 4 x --max_batch_rows=1", "-", None)
    errors = sum(run["errors"] for run in runs)
    add("no errors, no wrong replies (--verify)", f"{errors} errors", errors == 0 and bool(runs))
    return rows


def read_multi_gpu(path):
    """multi_gpu.tsv's rows: placement ("one" or "all"), weight, api,
    concurrency, summed requests/s, worst p50 and errors."""
    rows = []
    if not path or not os.path.exists(path):
        return rows
    with open(path) as tsv:
        for line in tsv:
            placement, weight, api, concurrency, rps, p50, errors = \
                line.rstrip("\n").split("\t")
            rows.append({"placement": placement, "weight": weight, "api": api,
                         "concurrency": int(concurrency),
                         "requests_per_second": float(rps), "p50_us": float(p50),
                         "errors": int(errors)})
    return rows


def multi_gpu_markdown(rows, gpus):
    """The multi-GPU table and issue 30's target: all GPUs >= 1.8 x GPU 0
    alone at 256 clients (unary, big weight), beside the ceiling the tiny
    weight shows."""
    if not rows:
        return []
    lines = ["", f"## {gpus} GPUs (issue 30)", "",
             f"Each weight uploaded {gpus} times, clients spread evenly over "
             "the copies; nibbled on GPU 0 alone (`--gpus=0`) or on every "
             "GPU (each copy on its own). The tiny weight's runs are the "
             "server's ceiling with next to no GPU work.", "",
             "| nibbled on | weight | api | clients | requests/s "
             "| worst p50 us | errors |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        where = "GPU 0" if row["placement"] == "one" else f"all {gpus} GPUs"
        shape = SHAPES.get(row["weight"], ("?", "?"))
        lines.append(f"| {where} | {row['weight']} {shape[0]}x{shape[1]} "
                     f"| {row['api']} | {row['concurrency']} "
                     f"| {row['requests_per_second']:.0f} | {row['p50_us']:.0f} "
                     f"| {row['errors']} |")
    rate = {(r["placement"], r["weight"], r["api"], r["concurrency"]):
            r["requests_per_second"] for r in rows}
    one = rate.get(("one", "big", "Matmul", 256))
    every = rate.get(("all", "big", "Matmul", 256))
    ceiling = rate.get(("all", "tiny", "Matmul", 256))
    if one and every:
        ratio = every / one
        verdict = "PASS" if ratio >= 1.8 else "FAIL"
        lines += ["", f"Target: all GPUs >= 1.8 x GPU 0 alone at 256 clients "
                      f"(unary): {ratio:.2f} x, {verdict}."]
        if ceiling:
            lines.append(f"The tiny weight on every GPU, same clients: "
                         f"{ceiling:.0f} requests/s; the big weight on every "
                         f"GPU reaches {100 * every / ceiling:.0f} % of it.")
    return lines


def markdown(runs, kernels, target_rows, multi_rows=(), gpus=0):
    lines = ["# gpu-serve-bench", "",
             "M = 1 f16 closed loop; kernel times are nibble-gpu-bench's "
             "medians for the scheduler's pick, backend call its --latency "
             "median of one M = 1 call through the backend (A and C in host "
             "memory).", "",
             "| weight | api | batching | concurrency | requests/s | p50 us "
             "| p99 us | errors | verified | kernel M=1 us "
             "| backend call M=1 us | kernel M=64 us |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        shape = SHAPES.get(run["weight"])
        k1 = kernels.get((*shape, 1)) if shape else None
        k64 = kernels.get((*shape, 64)) if shape else None
        label = (f"{run['weight']} {shape[0]}x{shape[1]}" if shape
                 else "health Check")
        lines.append(
            f"| {label} | {run['api']} | {run['batching']} | {run['concurrency']} "
            f"| {run['requests_per_second']:.0f} | {run['p50_us']} | {run['p99_us']} "
            f"| {run['errors']} | {run['verified']} "
            f"| {k1['median_us'] if k1 else '-'} "
            f"| {k1['call_us'] if k1 and k1['call_us'] is not None else '-'} "
            f"| {k64['median_us'] if k64 else '-'} |")
    lines += ["", "## Targets (issue 26)", "", "| target | measured | verdict |",
              "|---|---|---|"]
    lines += [f"| {what} | {measured} | {verdict} |"
              for what, measured, verdict in target_rows]
    lines += multi_gpu_markdown(multi_rows, gpus)
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", required=True)
    parser.add_argument("--kernels", required=True)
    parser.add_argument("--json", required=True)
    parser.add_argument("--markdown", required=True)
    parser.add_argument("--multi_gpu", default="")
    parser.add_argument("--gpus", type=int, default=0)
    args = parser.parse_args()
    runs = read_runs(args.runs) if os.path.exists(args.runs) else []
    kernels = read_kernels(args.kernels)
    target_rows = targets(runs, kernels)
    multi_rows = read_multi_gpu(args.multi_gpu)
    with open(args.json, "w") as f:
        json.dump({"runs": runs,
                   "kernels": [{"k": k, "n": n, "m": m, **v}
                               for (k, n, m), v in sorted(kernels.items())],
                   "targets": [{"target": t, "measured": m, "verdict": v}
                                for t, m, v in target_rows],
                   "multi_gpu": multi_rows}, f, indent=1)
    with open(args.markdown, "w") as f:
        f.write(markdown(runs, kernels, target_rows, multi_rows, args.gpus))
    return 0 if runs else 1


if __name__ == "__main__":
    sys.exit(main())
