#!/usr/bin/env python3
"""Where the CPU went over SECONDS: the machine's busy share, and for each
process its CPU use by thread name (nibbled names its threads nibble-pool,
nibble-batch, nibble-reply and nibble-metrics; gRPC's keep their own names).
One line per process: name total% [thread-name threads×busiest% sum%]...,
busiest names first; 100% is one core.

  thread_cpu.py SECONDS PID...
"""
import collections
import os
import sys
import time


def thread_ticks(pids):
    """(pid, tid) -> (thread name, user + system clock ticks)."""
    ticks = {}
    for pid in pids:
        try:
            tids = os.listdir(f'/proc/{pid}/task')
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f'/proc/{pid}/task/{tid}/stat') as stat:
                    text = stat.read()
            except OSError:
                continue
            # The name may hold spaces and parentheses: it ends at the last ')'.
            name = text[text.index('(') + 1:text.rindex(')')]
            fields = text[text.rindex(')') + 2:].split()
            ticks[(pid, tid)] = (name, int(fields[11]) + int(fields[12]))
    return ticks


def machine_ticks():
    """(all, idle + iowait) clock ticks of every CPU so far."""
    with open('/proc/stat') as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return sum(values), values[3] + values[4]


def main():
    seconds, pids = float(sys.argv[1]), sys.argv[2:]
    hz = os.sysconf('SC_CLK_TCK')
    before, machine_before, start = thread_ticks(pids), machine_ticks(), time.time()
    time.sleep(seconds)
    after, machine_after = thread_ticks(pids), machine_ticks()
    elapsed = time.time() - start
    all_ticks = machine_after[0] - machine_before[0]
    idle = machine_after[1] - machine_before[1]
    print(f'machine: {100 * (1 - idle / max(all_ticks, 1)):.0f}% busy '
          f'of {os.cpu_count()} cpus')
    for pid in pids:
        try:
            with open(f'/proc/{pid}/comm') as comm:
                process = comm.read().strip()
        except OSError:
            continue
        by_name = collections.defaultdict(list)
        for (owner, tid), (name, ticks) in after.items():
            if owner == pid:
                used = ticks - before.get((owner, tid), (name, 0))[1]
                by_name[name].append(100 * used / hz / elapsed)
        total = sum(sum(shares) for shares in by_name.values())
        parts = [f'{name} {len(shares)}x{max(shares):.0f}% {sum(shares):.0f}%'
                 for name, shares in sorted(by_name.items(),
                                            key=lambda item: -sum(item[1]))
                 if sum(shares) >= 1]
        print(f'{process}: {total:.0f}%  ' + '  '.join(parts))


if __name__ == '__main__':
    main()
