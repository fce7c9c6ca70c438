"""Benchmarks of ssd_forward and each kernel (marker `benchmark`, GPU only), and CPU tests of the
benchmark tools (FLOP/byte model, GPU clock, compare gate, plot).

On the GPU machine, one command runs everything (all anchor rows, the seqlen sweep, both dtypes
where supported, torch, mamba_ssm and flash-linear-attention side by side, each where it imports):

    python -m pytest -m benchmark --benchmark-json=bench.json

Timing: benchmarks/timing.py (CUDA events as pytest-benchmark's timer, so its statistics are GPU
times; L2 flushed before every round; compilation and autotuning in untimed warm-up calls).
Before timing, every implementation is checked once on a reduced problem of the same row (batch 1,
the first 1024 tokens, at most two heads per group; same headdim, dstate, ngroups, chunk_size)
against the float64 reference, element by element, within the bounds the property suite uses
(properties.compare.forward_bounds, from properties/bounds.py); a comparator with bf16 inputs
within the same bound of unit u_bf16 (properties.bounds.comparator_narrow_bounds).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import reference as R
from benchmarks import compare, perf_model, plot, report
from benchmarks.configs import (ANCHORS, SPEC_MAMBA_MS, SWEEP_SEQLENS, TARGET_FP32_MS, dims_of,
                                row_inputs, sweep_config)
from benchmarks.timing import GpuClock, cupy_flush, cupy_idle, measure
from kernels.arrays import launch_dims

REPO = Path(__file__).resolve().parents[1]

# ---------------------------------------------------------------------------------------------
# GPU benchmarks
# ---------------------------------------------------------------------------------------------

CLOCK = GpuClock()
ROUNDS = 30  # rounds per case; fewer (at least 5) when a round is slow (see TIME_BUDGET_S)
TIME_BUDGET_S = 1.0  # GPU seconds of timed rounds per case, at most
REDUCED_SEQLEN = 1024
REDUCED_HEADS_PER_GROUP = 2
# per row in this order: the peers' medians are known when cuTile's are recorded. "fla" is
# flash-linear-attention's chunk_simple_gla, the core of the same recurrence: its q and k (C and B)
# expanded per head and its v (x dt) formed before the timing, D added after it. "cutile" is
# ssd_forward as called by default (A and D checked by the kernels, no synchronisation);
# "cutile_nocheck" with check_values=False (the same kernels, no error word read back either
# way: the default should be within noise of it).
IMPLS = ("mamba_ssm", "fla", "torch", "cutile", "cutile_nocheck")
PEERS = ("mamba_ssm", "fla")  # the speedups are taken over these
CUTILE_FORWARDS = {"cutile": None, "cutile_nocheck": False}  # impl -> check_values
# timed after the row's ssd_forward: the forward's kernels, the scan's and the two kernels'
KERNELS = ("chunk_cumsum", "ssd_scan", "fwd_pass_state", "compute_out")
DTYPES = {"fp32": "float32", "bf16": "bfloat16"}
# the names under which the cuTile forward, its two kernels composed and the scan are checked
CUTILE_IMPLS = ("cutile", "cutile kernels", "cutile scan")


def _cases():
    rows = [("anchor", name, cfg, i) for i, (name, cfg) in enumerate(ANCHORS.items(), 1)]
    rows += [("sweep", f"seqlen_{s}", sweep_config(s), None) for s in SWEEP_SEQLENS]
    for series, name, cfg, anchor in rows:
        for short, dtype in DTYPES.items():
            ops = [("ssd_forward", impl) for impl in IMPLS]
            if series == "anchor":
                ops += [(k, "cutile") for k in KERNELS]
            for op, impl in ops:
                yield pytest.param((series, name, cfg, anchor, dtype, op, impl),
                                   id=f"{op}-{name}-{short}-{impl}")


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _mamba():
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as e:  # ImportError, or a broken triton/torch install under it
        pytest.skip(f"mamba_ssm cannot be imported ({type(e).__name__}: {e})")
    return mamba_chunk_scan_combined


def _fla():
    try:
        from fla.ops.simple_gla.chunk import chunk_simple_gla
    except Exception as e:  # ImportError, or a broken triton/torch install under it
        pytest.skip(f"flash-linear-attention cannot be imported ({type(e).__name__}: {e})")
    return chunk_simple_gla


def _fla_forward():
    """(forward(x, dt, A, B, C, D) -> (y, final_states), prepare, core) of
    flash-linear-attention (benchmarks.peers: fla_inputs, fla_core): y = o + D x; `core` is the
    timed call, on inputs `prepare` makes once."""
    from benchmarks.peers import fla_core, fla_inputs
    gla = _fla()
    torch = _torch()

    def prepare(x, dt, A, B, C, D):
        return fla_inputs(x, dt, A, B, C)

    def core(q, k, v, g):
        return fla_core(gla, q, k, v, g)

    def forward(x, dt, A, B, C, D):
        o, final = core(**prepare(x, dt, A, B, C, D))
        y = (o.float() + D[:, None] * x.float()).to(x.dtype)
        # fla's state is (batch, nheads, dstate, headdim)
        return y, torch.transpose(final, -1, -2)

    return forward, prepare, core


def _host(a) -> np.ndarray:
    """A GPU array (cupy or torch) as a float64 NumPy array."""
    if hasattr(a, "detach"):
        return a.detach().float().cpu().numpy().astype(np.float64)
    return a.get().astype(np.float64)


def _contiguous(a):
    """A C-contiguous copy-or-view of a cupy array or torch tensor."""
    if hasattr(a, "contiguous"):
        return a.contiguous()
    import cupy
    return cupy.ascontiguousarray(a)


class Row:
    """One row and dtype: its inputs on the GPU (torch tensors when torch is there, else cupy),
    the reduced problem each implementation is checked on, and its reference and bounds.

    Narrow rows (bf16): x, B, C in bfloat16, the rest float32; the reference is the float64
    forward of the bfloat16 values, y's bound properties.bounds.narrow_output_bound."""

    def __init__(self, config, dtype):
        from properties.compare import forward_bounds
        from properties.strategies import Problem
        torch = _torch()
        if dtype != "float32" and torch is None:
            pytest.skip(f"{dtype} inputs need torch (cupy has no bfloat16)")
        _, _, nheads, _, _, ngroups, chunk_size = config
        self.config, self.dtype, self.chunk_size = config, dtype, chunk_size
        arrays = row_inputs(config)
        if torch is not None:
            arrays = {k: torch.from_dlpack(v) for k, v in arrays.items()}
            for k in ("x", "B", "C"):
                arrays[k] = arrays[k].to(getattr(torch, dtype))
        self.full = arrays
        self.reduced = self._reduce(arrays, ngroups, nheads // ngroups)
        host = {k: _host(v) for k, v in self.reduced.items()}
        problem = Problem(host["x"], host["dt"], host["A"], host["B"], host["C"], chunk_size,
                          D=host["D"])
        self.y_ref, self.final_ref = R.ssd_chunked(problem.x, problem.dt, problem.A, problem.B,
                                                   problem.C, chunk_size, D=problem.D)
        self.expected = forward_bounds(problem)  # float32 arithmetic: the comparators'
        # the cuTile kernels': bfloat16 products for bfloat16 inputs (bounds.kappa)
        self.cutile_expected = forward_bounds(
            problem, operands="tfloat32" if dtype == "float32" else dtype)
        self.failures: dict[str, str | None] = {}

    @staticmethod
    def _reduce(arrays, ngroups, heads_per_group):
        """Batch 1, the first REDUCED_SEQLEN tokens, the first heads of every group."""
        keep = min(heads_per_group, REDUCED_HEADS_PER_GROUP)
        seqlen = min(REDUCED_SEQLEN, arrays["x"].shape[1])

        def heads(a, axis):  # split nheads into (ngroups, heads_per_group), keep the first `keep`
            shape = a.shape[:axis] + (ngroups, heads_per_group) + a.shape[axis + 1:]
            index = (slice(None),) * (axis + 1) + (slice(0, keep),)
            part = a.reshape(shape)[index]
            return _contiguous(part.reshape(a.shape[:axis] + (ngroups * keep,)
                                            + a.shape[axis + 1:]))

        return {
            "x": heads(arrays["x"][:1, :seqlen], 2),
            "dt": heads(arrays["dt"][:1, :seqlen], 2),
            "A": heads(arrays["A"], 0),
            "B": _contiguous(arrays["B"][:1, :seqlen]),
            "C": _contiguous(arrays["C"][:1, :seqlen]),
            "D": heads(arrays["D"], 0),
        }

    def bounds(self, impl):
        """(y bound, final_states bound) of `impl` on the reduced problem: for the cuTile
        kernels the bound of their products' operands (TF32, or bfloat16 for bfloat16 inputs),
        y's widened by its store in the row's dtype; for a comparator,
        properties.bounds.comparator_narrow_bounds (the same in float32; with narrow inputs its
        intermediates may be narrow too)."""
        from properties.bounds import comparator_narrow_bounds, narrow_output_bound
        if impl in CUTILE_IMPLS:
            return (narrow_output_bound(self.y_ref, self.cutile_expected.y, self.dtype),
                    self.cutile_expected.final)
        return comparator_narrow_bounds(self.y_ref, self.final_ref, self.expected.y,
                                        self.expected.final, self.dtype)

    def check(self, impl, forward) -> str | None:
        """Once per implementation: run forward(**reduced) -> (y, final_states) and compare it
        with the reference within the bounds; the failure message, or None when within."""
        if impl not in self.failures:
            y, final_states = forward(**self.reduced)
            failure = None
            y_bound, final_bound = self.bounds(impl)
            for what, got, ref, bound in (
                    ("y", y, self.y_ref, y_bound),
                    ("final_states", final_states, self.final_ref, final_bound)):
                err = np.abs(_host(got) - ref)
                if not np.all(err <= bound):  # NaN (an unwritten or non-finite output) fails too
                    with np.errstate(divide="ignore", invalid="ignore"):
                        worst = float(np.nanmax(err / bound))
                    failure = (f"{impl} {what} on the reduced problem of {self.config} "
                               f"{self.dtype}: "
                               f"{int(np.sum(~(err <= bound)))} elements outside the bound, worst "
                               f"|err| / bound = {worst:.3g}")
                    break
            self.failures[impl] = failure
        return self.failures[impl]


_ROW: dict = {}  # the one Row in use: cases come row by row, so inputs are made once per row
_MEDIANS: dict = {}  # (op, row name, dtype, impl) -> median seconds, for the speedups


def _row(config, dtype) -> Row:
    key = (config, dtype)
    if key not in _ROW:
        _ROW.clear()
        _ROW[key] = Row(config, dtype)
    return _ROW[key]


def _cutile(row, op, check_values=None):
    """(check failure or None, the timed call) of `op` of the cuTile kernels on `row`.

    The kernels are checked through their compositions (chunk_cumsum -> fwd_pass_state ->
    compute_out, and chunk_cumsum -> ssd_scan, each give y and final_states; on the GPU the
    reduced problem's forward runs the two kernels, its grid below half a wave), outputs
    NaN-filled; a timed kernel's inputs are
    computed once, before timing, by the kernels before it. A timed kernel runs with
    check_values=False: its vectors were checked with the composition, and the value read would
    put a host synchronisation inside the timed span (a starved round) of a kernel whose GPU
    time is what the gate compares.
    """
    import kernels
    from properties.runner import outputs_filled_with
    Q = row.chunk_size

    def forward(x, dt, A, B, C, D):
        return kernels.ssd_forward(x, dt, A, B, C, Q, D=D, return_final_states=True,
                                   check_values=check_values)

    def pipeline(x, dt, A, B, C, D):
        dt_out, dA_cumsum = kernels.chunk_cumsum(dt, A, Q)
        chunk_states, final_states = kernels.fwd_pass_state(x, B, dt_out, dA_cumsum)
        return kernels.compute_out(x, B, C, dt_out, dA_cumsum, chunk_states, D=D), final_states

    def scan(x, dt, A, B, C, D):
        dt_out, dA_cumsum = kernels.chunk_cumsum(dt, A, Q)
        return kernels.ssd_scan(x, B, C, dt_out, dA_cumsum, D=D)

    def nan_filled(f):
        def call(**inputs):
            with outputs_filled_with(math.nan):
                return f(**inputs)
        return call

    failure = row.check(CUTILE_IMPLS[0], nan_filled(forward))
    f = row.full
    if op == "ssd_forward":
        return failure, lambda: forward(f["x"], f["dt"], f["A"], f["B"], f["C"], f["D"])
    if op == "ssd_scan":
        failure = row.check(CUTILE_IMPLS[2], nan_filled(scan))
        dt_out, dA_cumsum = kernels.chunk_cumsum(f["dt"], f["A"], Q)
        return failure, lambda: kernels.ssd_scan(f["x"], f["B"], f["C"], dt_out, dA_cumsum,
                                                 D=f["D"], check_values=False)
    failure = row.check(CUTILE_IMPLS[1], nan_filled(pipeline))
    if op == "chunk_cumsum":
        return failure, lambda: kernels.chunk_cumsum(f["dt"], f["A"], Q, check_values=False)
    dt_out, dA_cumsum = kernels.chunk_cumsum(f["dt"], f["A"], Q)
    if op == "fwd_pass_state":
        return failure, lambda: kernels.fwd_pass_state(f["x"], f["B"], dt_out, dA_cumsum)
    chunk_states, _ = kernels.fwd_pass_state(f["x"], f["B"], dt_out, dA_cumsum)
    return failure, lambda: kernels.compute_out(f["x"], f["B"], f["C"], dt_out, dA_cumsum,
                                                chunk_states, D=f["D"], check_values=False)


def _comparator(row, impl):
    """(check failure or None, the timed call) of a side-by-side implementation on `row`."""
    if _torch() is None:
        pytest.skip("torch with CUDA is not installed: no side-by-side comparator")
    f = row.full
    if impl == "fla":
        forward, prepare, core = _fla_forward()
        inputs = prepare(f["x"], f["dt"], f["A"], f["B"], f["C"], f["D"])
        return row.check(impl, forward), lambda: core(**inputs)
    if impl == "mamba_ssm":
        scan = _mamba()

        def forward(x, dt, A, B, C, D):
            return scan(x, dt, A, B, C, row.chunk_size, D=D, return_final_states=True)
    else:
        if row.dtype != "float32":
            pytest.skip("the torch baseline runs in fp32 only (its bf16 einsum intermediates "
                        "are outside any bound)")
        from benchmarks.torch_ssd import ssd_chunked_torch

        def forward(x, dt, A, B, C, D):
            return ssd_chunked_torch(x, dt, A, B, C, row.chunk_size, D=D, return_final_states=True)
    timed = lambda: forward(f["x"], f["dt"], f["A"], f["B"], f["C"], f["D"])
    return row.check(impl, forward), timed


@pytest.fixture(scope="module")
def flush():
    return cupy_flush()


@pytest.fixture(scope="module")
def idle():
    return cupy_idle()


@pytest.mark.benchmark(timer=CLOCK)
@pytest.mark.parametrize("case", list(_cases()))
def test_speed(benchmark, flush, case):
    """Median GPU time of one implementation of one op on one row, with its rates and speedups.

    The correctness check runs first; a failed check still lets the timing be recorded (the
    side-by-side stays complete) and then fails the test with the check's message. Every case,
    the default forward ("cutile") included (it does not synchronise), is timed as GPU time
    behind a prefill (benchmarks/timing.py); test_latency times the host cost of a call.
    """
    series, name, config, anchor, dtype, op, impl = case
    row = _row(config, dtype)
    failure, fn = (_cutile(row, op, CUTILE_FORWARDS[impl]) if impl in CUTILE_FORWARDS
                   else _comparator(row, impl))
    fn()  # compilation / autotuning, untimed
    benchmark.group = f"{series} {name} {config} {dtype}"
    measure(benchmark, fn, CLOCK, flush, rounds=ROUNDS, budget_s=TIME_BUDGET_S)

    median = benchmark.stats["median"]
    _MEDIANS[(op, name, dtype, impl)] = median
    work = perf_model.work(op, dims_of(config), dtype, D="nheads", final_states=True)
    info = benchmark.extra_info
    info.update(impl=impl, op=op, dtype=dtype, series=series, row=name, config=list(config),
                check="ok" if failure is None else "FAILED", median_ms=median * 1e3,
                **perf_model.rates(work, median, dtype))
    if anchor is not None:
        info["anchor"] = anchor
    if op == "ssd_forward" and impl in CUTILE_FORWARDS:
        for peer in PEERS:
            peer_median = _MEDIANS.get((op, name, dtype, peer))
            if peer_median is not None:
                info[f"speedup_vs_{peer}"] = peer_median / median
        if series == "anchor":
            info["spec_mamba_ssm_ms"] = SPEC_MAMBA_MS[name][0 if dtype == "float32" else 1]
            if dtype == "float32":
                info["target_ms"] = TARGET_FP32_MS[name]
                info["meets_target"] = median * 1e3 <= TARGET_FP32_MS[name]
    if op in KERNELS:  # against the forward's GPU time
        forward_median = _MEDIANS.get(("ssd_forward", name, dtype, "cutile_nocheck"))
        if forward_median is not None:
            info["share_of_ssd_forward_pct"] = 100.0 * median / forward_median
    if failure is not None:
        pytest.fail(failure)


# ---------------------------------------------------------------------------------------------
# CPU tests of the tools
# ---------------------------------------------------------------------------------------------

FIRST_ANCHOR = dims_of(ANCHORS["mamba2_2p7b"])


def test_cases_cover_every_row_and_order_what_the_speedups_need():
    """Every anchor row has ssd_forward for all implementations and each kernel, in both dtypes;
    within a row and dtype the peers come before cuTile's ssd_forward, which comes before the
    kernels (speedup and share are computed from medians already recorded); one row's cases
    are contiguous (the inputs are made once per row)."""
    cases = [c.values[0] for c in _cases()]
    ids = [c.id for c in _cases()]
    assert len(set(ids)) == len(ids)
    keys = [(c[1], c[4]) for c in cases]
    for name in ANCHORS:
        for dtype in DTYPES.values():
            ops = [(c[5], c[6]) for c in cases if (c[1], c[4]) == (name, dtype)]
            assert ops == [("ssd_forward", i) for i in IMPLS] + [(k, "cutile") for k in KERNELS]
    assert all(IMPLS.index(peer) < IMPLS.index("cutile") for peer in PEERS)
    blocks = [k for i, k in enumerate(keys) if i == 0 or keys[i - 1] != k]
    assert len(blocks) == len(set(blocks))
    swept = sorted(c[2][1] for c in cases
                   if c[0] == "sweep" and c[5] == "ssd_forward" and c[6] == "cutile")
    assert swept == sorted(2 * SWEEP_SEQLENS)  # fp32 and bf16


def test_perf_model_first_anchor_matches_spec_counts():
    """The spec: ~65.5 GFLOP of useful work, ~0.69 GB of traffic (x, dt, B, C, y), a floor of
    ~0.18 ms."""
    b, t, h, p, n = 4, 4096, 80, 64, 128
    wk = perf_model.work("ssd_forward", FIRST_ANCHOR, D=None, final_states=False)
    assert wk.flop == pytest.approx(65.5e9, rel=2e-3)
    assert wk.bytes == 4 * (2 * b * t * h * p + b * t * h + h + 2 * b * t * n)
    assert wk.bytes == pytest.approx(0.69e9, rel=5e-3)
    with_states = perf_model.work("ssd_forward", FIRST_ANCHOR, D=None, final_states=True)
    assert with_states.bytes - wk.bytes == 4 * b * h * p * n
    assert perf_model.floor_seconds(with_states) == pytest.approx(0.18e-3, rel=0.02)


def test_perf_model_kernels_partition_the_products():
    """chunk_cumsum + fwd_pass_state + compute_out, and chunk_cumsum + ssd_scan, do exactly
    ssd_forward's matrix products."""
    for config in list(ANCHORS.values()) + [(2, 1000, 6, 32, 16, 3, 64)]:
        dims = dims_of(config)
        for path in (("chunk_cumsum", "fwd_pass_state", "compute_out"),
                     ("chunk_cumsum", "ssd_scan")):
            total = sum(perf_model.work(k, dims).flop for k in path)
            assert total == perf_model.work("ssd_forward", dims).flop


def test_perf_model_short_last_chunk_counts_its_tokens_only():
    """seqlen = chunk_size + 1: the second chunk is one token; its square products count 1,
    not Q^2."""
    Q, b, h, p, n, g = 64, 1, 2, 8, 16, 1
    one_chunk = perf_model.work("compute_out", dims_of((b, Q, h, p, n, g, Q)))
    plus_one = perf_model.work("compute_out", dims_of((b, Q + 1, h, p, n, g, Q)))
    # the extra token: C.B^T 1x1 per group (2n), intra 1 term per head (p), carried 2pn per head
    assert plus_one.flop - one_chunk.flop == 2 * g * n + h * p + 2 * h * p * n


def test_perf_model_bf16_halves_the_activation_bytes():
    b, t, h, p, n, g = 4, 4096, 80, 64, 128, 1
    fp32 = perf_model.work("ssd_forward", FIRST_ANCHOR, "float32")
    bf16 = perf_model.work("ssd_forward", FIRST_ANCHOR, "bfloat16")
    assert fp32.bytes - bf16.bytes == 2 * (2 * b * t * h * p + 2 * b * t * g * n)
    assert fp32.flop == bf16.flop
    assert perf_model.floor_seconds(bf16, "bfloat16") < perf_model.floor_seconds(fp32, "float32")


def test_perf_model_rates_at_the_floor_are_100_percent():
    wk = perf_model.work("ssd_forward", FIRST_ANCHOR)
    floor = perf_model.floor_seconds(wk)
    r = perf_model.rates(wk, floor)
    assert r["pct_of_floor"] == pytest.approx(100.0)
    assert r["tflops"] == pytest.approx(361.0)  # the first anchor is compute-bound in fp32
    assert perf_model.rates(wk, 2 * floor)["pct_of_floor"] == pytest.approx(50.0)


@pytest.mark.parametrize("op", KERNELS + ("ssd_forward",))
def test_timed_kernel_calls_read_no_values(op, monkeypatch):
    """The timed call of each kernel row reads no values on the host (no synchronisation inside
    its timed span), while the cuTile forward's default row does. On the interpreter: a fake
    row of NumPy arrays whose check passes; any value read raises."""
    import contract
    rng = np.random.default_rng(3)
    batch, seqlen, nheads, headdim, dstate, Q = 1, 40, 2, 16, 16, 16
    full = {"x": rng.standard_normal((batch, seqlen, nheads, headdim)).astype(np.float32),
            "dt": rng.uniform(0.01, 0.1, (batch, seqlen, nheads)).astype(np.float32),
            "A": -rng.uniform(1.0, 4.0, nheads).astype(np.float32),
            "B": rng.standard_normal((batch, seqlen, 1, dstate)).astype(np.float32),
            "C": rng.standard_normal((batch, seqlen, 1, dstate)).astype(np.float32),
            "D": rng.standard_normal(nheads).astype(np.float32)}
    row = type("FakeRow", (), {"chunk_size": Q, "full": full, "check": lambda *a: None})()
    failure, timed = _cutile(row, op)
    assert failure is None

    def read(*arrays):
        raise AssertionError("values read inside the timed call")
    monkeypatch.setattr(contract, "_host_vectors", read)
    if op == "ssd_forward":  # the default forward reads A and D: the case that starves
        with pytest.raises(AssertionError, match="values read"):
            timed()
    else:
        timed()


@pytest.mark.parametrize("op, dtype", [("ssd_backward", "float32"), ("ssd_forward", "float64")],
                         ids=["unknown_op", "unmodelled_dtype"])
def test_perf_model_rejects_unknown_op_and_dtype(op, dtype):
    with pytest.raises(ValueError, match="op" if op != "ssd_forward" else "dtype"):
        perf_model.work(op, FIRST_ANCHOR, dtype)


FAKE_CLOCK_TESTS = '''
import time

import pytest
from benchmarks.timing import GpuClock, measure


class Gpu:
    """A fake GPU timeline: events read `now` (ms); `starving` is what a query of a round's start
    event answers: one answer for every round, or a list, one per round in order."""
    def __init__(self, starving):
        self.now, self.flushes, self.events = 0.0, 0, 0
        self.starving = starving

    def event(self):
        gpu = self
        rnd, is_start = self.events // 2, self.events % 2 == 0
        self.events += 1
        starving = self.starving if isinstance(self.starving, bool) else self.starving[rnd]
        class Event:
            t = gpu.now
            done = starving and is_start
            def synchronize(self):
                pass
        return Event()


FED, STARVED, SYNCING = Gpu(False), Gpu(True), Gpu(True)
# warm-up rounds 1 and 2 starve, 3 does not; the first timed round starves, the others not
LATE = Gpu([True, True, False, True, False, False, False, False])
FED_CLOCK = GpuClock(FED.event, lambda a, b: b.t - a.t)
STARVED_CLOCK = GpuClock(STARVED.event, lambda a, b: b.t - a.t)
LATE_CLOCK = GpuClock(LATE.event, lambda a, b: b.t - a.t)
SYNCING_CLOCK = GpuClock(SYNCING.event, lambda a, b: b.t - a.t)


def run(benchmark, gpu, clock, durations_ms, rounds, host_ms=None, synchronises=False):
    pending = list(durations_ms)
    host = list(host_ms or [])
    idles = []

    def work():
        gpu.now += pending.pop(0)
        if host:  # the host's part of the call
            time.sleep(host.pop(0) * 1e-3)

    def flush():
        gpu.flushes += 1

    def idle():  # the flushes enqueued so far are done when the GPU is idle
        idles.append(gpu.flushes)

    measure(benchmark, work, clock, flush, rounds=rounds, idle=idle if synchronises else None)
    benchmark.extra_info.update(flushes=gpu.flushes, idles=idles)


@pytest.mark.benchmark(timer=FED_CLOCK)
def test_fed(benchmark):
    run(benchmark, FED, FED_CLOCK, [9.0, 9.0, 9.0, 1.0, 2.0, 3.0, 4.0, 50.0], rounds=5)


@pytest.mark.benchmark(timer=STARVED_CLOCK)
def test_starved(benchmark):
    run(benchmark, STARVED, STARVED_CLOCK, [1.0] * 8, rounds=5)


@pytest.mark.benchmark(timer=LATE_CLOCK)
def test_starved_late(benchmark):
    run(benchmark, LATE, LATE_CLOCK, [1.0] * 8, rounds=5)


@pytest.mark.benchmark(timer=SYNCING_CLOCK)
def test_latency(benchmark):
    run(benchmark, SYNCING, SYNCING_CLOCK, [7.0, 7.0, 7.0, 2.0, 1.0, 5.0, 3.0, 4.0], rounds=5,
        host_ms=[30.0, 30.0, 30.0, 5.0, 5.0, 5.0, 6.0, 40.0], synchronises=True)
'''


def test_gpu_clock_makes_pytest_benchmark_stats_gpu_times(tmp_path):
    """Through pytest-benchmark itself, with a fake GPU timeline: the recorded rounds are the
    event-to-event times (not host times), warm-up excluded; every starved round, warm-up or
    timed, doubles the prefill of the rounds after it; a synchronising call is timed from an
    idle GPU, one flush and one wait for the GPU before each round, and never counts as starved."""
    (tmp_path / "test_fake_clock.py").write_text(FAKE_CLOCK_TESTS)
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path),
         f"--benchmark-json={out}", "--benchmark-disable-gc"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = {b["name"]: b for b in json.loads(out.read_text())["benchmarks"]}
    fed, starved, late = runs["test_fed"], runs["test_starved"], runs["test_starved_late"]
    assert {b["extra_info"]["timing"] for b in (fed, starved, late)} == {"gpu"}
    assert fed["stats"]["rounds"] == 5
    assert fed["stats"]["median"] == pytest.approx(3.0e-3)
    assert fed["stats"]["min"] == pytest.approx(1.0e-3)
    assert fed["stats"]["max"] == pytest.approx(50.0e-3)
    assert fed["extra_info"]["prefill_memsets"] == 1 and fed["extra_info"]["starved_rounds"] == 0
    assert fed["extra_info"]["flushes"] == 3 + 5
    assert fed["options"]["timer"] == "gpu_clock"
    # doubled after each of the 3 warm-up rounds and the first timed one, then at MAX_PREFILL
    assert starved["extra_info"]["prefill_memsets"] == 16
    assert starved["extra_info"]["starved_rounds"] == 5
    assert starved["extra_info"]["flushes"] == 1 + 2 + 4 + 8 + 4 * 16
    # warm-up prefill 1, 2, 4 (the third round fed stays at 4), the first timed round starves
    # at 4 and the four after it run behind 8
    assert late["extra_info"]["starved_rounds"] == 1
    assert late["extra_info"]["prefill_memsets"] == 8
    assert late["extra_info"]["flushes"] == 1 + 2 + 4 + 4 + 4 * 8
    latency = runs["test_latency"]["extra_info"]
    assert latency["timing"] == "latency"
    assert "starved_rounds" not in latency and "prefill_memsets" not in latency
    assert latency["flushes"] == 3 + 5
    assert latency["idles"] == list(range(1, 3 + 5 + 1))  # each round waits after its flush
    assert runs["test_latency"]["stats"]["median"] == pytest.approx(3.0e-3)
    # the median host time of the timed calls (5 ms): not their GPU time (3), not their mean
    # (12.2), not with the warm-up calls (18)
    assert 5.0 <= latency["host_ms"] < 11.0
    assert all("host_ms" not in b["extra_info"] for b in (fed, starved, late))


