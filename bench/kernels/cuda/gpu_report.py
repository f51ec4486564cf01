#!/usr/bin/env python3
"""nibble's CUDA kernels against the GPU targets, from the JSON lines of
nibble-gpu-bench and bench/kernels/cuda/torch_baselines.py.

Prints one table per (format, group, shape): a row per M with the µs of the
scheduler's pick (one launch between two events, and per launch in chains
with no events between) and of each variant, the floor (weight bytes at the
copy bandwidth), the weight read alone (a kernel that only reads it,
launched as the matmuls are, both ways), cuBLAS fp16 and torch int4, and the
ratios the targets name, each marked PASS or MISS, with the pick's time over
the read. Every target takes the pick's time in chains: a floor has no
events between launches, and torch_baselines.py times its baselines as
chains too (replays of a CUDA graph of back-to-back launches, events only
around each replay); rows written before nibble-gpu-bench timed chains take
the time with events. Then,
per shape, the formats side by side (the pick's µs of each, and its time
over fp4's; no targets); then the count.
Exit status: 0 when every target is met, 1 when one is missed or has no
data, 2 when the input is unusable.

Usage: gpu_report.py NIBBLE_JSONL TORCH_JSONL [--markdown]
"""

import argparse
import json
import sys

CUBLAS = "cublas_fp16"
INT4 = "torch_int4pack_bf16_g128"
VARIANTS = [("fused", "fused"), ("double_buffered", "pipelined"),
            ("striped", "striped")]

FLOOR_MS = (1, 16)  # where the pick must be within FLOOR_MAX x the floor
FLOOR_MAX = 1.2
CUBLAS_MIN = {64: 2.5, 256: 1.0, 1024: 0.9}  # speedup over cuBLAS fp16
INT4_MS = (1,)  # where the pick must beat torch int4
TARGETS_TEXT = (
    "Targets: M = 1 and 16: pick <= 1.2 x floor; M = 1: faster than torch "
    "int4; M = 64: >= 2.5x faster than cuBLAS fp16; M = 256: no slower than "
    "cuBLAS; M = 1024: >= 0.9x cuBLAS's speed. \"us\" columns: the median "
    "of launches with an event between each two; \"chain us\": per launch in "
    "chains of launches with events only around each chain, as a model's "
    "layers run. x floor = pick chain / floor (a floor has no events); "
    "x read = pick / the weight read alone, both with events (no target); "
    "the x columns of the baselines are their time over the pick's chain "
    "time (they are timed in chains too, as CUDA graphs of back-to-back "
    "launches).")


def fail(message):
    print(f"gpu_report: {message}", file=sys.stderr)
    sys.exit(2)


def read_lines(path, required):
    """The machine object and the rows of a JSON lines file."""
    try:
        with open(path) as f:
            objects = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as error:
        if required:
            fail(f"cannot read {path}: {error}")
        print(f"gpu_report: no baselines from {path}: {error}",
              file=sys.stderr)
        return {}, []
    machine = next((o["machine"] for o in objects if "machine" in o), {})
    return machine, [o for o in objects if "machine" not in o]


class Verdicts:
    """Counts PASS, MISS and targets without data."""

    def __init__(self):
        self.passed = self.missed = self.no_data = 0

    def check(self, ratio, ok):
        """A cell: the ratio and its verdict; ok(ratio) is the target."""
        if ratio is None:
            self.no_data += 1
            return "- n/a"
        if ok(ratio):
            self.passed += 1
            return f"{ratio:.2f} PASS"
        self.missed += 1
        return f"{ratio:.2f} MISS"


def us(value):
    return "-" if value is None else f"{value:.1f}"


def ratio(numerator, denominator):
    if numerator is None or denominator is None or denominator <= 0:
        return None
    return numerator / denominator


def warmup_text(machine, torch_machine):
    """How long each tool ran its points before timing them, from their
    machine lines; lines written before they said so give nothing."""
    parts = []
    for tool, line in (("nibble", machine), ("the baselines", torch_machine)):
        seconds = line.get("steady_state_warmup_s")
        if seconds is not None:
            parts.append(f"{tool} {seconds:g} s")
    return "; warmed up before timing: " + ", ".join(parts) if parts else ""


def point_rows(points, baselines, key, verdicts):
    """The table's rows for one (format, group, k, n)."""
    _, _, k, n = key
    rows = []
    for m in sorted(points):
        variants = points[m]
        pick = next((r for r in variants.values() if r.get("pick")), None)
        pick_us = pick["median_us"] if pick else None
        chain_us = pick.get("chain_us") if pick else None
        first = next(iter(variants.values()))
        floor_us = first["floor_us"]
        read_us = first.get("read_us")
        read_chain_us = first.get("read_chain_us")
        cublas_us = baselines.get((CUBLAS, k, n, m))
        int4_us = baselines.get((INT4, k, n, m))
        cells = [str(m),
                 pick["variant"] if pick else "-", us(pick_us), us(chain_us)]
        cells += [us(variants[v]["median_us"]) if v in variants else "-"
                  for v, _ in VARIANTS]
        cells += [us(floor_us), us(read_us), us(read_chain_us),
                  us(cublas_us), us(int4_us)]
        # Rows written before nibble-gpu-bench timed chains have only the
        # launches with events.
        targets_us = chain_us if chain_us is not None else pick_us
        over_floor = ratio(targets_us, floor_us)
        if m in FLOOR_MS:
            cells.append(verdicts.check(over_floor, lambda r: r <= FLOOR_MAX))
        else:
            cells.append("-" if over_floor is None else f"{over_floor:.2f}")
        over_read = ratio(pick_us, read_us)
        cells.append("-" if over_read is None else f"{over_read:.2f}")
        speedup = ratio(cublas_us, targets_us)
        if m in CUBLAS_MIN:
            cells.append(verdicts.check(
                speedup, lambda r, m=m: r >= CUBLAS_MIN[m]))
        else:
            cells.append("-" if speedup is None else f"{speedup:.2f}")
        over_int4 = ratio(int4_us, targets_us)
        if m in INT4_MS:
            cells.append(verdicts.check(over_int4, lambda r: r > 1.0))
        else:
            cells.append("-" if over_int4 is None else f"{over_int4:.2f}")
        rows.append(cells)
    return rows


