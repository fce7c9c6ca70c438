"""Comparing a result with its float64 reference: the forward's bounds for a problem
(forward_bounds, from properties.bounds), the comparison that names the worst element
(check_close), bit-identity (check_identical), and the metrics the properties return."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

import reference as R
from properties.bounds import (DECAY_ETA, U_TF32, decay_term, float16_floor, ftz_floor, kappa,
                               tf32_bound)
from properties.strategies import Problem

# --------------------------------------------------------------------------------------------
# Expected values and bounds


def max_abs(*arrays) -> list[float]:
    return [0.0 if a is None else float(np.max(np.abs(a), initial=0.0)) for a in arrays]


def floor_of(p: Problem, dt_out, *states) -> float:
    """The flush-to-zero allowance: every factor's largest magnitude (states: the largest of
    the given state arrays or magnitudes)."""
    d = p.dims
    return ftz_floor(d.seqlen, d.dstate, *max_abs(p.x, p.B, p.C, dt_out, p.D, p.z),
                     max(max_abs(*states), default=0.0))


def float16_floor_of(p: Problem, dt_out, *states) -> tuple[float, float]:
    """float16_floor of p (its float16 operands' subnormals: y's, the final states') at p's
    sizes and largest magnitudes (states: the largest of the given state arrays or
    magnitudes)."""
    d = p.dims
    x, B, C, dt, z = max_abs(p.x, p.B, p.C, dt_out, p.z)
    return float16_floor(d.seqlen, p.chunk_size, d.dstate, x, B, C, dt,
                         max(max_abs(*states), default=0.0), z)


@dataclass
class ForwardBounds:
    """Per-element bounds on |y - y_ref| and |final_states - ref|: kappa u M + extra, where extra
    is the fp32-cumsum decay term plus the flush-to-zero floor."""

    M: np.ndarray
    final_M: np.ndarray
    kappa_y: float
    kappa_final: float
    extra_y: np.ndarray
    extra_final: np.ndarray
    floor: float  # y's flush-to-zero (and float16 operands') allowance, inside extra_y
    floor_final: float  # the final states', inside extra_final

    @property
    def y(self) -> np.ndarray:
        return tf32_bound(self.M, self.kappa_y) + self.extra_y

    @property
    def final(self) -> np.ndarray:
        return tf32_bound(self.final_M, self.kappa_final) + self.extra_final


# The chunk states' dtype docs/api.md promises where state_dtype is None, by the activations'
# dtype: the harness's own statement, never the forward's default (kernels.call.STATE_DTYPES),
# so that a wrong default cannot loosen the bound it is checked by; test_plan checks the plans
# keep it.
DEFAULT_STATE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}


def expected_state_dtype(activations: str, state_dtype: str | None) -> str:
    """The chunk states' dtype of a call with `activations` (x's dtype name) and `state_dtype`."""
    return DEFAULT_STATE_DTYPES[activations] if state_dtype is None else state_dtype


def forward_bounds(p: Problem, chunk_size: int | None = None, *, extra_kappa: float = 0.0,
                   chunk_decay_factor: float = 1.0, operands: str = "tfloat32",
                   stored_states: bool | None = None) -> ForwardBounds:
    """Bounds of ssd_forward on `p` at `chunk_size` (default p's), from bounds.py.

    `extra_kappa` adds TF32 roundings on the way (a state handed from one call to the next);
    `chunk_decay_factor` scales Lambda, the largest in-chunk decay, for runs whose chunks start
    elsewhere than p's (a chunk of another run overlaps at most 2 of p's chunks: factor 2);
    `operands`: the products' operand format, the inputs' dtype for 16-bit inputs
    (bounds.kappa); `stored_states`: the chunk states stored in bfloat16 (bounds.kappa), None:
    as docs/api.md says ssd_forward stores them by default (DEFAULT_STATE_DTYPES).
    """
    cs = chunk_size or p.chunk_size
    d = p.dims
    opts = p.options()
    if stored_states is None:
        stored_states = (operands != "tfloat32"
                         and expected_state_dtype(operands, None) != "float32")
    A_weaker = np.asarray(p.A, np.float64) * (1.0 - DECAY_ETA)
    M = R.ssd_magnitude(p.x, p.dt, p.A, p.B, p.C, cs, **opts)
    M_w = R.ssd_magnitude(p.x, p.dt, A_weaker, p.B, p.C, cs, **opts)
    cumsum_args = (cs, p.dt_bias, p.dt_softplus, p.dt_limit)
    dt_out, dA = R.chunk_cumsum_ref(p.dt, p.A, *cumsum_args)
    _, dA_w = R.chunk_cumsum_ref(p.dt, A_weaker, *cumsum_args)
    lam = chunk_decay_factor * float(np.max(np.abs(dA)))
    states_M, final_M = R.fwd_pass_state_magnitude(p.x, p.B, dt_out, dA, p.initial_states,
                                                   p.seq_idx)
    final_M_w = R.fwd_pass_state_magnitude(p.x, p.B, dt_out, dA_w, p.initial_states,
                                           p.seq_idx)[1]
    floor = floor_of(p, dt_out, states_M, final_M)
    floor_y, floor_final = floor, floor
    if operands == "float16":
        float16_y, float16_final = float16_floor_of(p, dt_out, states_M, final_M)
        floor_y, floor_final = floor + float16_y, floor + float16_final
    k_y = kappa("forward", d.seqlen, cs, d.dstate, operands, stored_states) + extra_kappa
    k_s = kappa("fwd_pass_state", d.seqlen, cs, d.dstate, operands, stored_states) + extra_kappa
    return ForwardBounds(M=M, final_M=final_M, kappa_y=k_y, kappa_final=k_s,
                         extra_y=decay_term(M, M_w, cs, lam) + floor_y,
                         extra_final=decay_term(final_M, final_M_w, cs, lam) + floor_final,
                         floor=floor_y, floor_final=floor_final)


def check_close(what: str, got, ref, bound, M, p: Problem, *, label: str | None = None,
                floor: float = 0.0, unit: tuple[str, float] = ("u", U_TF32)) -> dict:
    """Assert every element of `got` is finite and within `bound` of `ref`; return the observed
    max err/(u*M) (of the error beyond the flush-to-zero allowance `floor`; `unit` names u) and
    max err/bound, keyed by `label` (default `what`: a stable name for hypothesis.target)."""
    got = np.asarray(got, np.float64)
    ref = np.asarray(ref, np.float64)
    bad = ~np.isfinite(got)
    if bad.any():
        idx = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} non-finite outputs, first at {idx} "
                             f"({got[idx]}; reference {ref[idx]:.6g})\n  {p.describe()}")
    err = np.abs(got - ref)
    bound = np.broadcast_to(bound, err.shape)
    use = err / np.where(bound > 0, bound, np.inf)
    use[(err > 0) & (bound <= 0)] = np.inf
    worst = np.unravel_index(int(np.argmax(use)), use.shape) if use.size else ()
    over = err > bound
    M = np.broadcast_to(M, err.shape)
    beyond = np.maximum(err - floor, 0.0)
    ratio = float(np.max(np.where(M > 0, beyond / np.where(M > 0, M, 1.0), 0.0),
                         initial=0.0)) / unit[1]
    if over.any():
        w = tuple(int(i) for i in worst)
        raise AssertionError(
            f"{what}: {int(over.sum())} of {err.size} elements outside the bound; worst at {w}: "
            f"got {got[w]:.9g}, reference {ref[w]:.9g}, |err| {err[w]:.3g} > bound {bound[w]:.3g} "
            f"(err/({unit[0]}*M) = {err[w] / (unit[1] * M[w]) if M[w] > 0 else math.inf:.3g}, "
            f"max over elements {ratio:.3g})\n  {p.describe()}")
    label = label or what
    return {f"{label} err/({unit[0]}*M)": ratio,
            f"{label} err/bound": float(np.max(use, initial=0.0))}


def check_identical(what: str, got, expected, p: Problem):
    """Assert bit-identical arrays (same shape, same bits, no NaN)."""
    got, expected = np.asarray(got), np.asarray(expected)
    if got.shape != expected.shape:
        raise AssertionError(f"{what}: shapes differ, {got.shape} vs {expected.shape}\n"
                             f"  {p.describe()}")
    for name, a in (("got", got), ("expected", expected)):
        if a.dtype.kind == "f" and np.isnan(a).any():  # NaN-filled, never written: equal bits
            w = tuple(int(i) for i in np.argwhere(np.isnan(a))[0])
            raise AssertionError(f"{what}: {int(np.isnan(a).sum())} NaN elements in {name}, "
                                 f"first at {w}\n  {p.describe()}")
    same = (got.view(np.uint32) == expected.view(np.uint32)) if got.dtype == np.float32 \
        else got == expected
    if not same.all():
        w = tuple(int(i) for i in np.argwhere(~same)[0])
        raise AssertionError(f"{what}: {int((~same).sum())} of {same.size} elements differ; "
                             f"first at {w}: {got[w]!r} vs {expected[w]!r}\n  {p.describe()}")


def as_f32(a):
    return None if a is None else np.asarray(a, np.float32)


def merge_metrics(*metrics: dict) -> dict:
    out = {}
    for m in metrics:
        out.update(m)
    return out
