"""Packed variable-length rows (cu_seqlens): the whole forward of one row holding several
sequences, as separate calls, one per sequence, of any of the three forms."""

from __future__ import annotations

import math

import numpy as np

from contract import check_cu_seqlens, check_forward_args, cu_seqlens_values
from reference._common import f64, group_to_head, process_dt


def ssd_varlen_ref(x, dt, A, B, C, cu_seqlens, *, form: str = "recurrent", chunk_size=None,
                   D=None, z=None, dt_bias=None, initial_states=None, dt_softplus=False,
                   dt_limit=(0.0, math.inf)):
    """(y, varlen_states) of a packed row (batch 1): sequence k, tokens cu_seqlens[k] to
    cu_seqlens[k+1] - 1, as its own call of `form` ('recurrent', 'chunked' with `chunk_size`,
    or 'quadratic'), from initial_states[k] (num_seqs, nheads, headdim, dstate) or zeros.

    y is the sequences' outputs in order; varlen_states (num_seqs, nheads, headdim, dstate) each
    sequence's state after its last token: its initial state (or zeros) for an empty one.
    """
    from reference.ssd import ssd_chunked, ssd_quadratic, ssd_recurrent
    if form not in ("recurrent", "chunked", "quadratic"):
        raise ValueError(f"form must be 'recurrent', 'chunked' or 'quadratic', got {form!r}")
    if form == "chunked" and chunk_size is None:
        raise ValueError("chunk_size: the chunked form needs one")
    dims = check_forward_args(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                              dt_limit=dt_limit)
    num_seqs = check_cu_seqlens(cu_seqlens, dims, initial_states)
    offsets = cu_seqlens_values(cu_seqlens, dims.seqlen)
    states = (np.zeros((num_seqs, dims.nheads, dims.headdim, dims.dstate))
              if initial_states is None else f64(initial_states).copy())
    y = np.empty(f64(x).shape)
    options = dict(dt_bias=dt_bias, dt_softplus=dt_softplus, dt_limit=dt_limit)
    for k in range(num_seqs):
        lo, hi = offsets[k], offsets[k + 1]
        if lo == hi:
            continue
        part = lambda a, lo=lo, hi=hi: None if a is None else a[:, lo:hi]
        h0 = states[k:k + 1] if initial_states is not None else None
        args = (part(x), part(dt), A, part(B), part(C))
        kw = dict(D=D, z=part(z), initial_states=h0, **options)
        if form == "recurrent":
            y[:, lo:hi], final = ssd_recurrent(*args, **kw)
        elif form == "chunked":
            y[:, lo:hi], final = ssd_chunked(*args, chunk_size, **kw)
        else:
            y[:, lo:hi] = ssd_quadratic(*args, **kw)
            final = quadratic_final_state(*args, **kw)
        states[k] = final[0]
    return y, states


def quadratic_final_state(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial_states=None,
                          dt_softplus=False, dt_limit=(0.0, math.inf)):
    """The state after the last token in the quadratic form's terms (no seq_idx): H_T =
    sum_s exp(sum_{s < r <= T} dA_r) dt_s x_s (outer) B_s + exp(sum_r dA_r) initial_states,
    each decay a direct sum of non-positive terms (as ssd_quadratic's segment sums)."""
    nheads = x.shape[2]
    dt = process_dt(dt, dt_bias, dt_softplus, dt_limit)
    dA = dt * f64(A)  # (batch, seqlen, nheads)
    # after[s] = sum_{r > s} dA_r: the reverse cumsum shifted by one token (no subtraction)
    from_s = np.flip(np.cumsum(np.flip(dA, axis=1), axis=1), axis=1)  # sum over r >= s
    after = np.concatenate([from_s[:, 1:], np.zeros_like(dA[:, :1])], axis=1)
    Bh = group_to_head(B, nheads)
    H = np.einsum("bsh,bshp,bshn->bhpn", np.exp(after) * dt, f64(x), Bh, optimize=True)
    if initial_states is not None:
        H += np.exp(dA.sum(axis=1))[:, :, None, None] * f64(initial_states)
    return H
