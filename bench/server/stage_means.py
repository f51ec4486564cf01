#!/usr/bin/env python3
"""Where nibbled's matmul requests spent their time between two scrapes of
its /metrics: the means per request of the queue, kernel and reply stages
(nibble_matmul_*_seconds), of a unary Matmul call as a whole
(nibble_rpc_duration_seconds), the mean rows per kernel call, and on
--backend=cuda the means per GPU run of its host stages
(nibble_gpu_run_stage_seconds_total). Prints one line.

  stage_means.py BEFORE AFTER
"""
import collections
import re
import sys

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$')


def read(path):
    """Sample values by name and label text, e.g. ('x_sum', '{a="b"}'), of
    nibbled's series; HTTP headers before them are skipped."""
    samples = collections.defaultdict(float)
    with open(path) as text:
        for line in text:
            if not line.startswith('nibble_'):
                continue
            match = SAMPLE.match(line.strip())
            if match:
                samples[(match[1], match[2] or '')] += float(match[3])
    return samples


def delta(before, after, name, labels=None):
    """The growth of `name` summed over label sets containing `labels`."""
    return sum(value - before.get(key, 0.0)
               for key, value in after.items()
               if key[0] == name and (labels is None or labels in key[1]))


def mean_us(before, after, family, labels=None):
    count = delta(before, after, family + '_count', labels)
    if count <= 0:
        return '-'
    return '%.1f' % (1e6 * delta(before, after, family + '_sum', labels) /
                     count)


def main():
    before, after = read(sys.argv[1]), read(sys.argv[2])
    parts = ['per request us: queue %s kernel %s reply %s, unary call %s' % (
        mean_us(before, after, 'nibble_matmul_queue_seconds'),
        mean_us(before, after, 'nibble_matmul_kernel_seconds'),
        mean_us(before, after, 'nibble_matmul_reply_seconds'),
        mean_us(before, after, 'nibble_rpc_duration_seconds',
                'method="/nibble.v1.NibbleService/Matmul"'))]
    batches = delta(before, after, 'nibble_batch_rows_count')
    if batches > 0:
        parts.append('rows/batch %.1f' %
                     (delta(before, after, 'nibble_batch_rows_sum') / batches))
    runs = delta(before, after, 'nibble_gpu_runs_total')
    if runs > 0:
        parts.append('per GPU run us: ' + ' '.join(
            '%s %.1f' % (stage, 1e6 * delta(
                before, after, 'nibble_gpu_run_stage_seconds_total',
                'stage="%s"' % stage) / runs)
            for stage in ('lane_wait', 'gather', 'device', 'scatter')))
    print('; '.join(parts))


if __name__ == '__main__':
    main()
