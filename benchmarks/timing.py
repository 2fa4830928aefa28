"""Shared by the benchmark scripts: the median wall time of a call, in microseconds."""
import statistics
import time


def call_times_us(fn, repeats: int, warmup: int = 20) -> list:
    """The wall us of each of `repeats` calls of fn, after `warmup` untimed ones."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(1e6 * (time.perf_counter() - start))
    return samples


def median_us(fn, repeats: int, warmup: int = 20) -> float:
    return statistics.median(call_times_us(fn, repeats, warmup))


def median_us_interleaved(fns: dict, repeats: int, blocks: int = 4, warmup: int = 20) -> dict:
    """{key: median wall us} of each fn, `repeats` calls each, run A, B, B, A, ... in `blocks` blocks
    so that a change of the machine's load falls on every key alike."""
    keys = list(fns)
    for key in keys:
        for _ in range(warmup):
            fns[key]()
    samples = {key: [] for key in keys}
    for block in range(blocks):
        for key in keys if block % 2 == 0 else keys[::-1]:
            fn = fns[key]
            for _ in range(repeats // blocks):
                start = time.perf_counter()
                fn()
                samples[key].append(time.perf_counter() - start)
    return {key: 1e6 * statistics.median(values) for key, values in samples.items()}