def _bench_json(path, medians_ms: dict, impl="cutile", timing: dict | None = None):
    """A benchmark JSON of `medians_ms` (name -> ms); `timing` (name -> "gpu" / "latency") sets
    extra_info's timing method, absent (as in files of before the key) where not given."""
    def info(name):
        i = {"impl": impl if not name.endswith("mamba_ssm") else "mamba_ssm"}
        if timing and name in timing:
            i["timing"] = timing[name]
        return i
    path.write_text(json.dumps({"benchmarks": [
        {"fullname": f"tests/test_benchmarks.py::test_speed[{name}]", "name": name,
         "extra_info": info(name), "stats": {"median": ms * 1e-3}}
        for name, ms in medians_ms.items()]}))
    return str(path)


BASE = {"ssd_forward-row1-cutile": 0.40, "compute_out-row1-cutile": 0.25,
        "ssd_forward-row1-mamba_ssm": 1.19}


@pytest.mark.parametrize("current, status", [
    ({**BASE, "compute_out-row1-cutile": 0.30}, 1),  # +20 %: regression
    ({**BASE, "ssd_forward-row1-cutile": 0.30}, 0),  # faster: passes
    ({**BASE, "ssd_forward-row1-cutile": 0.43}, 0),  # +7.5 %: within the 10 % threshold
    ({**BASE, "ssd_forward-row1-mamba_ssm": 3.0}, 0),  # the comparator is not gated
    ({k: v for k, v in BASE.items() if k != "compute_out-row1-cutile"}, 1),  # a gated one missing
    ({**BASE, "ssd_forward-row2-cutile": 9.0}, 0),  # new benchmarks are not gated
], ids=["kernel_regression_fails", "improvement_passes", "within_threshold_passes",
        "comparator_not_gated", "missing_benchmark_fails", "new_benchmark_passes"])
