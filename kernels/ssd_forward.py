"""ssd_forward: the Mamba-2 SSD forward, the three kernels composed (drop-in for the forward of
mamba_ssm's mamba_chunk_scan_combined, same argument order)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from contract import ACTIVATION_DTYPES, check_dt_limit, check_forward_args, check_vector_values
from kernels import errors, tuning_table
from kernels.arrays import backend_of, check_grid
from kernels.chunk_cumsum import chunk_cumsum_launch
from kernels.compute_out import compute_out_launch
from kernels.fwd_pass_state import fwd_pass_state_launches, in_order_programs

# On the GPU an even batch runs as BATCH_PARTS slices of the batch, each its three kernels in
# order, the second slice on a side stream (Backend.launch_parts), where fwd_pass_state's
# in-order grid for the whole batch has more than SPLIT_MIN_WAVES programs per SM: its last wave
# then leaves SMs idle, which the other slice's compute_out takes. A split call takes more host
# time, so it is kept to where it pays (benchmarks/DECISIONS.md "ssd_forward: batch slices").
# Each slice sizes its grids for its share of the SMs, so it chooses the tiles and modes the
# whole batch would (its index width may narrow to int32 where the slice stays below 2^31
# elements); results are bit-identical to the whole batch's.
BATCH_PARTS = 2
SPLIT_MIN_WAVES = 2


@dataclass(frozen=True)
class ForwardArrays:
    """One forward's arrays (checked, contiguous, outputs allocated) and options, as the launchers
    take them: `seg` is the (batch, seqlen) int32 segment ids of seq_idx, or None; `errors` the
    call's error word (kernels.errors), None in a plan that is never run."""
    x: Any
    dt: Any
    A: Any
    B: Any
    C: Any
    D: Any
    z: Any
    dt_bias: Any
    initial_states: Any
    seg: Any
    dt_softplus: bool
    dt_limit: tuple[float, float]
    dt_out: Any
    dA_cumsum: Any
    chunk_states: Any
    final_states: Any
    y: Any
    errors: Any = None

    # every array but A, D and dt_bias is batch-first and C-contiguous
    BATCH_FIRST = ("x", "dt", "B", "C", "z", "initial_states", "seg", "dt_out", "dA_cumsum",
                   "chunk_states", "final_states", "y")

    def batch_slice(self, lo: int, hi: int) -> ForwardArrays:
        """The forward of batch elements lo..hi-1: contiguous views of the batch-first arrays."""
        return dataclasses.replace(self, **{
            name: None if getattr(self, name) is None else getattr(self, name)[lo:hi]
            for name in self.BATCH_FIRST})

    def compute_out_arrays(self) -> tuple:
        """compute_out_launch's arrays: (x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg,
        y)."""
        return (self.x, self.B, self.C, self.dt_out, self.dA_cumsum, self.chunk_states, self.D,
                self.z, self.seg, self.y)


class ForwardPart(NamedTuple):
    """A slice of the batch and the SMs it sizes its grids for."""
    arrays: ForwardArrays
    sm_count: Fraction


def rules_batch_parts(dims, kind: str, itemsize: int, sm_count: int, given=()) -> int:
    """How many batch slices ssd_forward runs concurrently (see BATCH_PARTS): on a GPU of
    `sm_count` SMs, an even batch whose in-order fwd_pass_state grid exceeds SPLIT_MIN_WAVES
    programs per SM and whose second slice starts 16-byte aligned in every batch-first array
    the call has (ct.launch specializes kernels on the alignment: a misaligned slice would lose
    TMA loads). `itemsize`: the activations' (x, B, C, z, y); `given`: the optional batch-first
    arrays passed (z, initial_states, seq_idx)."""
    if kind == "numpy" or dims.batch % BATCH_PARTS:
        return 1
    programs = in_order_programs(dims.batch, dims.nheads, dims.headdim, dims.dstate)
    if programs <= SPLIT_MIN_WAVES * sm_count:
        return 1
    for name in _BATCH_FIRST + tuple(given):
        per_element = math.prod(dims.shape(name)[1:]) * (itemsize if name in _NARROW else 4)
        if dims.batch // BATCH_PARTS * per_element % 16:
            return 1
    return BATCH_PARTS


# every batch-first array of a call without options; z, initial_states, seq_idx where given
_BATCH_FIRST = ("x", "dt", "B", "C", "y", "dt_out", "dA_cumsum", "chunk_states", "final_states")
_NARROW = ("x", "B", "C", "z", "y")