HEADER = ["M", "pick", "pick us", "chain us", "fused us", "pipelined us",
          "striped us", "floor us", "read us", "read chain us",
          "cuBLAS fp16 us", "torch int4 us", "x floor", "x read", "cuBLAS x",
          "int4 x"]


def render(title, rows, markdown):
    if markdown:
        lines = [f"### {title}", "",
                 "| " + " | ".join(HEADER) + " |",
                 "|" + "|".join("---:" if i != 1 else ":---"
                                for i in range(len(HEADER))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines) + "\n"
    widths = [max(len(cell) for cell in column)
              for column in zip(HEADER, *rows)]
    lines = [title]
    for row in [HEADER] + rows:
        lines.append("  ".join(cell.ljust(w) if i == 1 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(row,
                                                                 widths))))
    return "\n".join(lines) + "\n"


def format_rows(by_format, reference):
    """One shape's rows: per M, each format's pick µs and x `reference`."""
    ms = sorted({m for by_m in by_format.values() for m in by_m})
    rows = []
    for m in ms:
        picks = {}
        for label, by_m in by_format.items():
            pick = next((r for r in by_m.get(m, {}).values()
                         if r.get("pick")), None)
            picks[label] = pick["median_us"] if pick else None
        cells = [str(m)]
        for label, pick_us in picks.items():
            cells.append(us(pick_us))
            if label != reference:
                over = ratio(pick_us, picks.get(reference))
                cells.append("-" if over is None else f"{over:.2f}")
        rows.append(cells)
    return rows


def render_formats(k, n, by_format, markdown):
    """The formats of one shape side by side, fp4 the reference."""
    labels = list(by_format)
    reference = next((l for l in labels if l.startswith("fp4 ")), labels[0])
    header = ["M"]
    for label in labels:
        header.append(f"{label} us")
        if label != reference:
            header.append(f"x {reference.split()[0]}")
    rows = format_rows(by_format, reference)
    title = f"formats side by side (pick us), K={k} N={n}"
    if markdown:
        lines = [f"### {title}", "", "| " + " | ".join(header) + " |",
                 "|" + "|".join("---:" for _ in header) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
        return "\n".join(lines) + "\n"
    widths = [max(len(cell) for cell in column)
              for column in zip(header, *rows)]
    lines = [title]
    for row in [header] + rows:
        lines.append("  ".join(cell.rjust(w) for cell, w in zip(row, widths)))
    return "\n".join(lines) + "\n"


def main(argv):
    parser = argparse.ArgumentParser(
        description="nibble's CUDA kernels against the GPU targets.")
    parser.add_argument("nibble", help="nibble-gpu-bench --json output")
    parser.add_argument("torch", help="torch_baselines.py --json output")
    parser.add_argument("--markdown", action="store_true",
                        help="markdown tables (for docs/performance.md)")
    args = parser.parse_args(argv)

    machine, nibble_rows = read_lines(args.nibble, required=True)
    torch_machine, torch_rows = read_lines(args.torch, required=False)
    points = {}  # (format, group, k, n) -> m -> variant -> row
    for r in nibble_rows:
        if r.get("backend") != "cuda":
            continue
        key = (r["format"], r["group"], r["k"], r["n"])
        points.setdefault(key, {}).setdefault(r["m"], {})[r["variant"]] = r
    if not points:
        fail(f"{args.nibble} has no rows of backend cuda")
    baselines = {(r["kernel"], r["k"], r["n"], r["m"]): r["median_us"]
                 for r in torch_rows}

    out = []
    if machine:
        out.append(f"nibble on {machine.get('gpu', '?')}, "
                   f"{machine.get('sms', '?')} SMs, copy bandwidth "
                   f"{machine.get('copy_gbps', 0):.1f} GB/s"
                   f"{warmup_text(machine, torch_machine)}\n")
    out.append(TARGETS_TEXT + "\n")
    verdicts = Verdicts()
    for key, by_m in points.items():
        fmt, group, k, n = key
        rows = point_rows(by_m, baselines, key, verdicts)
        out.append(render(f"{fmt} g{group}, K={k} N={n}", rows,
                          args.markdown))
    shapes = {}  # (k, n) -> "format gGROUP" -> m -> variant -> row
    for (fmt, group, k, n), by_m in points.items():
        shapes.setdefault((k, n), {})[f"{fmt} g{group}"] = by_m
    for (k, n), by_format in shapes.items():
        if len(by_format) > 1:
            out.append(render_formats(k, n, by_format, args.markdown))
    out.append(f"targets met: {verdicts.passed} of "
               f"{verdicts.passed + verdicts.missed + verdicts.no_data} "
               f"({verdicts.missed} missed, {verdicts.no_data} without "
               "data)")
    print("\n".join(out))
    return 0 if verdicts.missed == 0 and verdicts.no_data == 0 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
