"""The whole SSD forward, three ways (recurrent, chunked, quadratic), and its magnitude bound M."""

from __future__ import annotations

import math

import numpy as np

from contract import check_dt_limit, check_forward_args
from reference._common import (abs_or_none, f64, gate, group_to_head, process_dt, segments,
                               skip_and_gate)
from reference.chunk_cumsum import chunk_cumsum_ref
from reference.compute_out import compute_out_ref
from reference.fwd_pass_state import fwd_pass_state_ref


def ssd_recurrent(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                  dt_softplus=False, dt_limit=(0.0, math.inf)):
    """(y, final_states): the literal token-by-token recurrence, the ground truth.

    1. dt <- clamp(softplus?(dt + dt_bias), dt_limit)
    2. head h reads group h // (nheads // ngroups) of B and C
    3. for every token t (vectorized over batch and heads), with H_{-1} = initial_states (or 0):
       H <- 0 where seq_idx[t] != seq_idx[t-1]
       H_t = exp(dt_t * A) * H_{t-1} + dt_t * x_t (outer) B_t
       y_t = H_t . C_t
    4. y += D * x, then y <- y * z * sigmoid(z); final_states = H_{seqlen-1}
    """
    dims = check_forward_args(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                              initial_states=initial_states, seq_idx=seq_idx, dt_limit=dt_limit)
    x = f64(x)
    # 1. (batch, seqlen, nheads)
    dt = process_dt(dt, dt_bias, dt_softplus, check_dt_limit(dt_limit))
    # 2. (batch, seqlen, nheads, dstate)
    Bh, Ch = group_to_head(B, dims.nheads), group_to_head(C, dims.nheads)
    # 3.
    seg = segments(seq_idx, dims.batch, dims.seqlen)
    decay = np.exp(dt * f64(A))  # dt >= 0, A < 0: exponent <= 0
    H = (np.zeros((dims.batch, dims.nheads, dims.headdim, dims.dstate)) if initial_states is None
         else f64(initial_states))
    y = np.empty_like(x)
    for t in range(dims.seqlen):
        if t > 0:
            H = np.where((seg[:, t] != seg[:, t - 1])[:, None, None, None], 0.0, H)
        dtx = dt[:, t, :, None] * x[:, t]  # (batch, nheads, headdim)
        H = decay[:, t, :, None, None] * H + dtx[..., None] * Bh[:, t, :, None, :]
        y[:, t] = np.einsum("bhpn,bhn->bhp", H, Ch[:, t])
    # 4.
    return skip_and_gate(y, x, D, z), H


def ssd_chunked(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                seq_idx=None, dt_softplus=False, dt_limit=(0.0, math.inf)):
    """(y, final_states): the three per-kernel references composed, as the kernels compose.

    1. (dt_out, dA_cumsum) = chunk_cumsum_ref
    2. (chunk_states, final_states) = fwd_pass_state_ref
    3. y = compute_out_ref
    """
    check_forward_args(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                       initial_states=initial_states, seq_idx=seq_idx, dt_limit=dt_limit)
    dt_out, dA_cumsum = chunk_cumsum_ref(dt, A, chunk_size, dt_bias, dt_softplus, dt_limit)
    chunk_states, final_states = fwd_pass_state_ref(x, B, dt_out, dA_cumsum, initial_states,
                                                    seq_idx)
    y = compute_out_ref(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seq_idx)
    return y, final_states


def ssd_quadratic(x, dt, A, B, C, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                  dt_softplus=False, dt_limit=(0.0, math.inf)):
    """y: the quadratic ("attention") form y = (L o C B^T)(dt x) over whole sequences.

    1. dt <- clamp(softplus?(dt + dt_bias), dt_limit); dA_t = dt_t * A_h (natural log units)
    2. segment sums in log space: segsum[t, s] = sum_{s < r <= t} dA_r, summed directly (a sum of
       non-positive terms: no cancellation of two large cumsums, never a positive exponent)
    3. L[t, s] = exp(segsum[t, s]) where s <= t and seg[s] == seg[t], else 0 (a select)
    4. y_t = sum_s L[t, s] * (C_t . B_s) * dt_s * x_s
    5. initial state: y_t += exp(sum_{r <= t} dA_r) * (C_t . initial_states^T) where seg[t] == 0
    6. y += D * x, then y <- y * z * sigmoid(z)
    """
    dims = check_forward_args(x, dt, A, B, C, D=D, z=z, dt_bias=dt_bias,
                              initial_states=initial_states, seq_idx=seq_idx, dt_limit=dt_limit)
    T = dims.seqlen
    x = f64(x)
    # 1. (batch, seqlen, nheads) and (batch, nheads, seqlen)
    dt = process_dt(dt, dt_bias, dt_softplus, check_dt_limit(dt_limit))
    dA = (dt * f64(A)).transpose(0, 2, 1)
    # 2. (batch, nheads, t, s): column s holds dA_r for r > s, summed down to row t
    below = np.tril(np.ones((T, T), dtype=bool), k=-1)  # [r, s]: r > s
    segsum = np.cumsum(np.where(below, dA[..., :, None], 0.0), axis=-2)
    # 3.
    seg = segments(seq_idx, dims.batch, T)
    mask = (np.tril(np.ones((T, T), dtype=bool)) & (seg[:, :, None] == seg[:, None, :]))[:, None]
    L = np.where(mask, np.exp(segsum), 0.0)
    # 4.
    Bh, Ch = group_to_head(B, dims.nheads), group_to_head(C, dims.nheads)
    CB = np.einsum("bthn,bshn->bhts", Ch, Bh, optimize=True)
    y = np.einsum("bhts,bshp->bthp", CB * L, dt[..., None] * x, optimize=True)
    # 5.
    if initial_states is not None:
        decay0 = np.where(seg[:, None, :] == 0, np.exp(np.cumsum(dA, axis=-1)), 0.0)  # (b, h, t)
        y += np.einsum("bhpn,bthn,bht->bthp", f64(initial_states), Ch, decay0, optimize=True)
    # 6.
    return skip_and_gate(y, x, D, z)


def ssd_magnitude(x, dt, A, B, C, chunk_size=None, D=None, z=None, dt_bias=None,
                  initial_states=None, seq_idx=None, dt_softplus=False, dt_limit=(0.0, math.inf)):
    """M, shaped like y: the same forward in float64 on |x|, |B|, |C|, |D|, |initial_states|
    (dt and decays unchanged: non-negative factors already), times |z * sigmoid(z)| with z.

    Every term of y is a product of those factors, so |y| <= M elementwise, and a rounding of
    one factor by u moves y by at most u * M. Computed by ssd_chunked when chunk_size is given
    (faster on long sequences), else by ssd_recurrent; the two agree to float64 rounding.
    """
    check_forward_args(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                       initial_states=initial_states, seq_idx=seq_idx, dt_limit=dt_limit)
    options = dict(D=abs_or_none(D), dt_bias=dt_bias, initial_states=abs_or_none(initial_states),
                   seq_idx=seq_idx, dt_softplus=dt_softplus, dt_limit=dt_limit)
    x_abs, B_abs, C_abs = abs_or_none(x), abs_or_none(B), abs_or_none(C)
    if chunk_size is None:
        M, _ = ssd_recurrent(x_abs, dt, A, B_abs, C_abs, **options)
    else:
        M, _ = ssd_chunked(x_abs, dt, A, B_abs, C_abs, chunk_size, **options)
    return M if z is None else M * np.abs(gate(z))