def ssd_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                seq_idx=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                return_final_states=False, *, check_values=None, batch_parts=None):
    """y (batch, seqlen, nheads, headdim), or (y, final_states) with return_final_states;
    arrays of the caller's type (NumPy: the CPU interpreter; CuPy or torch CUDA: the GPU, on the
    current stream). x, B, C, z: float32, bfloat16 or float16, all four alike (read in that
    dtype, computed in float32); y has x's dtype; every other input is taken as float32, and
    final_states is float32.

    Every argument's shape, dtype and device is checked before the first launch; then the three
    kernels run in order (forward_launches); on the GPU, for large even batches, for each of two
    batch slices, the second slice on a side stream forked from and joined into the current one
    (BATCH_PARTS; results bit-identical to the whole batch's). `batch_parts` (keyword only): run
    the batch as that many slices (at most one per element) instead of the rule's count; 1 never
    splits.

    The values of A, D and dt_bias (A < 0, all finite) are checked by the kernels that read
    them (kernels.errors): a bad value makes every output it feeds NaN and is raised as a
    ValueError naming the argument by the first later call that sees it without waiting (or by
    kernels.raise_pending_errors(), which waits). So on the GPU a call neither synchronises nor
    copies to the host. `check_values=True` (keyword only) checks them on the host before the
    launch instead, raising at once: on the GPU a synchronisation per call, for debugging. The
    default, None, is True for NumPy inputs (the interpreter: no synchronisation to save) and
    False on the GPU; False on NumPy defers the error as on the GPU.
    """
    errors.check_flag(check_values)
    _check_batch_parts(batch_parts)
    dt_limit = check_dt_limit(dt_limit)
    given = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
    if (all(a is None or type(a).__module__.partition(".")[0] == "torch" for a in given)
            and isinstance(chunk_size, int)):
        # torch tensors: one node of a torch.compile graph (kernels/torch_op.py), which runs
        # run_forward; anything else runs it directly (and is refused there, by name)
        from kernels import torch_op
        y, final_states = torch_op.ssd_forward(
            run_forward, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
            dt_softplus, dt_limit, check_values, batch_parts)
    else:
        y, final_states = run_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                      seq_idx, dt_softplus, dt_limit, check_values, batch_parts)
    return (y, final_states) if return_final_states else y


def run_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                dt_softplus, dt_limit, check_values, batch_parts):
    """(y, final_states): ssd_forward's work for any array kind."""
    backend, parts, y, final_states = prepare_forward(
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus, dt_limit,
        batch_parts)
    table = tuning_table.table(backend)
    if errors.check_on_host(check_values, backend):
        check_vector_values(A, D=D, dt_bias=dt_bias)
    word = errors.open_word(backend, "ssd_forward")
    plan = [forward_launches(dataclasses.replace(arrays, errors=word.array), sm_count,
                             tuned=table) for arrays, sm_count in parts]
    backend.launch_parts(plan)
    word.close()
    return y, final_states


def _check_batch_parts(batch_parts):
    if batch_parts is not None and not (isinstance(batch_parts, int) and batch_parts >= 1):
        raise ValueError(f"batch_parts: must be a positive int or None, got {batch_parts!r}")


def prepare_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                    dt_softplus, dt_limit, batch_parts=None):
    """(backend, [ForwardPart], y, final_states): ssd_forward's arguments checked (all but the
    values of A, D and dt_bias), made contiguous, its outputs allocated, the batch sliced
    (`batch_parts` slices, or rules_batch_parts' count where None)."""
    _check_batch_parts(batch_parts)
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
    dt_out, dA_cumsum, chunk_states, final_states = (
        backend.empty(dims.shape(n)) for n in ("dt_out", "dA_cumsum", "chunk_states",
                                               "final_states"))
    y = backend.empty(dims.shape("y"), like=x)
    if batch_parts is None:
        given = [n for n, a in (("z", z), ("initial_states", initial_states),
                                ("seq_idx", seq_idx)) if a is not None]
        batch_parts = rules_batch_parts(dims, backend.kind, x.dtype.itemsize, backend.sm_count,
                                        given)
    arrays = ForwardArrays(x, dt, A, B, C, D, z, dt_bias, initial_states, seg, dt_softplus,
                           dt_limit, dt_out, dA_cumsum, chunk_states, final_states, y)
    return (backend, forward_parts(arrays, backend.sm_count, min(batch_parts, dims.batch)), y,
            final_states)


def forward_plan(arrays: ForwardArrays, sm_count, parts: int) -> list[list[tuple]]:
    """The launches of one forward as `parts` slices of the batch, by the launchers' rules:
    [forward_launches of each] (forward_parts)."""
    return [forward_launches(*part) for part in forward_parts(arrays, sm_count, parts)]


def forward_parts(arrays: ForwardArrays, sm_count, parts: int) -> list[ForwardPart]:
    """The forward as `parts` slices of the batch.

    A slice of batch b_k of the whole batch b sizes its grids for sm_count * b_k / b SMs (a
    Fraction: the launchers only compare program counts with it), so that it takes the choices
    the whole would take on the device.
    """
    batch = int(arrays.x.shape[0])
    bounds = [batch * k // parts for k in range(parts + 1)]
    return [ForwardPart(arrays.batch_slice(lo, hi), Fraction(sm_count * (hi - lo), batch))
            for lo, hi in zip(bounds, bounds[1:])]


def forward_launches(arrays: ForwardArrays, sm_count, tuned=None) -> list[tuple]:
    """The launches of one forward, in order: [(kernel, grid, args)].

    Reads only shapes and dtypes (and which optional arrays are given) and the device's SM
    count, so the compile gate derives the specializations ssd_forward uses from here, with
    stand-in arrays. `tuned`: compute_out's tuned choices for the device, or None (the rules).
    1. chunk_cumsum: dt_out, dA_cumsum (log2 units), (batch, nheads, nchunks, chunk_size)
    2. fwd_pass_state: the state entering every chunk, and the final state (one launch, or two
       when the chunks go in parallel)
    3. compute_out: y
    """
    a = arrays
    return [
        chunk_cumsum_launch(a.dt, a.A, a.dt_bias, a.dt_out, a.dA_cumsum, a.dt_softplus,
                            a.dt_limit, errors=a.errors),
        *fwd_pass_state_launches(a.x, a.B, a.dt_out, a.dA_cumsum, a.initial_states, a.seg,
                                 a.chunk_states, a.final_states, sm_count),
        compute_out_launch(*a.compute_out_arrays(), sm_count, tuned, errors=a.errors),
    ]