def test_compare_gate(tmp_path, capsys, current, status):
    base = _bench_json(tmp_path / "base.json", BASE)
    cur = _bench_json(tmp_path / "cur.json", current)
    assert compare.main([base, cur, "--threshold", "0.10"]) == status
    out = capsys.readouterr()
    assert ("REGRESSION" in out.out or "MISSING" in out.out) == (status == 1)


@pytest.mark.parametrize("base_timing, cur_timing, slower, status, shown", [
    (None, "latency", 1.0, 1, "METHOD gpu -> latency"),  # a baseline from before: re-measure it
    ("latency", "gpu", 1.0, 1, "METHOD latency -> gpu"),
    ("latency", "latency", 1.3, 0, "ok"),  # within the latency threshold (0.40)
    ("latency", "latency", 1.5, 1, "REGRESSION"),
    (None, "gpu", 1.15, 1, "REGRESSION"),  # files without the key were all GPU time: 0.10
], ids=["unrecorded_to_latency_fails", "latency_to_gpu_fails", "latency_30_percent_passes",
        "latency_50_percent_fails", "gpu_15_percent_fails"])
def test_compare_by_timing_method(tmp_path, capsys, base_timing, cur_timing, slower, status,
                                  shown):
    """The default forward's row `slower` times its baseline; only the timing methods recorded
    and the medians differ."""
    name = "ssd_forward-row1-cutile"
    base = _bench_json(tmp_path / "base.json", BASE,
                       timing=None if base_timing is None else {name: base_timing})
    cur = _bench_json(tmp_path / "cur.json", {**BASE, name: slower * BASE[name]},
                      timing={name: cur_timing})
    assert compare.main([base, cur, "--threshold", "0.10"]) == status
    line = [ln for ln in capsys.readouterr().out.splitlines() if name in ln]
    assert len(line) == 1 and line[0].endswith(shown)


