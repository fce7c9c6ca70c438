"""mamba_ssm's `mamba_chunk_scan_combined` by name, signature and return order, on ssd_forward:
a model adopts the kernels by swapping one import,

    from kernels.ssd_combined import mamba_chunk_scan_combined

for `from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined` (mamba_ssm's
`Mamba2` layer: patch `mamba_ssm.modules.mamba2.mamba_chunk_scan_combined`). Forward only, as
ssd_forward: under autograd a backward raises (kernels.torch_op).
"""

from __future__ import annotations

import math

from kernels.arrays import backend_of
from kernels.ssd_forward import ssd_forward


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None,
                              initial_states=None, seq_idx=None, cu_seqlens=None,
                              dt_softplus=False, dt_limit=(0.0, math.inf),
                              return_final_states=False, return_varlen_states=False,
                              state_dtype=None):
    """out (batch, seqlen, nheads, headdim) in x's dtype; with return_final_states and
    return_varlen_states, (out, final_states, varlen_states) with those asked for, in that order,
    as mamba_ssm returns them (states float32).

    As in mamba_ssm, `seq_idx` resets the state where it changes and `cu_seqlens` is read only
    for the varlen states: without return_varlen_states it is not used. With it, the row's
    sequences run packed (ssd_forward's cu_seqlens: each its own forward, as mamba_ssm computes
    them where seq_idx marks the sequences, the way its Mamba2 layer passes them);
    `initial_states`, mamba_ssm's (1, nheads, headdim, dstate) state entering the row, is the
    first sequence's, and final_states the last sequence's state. Every argument is checked by
    ssd_forward, dtypes and strides as it takes them.
    """
    options = dict(D=D, z=z, dt_bias=dt_bias, seq_idx=seq_idx, dt_softplus=dt_softplus,
                   dt_limit=dt_limit, state_dtype=state_dtype)
    if not return_varlen_states:
        return ssd_forward(x, dt, A, B, C, chunk_size, initial_states=initial_states,
                           return_final_states=return_final_states, **options)
    y, varlen_states = ssd_forward(
        x, dt, A, B, C, chunk_size, initial_states=_first_sequence(initial_states, cu_seqlens),
        cu_seqlens=cu_seqlens, return_varlen_states=True, **options)
    if return_final_states:
        return y, varlen_states[-1:], varlen_states
    return y, varlen_states


def _first_sequence(initial_states, cu_seqlens):
    """The packed forward's initial states, one per sequence, of mamba_ssm's row state
    (1, nheads, headdim, dstate): the first sequence's, zeros for the others (float32)."""
    if initial_states is None or cu_seqlens is None:
        return initial_states
    shape = tuple(int(n) for n in initial_states.shape)
    if len(shape) != 4 or shape[0] != 1:
        raise ValueError(f"initial_states: with cu_seqlens, the row's state (1, nheads, headdim, "
                         f"dstate) as mamba_ssm takes it, got shape {shape}")
    backend = backend_of(initial_states=initial_states, cu_seqlens=cu_seqlens)
    per_sequence = backend.zeros((int(cu_seqlens.shape[0]) - 1, *shape[1:]))
    per_sequence[:1] = initial_states
    return per_sequence
