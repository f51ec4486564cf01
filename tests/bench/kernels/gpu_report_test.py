#!/usr/bin/env python3
"""bench/kernels/cuda/gpu_report.py on made-up nibble-gpu-bench and
torch_baselines.py rows: the floor and baseline verdicts on the pick's chain
time, the pick's time over the weight read alone (x read), rows written
before nibble-gpu-bench timed that read or chains, and the first line's
warm-ups."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

REPORT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                      "..", "bench", "kernels", "cuda", "gpu_report.py")


def bench_row(m, variant, median_us, pick, read_us, chain_us=None,
              read_chain_us=None):
    row = {"backend": "cuda", "kernel": f"{variant}_u4b8_sm90",
           "variant": variant, "pick": pick, "format": "u4b8", "group": 128,
           "m": m, "k": 8192, "n": 28672, "threads": 132,
           "median_us": median_us, "floor_us": 40.0}
    if read_us is not None:
        row["read_us"] = read_us
    if chain_us is not None:
        row["chain_us"] = chain_us
        row["read_chain_us"] = read_chain_us
    return row


def baseline_row(kernel, m, median_us):
    return {"backend": "torch", "kernel": kernel, "m": m, "k": 8192,
            "n": 28672, "median_us": median_us}


def write_lines(path, rows, machine_fields=None):
    machine = {"gpu": "test", "sms": 132, "copy_gbps": 3000.0}
    machine.update(machine_fields or {})
    with open(path, "w") as f:
        f.write(json.dumps({"machine": machine}) + "\n")
        for row in rows:
            f.write(json.dumps(row) + "\n")


def run_report(rows, baselines=(), machine_fields=None):
    """gpu_report.py's exit status and its output's lines."""
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "nibble.jsonl")
        write_lines(path, rows, machine_fields)
        torch_path = os.path.join(directory, "torch.jsonl")
        if baselines:
            write_lines(torch_path, baselines, machine_fields)
        result = subprocess.run([sys.executable, REPORT, path, torch_path],
                                capture_output=True, text=True)
    return result.returncode, result.stdout.splitlines()


def report(rows, baselines=()):
    """gpu_report.py's exit status and its table's rows, cell by cell."""
    returncode, lines = run_report(rows, baselines)
    header = next(i for i, line in enumerate(lines)
                  if line.split()[:2] == ["M", "pick"])
    table = []
    for line in lines[header + 1:]:
        if not line.strip():
            break
        table.append(line.split())
    return returncode, lines[header].split(), table


class GpuReportTest(unittest.TestCase):

    def test_x_floor_takes_the_chain_time_and_x_read_the_launch_time(self):
        status, header, table = report([
            bench_row(1, "double_buffered", 51.0, True, 43.5, 47.0, 41.0),
            bench_row(1, "striped", 52.0, False, 43.5, 49.0, 41.0),
            bench_row(16, "double_buffered", 58.0, True, 43.5, 54.0, 41.0)])
        self.assertIn("read", header)
        one, sixteen = table
        # M, pick, pick us, chain us, fused us (not timed), pipelined us,
        # striped us, floor us, read us, read chain us, the two baselines
        # (none), x floor and its verdict, x read, ...
        self.assertEqual(one[:4], ["1", "double_buffered", "51.0", "47.0"])
        self.assertEqual(one[7:10], ["40.0", "43.5", "41.0"])
        self.assertEqual(one[12:15], ["1.18", "PASS", "1.17"])
        self.assertEqual(sixteen[12:15], ["1.35", "MISS", "1.33"])
        self.assertEqual(status, 1)  # a MISS, and no baselines

    def test_baseline_verdicts_take_the_chain_time(self):
        # torch_baselines.py times chains (CUDA graph replays), so the pick's
        # chain time is what it is held against: with the launch time the
        # verdicts below would flip.
        _, _, table = report(
            [bench_row(1, "double_buffered", 25.0, True, 20.0, 20.0, 18.0),
             bench_row(256, "double_buffered", 180.0, True, 20.0, 200.0,
                       18.0)],
            [baseline_row("torch_int4pack_bf16_g128", 1, 22.0),
             baseline_row("cublas_fp16", 256, 190.0)])
        one, two_fifty_six = table
        # ..., cuBLAS x, int4 x and their verdicts
        self.assertEqual(one[-2:], ["1.10", "PASS"])
        self.assertEqual(two_fifty_six[-3:], ["0.95", "MISS", "-"])

    def test_rows_without_chains_or_a_read_take_the_launch_time(self):
        _, _, table = report([bench_row(1, "double_buffered", 47.0, True,
                                        None)])
        (one,) = table
        self.assertEqual(one[3], "-")
        self.assertEqual(one[7:10], ["40.0", "-", "-"])
        self.assertEqual(one[12:15], ["1.18", "PASS", "-"])
        _, _, table = report(
            [bench_row(1, "double_buffered", 25.0, True, 20.0)],
            [baseline_row("torch_int4pack_bf16_g128", 1, 22.0)])
        (one,) = table
        self.assertEqual(one[-2:], ["0.88", "MISS"])

    def test_the_first_line_says_how_long_each_tool_warmed_up(self):
        rows = [bench_row(1, "double_buffered", 47.0, True, 43.5)]
        baselines = [baseline_row("cublas_fp16", 1, 150.0)]
        _, lines = run_report(rows, baselines, {"steady_state_warmup_s": 2.0})
        self.assertTrue(lines[0].endswith(
            "; warmed up before timing: nibble 2 s, the baselines 2 s"),
            lines[0])
        _, lines = run_report(rows, baselines)
        self.assertTrue(lines[0].endswith("copy bandwidth 3000.0 GB/s"),
                        lines[0])


if __name__ == "__main__":
    unittest.main()