def test_compare_latency_threshold_is_respected(tmp_path):
    name = "ssd_forward-row1-cutile"
    base = _bench_json(tmp_path / "base.json", BASE, timing={name: "latency"})
    cur = _bench_json(tmp_path / "cur.json", {**BASE, name: 1.3 * BASE[name]},
                      timing={name: "latency"})
    assert compare.main([base, cur, "--latency-threshold", "0.2"]) == 1
    assert compare.main([base, cur, "--latency-threshold", "0.35"]) == 0


def test_compare_threshold_is_respected(tmp_path):
    base = _bench_json(tmp_path / "base.json", BASE)
    cur = _bench_json(tmp_path / "cur.json", {**BASE, "ssd_forward-row1-cutile": 0.43})
    assert compare.main([base, cur, "--threshold", "0.05"]) == 1


def test_compare_gates_the_no_value_read_forward(tmp_path):
    base = _bench_json(tmp_path / "base.json", {"ssd_forward-row1-cutile_nocheck": 0.30},
                       impl="cutile_nocheck")
    cur = _bench_json(tmp_path / "cur.json", {"ssd_forward-row1-cutile_nocheck": 0.40},
                      impl="cutile_nocheck")
    assert compare.main([base, cur, "--threshold", "0.10"]) == 1


LATENCY = "ssd_forward-row1-cutile"  # BASE's default-call row, timed as a latency below
LATENCY_2 = "ssd_forward-row2-cutile"  # a second default-call row
KERNEL = "compute_out-row1-cutile"


