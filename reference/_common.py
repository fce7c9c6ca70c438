"""Steps every stage shares: float64 upcast, the step size, group -> head, segments, skip and gate.

Written once so that the forms and the per-kernel references differ only in the part of the
math they are meant to check independently (the recurrence, the jump formula, the quadratic form).
"""

from __future__ import annotations

import math

import numpy as np

LOG2E = 1.0 / math.log(2.0)  # natural-log units -> log2 units (dA_cumsum = a * log2(e))

# softplus(v) = log(1 + e^v) for v <= 20 and v itself above (as mamba_ssm): the two differ by
# log1p(e^-v) / v < 1e-10 relative there, and e^v is never formed for large v.
SOFTPLUS_THRESHOLD = 20.0


def f64(a):
    """`a` as a float64 NumPy array (any float dtype is upcast); None stays None."""
    return None if a is None else np.asarray(a, dtype=np.float64)


def softplus(v: np.ndarray) -> np.ndarray:
    # clamp before exp: e^v is only computed where it is used (v <= 20), so it never overflows
    return np.where(v > SOFTPLUS_THRESHOLD, v,
                    np.log1p(np.exp(np.minimum(v, SOFTPLUS_THRESHOLD))))


def process_dt(dt, dt_bias, dt_softplus: bool, dt_limit: tuple[float, float]) -> np.ndarray:
    """The step size: dt <- clamp(softplus?(dt + dt_bias), dt_limit), float64, shaped like dt.

    The clamp is always applied (the default (0, inf) turns a negative step into 0), so every
    processed dt is >= 0 and every decay dt * A is <= 0.
    """
    dt = f64(dt)
    if dt_bias is not None:
        dt = dt + f64(dt_bias)
    if dt_softplus:
        dt = softplus(dt)
    lo, hi = dt_limit
    return np.clip(dt, lo, hi)


def group_to_head(BC: np.ndarray, nheads: int) -> np.ndarray:
    """(batch, seqlen, ngroups, dstate) -> (batch, seqlen, nheads, dstate): head h reads group
    h // (nheads // ngroups)."""
    return np.repeat(f64(BC), nheads // BC.shape[2], axis=2)


def segments(seq_idx, batch: int, seqlen: int) -> np.ndarray:
    """Segment id of every token, (batch, seqlen): the count of changes of seq_idx up to t.

    The state resets exactly where seq_idx[t] != seq_idx[t-1], whatever the values (a sequence
    id that comes back later starts a new segment). Token 0 is in segment 0, the segment the
    initial state belongs to. Without seq_idx every token is in segment 0.
    """
    if seq_idx is None:
        return np.zeros((batch, seqlen), dtype=np.int64)
    seq_idx = np.asarray(seq_idx)
    changes = (seq_idx[:, 1:] != seq_idx[:, :-1]).astype(np.int64)
    first = np.zeros((batch, 1), dtype=np.int64)
    return np.concatenate([first, np.cumsum(changes, axis=1)], axis=1)


def to_chunks(a: np.ndarray, chunk_size: int, edge: bool = False) -> np.ndarray:
    """(batch, seqlen, ...) -> (batch, nchunks, chunk_size, ...), padding a short last chunk.

    Padding is 0 (x, B, C: the padded tokens have dt_out = 0 and contribute nothing), or with
    `edge` the last real value (segment ids: the padding stays in the last token's segment).
    """
    batch, seqlen = a.shape[:2]
    nchunks = -(-seqlen // chunk_size)
    pad = [(0, 0), (0, nchunks * chunk_size - seqlen)] + [(0, 0)] * (a.ndim - 2)
    a = np.pad(a, pad, mode="edge" if edge else "constant")
    return a.reshape((batch, nchunks, chunk_size) + a.shape[2:])


def sigmoid(v: np.ndarray) -> np.ndarray:
    # e^-|v| never overflows; both branches are the exact sigmoid
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def gate(z) -> np.ndarray:
    """The z gate's factor z * sigmoid(z), float64."""
    z = f64(z)
    return z * sigmoid(z)


def skip_and_gate(y: np.ndarray, x: np.ndarray, D, z) -> np.ndarray:
    """y + D * x (D of shape (nheads,) or (nheads, headdim)), then y * z * sigmoid(z)."""
    if D is not None:
        nheads, headdim = x.shape[2:]
        y = y + np.broadcast_to(f64(D).reshape(nheads, -1), (nheads, headdim)) * x
    if z is not None:
        y = y * gate(z)
    return y


def abs_or_none(a):
    """|a| in float64, for the magnitude bound M; None stays None."""
    return None if a is None else np.abs(f64(a))
