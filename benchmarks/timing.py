"""GPU time as pytest-benchmark's clock: the fixture's statistics are GPU times, not host times.

How a round is timed (`measure`):
1. `setup` (outside the timed span) enqueues a 256 MB memset: it evicts the 60 MB L2, so no round
   starts with the previous round's data in cache, and it keeps the GPU busy while the host
   enqueues the work under test (the "prefill").
2. The timer records CUDA event E1, the work is enqueued, the timer records event E2;
   pytest-benchmark computes `E2 - E1`, which `GpuInstant.__sub__` turns into the GPU time
   between the two events (cudaEventElapsedTime, ~0.5 us resolution). Compilation and
   autotuning happen in warm-up calls that are not timed.
3. Right after the host has enqueued the work, E1 is queried. If E1 has not completed, the GPU was
   still busy with the prefill when the last launch arrived: the span E1 -> E2 holds GPU work only,
   with no gap waiting for the host. If E1 has completed, the GPU may have idled waiting for a
   launch (the host's Python is slower than the prefill, or the work synchronises with the host):
   that round is counted as `starved`. Each starved round, warm-up or timed, doubles the prefill
   of the rounds after it (1, 2, 4, ... up to MAX_PREFILL memsets: on the H200 the warm-up once
   left it at 4 while all 30 timed rounds starved, and a batch run as two slices on two streams
   starved 24-30 of 30 rounds at 8); `extra_info['starved_rounds']` counts the timed
   rounds that starved, and a non-zero count means those medians include host time.

A call that synchronises with the host (ssd_forward as called by default reads A and D on the
host before its first launch) starves whatever the prefill: the host waits for the prefill to
drain in its read, and the span then holds the host's wake-up after that wait, which grows with
the prefill (rows whose kernels had not changed moved by up to +91 %). Such a call
is timed as a *latency* (`idle` given): each round's setup flushes L2 and waits until the GPU is
idle, so E1 marks the moment the host starts the call and E1 -> E2 is what the caller waits for,
from its first Python line to the last kernel's end (host checks, the read, the launches, the
GPU work). No prefill; `extra_info['timing']` says which ("gpu" or "latency") a median is.

The events, the prefill and the calls run on the legacy default stream (cupy's and torch's
current stream unless a caller changes it), so they share one timeline; work a call puts on
other streams (ssd_forward's second batch slice) forks from and joins into it.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

FLUSH_BYTES = 256 << 20  # over four times the H200's L2 (60 MB, as PyTorch reports it)
MAX_PREFILL = 16  # memsets of FLUSH_BYTES before a round: ~1.4 ms of GPU time at most
WARMUP_ROUNDS = 3
MIN_ROUNDS = 5


def _cupy_event():
    import cupy
    event = cupy.cuda.Event()
    event.record()
    return event


def _cupy_elapsed_ms(start, end) -> float:
    import cupy
    return cupy.cuda.get_elapsed_time(start, end)


class GpuInstant:
    """A point on the GPU timeline (a recorded CUDA event); `later - earlier` is GPU seconds."""

    __slots__ = ("event", "_elapsed_ms")

    def __init__(self, event, elapsed_ms: Callable[[Any, Any], float]):
        self.event = event
        self._elapsed_ms = elapsed_ms

    def __sub__(self, earlier: GpuInstant) -> float:
        self.event.synchronize()
        return self._elapsed_ms(earlier.event, self.event) * 1e-3


class GpuClock:
    """The timer handed to pytest-benchmark (`pytest.mark.benchmark(timer=clock)`).

    Each call records an event on the current stream and returns it as a GpuInstant; the
    fixture's `end - start` is then the GPU time of what was enqueued in between.
    `record_event` and `elapsed_ms` are the CUDA calls, replaceable by fakes in CPU tests.
    """

    __name__ = "gpu_clock"  # how pytest-benchmark names the timer in its JSON

    def __init__(self, record_event: Callable[[], Any] = _cupy_event,
                 elapsed_ms: Callable[[Any, Any], float] = _cupy_elapsed_ms):
        self._record_event = record_event
        self._elapsed_ms = elapsed_ms
        self.last: GpuInstant | None = None

    def __call__(self) -> GpuInstant:
        self.last = GpuInstant(self._record_event(), self._elapsed_ms)
        return self.last

    def last_reached(self) -> bool:
        """True when the GPU has already passed the most recent event."""
        return bool(self.last.event.done)


def cupy_flush() -> Callable[[], None]:
    """A callable that enqueues one write of FLUSH_BYTES on the current stream (the L2 flush)."""
    import cupy
    buffer = cupy.empty(FLUSH_BYTES, dtype=cupy.uint8)
    return lambda: buffer.data.memset_async(0, FLUSH_BYTES)


def cupy_idle() -> Callable[[], None]:
    """A callable that returns once the GPU has finished everything enqueued so far."""
    import cupy
    return cupy.cuda.Device().synchronize


def measure(benchmark, fn: Callable[[], Any], clock: GpuClock, flush: Callable[[], None], *,
            rounds: int, budget_s: float = math.inf, warmup_rounds: int = WARMUP_ROUNDS,
            idle: Callable[[], None] | None = None):
    """Time `fn` (already compiled and checked) for `rounds` rounds; return its last result.

    `benchmark` is pytest-benchmark's fixture, whose test carries `timer=clock`. The warm-up
    rounds are timed the same way but not recorded; they set the prefill length, and the number
    of rounds drops (to MIN_ROUNDS at least) where `rounds` of them would exceed `budget_s`.
    With `idle` (for a call that synchronises with the host), each round starts from an idle GPU
    and its time is the call's latency: no prefill, no starved rounds counted; the median host
    time of the call (until it returns) is recorded too, as `host_ms`: the part of a latency
    that moves with the host's speed.
    """
    state = {"prefill": 1, "starved": 0, "host_s": []}

    def setup():
        for _ in range(state["prefill"]):
            flush()
        if idle is not None:
            idle()

    def timed_round():
        start = time.perf_counter()
        result = fn()
        state["host_s"].append(time.perf_counter() - start)
        if idle is None and clock.last_reached():
            state["starved"] += 1
            if state["prefill"] < MAX_PREFILL:  # the next rounds start behind more GPU work
                state["prefill"] *= 2
        return result

    fastest = math.inf
    for _ in range(warmup_rounds):
        setup()
        start = clock()
        timed_round()
        fastest = min(fastest, clock() - start)
    if fastest * rounds > budget_s:
        rounds = max(MIN_ROUNDS, int(budget_s / fastest))
    state["starved"], state["host_s"] = 0, []
    result = benchmark.pedantic(timed_round, setup=setup, rounds=rounds, iterations=1)
    if idle is None:
        benchmark.extra_info.update(timing="gpu", prefill_memsets=state["prefill"],
                                    starved_rounds=state["starved"])
    else:
        benchmark.extra_info.update(timing="latency",
                                    host_ms=1e3 * statistics.median(state["host_s"]))
    benchmark.extra_info["timer"] = "cuda_events"
    return result