def _full(name: str) -> str:
    return f"tests/test_benchmarks.py::test_speed[{name}]"


def _latency_json(path, slower: float = 1.0, kernel_slower: float = 1.0, slower_2: float = 1.0,
                  commit: str | None = None, rows=None, timing: str = "latency"):
    """BASE and LATENCY_2 (0.5 ms) with the default-call rows timed as latencies (`timing`),
    LATENCY `slower` times its baseline median, LATENCY_2 `slower_2` times, the compute_out row
    `kernel_slower` times; only `rows` (names) where given; pytest-benchmark's commit id
    `commit` where given."""
    medians = {**BASE, LATENCY: slower * BASE[LATENCY], KERNEL: kernel_slower * BASE[KERNEL],
               LATENCY_2: slower_2 * 0.5}
    if rows is not None:
        medians = {k: v for k, v in medians.items() if k in rows}
    out = _bench_json(path, medians, timing={LATENCY: timing, LATENCY_2: timing})
    if commit is not None:
        data = json.loads(Path(out).read_text())
        data["commit_info"] = {"id": commit}
        Path(out).write_text(json.dumps(data))
    return out


@pytest.mark.parametrize("retry_slower, status, shown", [
    ([1.0], 0, "ok: median of 2 runs +30.0%"),
    ([1.1, 1.2], 0, "ok: median of 3 runs +20.0%"),  # one slow process does not fail the gate
    ([1.5, 1.1], 1, "REGRESSION: median of 3 runs +50.0%"),  # nor one fast one pass it
], ids=["within_in_median_of_two", "slow_process_then_within_passes",
        "fast_process_does_not_pass_a_regression"])
def test_compare_judges_a_regressed_latency_by_the_median_of_its_runs(tmp_path, capsys,
                                                                     retry_slower, status,
                                                                     shown):
    base = _latency_json(tmp_path / "base.json")
    cur = _latency_json(tmp_path / "cur.json", slower=1.6)
    retries = [a for k, f in enumerate(retry_slower)
               for a in ("--retry", _latency_json(tmp_path / f"retry{k}.json", slower=f,
                                                  rows=[LATENCY]))]
    assert compare.main([base, cur, *retries]) == status
    line = [ln for ln in capsys.readouterr().out.splitlines() if _full(LATENCY) in ln]
    assert len(line) == 1 and line[0].endswith(shown)


@pytest.mark.parametrize("retry", [
    dict(rows=[LATENCY_2]),  # the retry lacks the row
    dict(timing="gpu"),  # the row timed by another method there
], ids=["retry_without_the_row", "retry_timed_otherwise"])
def test_compare_counts_only_retries_of_the_row_timed_alike(tmp_path, capsys, retry):
    base = _latency_json(tmp_path / "base.json")
    cur = _latency_json(tmp_path / "cur.json", slower=1.6)
    again = _latency_json(tmp_path / "retry.json", **retry)
    assert compare.main([base, cur, "--retry", again]) == 1
    line = [ln for ln in capsys.readouterr().out.splitlines() if _full(LATENCY) in ln]
    assert line[0].endswith("REGRESSION (in no retry)")


@pytest.mark.parametrize("current, shown", [
    (dict(kernel_slower=1.2), "REGRESSION"),  # GPU time: steady between runs, never retried
    (dict(rows=[KERNEL, LATENCY_2]), "MISSING"),
    (dict(timing="gpu"), "METHOD latency -> gpu"),
], ids=["gpu_time_regression", "missing_latency", "latency_timed_otherwise"])
def test_compare_retries_excuse_nothing_but_latencies(tmp_path, capsys, current, shown):
    """A retry where every row is as fast as the baseline leaves these failures failed."""
    base = _latency_json(tmp_path / "base.json")
    cur = _latency_json(tmp_path / "cur.json", **current)
    again = _latency_json(tmp_path / "retry.json")
    assert compare.main([base, cur, "--retry", again]) == 1
    assert shown in capsys.readouterr().out


def test_compare_refuses_a_retry_it_cannot_use(tmp_path, capsys):
    base = _latency_json(tmp_path / "base.json")
    cur = _latency_json(tmp_path / "cur.json", slower=1.6, commit="a" * 40)
    other = _latency_json(tmp_path / "other.json", commit="b" * 40)
    assert compare.main([base, cur, "--retry", other]) == 2
    assert "not of the current run's" in capsys.readouterr().err
    assert compare.main([base, cur, "--retry", str(tmp_path / "absent.json")]) == 2
    same = _latency_json(tmp_path / "same.json", commit="a" * 40)
    assert compare.main([base, cur, "--retry", same]) == 0


@pytest.mark.parametrize("current, expected", [
    (dict(slower=1.6), [LATENCY]),
    (dict(slower=1.6, slower_2=1.6), [LATENCY, LATENCY_2]),
    (dict(slower=1.6, kernel_slower=1.2), None),  # a GPU-time regression fails whatever
    (dict(slower=1.6, rows=[KERNEL, LATENCY]), None),  # LATENCY_2 missing
    (dict(), None),  # nothing failed
], ids=["one_latency", "two_latencies", "latency_and_gpu_time", "latency_and_missing",
        "nothing_failed"])
def test_latency_regressions_to_measure_again(tmp_path, current, expected):
    base = compare.load(_latency_json(tmp_path / "base.json"))
    rows, _ = compare.compare(base, compare.load(_latency_json(tmp_path / "cur.json", **current)),
                              0.10)
    assert compare.latency_regressions(base, rows) == (
        None if expected is None else [_full(n) for n in expected])


@pytest.mark.parametrize("runs, kernel_slower, status, rerun", [
    ([(1.0, 1.0)], 1.0, "pass", []),
    ([(1.6, 1.0), (1.1, None), (1.2, None)], 1.0, "pass (latencies: the median of 3 runs)",
     [LATENCY]),
    ([(1.6, 1.0), (1.5, None), (1.1, None)], 1.0, "FAIL", [LATENCY]),
    ([(1.6, 1.6), (1.1, 1.5), (1.2, 1.5)], 1.0, "FAIL", [LATENCY, LATENCY_2]),
    ([(1.6, 1.0)], 1.2, "FAIL", []),  # a GPU-time regression: nothing to measure again
], ids=["no_regression", "latency_within_by_median", "latency_regressed_by_median",
        "one_of_two_latencies_regressed", "gpu_time_regression_not_rerun"])
def test_review_gate_reruns_regressed_latencies(tmp_path, runs, kernel_slower, status, rerun):
    """properties.gate's benchmark step with a fake benchmark run: the first run writes every
    row, each rerun only the rows asked for; runs[k] = (LATENCY, LATENCY_2) of the k-th run,
    each as a multiple of its baseline median."""
    from properties import gate
    base = Path(_latency_json(tmp_path / "base.json"))
    calls = []

    def run(json_path, node_ids):
        calls.append(list(node_ids))
        slower, slower_2 = runs[len(calls) - 1]
        _latency_json(json_path, slower=slower, slower_2=slower_2 or 1.0,
                      kernel_slower=kernel_slower,
                      rows=[n for n in (LATENCY, LATENCY_2, KERNEL) if _full(n) in node_ids]
                      if node_ids else None)
        return 0

    assert gate.benchmark_gate(run, tmp_path, baseline=base) == status
    assert calls == [[]] + [[_full(n) for n in rerun]] * (len(runs) - 1)


