"""The properties: plain functions of (problem, backend) that raise AssertionError with the
worst offending element, and return metrics (observed bound ratios) for `hypothesis.target`.

`PROPERTIES` maps each name to its check and its strategy; the tests, the nightly fuzzer, the
replayer and the mutant runner all go through it. The backend is 'interpreter' (NumPy arrays:
the kernels run on the CPU tile interpreter) or 'gpu' (CuPy arrays). A problem's arrays reach
the kernels laid out as its layout says, wherever a property passes them to a kernel or to the
forward (properties.runner: running a case); results are compared with their references within
the derived bounds by properties.compare.
"""

from __future__ import annotations

import contextlib
import itertools
import math
from dataclasses import dataclass
from collections.abc import Callable

import ml_dtypes
import numpy as np
from hypothesis import strategies as st

import reference as R
from contract import Dims
from kernels import (chunk_cumsum, compute_out, fwd_pass_state, raise_pending_errors, ssd_forward,
                     ssd_scan)
from kernels.arrays import LaunchDims
from kernels.compute_out import BLOCK_TS, OCCUPANCIES, RULES_BLOCK_T, RULES_OCCUPANCY
from kernels.compute_out import compute_out_choices
from kernels.fwd_pass_state import BLOCK_KS, BLOCK_NS, BLOCK_PS, MODES, PASS_BLOCKS
from kernels.fwd_pass_state import rules_choice as fwd_pass_state_rules
from kernels.call import Call
from kernels.plan import plan_of
from kernels.ssd_scan import RULES_CHOICE as SCAN_RULES_CHOICE
from kernels.ssd_scan import OCCUPANCIES as SCAN_OCCUPANCIES
from kernels.ssd_scan import WORKER_WARPS as SCAN_WORKER_WARPS
from kernels.ssd_scan import ssd_scan_choices
from properties.bounds import (FTZ_MIN, U_FP32, chunk_cumsum_bound, kappa, narrow_output_bound,
                               tf32_bound)
from properties.compare import (as_f32, check_close, check_identical, expected_state_dtype,
                                floor_of, forward_bounds, max_abs, merge_metrics)
from properties.profiles import buckets, caps
from properties.runner import BACKENDS, forward, narrow_backend, on_backend, run_on
from properties.strategies import WEIGHT_ARRAYS, Problem, problem, problems, spec_of

# --------------------------------------------------------------------------------------------
# The properties


def forward_tf32_bound(p: Problem, backend: str) -> dict:
    """ssd_forward's y and final_states against the float64 recurrence, per element within
    kappa u M (+ the cumsum and flush-to-zero terms); every output finite."""
    y, final = forward(p, backend)
    y_ref, final_ref = R.ssd_recurrent(p.x, p.dt, p.A, p.B, p.C, **p.options())
    b = forward_bounds(p)
    return merge_metrics(
        check_close("forward y", y, y_ref, b.y, b.M, p, floor=b.floor),
        check_close("forward final_states", final, final_ref, b.final, b.final_M, p,
                    floor=b.floor_final))


# y's largest magnitude in the float16 property: below float16's largest finite, 65504, with
# room for the kernel's own error
FP16_Y_MAX = 2.0 ** 14


def _pow2_scale(m: float, top: float) -> float:
    """The power of two (<= 1) that brings a largest magnitude m down to <= top."""
    return 1.0 if m <= top else 2.0 ** -math.ceil(math.log2(m / top))


def _as_float16(p: Problem) -> Problem:
    """p with x, B, C, z in float16, and where p.weights is "activation" dt, dt_bias, D and
    initial_states too (A stays float32), inside float16's range: x, B, C, and initial_states
    where it is float16, first scaled by powers of two (exact) to magnitudes <= 2^10 (dt,
    dt_bias and D are far inside it: strategies.problem), then x and initial_states together
    (y is linear in them jointly) until the float64 y of the float16 values is <= FP16_Y_MAX.
    What rounds to a float16 subnormal or to zero is part of the problem: the reference reads
    the same values."""
    f16 = lambda a, scale=1.0: None if a is None else (np.asarray(a, np.float64) * scale).astype(
        np.float16)
    x, B, C = (f16(a, _pow2_scale(max_abs(a)[0], 2.0 ** 10)) for a in (p.x, p.B, p.C))
    q = p.replace(x=x, B=B, C=C, z=f16(p.z))
    if p.weights == "activation":
        q = q.replace(dt=f16(p.dt), dt_bias=f16(p.dt_bias), D=f16(p.D), initial_states=f16(
            p.initial_states, _pow2_scale(max_abs(p.initial_states)[0], 2.0 ** 10)))
    y_ref, _ = R.ssd_recurrent(q.x, q.dt, q.A, q.B, q.C, **q.options())
    scale = _pow2_scale(max_abs(y_ref)[0], FP16_Y_MAX)
    if scale == 1.0:
        return q
    init = q.initial_states
    return q.replace(x=f16(q.x, scale), initial_states=None if init is None else
                     (np.asarray(init, np.float64) * scale).astype(init.dtype))


def _as_bfloat16(p: Problem) -> Problem:
    """p with x, B, C, z in bfloat16, and where p.weights is "activation" dt, dt_bias, D and
    initial_states too, and A where p.narrow_A (rounded to nearest; bfloat16 has float32's
    exponent range, so nothing is scaled): the reference reads the same values."""
    bf16 = lambda a: None if a is None else np.asarray(a, np.float32).astype(
        ml_dtypes.bfloat16)
    names = ("x", "B", "C", "z", *(WEIGHT_ARRAYS if p.weights == "activation" else ()),
             *(("A",) if p.narrow_A else ()))
    return p.replace(**{n: bf16(getattr(p, n)) for n in names})


def forward_bf16_bound(p: Problem, backend: str) -> dict:
    """ssd_forward with x, B, C, z in bfloat16, the weights as p's say (_as_bfloat16; the rest
    float32; on the GPU as torch tensors, CuPy has no bfloat16): its products take bfloat16
    operands, its weights are widened exactly; y in bfloat16 within narrow_output_bound of the
    float64 forward of the bfloat16 values, final_states (float32) within its bound, both at
    kappa of bfloat16 operands, and of bfloat16 chunk states where the forward keeps chunk
    states (_keeps_chunk_states)."""
    q = _as_bfloat16(p)
    y, final = forward(q, backend)
    if y.dtype != ml_dtypes.bfloat16 or final.dtype != np.float32:
        raise AssertionError(f"bfloat16 inputs gave y {y.dtype}, final_states {final.dtype} "
                             f"(want bfloat16, float32)\n  {q.describe()}")
    wide = _wide(q)
    y_ref, final_ref = R.ssd_recurrent(wide.x, wide.dt, wide.A, wide.B, wide.C,
                                       **wide.options())
    b = forward_bounds(wide, operands="bfloat16",
                       stored_states=_keeps_chunk_states(q, narrow_backend(backend)))
    return merge_metrics(
        check_close("bf16 y", y.astype(np.float64), y_ref,
                    narrow_output_bound(y_ref, b.y, "bfloat16"), b.M, wide, floor=b.floor),
        check_close("bf16 final_states", final, final_ref, b.final, b.final_M, wide,
                    floor=b.floor_final))


