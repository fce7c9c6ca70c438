"""ssd_forward: the Mamba-2 SSD forward, the three kernels composed (drop-in for the forward of
mamba_ssm's mamba_chunk_scan_combined, same argument order)."""

from __future__ import annotations

import math

from contract import ACTIVATION_DTYPES, check_dt_limit, check_forward_args, check_vector_values
from kernels.arrays import backend_of, check_grid
from kernels.chunk_cumsum import chunk_cumsum_launch
from kernels.compute_out import compute_out_launch
from kernels.fwd_pass_state import fwd_pass_state_launches


def ssd_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                seq_idx=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                return_final_states=False, *, check_values=True):
    """y (batch, seqlen, nheads, headdim), or (y, final_states) with return_final_states;
    arrays of the caller's type (NumPy: the CPU interpreter; CuPy or torch CUDA: the GPU, on the
    current stream). x, B, C, z: float32, bfloat16 or float16, all four alike (read in that
    dtype, computed in float32); y has x's dtype; every other input is taken as float32, and
    final_states is float32.

    Every argument is checked before the first launch; then the three kernels run in order
    (forward_launches). Checking the values of A, D and dt_bias (A < 0, all finite) copies them
    to the host: a synchronisation per call, which waits for the work already queued on the GPU.
    It comes last, after the shape checks, the allocations and the launch arguments, so that the
    GPU idles only for the host's launch of the first kernel after it. `check_values=False`
    (keyword only) leaves that check out, for CUDA graph capture and timing loops whose vectors
    were checked once before; bad values are then the caller's responsibility (shapes and dtypes
    are still checked).
    """
    backend = backend_of(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                         initial_states=initial_states, seq_idx=seq_idx)
    dims = check_forward_args(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                              initial_states=initial_states, seq_idx=seq_idx, dt_limit=dt_limit,
                              float_dtypes=("float32",), activation_dtypes=ACTIVATION_DTYPES,
                              check_values=False)
    dt_limit = check_dt_limit(dt_limit)
    check_grid(dims.batch, dims.nheads)
    x, B, C, z = (backend.contiguous(a) for a in (x, B, C, z))
    dt, A, D, dt_bias, initial_states = (
        backend.contiguous_float32(a) for a in (dt, A, D, dt_bias, initial_states))
    seg = backend.segment_ids(seq_idx)

    dt_out = backend.empty(dims.shape("dt_out"))
    dA_cumsum = backend.empty(dims.shape("dA_cumsum"))
    chunk_states = backend.empty(dims.shape("chunk_states"))
    final_states = backend.empty(dims.shape("final_states"))
    y = backend.empty(dims.shape("y"), like=x)
    launches = forward_launches(x, dt, A, B, C, D, z, dt_bias, initial_states, seg, dt_softplus,
                                dt_limit, dt_out, dA_cumsum, chunk_states, final_states, y,
                                backend.sm_count)
    if check_values:
        check_vector_values(A, D=D, dt_bias=dt_bias)
    for kernel, grid, args in launches:
        backend.launch(kernel, grid, args)
    return (y, final_states) if return_final_states else y


def forward_launches(x, dt, A, B, C, D, z, dt_bias, initial_states, seg, dt_softplus, dt_limit,
                     dt_out, dA_cumsum, chunk_states, final_states, y, sm_count):
    """The launches of one forward, in order: [(kernel, grid, args)].

    Reads only shapes and dtypes (and which optional arrays are given) and the device's SM
    count, so the compile gate derives the specializations ssd_forward uses from here, with
    stand-in arrays.
    1. chunk_cumsum: dt_out, dA_cumsum (log2 units), (batch, nheads, nchunks, chunk_size)
    2. fwd_pass_state: the state entering every chunk, and the final state (one launch, or two
       when the chunks go in parallel)
    3. compute_out: y
    """
    return [
        chunk_cumsum_launch(dt, A, dt_bias, dt_out, dA_cumsum, dt_softplus, dt_limit),
        *fwd_pass_state_launches(x, B, dt_out, dA_cumsum, initial_states, seg, chunk_states,
                                 final_states, sm_count),
        compute_out_launch(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y, sm_count),
    ]