@pytest.mark.parametrize("rc, writes, status", [
    (1, True, "FAIL (benchmark rerun)"),
    (0, False, "FAIL (a rerun wrote no results: its rows were skipped?)"),
], ids=["rerun_fails", "rerun_writes_nothing"])
def test_review_gate_fails_on_a_rerun_that_gives_nothing(tmp_path, rc, writes, status):
    from properties import gate
    base = Path(_latency_json(tmp_path / "base.json"))

    def run(json_path, node_ids):
        if not node_ids:
            _latency_json(json_path, slower=1.6)
            return 0
        if writes:
            _latency_json(json_path, rows=[LATENCY])
        return rc

    assert gate.benchmark_gate(run, tmp_path, baseline=base) == status


SWEEP_SM_COUNT = 132  # the H200's


def _sweep_runnable(sweep, kernel, config):
    """The rules' choice and the declared choices the row's shape can run, straight from the
    kernel module (what sweep_choices must draw from)."""
    mod = sweep.kernel_module(kernel)
    a = sweep.stand_ins(config)
    chunk = config[-1]
    dims = launch_dims(a["x"], a["B"], a["dt_out"])  # no seq_idx, int32 indices
    rules = mod.rules_choice(dims, SWEEP_SM_COUNT)
    if kernel == "chunk_cumsum":
        return rules, list(mod.CHOICES)
    if kernel == "fwd_pass_state":
        return rules, [c for c in mod.CHOICES if c.mode in mod.modes(chunk)]
    if kernel == "ssd_scan":
        return rules, mod.ssd_scan_choices(a["x"], a["B"])
    return rules, mod.compute_out_choices(*sweep.compute_out_arrays(a))


@pytest.mark.parametrize("row", list(ANCHORS))
def test_sweep_times_the_rules_choice_and_its_neighbours(row):
    """On every anchor row, each kernel's sweep is the rules' choice first (once), then declared
    choices the shape can run that differ from it in exactly one field; every runnable choice one
    field away is timed unless its launches equal one timed before it (then it is named as
    such); --all is every runnable choice, each distinct launch once."""
    from benchmarks import sweep
    config = ANCHORS[row]
    for kernel in sweep.KERNELS:
        mod = sweep.kernel_module(kernel)
        rules, runnable = _sweep_runnable(sweep, kernel, config)
        timed, same = sweep.sweep_choices(kernel, config, SWEEP_SM_COUNT)
        names = [n for n, _ in timed]
        assert timed[0] == (sweep.label(kernel, rules), rules), (row, kernel)
        assert [c for _, c in timed].count(rules) == 1
        assert len(set(names)) == len(names) and len(names) > 1
        for name, choice in timed[1:]:
            assert choice in mod.CHOICES and choice in runnable, (row, kernel, name)
            assert sum(u != v for u, v in zip(choice, rules)) == 1, (row, kernel, name)
            assert name == sweep.label(kernel, choice)
        neighbours = {sweep.label(kernel, c) for c in runnable
                      if sum(u != v for u, v in zip(c, rules)) == 1}
        assert set(names[1:]) | {n for n, _ in same} == neighbours, (row, kernel)
        assert all(twin in names for _, twin in same)
        every, every_same = sweep.sweep_choices(kernel, config, SWEEP_SM_COUNT, everything=True)
        assert every[0] == timed[0] and set(names) <= {n for n, _ in every}
        assert {n for n, _ in every} | {n for n, _ in every_same} == {
            sweep.label(kernel, c) for c in runnable}
        a = sweep.stand_ins(config)
        keys = [sweep.launch_key(sweep.launches_of(kernel, mod, a, SWEEP_SM_COUNT, c))
                for _, c in every]
        assert len(set(keys)) == len(keys)  # each distinct launch once


def test_sweep_neighbours_of_the_anchor_rows():
    """What the rules' neighbours are on the H200: the other fwd_pass_state mode where the chunk
    size allows it (the small- / large-grid choice), the other compute_out layout, and fields the
    shape clamps (block_k at chunk 64, block_n at dstate 64, pass_block in order) not timed."""
    from benchmarks import sweep

    def names(row, kernel, **kw):
        timed, same = sweep.sweep_choices(kernel, ANCHORS[row], SWEEP_SM_COUNT, **kw)
        return [n for n, _ in timed], dict(same)

    timed, same = names("mamba2_2p7b", "fwd_pass_state")
    assert timed[0] == "in_order/k128/p64/n128/occ2/pass32"
    assert "parallel_chunks/k128/p64/n128/occ2/pass32" in timed
    assert same == {"in_order/k128/p64/n128/occ2/pass64": timed[0],
                    "in_order/k128/p64/n128/occ2/pass16": timed[0]}
    timed, _ = names("long_seq", "fwd_pass_state")
    assert timed[0] == "parallel_chunks/k128/p64/n128/occ2/pass32"
    assert {"in_order/k128/p64/n128/occ2/pass32",
            "parallel_chunks/k128/p64/n128/occ2/pass64"} <= set(timed)
    timed, same = names("chunk_64", "fwd_pass_state")
    assert timed[0] == "in_order/k128/p64/n128/occdefault/pass32"
    assert not any(n.startswith("parallel_chunks") for n in timed)  # modes(64): in order only
    assert same["in_order/k64/p64/n128/occdefault/pass32"] == timed[0]
    _, same = names("groups_8", "fwd_pass_state")
    assert same["in_order/k128/p64/n64/occ2/pass32"] == "in_order/k128/p64/n128/occ2/pass32"
    timed, _ = names("mamba2_2p7b", "compute_out")
    # the program per chunk is declared at its 64-token block only
    assert timed == ["whole_chunks/h2/occ2/t64", "token_blocks/h2/occ2/t64",
                     "whole_chunks/h1/occ2/t64", "whole_chunks/h2/occ1/t64"]
    timed, _ = names("chunk_64", "compute_out")  # one token block a chunk: one head, t128 = t64
    assert timed == ["token_blocks/h1/occ2/t64", "token_blocks/h1/occ1/t64",
                     "token_blocks/h1/occ2/t32", "whole_chunks/h1/occ2/t64"]
    timed, _ = names("groups_8", "compute_out")
    assert timed[0] == "token_blocks/h2/occ2/t64" and "whole_chunks/h2/occ2/t64" in timed
    assert names("mamba2_130m", "chunk_cumsum")[0] == ["h16", "h8", "h32"]
    timed, _ = names("mamba2_2p7b", "compute_out", only={"token_blocks/h1/occ1/t32"})
    assert timed == ["whole_chunks/h2/occ2/t64", "token_blocks/h1/occ1/t32"]


def test_sweep_labels_are_unique_stable_and_parse_back():
    from benchmarks import sweep
    found = sweep.labels()
    modules = {kernel: sweep.kernel_module(kernel) for kernel in sweep.KERNELS}
    chunk_cumsum, fwd_pass_state, compute_out, ssd_scan = modules.values()
    assert len(found) == sum(len(m.CHOICES) for m in modules.values())
    for kernel, mod in modules.items():
        for choice in mod.CHOICES:
            name = sweep.label(kernel, choice)
            assert sweep.choice_of(name) == (kernel, choice)
            assert name.count("/") == len(choice) - 1
    assert sweep.label("compute_out", compute_out.Choice("token_blocks", 2, 2, 64)) == \
        "token_blocks/h2/occ2/t64"
    assert sweep.label("fwd_pass_state", fwd_pass_state.Choice(
        "in_order", 128, 64, 128, None, 32)) == "in_order/k128/p64/n128/occdefault/pass32"
    assert sweep.label("chunk_cumsum", chunk_cumsum.Choice(16)) == "h16"
    assert (sweep.label("ssd_scan", ssd_scan.Choice(1, 2, 64, None))
            == "scan_h1/occ2/p64/wdefault/seg0")
    assert sweep.label("ssd_scan", ssd_scan.Choice(1, 1, 64, 8)) == "scan_h1/occ1/p64/w8/seg0"
    assert (sweep.label("ssd_scan", ssd_scan.Choice(1, 1, 64, None, 1))
            == "scan_h1/occ1/p64/wdefault/seg1")
    with pytest.raises(ValueError, match="closest: token_blocks/h2/occ2/t64"):
        sweep.choice_of("token_blocks/h2/occ2/t65")


