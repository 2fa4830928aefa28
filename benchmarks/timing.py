"""Shared by the benchmark scripts: the median wall time of a call, in microseconds."""
import statistics
import time


def median_us(fn, repeats: int, warmup: int = 20) -> float:
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return 1e6 * statistics.median(samples)