def _keeps_chunk_states(q: Problem, backend: str) -> bool:
    """Whether ssd_forward on q's (bfloat16) arrays, on `backend`, stores chunk states between
    its kernels: on q's route where it names one (the chunk states' routes; the scan keeps its
    state in registers), else by its launch plan's outputs (the rules' route depends on the
    device); AssertionError where the plan stores them otherwise than that, or in another dtype
    than the documented default (DEFAULT_STATE_DTYPES: bfloat16)."""
    plan = plan_of(Call(**on_backend(q, backend), chunk_size=q.chunk_size,
                        dt_softplus=q.dt_softplus, dt_limit=q.dt_limit, route=q.route,
                        batch_parts=q.batch_parts))
    narrow = {name: like_x for name, _, like_x in plan.outputs}.get("chunk_states")
    stored = narrow is not None if q.route is None else q.route != "scan"
    if (narrow is not None) != stored or narrow is False:
        kept = {None: "none", True: "bfloat16", False: "float32"}[narrow]
        want = expected_state_dtype("bfloat16", None) if stored else "none"
        raise AssertionError(f"bfloat16 inputs on route {q.route} keep chunk states {kept} "
                             f"(want {want})\n  {q.describe()}")
    return stored


def forward_fp16_bound(p: Problem, backend: str) -> dict:
    """ssd_forward with x, B, C, z in float16 (dt, D, dt_bias, initial_states float32 or float16
    as p's weights say, A float32: _as_float16): y in float16 within narrow_output_bound of the
    float64 forward of the float16 values, final_states (float32) within its bound, both at
    kappa of float16 inputs (float16 operands: the scan's guarded, the other kernels' scaled);
    and the same problem with its decayed weights pushed past float16's range
    (_weights_past_float16), which a product rounding them to float16 unguarded and unscaled
    would make inf, within the same bound."""
    q = _as_float16(p)
    pushed = _weights_past_float16(q)
    return merge_metrics(_fp16_forward_within_bound("fp16", q, backend),
                         *([] if pushed is None else [_fp16_forward_within_bound(
                             "fp16 weights past float16's range", pushed, backend)]))


def _fp16_forward_within_bound(what: str, q: Problem, backend: str) -> dict:
    y, final = forward(q, backend)
    if y.dtype != np.float16 or final.dtype != np.float32:
        raise AssertionError(f"float16 inputs gave y {y.dtype}, final_states {final.dtype} "
                             f"(want float16, float32)\n  {q.describe()}")
    y_ref, final_ref = R.ssd_recurrent(q.x, q.dt, q.A, q.B, q.C, **q.options())
    b = forward_bounds(q, operands="float16")
    return merge_metrics(
        check_close(f"{what} y", y, y_ref, narrow_output_bound(y_ref, b.y, "float16"), b.M, q,
                    floor=b.floor),
        check_close(f"{what} final_states", final, final_ref, b.final, b.final_M, q,
                    floor=b.floor_final))


# how far past float16's largest finite value a pushed operand goes (twice its range: it must
# overflow, not graze it): _weights_past_float16's largest weight, and test_narrow_inputs' operands
FP16_PUSH = 2.0 ** 17


