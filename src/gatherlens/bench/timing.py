"""How a benchmark times a call: the one home of the suites' timers.

    >>> call_seconds(lambda: F.embedding(ids, table))             # one call, wall seconds
    >>> sample_seconds(lambda: F.embedding(ids, table))           # per call, over ~20 ms of calls
    >>> samples = round_robin({"a": fa, "b": fb}, repeats=5)      # {"a": [s, ...], "b": [s, ...]}
    >>> medians(samples)                                          # {"a": s, "b": s}

Round-robin: every repeat times each function once, in turn, so noise on a shared machine hits
them all alike. A suite that times in a fresh process (bench/fresh.py) uses these inside it.
"""
from __future__ import annotations

import statistics
import time

__all__ = ["call_seconds", "sample_seconds", "round_robin", "medians"]


def call_seconds(fn) -> float:
    """Wall seconds of one call of fn (time.perf_counter)."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def sample_seconds(fn, budget_s: float = 2e-2, max_calls: int = 10000, first_counts: bool = False) -> float:
    """Seconds per call of fn, averaged over enough calls to last about budget_s.

    One timed call first sizes the loop: budget_s / its time, 1 to `max_calls` calls (a microsecond
    op needs thousands of calls per sample: fewer leave the timer's jitter in the ratios). With
    `first_counts`, an op that gets a single call returns that first call's time, not a second one
    (a slow grid finishes sooner).
    """
    once = call_seconds(fn)
    calls = max(1, min(max_calls, int(budget_s / max(once, 1e-7))))
    if first_counts and calls == 1:
        return once
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls


def round_robin(fns: dict, repeats: int, sample=call_seconds) -> dict:
    """{name: [repeats samples]}: each repeat samples every fn once, in order (`sample(fn)` seconds)."""
    samples = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            samples[name].append(sample(fn))
    return samples


def medians(samples: dict) -> dict:
    """{name: median of its samples}."""
    return {name: statistics.median(values) for name, values in samples.items()}
