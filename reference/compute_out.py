"""Reference of the compute_out stage: the output of every chunk from the state entering it."""

from __future__ import annotations

import numpy as np

from contract import check_compute_out_args
from reference._common import (abs_or_none, f64, gate, group_to_head, segments, skip_and_gate,
                               to_chunks)


def compute_out_ref(x, B, C, dt_out, dA_cumsum, chunk_states, D=None, z=None, seq_idx=None):
    """y, (batch, seqlen, nheads, headdim), float64.

    For token t of chunk c, with a = dA_cumsum of the chunk (log2 units) and S_c = chunk_states[c]:
    1. segments: seg[t] counts the changes of seq_idx up to t; S_c belongs to seg_before[c] =
       seg[c * chunk_size - 1] (chunk 0: segment 0, the initial state's)
    2. carried-state term 2^(a_t) * (C_t . S_c^T), only where seg[t] == seg_before[c]
    3. causal decay matrix L[t, s] = 2^(a_t - a_s) for s <= t in the same segment, else 0
       (exponent clamped to <= 0 and the mask a select: 2^positive is never formed)
    4. intra-chunk term sum_s (C_t . B_s) * L[t, s] * dt_s * x_s
    5. y = carried + intra + D * x, then the gate y * z * sigmoid(z)
    Positions past seqlen in a short last chunk are computed on zero padding and dropped.
    """
    dims = check_compute_out_args(x, B, C, dt_out, dA_cumsum, chunk_states, D=D, z=z,
                                  seq_idx=seq_idx)
    batch, seqlen, nheads, cs = dims.batch, dims.seqlen, dims.nheads, dims.chunk_size
    x = f64(x)
    dt_out, a = f64(dt_out), f64(dA_cumsum)  # (batch, nheads, nchunks, chunk_size)
    xc = to_chunks(x, cs)  # (batch, nchunks, chunk_size, nheads, headdim)
    Bc = to_chunks(group_to_head(B, nheads), cs)  # (batch, nchunks, chunk_size, nheads, dstate)
    Cc = to_chunks(group_to_head(C, nheads), cs)

    # 1. segments, (batch, nchunks, chunk_size), padded with the last real token's segment
    seg = to_chunks(segments(seq_idx, batch, seqlen), cs, edge=True)
    seg_before = np.concatenate([np.zeros((batch, 1), dtype=seg.dtype), seg[:, :-1, -1]], axis=1)

    # 2. carried-state term, (batch, nchunks, chunk_size, nheads, headdim)
    carried_in = (seg == seg_before[:, :, None])[:, None]  # (batch, 1, nchunks, chunk_size)
    decay_in = np.where(carried_in, np.exp2(np.minimum(a, 0.0)), 0.0)  # (b, h, c, t)
    y = np.einsum("bcthn,bchpn,bhct->bcthp", Cc, f64(chunk_states), decay_in, optimize=True)

    # 3. causal decay matrix, (batch, nheads, nchunks, t, s)
    causal = np.tril(np.ones((cs, cs), dtype=bool))
    same = seg[:, :, :, None] == seg[:, :, None, :]  # (batch, nchunks, t, s)
    mask = (causal & same)[:, None]
    L = np.where(mask, np.exp2(np.minimum(a[..., :, None] - a[..., None, :], 0.0)), 0.0)

    # 4. intra-chunk term: (C B^T o L) (dt x)
    CB = np.einsum("bcthn,bcshn->bhcts", Cc, Bc, optimize=True)
    y += np.einsum("bhcts,bhcs,bcshp->bcthp", CB * L, dt_out, xc, optimize=True)

    # 5. back to (batch, seqlen, nheads, headdim), skip connection and gate
    y = y.reshape(batch, -1, nheads, dims.headdim)[:, :seqlen]
    return skip_and_gate(y, x, D, z)


def compute_out_magnitude(x, B, C, dt_out, dA_cumsum, chunk_states, D=None, z=None, seq_idx=None):
    """M, shaped like y: compute_out_ref on |x|, |B|, |C|, |chunk_states|, |D| (dt_out and decays
    unchanged), times |z * sigmoid(z)| when z is given."""
    check_compute_out_args(x, B, C, dt_out, dA_cumsum, chunk_states, D=D, z=z, seq_idx=seq_idx)
    M = compute_out_ref(abs_or_none(x), abs_or_none(B), abs_or_none(C), dt_out, dA_cumsum,
                        abs_or_none(chunk_states), abs_or_none(D), None, seq_idx)
    return M if z is None else M * np.abs(gate(z))