def _weights_past_float16(q: Problem) -> Problem | None:
    """q (float16 activations) with B scaled up and x down by one power of two 2^k, so that its
    largest decayed weight on the diagonal (C_t . B_t dt_t: no decay there) is FP16_PUSH or more,
    past float16's range (the scan's guard redoes such a call on TF32 operands, the other
    kernels scale: kernels.tiles.float16_scaled); y's
    terms through B x keep their values, D x gets smaller. None where the weights already pass
    the range or are all zero, or B would leave float16's range (|B| 2^k >= 2^15)."""
    d = q.dims
    dt_out = R.chunk_cumsum_ref(q.dt, q.A, q.chunk_size, q.dt_bias, q.dt_softplus,
                                q.dt_limit)[0]
    dt = np.moveaxis(dt_out.reshape(d.batch, d.nheads, -1)[:, :, :d.seqlen], 1, 2)  # [b, t, h]
    cb = np.einsum("btgn,btgn->btg", np.asarray(q.C, np.float64), np.asarray(q.B, np.float64))
    largest = float(np.max(np.abs(np.repeat(cb, d.nheads // d.ngroups, axis=2) * dt),
                        initial=0.0))
    if not 0.0 < largest < FP16_PUSH:
        return None
    k = math.ceil(math.log2(FP16_PUSH / largest))
    if max_abs(q.B)[0] * 2.0 ** k >= 2.0 ** 15:
        return None
    f16 = lambda a, e: (np.asarray(a, np.float64) * 2.0 ** e).astype(np.float16)
    return q.replace(B=f16(q.B, k), x=f16(q.x, -k))


def chunk_cumsum_alone(p: Problem, backend: str) -> dict:
    """chunk_cumsum alone: dt_out within C_DT u32 relative, dA_cumsum within gamma |a|."""
    args = (p.chunk_size, p.dt_bias, p.dt_softplus, p.dt_limit)
    dt_out, dA = run_on(chunk_cumsum, backend, p.dt, p.A, *args, laid_out_as=p)
    dt_ref, dA_ref = R.chunk_cumsum_ref(p.dt, p.A, *args)
    dt_bound, dA_bound = chunk_cumsum_bound(dt_ref, dA_ref, p.chunk_size)
    # + the flush-to-zero allowance: every term dt * A below 2^-126 may vanish; the observed
    # error is reported relative to |ref| in fp32 units (these are fp32 computations)
    u32 = ("u32", U_FP32)
    return merge_metrics(
        check_close("chunk_cumsum dt_out", dt_out, dt_ref, dt_bound + FTZ_MIN, np.abs(dt_ref), p,
                    floor=FTZ_MIN, unit=u32),
        check_close("chunk_cumsum dA_cumsum", dA, dA_ref, dA_bound + p.chunk_size * FTZ_MIN,
                    np.abs(dA_ref), p, floor=p.chunk_size * FTZ_MIN, unit=u32))


def _exact_upstream(p: Problem):
    """dt_out, dA_cumsum and chunk_states of the float64 references rounded to float32: the
    inputs of one kernel alone, exactly representable so kernel and reference read the same."""
    dt_out, dA = (as_f32(a) for a in R.chunk_cumsum_ref(p.dt, p.A, p.chunk_size, p.dt_bias,
                                                        p.dt_softplus, p.dt_limit))
    states, _ = R.fwd_pass_state_ref(p.x, p.B, dt_out, dA, p.initial_states, p.seq_idx)
    return dt_out, dA, as_f32(states)


# fwd_pass_state_alone's tiles: the rules', and the smallest declared ones (several blocks of
# headdim and dstate in small problems)
FWD_PASS_STATE_TILES = {"rules": {}, "small": dict(
    block_k=min(BLOCK_KS), block_p=min(BLOCK_PS), block_n=min(BLOCK_NS),
    pass_block=min(PASS_BLOCKS))}


def fwd_pass_state_alone(p: Problem, backend: str) -> dict:
    """fwd_pass_state alone (fp32-exact dt_out, dA_cumsum), in each mode (in order; chunks in
    parallel then the pass: the rules pick one by the grid and the chunk size, `choice` forces
    each), with the rules' tiles and with small declared ones (FWD_PASS_STATE_TILES: several
    blocks of each dimension in small problems): chunk_states and final_states within
    kappa('fwd_pass_state') u M; and in bfloat16 (x, B rounded to it; the reference of their
    values) at the rules' choice, within kappa of bfloat16 operands, and in each mode with the
    chunk states stored in bfloat16 (state_dtype), within kappa of stored bfloat16 states
    (chunk_states: plus their store's rounding, narrow_output_bound)."""
    d = p.dims
    dt_out, dA, _ = _exact_upstream(p)
    states_ref, final_ref = R.fwd_pass_state_ref(p.x, p.B, dt_out, dA, p.initial_states,
                                                 p.seq_idx)
    states_M, final_M = R.fwd_pass_state_magnitude(p.x, p.B, dt_out, dA, p.initial_states,
                                                   p.seq_idx)
    k = kappa("fwd_pass_state", d.seqlen, d.chunk_size, d.dstate)
    floor = floor_of(p, dt_out, states_M, final_M)
    metrics = []
    rules = fwd_pass_state_rules(LaunchDims(d), 1)
    for mode, (name, tiles) in itertools.product(MODES, FWD_PASS_STATE_TILES.items()):
        states, final = run_on(fwd_pass_state, backend, p.x, p.B, dt_out, dA, p.initial_states,
                               p.seq_idx, choice=rules._replace(mode=mode, **tiles),
                               laid_out_as=p)
        metrics += [
            check_close(f"fwd_pass_state ({mode}, {name} tiles) chunk_states", states,
                        states_ref, tf32_bound(states_M, k) + floor, states_M, p, floor=floor),
            check_close(f"fwd_pass_state ({mode}, {name} tiles) final_states", final, final_ref,
                        tf32_bound(final_M, k) + floor, final_M, p, floor=floor)]
    # bfloat16 x and B (the reference of their values) at the rules' choice: w o x rounded to
    # bfloat16 before its product
    q = _as_bfloat16(p)
    wide = _wide(q)
    dt_out, dA, _ = _exact_upstream(wide)
    refs = R.fwd_pass_state_ref(wide.x, wide.B, dt_out, dA, wide.initial_states, wide.seq_idx)
    mags = R.fwd_pass_state_magnitude(wide.x, wide.B, dt_out, dA, wide.initial_states,
                                      wide.seq_idx)
    k = kappa("fwd_pass_state", d.seqlen, d.chunk_size, d.dstate, "bfloat16")
    floor = floor_of(wide, dt_out, *mags)
    outs = run_on(fwd_pass_state, narrow_backend(backend), q.x, q.B, dt_out, dA,
                  q.initial_states, q.seq_idx, laid_out_as=q)
    for what, out, ref, M in zip(("chunk_states", "final_states"), outs, refs, mags):
        metrics.append(check_close(f"fwd_pass_state bf16 {what}", out, ref,
                                   tf32_bound(M, k) + floor, M, wide, floor=floor))
    k = kappa("fwd_pass_state", d.seqlen, d.chunk_size, d.dstate, "bfloat16", stored_states=True)
    for mode in MODES:  # the chunk states stored in bfloat16: the increments too, in parallel
        states, final = run_on(fwd_pass_state, narrow_backend(backend), q.x, q.B, dt_out, dA,
                               q.initial_states, q.seq_idx, choice=rules._replace(mode=mode),
                               state_dtype="bfloat16", laid_out_as=q)
        if states.dtype != ml_dtypes.bfloat16:
            raise AssertionError(f"state_dtype bfloat16 gave chunk_states {states.dtype}\n  "
                                 f"{wide.describe()}")
        bound = tf32_bound(mags[0], k) + floor
        metrics += [check_close(f"fwd_pass_state ({mode}) bf16 stored chunk_states",
                                states.astype(np.float64), refs[0],
                                narrow_output_bound(refs[0], bound, "bfloat16"), mags[0], wide,
                                floor=floor),
                    check_close(f"fwd_pass_state ({mode}) bf16 stored final_states", final,
                                refs[1], tf32_bound(mags[1], k) + floor, mags[1], wide,
                                floor=floor)]
    return merge_metrics(*metrics)


def compute_out_alone_choices(runnable: list, params: dict) -> list:
    """The choices compute_out_alone runs among those the shape can (`runnable`; seq_idx stands
    in for its segment ids and x for y: the choices read shapes and dtypes): those at the
    example's occupancy hint and token block (a stored reproducer without them: the launcher's),
    and the program per chunk (declared at one token block) whatever the drawn one. A token block
    that clamps to an earlier one's extent is no choice of its own: it runs as the rules'
    (BLOCK_TS lists that first)."""
    occupancy = params.get("occupancy", RULES_OCCUPANCY)
    block_t = params.get("block_t", RULES_BLOCK_T)
    runnable = [c for c in runnable if c.occupancy == occupancy]
    block_t = block_t if block_t in {c.block_t for c in runnable} else RULES_BLOCK_T
    return [c for c in runnable if c.block_t == block_t or c.layout == "whole_chunks"]


def compute_out_alone(p: Problem, backend: str) -> dict:
    """compute_out alone (fp32-exact dt_out, dA_cumsum, chunk_states) in every choice it can run
    on the shape (compute_out_choices: each program layout and number of heads per program that
    the rules or a tuned table may launch), at the occupancy hint the example draws and its token
    block (compute_out_alone_choices): y within kappa('compute_out') u M; and in bfloat16 (x, B,
    C, z rounded to it; the reference of their values) at the rules' choice, y (bfloat16) within
    narrow_output_bound of kappa of bfloat16 operands, and bit-identical from the chunk states
    in bfloat16."""
    d = p.dims
    dt_out, dA, states = _exact_upstream(p)
    args = (p.x, p.B, p.C, dt_out, dA, states, p.D, p.z, p.seq_idx)
    y_ref = R.compute_out_ref(*args)
    M = R.compute_out_magnitude(*args)
    bound = tf32_bound(M, kappa("compute_out", d.seqlen, d.chunk_size, d.dstate))
    floor = floor_of(p, dt_out, states)
    choices = compute_out_alone_choices(compute_out_choices(*args, p.x), p.params)
    if not any(c.layout == "token_blocks" for c in choices):  # checked nothing of its own
        raise ValueError(f"compute_out_alone: no choice at occupancy "
                         f"{p.params.get('occupancy')!r} (OCCUPANCIES {OCCUPANCIES})\n  "
                         f"{p.describe()}")
    metrics = []
    for choice in choices:
        y = run_on(compute_out, backend, *args, choice=choice, laid_out_as=p)
        metrics.append(check_close(
            f"compute_out ({choice.layout}, {choice.heads} heads, occupancy {choice.occupancy}, "
            f"block_t {choice.block_t}) y", y, y_ref, bound + floor, M, p, floor=floor))
    # bfloat16 x, B, C, z (the reference of their values) at the rules' choice: the state and
    # the decayed weights rounded to bfloat16 before their products, y stored in bfloat16
    q = _as_bfloat16(p)
    wide = _wide(q)
    dt_out, dA, states = _exact_upstream(wide)
    args = (wide.x, wide.B, wide.C, dt_out, dA, states, wide.D, wide.z, wide.seq_idx)
    y_ref, M = R.compute_out_ref(*args), R.compute_out_magnitude(*args)
    floor = floor_of(wide, dt_out, states)
    bound = tf32_bound(M, kappa("compute_out", d.seqlen, d.chunk_size, d.dstate, "bfloat16"))
    y = run_on(compute_out, narrow_backend(backend), q.x, q.B, q.C, dt_out, dA, states, q.D, q.z,
               q.seq_idx, laid_out_as=q)
    metrics.append(check_close("compute_out bf16 y", y.astype(np.float64), y_ref,
                               narrow_output_bound(y_ref, bound + floor, "bfloat16"), M, wide,
                               floor=floor))
    # chunk states stored in bfloat16 (state_dtype) are the state operand compute_out rounds
    # float32 ones to (nearest even): the same y, bit for bit
    y16 = run_on(compute_out, narrow_backend(backend), q.x, q.B, q.C, dt_out, dA,
                 states.astype(ml_dtypes.bfloat16), q.D, q.z, q.seq_idx, laid_out_as=q)
    check_identical("compute_out bf16 y of bfloat16 chunk states", y16, y, wide)
    return merge_metrics(*metrics)


def _wide(q: Problem) -> Problem:
    """q with its floating arrays (the activations x, B, C, z and the weights dt, A, dt_bias,
    D, initial_states) as float64: the reference of their own values."""
    return q.replace(**{n: None if getattr(q, n) is None else
                        np.asarray(getattr(q, n), np.float64)
                        for n in ("x", "B", "C", "z", "dt", "A", "dt_bias", "D",
                                  "initial_states")})


def ssd_scan_alone(p: Problem, backend: str) -> dict:
    """ssd_scan alone (fp32-exact dt_out, dA_cumsum) in every choice the shape allows at the
    example's hints (occupancy, worker warps), and in bfloat16 (on the GPU as torch tensors),
    its weights as the example's say (_as_bfloat16), at the rules' choice: y and final_states
    within the forward's bounds (the scan's roundings are the forward's: accumulation_length
    counts its state's token blocks). The GPU's forward runs the scan on large grids only, and
    the property suite's grids are small: the scan's launches of every kind are checked here."""
    dt_out, dA, _ = _exact_upstream(p)
    hints = (p.params.get("occupancy", SCAN_RULES_CHOICE.occupancy),
             p.params.get("warps", SCAN_RULES_CHOICE.warps))
    args = (p.B, p.C, dt_out, dA)
    kw = dict(D=p.D, z=p.z, initial_states=p.initial_states, seq_idx=p.seq_idx)
    y_ref, final_ref = R.ssd_recurrent(p.x, p.dt, p.A, p.B, p.C, **p.options())
    b = forward_bounds(p)
    metrics = []
    for choice in ssd_scan_choices(p.x, p.B):
        if (choice.occupancy, choice.warps) != hints:
            continue
        y, final = run_on(ssd_scan, backend, p.x, *args, **kw, choice=choice, laid_out_as=p)
        name = (f"ssd_scan ({choice.heads} heads, block_p {choice.block_p}, occupancy "
                f"{choice.occupancy}, worker warps {choice.warps}, segments {choice.segments})")
        metrics += [check_close(f"{name} y", y, y_ref, b.y, b.M, p, floor=b.floor),
                    check_close(f"{name} final_states", final, final_ref, b.final, b.final_M,
                                p, floor=b.floor_final)]
    if not metrics:  # checked nothing
        raise ValueError(f"ssd_scan_alone: no choice at hints (occupancy, worker warps) "
                         f"{hints!r} (OCCUPANCIES {SCAN_OCCUPANCIES}, WORKER_WARPS "
                         f"{SCAN_WORKER_WARPS})\n  {p.describe()}")
    q = _as_bfloat16(p)
    wide = _wide(q)
    dt_out, dA, _ = _exact_upstream(wide)
    y, final = run_on(ssd_scan, narrow_backend(backend), q.x, q.B, q.C, dt_out, dA, D=q.D, z=q.z,
                      initial_states=q.initial_states, seq_idx=q.seq_idx, laid_out_as=q)
    y_ref, final_ref = R.ssd_recurrent(wide.x, wide.dt, wide.A, wide.B, wide.C,
                                       **wide.options())
    b = forward_bounds(wide, operands="bfloat16", stored_states=False)  # the scan keeps none
    metrics += [check_close("ssd_scan bf16 y", y.astype(np.float64), y_ref,
                            narrow_output_bound(y_ref, b.y, "bfloat16"), b.M, wide,
                            floor=b.floor),
                check_close("ssd_scan bf16 final_states", final, final_ref, b.final, b.final_M,
                            wide, floor=b.floor_final)]
    return merge_metrics(*metrics)


def three_kernels(p: Problem, backend: str):
    """y of chunk_cumsum, fwd_pass_state and compute_out called in turn at their rules' choices:
    the forward where it does not take the scan (a small grid on a GPU; never on the
    interpreter, whose one SM takes the scan wherever it can run)."""
    dt_out, dA = run_on(chunk_cumsum, backend, p.dt, p.A, p.chunk_size, p.dt_bias, p.dt_softplus,
                        p.dt_limit, laid_out_as=p)
    states, _ = run_on(fwd_pass_state, backend, p.x, p.B, dt_out, dA, p.initial_states, p.seq_idx,
                       laid_out_as=p)
    return run_on(compute_out, backend, p.x, p.B, p.C, dt_out, dA, states, p.D, p.z, p.seq_idx,
                  laid_out_as=p)


def causal_prefix(p: Problem, backend: str) -> dict:
    """Changing x, B, C, dt at every position > t (to large finite values too) leaves
    y[:, :t+1] bit-identical: the forward's, and the three kernels' in turn (three_kernels)."""
    t, large = p.params["t"], p.params["large"]
    rng = np.random.default_rng(p.params["seed"])
    scale = 1e4 if large else 1.0
    changed = {}
    for name in ("x", "B", "C", "dt"):
        a = getattr(p, name).copy()
        later = a[:, t + 1:]
        new = rng.standard_normal(later.shape) * scale * (np.abs(later).max(initial=0.0) + 1.0)
        if name == "dt":
            new = np.abs(new) * (100.0 if large else 1.0)
        a[:, t + 1:] = new
        changed[name] = a
    y, _ = forward(p, backend)
    y2, _ = forward(p.replace(**changed), backend)
    check_identical(f"y[:, :{t + 1}] after changing x, B, C, dt beyond t={t}",
                    y2[:, :t + 1], y[:, :t + 1], p)
    y, y2 = three_kernels(p, backend), three_kernels(p.replace(**changed), backend)
    check_identical(f"the three kernels' y[:, :{t + 1}] after changing x, B, C, dt beyond "
                    f"t={t}", y2[:, :t + 1], y[:, :t + 1], p)
    return {}


def packed_offsets(seqlen: int, lengths: list[int]) -> np.ndarray:
    """cu_seqlens of a row of seqlen tokens: sequences of `lengths` in turn while they fit, the
    last one cut to what is left, then one more sequence with the rest (if any)."""
    offsets = [0]
    for n in lengths:
        offsets.append(min(offsets[-1] + n, seqlen))
    if offsets[-1] < seqlen or len(offsets) == 1:
        offsets.append(seqlen)
    return np.asarray(offsets, np.int32)


def _packed_row(p: Problem) -> tuple[Problem, np.ndarray]:
    """p's first row with a random initial state per sequence (p.params["seed"], else 0), and
    the offsets of its sequences (p.params["lengths"], else 0, 1, chunk - 1, chunk, chunk + 1,
    then the rest)."""
    row = lambda a: None if a is None else a[:1]
    d, q_size = p.dims, p.chunk_size
    cu = packed_offsets(d.seqlen, p.params.get("lengths", [0, 1, q_size - 1, q_size, q_size + 1]))
    rng = np.random.default_rng(p.params.get("seed", 0))
    h0 = rng.standard_normal((len(cu) - 1, d.nheads, d.headdim, d.dstate)).astype(np.float32)
    return p.replace(x=row(p.x), dt=row(p.dt), B=row(p.B), C=row(p.C), z=row(p.z), seq_idx=None,
                     initial_states=h0), cu  # a state per sequence


def varlen_packed(p: Problem, backend: str) -> dict:
    """The first batch row of p cut into sequences at the drawn lengths (0, 1, chunk - 1, chunk,
    chunk + 1 and several chunks among the draws; packed_offsets), each from its own random
    initial state, the arrays laid out as p's layout says: ssd_forward(cu_seqlens=...) equals a
    call per sequence, y and each sequence's final state within that sequence's own forward
    bounds (forward_bounds of the sequence alone); an empty sequence's state is its initial
    state, bit for bit. The same row again with x, B, C, z in bfloat16 (its own kernel object;
    on the GPU as torch tensors), the weights and the initial states as p's say (_as_bfloat16),
    y within narrow_output_bound at kappa of bfloat16 operands. Without drawn lengths (a cover
    problem): 0, 1, chunk - 1, chunk, chunk + 1, then the rest."""
    q, cu = _packed_row(p)
    return merge_metrics(_packed_against_alone(q, cu, backend),
                         _packed_against_alone(_as_bfloat16(q), cu, narrow_backend(backend)))


def _packed_against_alone(q: Problem, cu, backend: str) -> dict:
    """varlen_packed's check of one packed row q (float32 or bfloat16 activations; its
    initial_states one per sequence of cu)."""
    narrow = q.x.dtype == ml_dtypes.bfloat16
    h0 = q.initial_states
    opts = dict(D=q.D, z=q.z, dt_bias=q.dt_bias, dt_softplus=q.dt_softplus, dt_limit=q.dt_limit)
    y, states = run_on(ssd_forward, backend, q.x, q.dt, q.A, q.B, q.C, q.chunk_size,
                       initial_states=h0, cu_seqlens=cu, return_varlen_states=True,
                       laid_out_as=q, **opts)
    metrics = []
    for k in range(len(cu) - 1):
        lo, hi = int(cu[k]), int(cu[k + 1])
        if lo == hi:  # its initial state widened to float32 (exact), bit for bit
            check_identical(f"sequence {k}'s state (empty: its initial state)", states[k],
                            np.asarray(h0[k], np.float32), q)
            continue
        cut = lambda a, lo=lo, hi=hi: None if a is None else a[:, lo:hi]
        alone = _wide(q.replace(x=cut(q.x), dt=cut(q.dt), B=cut(q.B), C=cut(q.C), z=cut(q.z),
                                initial_states=h0[k:k + 1]))
        y_ref, final_ref = R.ssd_recurrent(alone.x, alone.dt, alone.A, alone.B, alone.C,
                                           **alone.options())
        # the packed path keeps no chunk states
        b = forward_bounds(alone, operands="bfloat16" if narrow else "tfloat32",
                           stored_states=False)
        y_bound = narrow_output_bound(y_ref, b.y, "bfloat16") if narrow else b.y
        what = f"{'bf16 ' if narrow else ''}sequence {k} (tokens {lo}:{hi})"
        metrics += [check_close(f"{what} y", np.asarray(y[:, lo:hi], np.float64), y_ref, y_bound,
                                b.M, alone, label="y", floor=b.floor),
                    check_close(f"{what} state", states[k:k + 1], final_ref, b.final, b.final_M,
                                alone, label="state", floor=b.floor_final)]
    return merge_metrics(*metrics)


def cumsum_non_increasing(p: Problem, backend: str) -> dict:
    """chunk_cumsum's dA_cumsum: finite, <= 0, non-increasing within every chunk."""
    _, dA = run_on(chunk_cumsum, backend, p.dt, p.A, p.chunk_size, p.dt_bias, p.dt_softplus,
                   p.dt_limit, laid_out_as=p)
    if not np.isfinite(dA).all():
        raise AssertionError(f"dA_cumsum has non-finite entries\n  {p.describe()}")
    if (dA > 0).any():
        w = tuple(int(i) for i in np.argwhere(dA > 0)[0])
        raise AssertionError(f"dA_cumsum > 0 at {w}: {dA[w]!r}\n  {p.describe()}")
    rise = np.diff(dA, axis=-1) > 0
    if rise.any():
        w = tuple(int(i) for i in np.argwhere(rise)[0])
        nxt = w[:-1] + (w[-1] + 1,)
        raise AssertionError(f"dA_cumsum increases within a chunk at (batch, head, chunk, pos) "
                             f"{w}: {dA[w]!r} -> {dA[nxt]!r}\n  {p.describe()}")
    return {}


def chunk_size_invariance(p: Problem, backend: str) -> dict:
    """y at two chunk sizes agree within the sum of their bounds."""
    other = p.params["other_chunk_size"]
    y1, _ = forward(p, backend)
    y2, _ = forward(p.replace(chunk_size=other), backend)
    b1, b2 = forward_bounds(p), forward_bounds(p, other)
    return check_close(f"y at chunk_size {p.chunk_size} vs {other}", y1, y2, b1.y + b2.y,
                       b1.M, p, label="chunk_size invariance y", floor=b1.floor + b2.floor)


def _part(p: Problem, start: int, stop: int, batch=slice(None), initial_states=None) -> Problem:
    """The tokens [start, stop) of rows `batch` of p, as a problem of its own."""
    def cut(a):
        return None if a is None else a[batch, start:stop]
    return p.replace(x=cut(p.x), dt=cut(p.dt), B=cut(p.B), C=cut(p.C), z=cut(p.z),
                     seq_idx=None, initial_states=initial_states)


def split_carries_state(p: Problem, backend: str) -> dict:
    """Two calls split at position k, final_states of the first as initial_states of the
    second, reproduce the single call (y and final_states) within the bounds."""
    k = p.params["split"]
    y, final = forward(p, backend)
    y1, final1 = forward(_part(p, 0, k, initial_states=p.initial_states), backend)
    y2, final2 = forward(_part(p, k, p.dims.seqlen, initial_states=final1), backend)
    d = p.dims
    single = forward_bounds(p)
    # the split run: its second part's chunks start at k (Lambda at most doubled) and it reads
    # a state with fwd_pass_state's own error: + its TF32 roundings
    split = forward_bounds(p, extra_kappa=kappa("fwd_pass_state", d.seqlen, d.chunk_size,
                                                d.dstate), chunk_decay_factor=2.0)
    return merge_metrics(
        check_close(f"y split at {k} vs single call", np.concatenate([y1, y2], axis=1), y,
                    single.y + split.y, single.M, p, label="split y",
                    floor=single.floor + split.floor),
        check_close(f"final_states split at {k} vs single call", final2, final,
                    single.final + split.final, single.final_M, p, label="split final_states",
                    floor=single.floor + split.floor))


def seq_idx_packing(p: Problem, backend: str) -> dict:
    """A packed call with seq_idx equals separate calls on every segment (the first segment
    of a row starting from initial_states, the others from zero), within the bounds."""
    y, final = forward(p, backend)
    y_sep = np.empty_like(y)
    final_sep = np.empty_like(final)
    for b in range(p.dims.batch):
        row = p.seq_idx[b]
        starts = [0] + [int(i) for i in np.flatnonzero(row[1:] != row[:-1]) + 1]
        stops = starts[1:] + [p.dims.seqlen]
        for i, (s0, s1) in enumerate(zip(starts, stops)):
            init = None if (i or p.initial_states is None) else p.initial_states[b:b + 1]
            ys, fs = forward(_part(p, s0, s1, slice(b, b + 1), init), backend)
            y_sep[b:b + 1, s0:s1] = ys
            final_sep[b:b + 1] = fs
    bounds = forward_bounds(p, chunk_decay_factor=2.0)
    return merge_metrics(
        check_close("y packed with seq_idx vs separate calls", y, y_sep, 2 * bounds.y,
                    bounds.M, p, floor=2 * bounds.floor),
        check_close("final_states packed vs last segment's call", final, final_sep,
                    2 * bounds.final, bounds.final_M, p, floor=2 * bounds.floor))


def ragged_equals_padded(p: Problem, backend: str) -> dict:
    """A ragged last chunk gives bit-identically the y of the same run zero-padded to a
    multiple of chunk_size."""
    d = p.dims
    padded_len = -(-d.seqlen // d.chunk_size) * d.chunk_size

    def pad(a, mode="constant"):
        if a is None:
            return None
        width = [(0, 0), (0, padded_len - d.seqlen)] + [(0, 0)] * (a.ndim - 2)
        return np.pad(a, width, mode=mode)

    y, _ = forward(p, backend)
    y_pad, _ = forward(p.replace(x=pad(p.x), dt=pad(p.dt), B=pad(p.B), C=pad(p.C), z=pad(p.z),
                                 seq_idx=pad(p.seq_idx, "edge")), backend)
    check_identical(f"y of seqlen {d.seqlen} vs zero-padded to {padded_len}",
                    y, y_pad[:, :d.seqlen], p)
    return {}


def linearity_in_x(p: Problem, backend: str) -> dict:
    """y(2^k x1 + x2) = 2^k y(x1) + y(x2) within the three bounds (z = None, no initial
    state: y is linear in x)."""
    alpha = 2.0 ** p.params["alpha_log2"]
    rng = np.random.default_rng(p.params["seed"])
    x2 = as_f32(rng.standard_normal(p.x.shape) * (np.abs(p.x).max(initial=0.0) + 1e-30))
    x12 = as_f32(alpha * p.x.astype(np.float64) + x2)
    y1, _ = forward(p, backend)
    y2, _ = forward(p.replace(x=x2), backend)
    y12, _ = forward(p.replace(x=x12), backend)
    b1, b2 = forward_bounds(p), forward_bounds(p.replace(x=x2))
    b12 = forward_bounds(p.replace(x=x12))
    # x12 is alpha x1 + x2 rounded to fp32: y moves by <= u32 M12 for that rounding
    bound = b12.y + alpha * b1.y + b2.y + U_FP32 * b12.M
    combined = alpha * y1.astype(np.float64) + y2
    # the ratio's M: all three runs' magnitudes (x12 may cancel, M12 alone can be tiny)
    M = b12.M + alpha * b1.M + b2.M
    return check_close(f"y(2^{p.params['alpha_log2']} x1 + x2) vs the same of y", y12,
                       combined, bound, M, p, label="linearity y",
                       floor=b12.floor + alpha * b1.floor + b2.floor)


def head_permutation(p: Problem, backend: str) -> dict:
    """Permuting heads within their groups permutes y's heads, bit-identically."""
    perm = np.asarray(p.params["perm"])
    y, final = forward(p, backend)

    def take(a, axis):
        return None if a is None else np.take(a, perm, axis=axis)

    q = p.replace(x=take(p.x, 2), dt=take(p.dt, 2), A=take(p.A, 0), D=take(p.D, 0),
                  z=take(p.z, 2), dt_bias=take(p.dt_bias, 0),
                  initial_states=take(p.initial_states, 1))
    y_perm, final_perm = forward(q, backend)
    check_identical(f"y with heads permuted by {perm.tolist()}", y_perm, take(y, 2), p)
    check_identical("final_states with heads permuted", final_perm, take(final, 1), p)
    return {}


def determinism(p: Problem, backend: str) -> dict:
    """Two runs on the same input are bit-identical (y and final_states)."""
    y, final = forward(p, backend)
    y2, final2 = forward(p, backend)
    check_identical("y of two runs", y2, y, p)
    check_identical("final_states of two runs", final2, final, p)
    return {}


# the start of each bad argument's error, on the device (kernels.errors) and on the host
# (contract.check_vector_values, contract.cu_seqlens_values): what names it
_NAMES = {"A": "A must", "dt_bias": "dt_bias must", "D": "D must", "cu_seqlens": "cu_seqlens must"}


def _named(error: ValueError) -> set[str]:
    """The arguments a bad-value error names."""
    return {name for name, start in _NAMES.items() if start in str(error)}


# the launchers alone that check values, each with the arguments it checks and the names of
# its outputs (bad_values' paths beside ssd_forward's "forward" and "packed")
ALONE_CHECKS = {"chunk_cumsum": (("A", "dt_bias"), ("dt_out", "dA_cumsum")),
                "ssd_scan": (("D",), ("y", "final_states")), "compute_out": (("D",), ("y",))}
# the arguments each path of bad_values checks, and the names of its outputs
PATH_CHECKS = {"forward": (("A", "dt_bias", "D"), ("y", "final_states")),
               "packed": (("A", "dt_bias", "D", "cu_seqlens"), ("y", "varlen_states")),
               **ALONE_CHECKS}


def _alone(path: str, q: Problem, backend: str, check) -> tuple:
    """The outputs of launcher `path` (ALONE_CHECKS) alone on q's arrays, check_values=check;
    the kernels after chunk_cumsum read the float64 references' dt_out, dA_cumsum and chunk
    states rounded to float32 (_exact_upstream), computed from q's A and dt_bias, which
    bad_values keeps good on their paths."""
    if path == "chunk_cumsum":
        return run_on(chunk_cumsum, backend, q.dt, q.A, q.chunk_size, q.dt_bias, q.dt_softplus,
                      q.dt_limit, check_values=check, laid_out_as=q)
    dt_out, dA, states = _exact_upstream(q)
    if path == "ssd_scan":
        return run_on(ssd_scan, backend, q.x, q.B, q.C, dt_out, dA, q.D, q.z, q.initial_states,
                      q.seq_idx, check_values=check, laid_out_as=q)
    return (run_on(compute_out, backend, q.x, q.B, q.C, dt_out, dA, states, q.D, q.z, q.seq_idx,
                   check_values=check, laid_out_as=q),)


def bad_values(p: Problem, backend: str) -> dict:
    """A call with bad values planted (p.params["bad"]: [argument, index, value] each, a head of
    A or dt_bias, a head or a (head, channel) of D, NaN, +-inf, A >= 0; on a packed row also
    ["cu_seqlens", kind, None], offsets not starting at 0, ending past or short of seqlen, or
    decreasing), on p.params["path"]: ssd_forward's "forward" (p as drawn) or "packed" (p's first
    row cut into sequences at p.params["lengths"], each from its own initial state), or a
    launcher alone that checks values (ALONE_CHECKS: chunk_cumsum A and dt_bias, ssd_scan and
    compute_out D), under p.params["check_values"]:
    - False (the GPU's default): every output a bad value feeds is NaN (A, dt_bias: the head's
      y and its final state, or the states of its non-empty sequences, or chunk_cumsum's
      outputs of the head; D: the head's or the channel's y alone; cu_seqlens: all of y and
      every state), every other output is bit for bit the good call's; the pending error names
      each bad argument and no other; a good call after it gives the good call's outputs and no
      error.
    - True, or None on the interpreter (checked on the host): a ValueError at once, naming one
      bad argument and no good one, nothing launched, nothing pending."""
    bad = [(name, index if name == "cu_seqlens" else tuple(index), value)
           for name, index, value in p.params["bad"]]
    check_values = p.params["check_values"]
    path = p.params["path"]
    packed = path == "packed"
    cu = None
    if packed:
        p, cu = _packed_row(p)
    planted, cu_bad = {}, cu
    for name, index, value in bad:
        if name == "cu_seqlens":
            cu_bad = _bad_offsets(cu, index)
        else:
            planted.setdefault(name, np.array(getattr(p, name), copy=True))[index] = value
    q = p.replace(**planted)

    def call(problem, offsets, check):
        if path in ALONE_CHECKS:
            return _alone(path, problem, backend, check)
        options = dict(D=problem.D, z=problem.z, dt_bias=problem.dt_bias,
                       initial_states=problem.initial_states, dt_softplus=problem.dt_softplus,
                       dt_limit=problem.dt_limit, check_values=check, laid_out_as=problem)
        if packed:
            return run_on(ssd_forward, backend, problem.x, problem.dt, problem.A, problem.B,
                          problem.C, problem.chunk_size, cu_seqlens=offsets,
                          return_varlen_states=True, **options)
        return run_on(ssd_forward, backend, problem.x, problem.dt, problem.A, problem.B,
                      problem.C, problem.chunk_size, seq_idx=problem.seq_idx,
                      return_final_states=True, **options)
    good = call(p, cu, None)
    raise_pending_errors()  # the good call reports nothing
    host_checked = check_values or (check_values is None and backend == "interpreter")
    try:
        got = call(q, cu_bad, check_values)
    except ValueError as e:
        named = _named(e)
        if not host_checked or len(named) != 1 or not named <= {n for n, _, _ in bad}:
            raise AssertionError(f"check_values={check_values}: ValueError {e!s:.200} names "
                                 f"{sorted(named)}; bad: {bad}\n  {q.describe()}") from None
        raise_pending_errors()  # nothing launched, nothing pending
        return {}
    try:
        if host_checked:
            raise AssertionError(f"check_values={check_values}: no ValueError for {bad}\n"
                                 f"  {q.describe()}")
        _check_fed(q, bad, got, good, _fed(bad, got, cu, path), PATH_CHECKS[path][1])
    except AssertionError:
        with contextlib.suppress(ValueError):  # the next example must not be blamed for it
            raise_pending_errors()
        raise
    after = call(p, cu, None)
    raise_pending_errors()  # the good call after it is not blamed
    for what, a, b in zip(PATH_CHECKS[path][1], after, good):
        check_identical(f"{what} of a good call after", a, b, p)
    return {}




def _bad_offsets(cu: np.ndarray, kind: str) -> np.ndarray:
    """Offsets `cu` made bad: not starting at 0 ("start"), ending past seqlen ("end_past") or
    one token short of it ("end_short", where the last sequence has a token to lose), or
    decreasing between the first end and the last start (_decreasing: two sequences overlap)."""
    bad = cu.copy()
    if kind == "start":
        bad[0] = 1
    elif kind == "decreasing":
        k = _decreasing(cu)
        bad[k], bad[k + 1] = cu[k + 1], cu[k]
    else:
        bad[-1] += 1 if kind == "end_past" else -1
    return bad


def _decreasing(cu: np.ndarray) -> int | None:
    """The first k with cu[k] < cu[k + 1] where neither k nor k + 1 is the first or the last
    offset's index: swapping the two makes the offsets decrease there (the first and the last
    offsets unchanged), and the sequence before the pair and the one after it then overlap on
    cu[k] .. cu[k + 1]; None where there is no such k."""
    return next((k for k in range(1, len(cu) - 2) if cu[k] < cu[k + 1]), None)


def _fed(bad: list, got: tuple, cu, path: str) -> tuple[np.ndarray, ...]:
    """The elements of each output of `got` that the bad values feed: of chunk_cumsum's a head's
    (A, dt_bias); else a head's y and its final state or the states of its non-empty sequences
    (A, dt_bias), a head's or a channel's y (D), everything (cu_seqlens)."""
    fed = tuple(np.zeros(a.shape, bool) for a in got)
    if path == "chunk_cumsum":  # (batch, nheads, nchunks, chunk_size) each
        for _, index, _ in bad:
            for where in fed:
                where[:, index[0]] = True
        return fed
    fed_y, fed_states = fed[0], fed[1] if len(fed) > 1 else None
    sequences = slice(None) if cu is None else np.diff(cu) > 0  # a batch row, or a sequence
    for name, index, _ in bad:
        if name == "cu_seqlens":
            fed_y[...] = fed_states[...] = True
        elif name == "D":  # D feeds y alone: the head's, or the channel's
            fed_y[(slice(None), slice(None)) + index] = True
        else:
            fed_y[:, :, index[0]] = True
            fed_states[sequences, index[0]] = True
    return fed


def _check_fed(q: Problem, bad: list, got: tuple, good: tuple, fed: tuple, names: tuple):
    """bad_values' checks of a call that ran with bad values (q): NaN where they feed, the good
    call's bits elsewhere (outputs `names`), the pending error naming each bad argument."""
    for what, a, b, where in zip(names, got, good, fed, strict=True):
        if not np.isnan(a[where]).all():
            w = tuple(int(i) for i in np.argwhere(where & ~np.isnan(a))[0])
            raise AssertionError(f"bad {bad}: {what}{list(w)}, which a bad value feeds, is "
                                 f"{a[w]!r}, not NaN\n  {q.describe()}")
        check_identical(f"{what} a bad value does not feed", np.where(where, b, a), b, q)
    try:
        raise_pending_errors()
    except ValueError as e:
        named = _named(e)
        if named != {n for n, _, _ in bad}:
            raise AssertionError(f"the error names {sorted(named)} for bad {bad}: "
                                 f"{e!s:.300}\n  {q.describe()}") from None
    else:
        raise AssertionError(f"no error pending after bad {bad}\n  {q.describe()}")


# --------------------------------------------------------------------------------------------
# Strategies with each property's own parameters, and the registry


def _with(strategy, **params):
    """Problems from `strategy`, with params drawn by the callables in `params` (each takes
    the problem and returns a strategy)."""
    @st.composite
    def draw_case(draw):
        p = draw(strategy)
        return p.replace(params={k: draw(f(p)) for k, f in params.items()})
    return draw_case()


# bad values by argument: A >= 0 is refused as a non-finite value is
_BAD = {"A": (math.nan, math.inf, -math.inf, 0.0, 0.5),
        "dt_bias": (math.nan, math.inf, -math.inf), "D": (math.nan, math.inf, -math.inf)}


def _lengths(p: Problem):
    """Sequence lengths of a packed row of p (packed_offsets): the edges of a chunk and any."""
    return st.lists(st.one_of(
        st.sampled_from((0, 1, p.chunk_size - 1, p.chunk_size, p.chunk_size + 1,
                         2 * p.chunk_size + 3)),
        st.integers(0, p.dims.seqlen)), min_size=1, max_size=8)


@st.composite
def _bad_value_problems(draw, strategy):
    """Problems of `strategy` with bad_values' parameters, JSON-able: the path (one whose
    checked arguments the problem has: PATH_CHECKS), check_values, a packed row's lengths and
    seed, and one bad value or several, [argument, index, value] each, among the problem's A,
    dt_bias and D that the path checks (a head; of a D per channel, a (head, channel)) and, on
    a packed row, its offsets (["cu_seqlens", kind, None])."""
    p = draw(strategy)
    paths = [path for path, (names, _) in PATH_CHECKS.items()
             if any(n == "cu_seqlens" or getattr(p, n) is not None for n in names)]
    params = {"path": draw(st.sampled_from(paths)),
              "check_values": draw(st.sampled_from((False, None, True)))}
    offsets = []
    if params["path"] == "packed":
        params.update(lengths=draw(_lengths(p)), seed=draw(_seeds(p)))
        cu = packed_offsets(p.dims.seqlen, params["lengths"])
        offsets = ((["end_short"] if cu[-2] < cu[-1] else [])
                   + (["decreasing"] if _decreasing(cu) is not None else [])
                   + ["start", "end_past"])
    checked = PATH_CHECKS[params["path"]][0]
    present = [n for n in _BAD if n in checked and getattr(p, n) is not None] + (
        ["cu_seqlens"] if offsets else [])

    def one(name):
        if name == "cu_seqlens":
            return [name, draw(st.sampled_from(offsets)), None]
        # each axis: its first, its last or any entry (the last head's or channel's block)
        index = [draw(st.one_of(st.just(0), st.just(n - 1), st.integers(0, n - 1)))
                 for n in getattr(p, name).shape]
        return [name, index, draw(st.sampled_from(_BAD[name]))]
    # each argument bad or not (one at least), so that every one is often bad, alone or with
    # others
    chosen = [n for n in present if draw(st.booleans())] or [draw(st.sampled_from(present))]
    return p.replace(params=dict(params, bad=[one(name) for name in chosen]))


def bad_value_examples() -> list[Problem]:
    """bad_values' explicit examples, run before its drawn ones: a per-channel D bad in its
    last channel past chunk_cumsum's first 64-channel block; packed offsets ending one token
    short of seqlen, starting past 0 (with a zero A; and alone, where the first sequence has
    tokens, so that no decrease gives it away), decreasing (two sequences overlap), and of 300
    sequences ending short, past chunk_cumsum's first block of offsets (BLOCK_CU), each on the
    device's checks; and a bad dt_bias alone through chunk_cumsum alone, checked on the host."""
    wide = _per_channel_D(problem(spec_of(Dims(1, 40, 2, 80, 1, 8, 16), {})))
    packed = problem(spec_of(Dims(1, 70, 4, 8, 1, 8, 16), dict(D="head", dt_bias=True)))
    row = dict(path="packed", check_values=False, lengths=[0, 20, 5], seed=1)
    return [wide.replace(params=dict(path="forward", check_values=False,
                                     bad=[["D", [1, 79], math.inf]])),
            packed.replace(params=dict(row, bad=[["cu_seqlens", "end_short", None]])),
            packed.replace(params=dict(row, bad=[["cu_seqlens", "start", None],
                                                 ["A", [0], 0.0]])),
            packed.replace(params=dict(row, lengths=[30, 20],
                                       bad=[["cu_seqlens", "decreasing", None]])),
            packed.replace(params=dict(row, lengths=[20, 5],
                                       bad=[["cu_seqlens", "start", None]])),
            problem(spec_of(Dims(1, 300, 1, 8, 1, 8, 16), {})).replace(params=dict(
                row, lengths=[1] * 299, bad=[["cu_seqlens", "end_short", None]])),
            packed.replace(params=dict(path="chunk_cumsum", check_values=True,
                                       bad=[["dt_bias", [3], math.nan]]))]


def _per_channel_D(p: Problem) -> Problem:
    """p with a D per channel, (nheads, headdim), of its own values."""
    rng = np.random.default_rng(p.dims.nheads * 1000 + p.dims.headdim)
    return p.replace(D=rng.standard_normal((p.dims.nheads, p.dims.headdim)).astype(np.float32))


# the launcher's own hint and token block first: Hypothesis draws a sampled_from's first element
# most often (the ci examples: 83 of 100 against 17), and the rules launch every kernel at them
_OCCUPANCIES = (RULES_OCCUPANCY, *(o for o in OCCUPANCIES if o != RULES_OCCUPANCY))
_BLOCK_TS = (RULES_BLOCK_T, *(t for t in BLOCK_TS if t != RULES_BLOCK_T))


def _seeds(p):
    return st.integers(0, 2**32 - 1)


def _perms(p):
    d = p.dims
    per_group = d.nheads // d.ngroups
    return st.lists(st.permutations(range(per_group)), min_size=d.ngroups,
                    max_size=d.ngroups).map(
        lambda perms: [g * per_group + i for g, perm in enumerate(perms) for i in perm])


@dataclass(frozen=True)
class Property:
    name: str
    check: Callable[[Problem, str], dict]
    strategy: Callable[[], st.SearchStrategy]  # built when asked: the caps of the profile then


PROPERTIES = {prop.name: prop for prop in [
    # a third of the examples wide (short, past the kernels' largest tiles)
    Property("forward_tf32_bound", forward_tf32_bound,
             lambda: st.one_of(problems(), problems(), problems(wide=True))),
    Property("extreme_decays_finite_and_bounded", forward_tf32_bound,
             lambda: problems(extreme=True)),
    Property("forward_fp16_bound", forward_fp16_bound, lambda: problems()),
    Property("forward_bf16_bound", forward_bf16_bound, lambda: problems()),
    Property("chunk_cumsum_alone", chunk_cumsum_alone,
             lambda: st.one_of(problems(), problems(wide=True))),
    # a third of the examples where the carried state matters as much as each chunk's increment,
    # a third wide
    Property("fwd_pass_state_alone", fwd_pass_state_alone,
             lambda: st.one_of(problems(), problems(carried=True), problems(wide=True))),
    # a quarter of the examples with several heads per group (two per program where their count
    # is even), in either layout, with decays over a chunk that leave what a token block carries
    # to the next of the order of the next block's own term (carried=True), so an error in that
    # carry shows above the bound; three quarters without seq_idx (the program per chunk runs
    # without it only), a quarter of them wide
    # on the GPU one bucket per branch (properties.profiles.buckets): each example compiles
    # several kernels (every choice at its drawn hint and token block); the profile's buckets
    # for shared heads (its one bucket has a single group: the second brings groups of heads)
    Property("compute_out_alone", compute_out_alone, lambda: _with(
        st.one_of(*(problems(**kw, buckets=min(n, buckets())) for kw, n in (
            ({}, 1), (dict(segments=False), 1), (dict(segments=False, wide=True), 1),
            (dict(shared_heads=True, segments=False, carried=True), 2)))),
        occupancy=lambda p: st.sampled_from(_OCCUPANCIES),
        block_t=lambda p: st.sampled_from(_BLOCK_TS))),
    # a quarter of the examples wide; at a drawn occupancy hint (each example compiles the
    # choices at that hint, and the rules' choice in bfloat16)
    Property("ssd_scan_alone", ssd_scan_alone, lambda: _with(
        st.one_of(problems(), problems(carried=True), problems(segments=False),
                  problems(wide=True)),
        occupancy=lambda p: st.sampled_from(SCAN_OCCUPANCIES),
        warps=lambda p: st.sampled_from(SCAN_WORKER_WARPS))),
    Property("causal_prefix", causal_prefix, lambda: _with(
        problems(min_seqlen=2), t=lambda p: st.integers(0, p.dims.seqlen - 2),
        large=lambda p: st.booleans(), seed=_seeds)),
    # lengths around the chunk (0, 1, chunk - 1, chunk, chunk + 1), several chunks, any
    Property("varlen_packed", varlen_packed, lambda: _with(
        problems(initial_states=False, segments=False), lengths=_lengths, seed=_seeds)),
    Property("cumsum_non_increasing", cumsum_non_increasing,
             lambda: st.one_of(problems(), problems(extreme=True))),
    Property("chunk_size_invariance", chunk_size_invariance, lambda: _with(
        problems(), other_chunk_size=lambda p: st.sampled_from(
            [c for c in caps().chunk_sizes if c != p.chunk_size]))),
    Property("split_carries_state", split_carries_state, lambda: _with(
        problems(segments=False, min_seqlen=2),
        split=lambda p: st.integers(1, p.dims.seqlen - 1))),
    Property("seq_idx_packing", seq_idx_packing, lambda: problems(segments=True, min_seqlen=2)),
    Property("ragged_equals_padded", ragged_equals_padded, lambda: problems(ragged=True)),
    Property("linearity_in_x", linearity_in_x, lambda: _with(
        problems(gate=False, initial_states=False),
        alpha_log2=lambda p: st.integers(-4, 4), seed=_seeds)),
    Property("head_permutation", head_permutation, lambda: _with(problems(), perm=_perms)),
    Property("determinism", determinism, lambda: problems()),
    # a third of the examples wide with a per-channel D (past chunk_cumsum's 64-channel check
    # block where headdim is)
    Property("bad_values", bad_values, lambda: _bad_value_problems(
        st.one_of(problems(), problems(), problems(wide=True).map(_per_channel_D)))),
]}


def run(name: str, p: Problem, backend: str) -> dict:
    """Check property `name` on `p`; AssertionError if it does not hold; its metrics."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return PROPERTIES[name].check(p, backend)
