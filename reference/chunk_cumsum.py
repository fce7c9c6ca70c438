"""Reference of the chunk_cumsum stage: the processed step size and the in-chunk decay cumsum."""

from __future__ import annotations

import math

import numpy as np

from contract import check_chunk_cumsum_args, check_dt_limit
from reference._common import LOG2E, f64, process_dt, to_chunks


def chunk_cumsum_ref(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf)):
    """(dt_out, dA_cumsum), both (batch, nheads, nchunks, chunk_size), float64.

    1. dt <- clamp(softplus?(dt + dt_bias), dt_limit)   (clamp always applied: dt_out >= 0)
    2. split seqlen into chunks; a short last chunk is padded with dt = 0 beyond seqlen
    3. dA_cumsum[t] = log2(e) * sum_{s <= t in chunk} dt_s * A_h   (log2 units, so later
       exponentials are exp2); <= 0 and non-increasing within a chunk

    Padding choice: beyond seqlen dt_out = 0, so dA_cumsum continues flat at the last real
    value. A padded token then contributes nothing (its weight has the factor dt = 0), and the
    last entry of a short chunk is the decay over the real tokens, as the jump formula needs.
    """
    check_chunk_cumsum_args(dt, A, chunk_size, dt_bias=dt_bias, dt_limit=dt_limit)
    # 1. the step size, (batch, seqlen, nheads)
    dt_out = process_dt(dt, dt_bias, dt_softplus, check_dt_limit(dt_limit))
    # 2. (batch, nchunks, chunk_size, nheads) -> (batch, nheads, nchunks, chunk_size)
    dt_out = to_chunks(dt_out, chunk_size).transpose(0, 3, 1, 2)
    # 3. in-chunk cumulative decay in log2 units; every term dt * A is <= 0
    dA_cumsum = np.cumsum(dt_out * f64(A)[None, :, None, None] * LOG2E, axis=-1)
    return np.ascontiguousarray(dt_out), dA_cumsum
