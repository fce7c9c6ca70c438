"""ssd_forward: the Mamba-2 SSD forward, the kernels composed (drop-in for the forward of
mamba_ssm's mamba_chunk_scan_combined, same argument order).

A call is one pipeline, top to bottom: its arguments as one Call (kernels.call), the plan of its
signature (kernels.plan: validated and built on the signature's first call, then kept), bound to
the call's arrays and launched inside the call's error word (kernels.errors)."""

from __future__ import annotations

import importlib.util
import math

from kernels import errors
from kernels.call import Call
from kernels.plan import plan_of


def ssd_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                return_final_states=False, return_varlen_states=False, *, check_values=None,
                batch_parts=None, state_dtype=None, route=None):
    """y (batch, seqlen, nheads, headdim), or (y, final_states) with return_final_states; arrays of
    the caller's type (NumPy: the CPU interpreter; CuPy or torch CUDA: the GPU, on the current
    stream). x, B, C, z: float32, bfloat16 or float16, all four alike (read in that dtype;
    products as kernels.tiles.mma_operand says, accumulated in float32); y has x's dtype. dt,
    A, dt_bias, D, initial_states: each float32 or x's dtype (read and widened to float32 in the
    kernels, as mamba_ssm reads them); final_states is float32.

    Arrays are read where they lie, strided views included (x, B, C, z, dt as torch.split views
    of one projection, a batch or token slice, token-major views): any layout whose strides are
    non-negative runs without a copy; one with a negative stride is copied C-contiguous first
    (contract.kernel_layout; the plan's copies name them: kernels.plan).

    Every argument's shape, dtype and device is checked before the first launch (once per
    signature: kernels.plan); then the kernels run in order (kernels.launches.forward_launches:
    chunk_cumsum and the scan where its grid fills the GPU, else chunk_cumsum, fwd_pass_state
    and compute_out); on the GPU, for large even batches that run the three kernels, for each of
    two batch slices, the second slice on a side stream forked from and joined into the current
    one (kernels.launches.BATCH_PARTS; results bit-identical to the whole batch's).
    `batch_parts` (keyword only): run the batch as that many slices (at most one per element)
    instead of the rule's count; 1 never splits. `route` (keyword only): one of
    kernels.launches.ROUTES instead of the rules' ("scan": a dstate tile of at most 128), for
    tests and measurements: every route gives y and final_states within the same bounds.

    `state_dtype` (keyword only; mamba_ssm's name): the dtype the chunk states are stored in
    between fwd_pass_state and compute_out, float32, or bfloat16 for bfloat16 inputs (float16
    states would overflow past 65504), by name or as a NumPy, ml_dtypes or torch dtype; None:
    kernels.call.STATE_DTYPES' for x's dtype. With fwd_pass_state's chunks in parallel bfloat16
    states add one rounding to the carried state's path (in order, y is bit-identical;
    properties/bounds.py); the scan and the packed path keep their state in float32 registers,
    and final_states is float32 always.

    The values of A, D and dt_bias (A < 0, all finite) are checked on the device, by
    chunk_cumsum (kernels.errors): a bad value makes every output it feeds NaN and is raised as
    a ValueError naming the argument by the first later call that sees it without waiting (or by
    kernels.raise_pending_errors(), which waits). So on the GPU a call neither synchronises nor
    copies to the host. `check_values=True` (keyword only) checks them on the host before the
    launch instead, raising at once: on the GPU a synchronisation per call, for debugging. The
    default, None, is True for NumPy inputs (the interpreter: no synchronisation to save) and
    False on the GPU; False on NumPy defers the error as on the GPU.

    Packed variable-length rows (mamba_ssm's names): `cu_seqlens` (num_seqs + 1,) int32 or
    int64, the offsets of the sequences packed in a row of batch 1 (starting at 0,
    non-decreasing, ending at seqlen; an empty sequence is two equal offsets). Each sequence
    runs as its own forward (kernels.launches.varlen_launches: chunk_cumsum, then ssd_varlen, a
    program per sequence and head); `initial_states`, where given, is one state per sequence,
    (num_seqs, nheads, headdim, dstate). `return_varlen_states=True` returns (y, varlen_states),
    each sequence's state after its last token (an empty one's: its initial state, or zeros),
    (num_seqs, nheads, headdim, dstate) float32. seq_idx, where given with cu_seqlens, must be
    each token's sequence (checked where values are checked on the host; the kernels read
    cu_seqlens only). Under torch the packed forward is forward only (no autograd and no
    torch.compile op: refused by name). Offsets that are wrong are found as A's values are: on
    the host for NumPy inputs, else on the device (all of y and every state NaN, a ValueError
    naming cu_seqlens from a later call).
    """
    call = Call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
                dt_softplus, dt_limit, return_final_states, return_varlen_states, check_values,
                batch_parts, state_dtype, route)
    # torch tensors: through the custom op where torch.compile traces the call or autograd
    # records it (kernels/torch_op.py), else run here
    arrays = torch_op.forward(run, call) if torch_op is not None and _is_torch(x) else run(call)
    if return_varlen_states:
        return arrays["y"], arrays["varlen_states"]
    return (arrays["y"], arrays["final_states"]) if return_final_states else arrays["y"]


def run(call: Call) -> dict:
    """The call's arrays by name, its outputs written: the plan of its signature (plan_of) bound
    to them and launched on the caller's current stream, inside the call's error word."""
    plan = plan_of(call)
    backend = plan.backend
    with backend.on_device():
        arrays = plan.arrays(call)
        if plan.on_host:  # last before the launch: it waits
            plan.check_values(call, arrays)
        stream = backend.current_stream()
        with errors.open_word(backend, "ssd_forward", stream) as word:
            arrays["errors"] = word.array
            backend.launch_parts(plan.bind(arrays), stream)
    return arrays


def _is_torch(a) -> bool:
    return type(a).__module__.partition(".")[0] == "torch"


# Where torch is installed, the custom op of torch tensors (kernels.torch_op) is registered here,
# at import: a registration on a first call that torch.compile traces would break its graph. A
# torch that fails to import (a broken install) leaves NumPy and CuPy calls working.
torch_op = None
if importlib.util.find_spec("torch") is not None:
    try:
        from kernels import torch_op
    except (ImportError, OSError):
        torch_op = None
    else:
        torch_op.register(run)