def test_sweep_ablations_match_the_kernel_source_and_launch_with_the_rules_choice(tmp_path):
    """Every ablation edit matches the current kernel source exactly its count (load_variant
    refuses one that does not), and each copy launches the rules' choice (compute_out's with
    its program per token block) on every anchor row."""
    from benchmarks import sweep
    for kernel, ablations in sweep.ABLATIONS.items():
        source = (REPO / "kernels" / f"{kernel}.py").read_text()
        for tag, edits in ablations:
            for old, _, count in edits:
                assert source.count(old) == count, (kernel, tag, old)
            mod = sweep.load_variant(kernel, edits, tmp_path, tag)
            copy = (tmp_path / f"{kernel}_{tag}.py").read_text()
            assert copy != source and all(new in copy for _, new, _ in edits)
            for config in ANCHORS.values():
                a = sweep.stand_ins(config)
                rules, _ = sweep.rules_and_runnable(kernel, a, SWEEP_SM_COUNT)
                choice = sweep.ablation_choice(kernel, rules)
                if kernel == "compute_out":
                    assert choice.layout == "token_blocks"
                    assert choice._replace(layout=rules.layout) == rules
                launches = sweep.launches_of(kernel, mod, a, SWEEP_SM_COUNT, choice)
                ours = sweep.launches_of(kernel, sweep.kernel_module(kernel), a,
                                         SWEEP_SM_COUNT, choice)
                assert [g for _, g, _ in launches] == [g for _, g, _ in ours]
    with pytest.raises(ValueError, match="matches 0 times, not 1"):
        sweep.load_variant("compute_out", [("no such text", "", 1)], tmp_path, "bad")


def test_sweep_relative_error():
    from benchmarks import sweep
    ref = np.array([1.0, -4.0])
    assert sweep.relative_error([ref], [ref]) == 0.0
    assert sweep.relative_error([np.array([1.0, -3.0])], [ref]) == 0.25
    assert sweep.relative_error([ref, np.array([0.0, math.nan])], [ref, ref]) == math.inf


@pytest.mark.parametrize("argv, message", [
    (["--only", "token_blocks/h3/occ2/t64"],
     "--only: no declared choice is labelled 'token_blocks/h3/occ2/t64'"),
    (["--only", "h16,bogus"], "--only: no declared choice is labelled 'bogus'"),
    (["--ablate", "--only", "h16"], "with --ablate it names ablations"),
    (["--forward", "--only", "h16"], "not with --forward or --tune"),
    (["--rows", "mamba2_2p7b,nope"], "--rows: no anchor row 'nope'"),
    (["--candidate", "compute_out"], "--candidate takes MODULE=FILE"),
    (["--candidate", "nope=x.py"], "--candidate: no kernel module 'nope'"),
    (["--candidate", "compute_out=/no/such/file.py"], "no file /no/such/file.py"),
    (["--ablate", "--candidate", "chunk_cumsum=conftest.py"], "no kernel module 'chunk_cumsum'"),
    (["--all", "--ablate"], "not allowed with"),
], ids=["unknown_label", "unknown_of_two", "choice_with_ablate", "with_forward", "unknown_row",
        "candidate_form", "candidate_module", "candidate_file", "candidate_ablate", "all_ablate"])
def test_sweep_refuses_bad_arguments_before_the_gpu(argv, message, capsys):
    from benchmarks import sweep
    with pytest.raises(SystemExit) as e:
        sweep.main(argv)
    assert e.value.code == 2 and message in capsys.readouterr().err


def test_sweep_candidate_is_timed_after_the_rules_choice(tmp_path):
    """--candidate MODULE=FILE: the file loaded as a module copy, launched without a choice (its
    own rules'); it launches as the committed module does when it is a copy."""
    from benchmarks import sweep
    path = tmp_path / "rewrite.py"
    path.write_text((REPO / "kernels" / "compute_out.py").read_text())
    a = sweep.parse_args(["--rows", "groups_8", "--candidate", f"compute_out={path}",
                          "--only", "token_blocks/h1/occ2/t64"])
    assert a.candidate == {"compute_out": str(path)} and a.only == ["token_blocks/h1/occ2/t64"]
    [(tag, mod, choice, mark)] = sweep.candidate_entries("compute_out", a.candidate, tmp_path)
    assert tag == "file:rewrite" and choice is None and mark == ""
    assert sweep.candidate_entries("fwd_pass_state", a.candidate, tmp_path) == []
    stand_ins = sweep.stand_ins(ANCHORS["groups_8"])
    theirs = sweep.launches_of("compute_out", mod, stand_ins, SWEEP_SM_COUNT, None)
    ours = sweep.launches_of("compute_out", sweep.kernel_module("compute_out"), stand_ins,
                             SWEEP_SM_COUNT, None)
    assert [g for _, g, _ in theirs] == [g for _, g, _ in ours]


def test_compare_refuses_to_pass_on_nothing_compared(tmp_path, capsys):
    base = _bench_json(tmp_path / "base.json", {"ssd_forward-row1-mamba_ssm": 1.0})
    assert compare.main([base, base]) == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "benchmarks"}')
    assert compare.main([str(bad), base]) == 2
    assert "not a pytest-benchmark JSON" in capsys.readouterr().err


