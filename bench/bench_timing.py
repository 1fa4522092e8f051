"""Timing shared by the collective benchmarks' rank scripts (hvd_collectives_bench.py,
horovod_rank.py), which run beside it in bench/."""

import statistics
import time


def median_ms(call, barrier, iterations):
    """The median milliseconds of `iterations` calls, each after `barrier()`."""
    times = []
    for _ in range(iterations):
        barrier()
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)
