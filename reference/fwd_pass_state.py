"""Reference of the fwd_pass_state stage: the state entering every chunk, by the jump formula."""

from __future__ import annotations

import numpy as np

from contract import check_fwd_pass_state_args
from reference._common import abs_or_none, f64, group_to_head, segments, to_chunks


def fwd_pass_state_ref(x, B, dt_out, dA_cumsum, initial_states=None, seq_idx=None):
    """(chunk_states, final_states): the state entering each chunk, (batch, nchunks, nheads,
    headdim, dstate) (chunk 0: initial_states or 0), and the state after the last token.

    With a = dA_cumsum of chunk c (log2 units) and `last` its last position:
    1. segments: seg[t] counts the changes of seq_idx up to t; the state carried into chunk c
       belongs to seg_before[c] = seg[c * chunk_size - 1] (chunk 0: segment 0, the initial
       state's); chunk c hands on the state of seg_last[c], its last real token's segment
    2. weights w_s = dt_s * 2^(a_last - a_s), kept only where seg[s] == seg_last[c]
    3. increments X_c = sum_s w_s * x_s (outer) B_s   (one matrix product per chunk)
    4. carry_c = 2^(a_last) where seg_before[c] == seg_last[c], else 0 (a reset in the chunk)
    5. S_0 = initial_states; S_{c+1} = carry_c * S_c + X_c; final_states = S_nchunks
    The padding of a short last chunk (dt_out = 0, a flat) contributes nothing.
    """
    dims = check_fwd_pass_state_args(x, B, dt_out, dA_cumsum, initial_states=initial_states,
                                     seq_idx=seq_idx)
    batch, nheads, headdim, dstate = dims.batch, dims.nheads, dims.headdim, dims.dstate
    cs, nchunks = dims.chunk_size, dims.nchunks
    dt_out, a = f64(dt_out), f64(dA_cumsum)  # (batch, nheads, nchunks, chunk_size)
    xc = to_chunks(f64(x), cs)  # (batch, nchunks, chunk_size, nheads, headdim)
    Bc = to_chunks(group_to_head(B, nheads), cs)  # (batch, nchunks, chunk_size, nheads, dstate)

    # 1. segments, (batch, nchunks, chunk_size) padded with the last real token's segment
    seg = to_chunks(segments(seq_idx, batch, dims.seqlen), cs, edge=True)
    seg_last = seg[:, :, -1]  # (batch, nchunks)
    seg_before = np.concatenate([np.zeros((batch, 1), dtype=seg.dtype), seg[:, :-1, -1]], axis=1)

    # 2. weights, (batch, nheads, nchunks, chunk_size); the exponent is <= 0 (a non-increasing),
    #    clamped so that rounding in a given dA_cumsum cannot make it positive
    a_last = a[..., -1:]
    same = (seg == seg_last[:, :, None])[:, None]  # (batch, 1, nchunks, chunk_size)
    w = np.where(same, dt_out * np.exp2(np.minimum(a_last - a, 0.0)), 0.0)

    # 3. increments, (batch, nchunks, nheads, headdim, dstate)
    X = np.einsum("bhcs,bcshp,bcshn->bchpn", w, xc, Bc, optimize=True)

    # 4. carry factor, (batch, nchunks, nheads)
    keep = (seg_before == seg_last)[:, :, None]
    carry = np.where(keep, np.exp2(np.minimum(a_last[..., 0], 0.0)).transpose(0, 2, 1), 0.0)

    # 5. sequential loop over chunks
    chunk_states = np.empty((batch, nchunks, nheads, headdim, dstate))
    state = (np.zeros((batch, nheads, headdim, dstate)) if initial_states is None
             else f64(initial_states))
    for c in range(nchunks):
        chunk_states[:, c] = state
        state = carry[:, c, :, None, None] * state + X[:, c]
    return chunk_states, state


def fwd_pass_state_magnitude(x, B, dt_out, dA_cumsum, initial_states=None, seq_idx=None):
    """(chunk_states_M, final_states_M): fwd_pass_state_ref on |x|, |B|, |initial_states|
    (dt_out and decays unchanged: already non-negative factors)."""
    check_fwd_pass_state_args(x, B, dt_out, dA_cumsum, initial_states=initial_states,
                              seq_idx=seq_idx)
    return fwd_pass_state_ref(abs_or_none(x), abs_or_none(B), dt_out, dA_cumsum,
                              abs_or_none(initial_states), seq_idx)