def test_compare_runs_as_a_module(tmp_path):
    base = _bench_json(tmp_path / "base.json", BASE)
    cur = _bench_json(tmp_path / "cur.json", {**BASE, "compute_out-row1-cutile": 0.5})
    proc = subprocess.run([sys.executable, "-m", "benchmarks.compare", base, cur,
                           "--threshold", "0.10"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "REGRESSION" in proc.stdout


def test_report_table_of_the_anchor_rows(tmp_path, capsys):
    def bench(op, impl, ms, **info):
        return {"extra_info": {"series": "anchor", "row": "mamba2_2p7b", "dtype": "float32",
                               "op": op, "impl": impl, **info}, "stats": {"median": ms * 1e-3}}
    rows = [bench("ssd_forward", "mamba_ssm", 1.2), bench("ssd_forward", "fla", 0.8),
            bench("ssd_forward", "torch", 17.0),
            bench("ssd_forward", "cutile", 0.4, target_ms=0.36, meets_target=False,
                  pct_of_floor=45.4, timing="latency"),
            bench("ssd_forward", "cutile_nocheck", 0.3, target_ms=0.36, meets_target=True),
            bench("chunk_cumsum", "cutile", 0.01, share_of_ssd_forward_pct=2.5),
            bench("ssd_scan", "cutile", 0.28, share_of_ssd_forward_pct=93.3),
            bench("fwd_pass_state", "cutile", 0.15, share_of_ssd_forward_pct=37.5),
            bench("compute_out", "cutile", 0.25, share_of_ssd_forward_pct=62.5)]
    path = tmp_path / "bench.json"
    path.write_text(json.dumps({"benchmarks": rows}))
    assert report.main([str(path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3  # header, rule, the one row present
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells == ["mamba2_2p7b", "4, 4096, 80, 64, 128, 1, 256", "float32", "0.400", "0.300",
                     "1.200", "0.800", "17.000", "3.00x", "4.00x", "2.00x", "0.36", "no / yes",
                     "45", "latency", "0.010 (2 %)", "0.280 (93 %)", "0.150 (38 %)",
                     "0.250 (62 %)"]


PLOT_SCALES = {("cutile", "float32"): 0.3, ("cutile", "bfloat16"): 0.35,
               ("cutile_nocheck", "float32"): 0.25, ("mamba_ssm", "float32"): 1.2,
               ("torch", "float32"): 17.0}


def _plot_benchmarks():
    """ssd_forward sweep and anchor results of every (impl, dtype) in PLOT_SCALES, a kernel's
    result (left out of the picture), and the default cutile forward timed as a latency."""
    benchmarks = []
    for (impl, dtype), scale in PLOT_SCALES.items():
        timing = "latency" if impl == "cutile" else "gpu"
        for s in SWEEP_SEQLENS:
            benchmarks.append({"extra_info": {"impl": impl, "op": "ssd_forward", "dtype": dtype,
                                              "series": "sweep", "config": list(sweep_config(s)),
                                              "timing": timing, "pct_of_floor": 10 / scale},
                               "stats": {"median": scale * s / 16384 * 1e-3}})
        for i, name in enumerate(ANCHORS, 1):
            benchmarks.append({"extra_info": {"impl": impl, "op": "ssd_forward", "dtype": dtype,
                                              "series": "anchor", "anchor": i, "timing": timing,
                                              "config": list(ANCHORS[name])},
                               "stats": {"median": scale * (1 + i / 10) * 1e-3}})
    benchmarks.append({"extra_info": {"impl": "cutile", "op": "compute_out", "dtype": "float32",
                                      "series": "sweep", "config": list(sweep_config(1024))},
                       "stats": {"median": 1.0}})
    return benchmarks


def test_plot_writes_a_png(tmp_path, capsys):
    image = pytest.importorskip("matplotlib.image")
    bench, out = tmp_path / "bench.json", tmp_path / "plot.png"
    bench.write_text(json.dumps({"benchmarks": _plot_benchmarks()}))
    assert plot.main([str(bench), "-o", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = image.imread(out)
    height, width = pixels.shape[:2]
    assert width >= 1000 and height >= 500
    assert pixels[..., :3].std() > 0.05  # drawn on, not a blank canvas
    assert f"wrote {out} ({width}x{height})" in capsys.readouterr().out


def test_plot_figure_panels():
    """Time against seqlen (log-log) and on the anchor rows (log time), % of the floor against
    seqlen; every (impl, dtype) a series in each panel and named in the one legend."""
    pytest.importorskip("matplotlib")
    fig = plot.figure(_plot_benchmarks())
    try:
        sweep, rows, floor = fig.axes
        assert sweep.get_xscale() == sweep.get_yscale() == rows.get_yscale() == "log"
        assert floor.get_xscale() == "log" and floor.get_yscale() == "linear"
        assert "seqlen" in sweep.get_xlabel() and "seqlen" in floor.get_xlabel()
        assert "ms" in sweep.get_ylabel() and "ms" in rows.get_ylabel()
        assert "anchor row" in rows.get_xlabel()
        assert "roofline floor" in floor.get_ylabel() and "roofline floor" in floor.get_title()
        assert [t.get_text() for t in rows.get_xticklabels()] == [
            f"{i}\n{name}" for i, name in enumerate(ANCHORS, 1)]
        (legend,) = fig.legends
        labels = [t.get_text() for t in legend.get_texts()]
        assert labels == sorted(f"{impl} {dtype}" + (" (latency)" if impl == "cutile" else "")
                                for impl, dtype in PLOT_SCALES)
        for ax in (sweep, rows, floor):
            assert len(ax.get_lines()) == len(PLOT_SCALES)
        by_label = {line.get_label(): line for line in sweep.get_lines()}
        line = by_label["cutile_nocheck float32"]
        assert list(line.get_xdata()) == list(SWEEP_SEQLENS)
        assert np.allclose(line.get_ydata(), [0.25 * s / 16384 for s in SWEEP_SEQLENS])
        pct = {line.get_label(): line.get_ydata() for line in floor.get_lines()}
        assert np.allclose(pct["torch float32"], 10 / 17.0)
        fp32, bf16 = by_label["cutile float32 (latency)"], by_label["cutile bfloat16 (latency)"]
        assert fp32.get_color() == bf16.get_color()  # one colour per implementation,
        assert fp32.get_linestyle() != bf16.get_linestyle()  # a line style per dtype
        assert "ssd_forward" in fig.get_suptitle()
    finally:
        plot.pyplot().close(fig)


@pytest.mark.parametrize("text, message", [
    ("", "is not JSON"),
    ("[1, 2]", "no 'benchmarks' list"),
    (json.dumps({"benchmarks": [b for b in _plot_benchmarks()
                                if b["extra_info"]["op"] != "ssd_forward"]}), "no ssd_forward"),
    (json.dumps({"benchmarks": [{"extra_info": {"op": "ssd_forward", "series": "sweep"}}]}),
     "lacks 'stats'"),
])
def test_plot_refuses_bad_json(tmp_path, capsys, text, message):
    bench, out = tmp_path / "bench.json", tmp_path / "plot.png"
    bench.write_text(text)
    assert plot.main([str(bench), "-o", str(out)]) == 2
    assert not out.exists()
    assert message in capsys.readouterr().err


def test_plot_names_the_extra_without_matplotlib(tmp_path, capsys, monkeypatch):
    bench, out = tmp_path / "bench.json", tmp_path / "plot.png"
    bench.write_text(json.dumps({"benchmarks": _plot_benchmarks()}))
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    assert plot.main([str(bench), "-o", str(out)]) == 2
    assert not out.exists()
    assert 'pip install -e ".[bench]"' in capsys.readouterr().err


def test_torch_baseline_matches_the_reference():
    """The side-by-side PyTorch implementation (CPU here when torch is installed) against the
    float64 reference: in float64 to rounding, over a short last chunk, groups, both D shapes and
    initial states; in float32 within the forward's bounds (it is more accurate than TF32)."""
    torch = pytest.importorskip("torch")
    from benchmarks.torch_ssd import ssd_chunked_torch
    from properties.bounds import FLOAT64_REL
    from properties.compare import forward_bounds
    from properties.strategies import Problem
    rng = np.random.default_rng(7)
    b, t, h, p, n, g, Q = 2, 100, 4, 8, 16, 2, 32
    x = rng.standard_normal((b, t, h, p))
    B, C = rng.standard_normal((b, t, g, n)), rng.standard_normal((b, t, g, n))
    dt = np.exp(rng.uniform(math.log(1e-3), math.log(1e-1), (b, t, h)))
    A = -rng.uniform(1.0, 16.0, h)
    S0 = rng.standard_normal((b, h, p, n))
    for D in (rng.standard_normal((h, p)), rng.standard_normal(h)):
        problem = Problem(x, dt, A, B, C, Q, D=D, initial_states=S0)
        y_ref, final_ref = R.ssd_chunked(x, dt, A, B, C, Q, D=D, initial_states=S0)
        fp32 = forward_bounds(problem)
        for dtype, y_bound, final_bound in ((torch.float64, FLOAT64_REL * fp32.M,
                                             FLOAT64_REL * fp32.final_M),
                                            (torch.float32, fp32.y, fp32.final)):
            T = lambda a, dtype=dtype: torch.from_numpy(a).to(dtype)
            y, final = ssd_chunked_torch(T(x), T(dt), T(A), T(B), T(C), Q, D=T(D),
                                         initial_states=T(S0), return_final_states=True)
            assert np.all(np.abs(y.double().numpy() - y_ref) <= y_bound)
            assert np.all(np.abs(final.double().numpy() - final_ref) <= final_bound)


def test_peers_table_row_goes_on_past_a_peer_that_fails(capsys):
    """benchmarks.peers' row: each implementation's median in IMPLEMENTATIONS order, "-" where it
    was not called, "failed" where it raised (fused-5 on bfloat16), and cuTile's speedup over the
    fastest peer that ran."""
    from benchmarks.peers import IMPLEMENTATIONS, timed_cells

    def fails():
        raise RuntimeError("does not compile for bfloat16")
    medians = {"cutile": 0.4, "mamba_ssm": 0.7, "fused5": 0.5}
    calls = {"cutile": "cutile", "mamba_ssm": "mamba_ssm", "fla": fails, "fused5": "fused5"}
    cells = timed_cells(calls, reps=3, timer=lambda call, reps: (
        call() if callable(call) else medians[call]))
    assert IMPLEMENTATIONS == ("cutile", "mamba_ssm", "fla", "fused5")
    assert cells == ["0.400", "0.700", "failed", "0.500", "1.25x"]
    assert "fla failed (RuntimeError: does not compile for bfloat16)" in capsys.readouterr().out
    assert timed_cells({"cutile": "cutile"}, reps=3, timer=lambda c, r: 0.4) == [
        "0.400", "-", "-", "-", "-"]
    with pytest.raises(RuntimeError, match="does not compile"):  # ours failing is no table row
        timed_cells({"cutile": fails, "mamba_ssm": "mamba_ssm"}, reps=3,
                    timer=lambda call, reps: call() if callable(call) else medians[call])


def test_client_keeps_the_median_of_each_rounds_paired_savings():
    """benchmarks.client's `kept`: each round's layer saving (the same round's two layer times)
    over each round's scan saving, medians of the pairs; a drift between rounds cancels where
    medians of the four times apart would not (here they would say 120 %)."""
    from benchmarks.client import kept_saving
    rounds = {"layer mamba_ssm": [10.0, 12.0, 11.0], "layer cutile": [9.5, 11.6, 10.4],
              "scan mamba_ssm": [1.0, 1.2, 1.1], "scan cutile": [0.5, 0.7, 0.6]}
    assert kept_saving(rounds) == pytest.approx(0.5 / 0.5)
    slower = dict(rounds, **{"scan cutile": [1.1, 1.3, 1.2]})
    assert kept_saving(slower) == -math.inf
