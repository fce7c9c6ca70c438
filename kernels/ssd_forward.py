"""ssd_forward: the Mamba-2 SSD forward, the kernels composed (drop-in for the forward of
mamba_ssm's mamba_chunk_scan_combined, same argument order)."""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import threading
import types
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from contract import (ACTIVATION_DTYPES, check_cu_seqlens, check_dt_limit, check_forward_args,
                      check_seq_idx_of_offsets, check_vector_values, cu_seqlens_values,
                      contiguous_strides, dtype_name, element_strides, kernel_layout,
                      state_dtype_name, weight_dtypes)
from kernels import errors, tuning_table
from kernels.arrays import GRID_YZ_MAX, backend_of, check_grid, needs_int64
from kernels.chunk_cumsum import chunk_cumsum_launch
from kernels.compute_out import compute_out_launch
from kernels.fwd_pass_state import fwd_pass_state_launches, in_order_programs
from kernels.ssd_scan import SCAN_MAX_DSTATE, scan_fits, scan_runs, ssd_scan_launch
from kernels.ssd_varlen import ssd_varlen_launches

# On the GPU an even batch that runs the three kernels (not the scan) runs as BATCH_PARTS slices
# of the batch, each its three kernels in order, the second slice on a side stream
# (Backend.launch_parts), where fwd_pass_state's in-order grid for the whole batch has more than
# SPLIT_MIN_WAVES programs per SM: its last wave then leaves SMs idle, which the other slice's
# compute_out takes. A split call takes more host time, so it is kept to where it pays
# (benchmarks/DECISIONS.md "ssd_forward: batch slices").
# Each slice sizes its grids for its share of the SMs, so it chooses the tiles and modes the
# whole batch would (its index width may narrow to int32 where the slice stays below 2^31
# elements); results are bit-identical to the whole batch's.
BATCH_PARTS = 2
SPLIT_MIN_WAVES = 2

# The dtype the chunk states are stored in between fwd_pass_state and compute_out where the call
# leaves state_dtype None, by the activations' dtype: bfloat16 for bfloat16 (half the states'
# traffic), float32 else (float16 states would overflow past 65504); DECISIONS.md "Chunk
# states' dtype".
STATE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}

# The forward's routes (ssd_forward's `route`; None: the rules choose, forward_launches): the
# scan, or the chunk states through memory, fwd_pass_state's chunks in order or in parallel
# (then its state pass), then compute_out. Every route computes the same forward within the
# same bounds (properties/bounds.py); the rules pick by speed and the device's SM count.
ROUTES = ("scan", "chunks_in_order", "chunks_parallel")
# fwd_pass_state's mode on each route of the chunk states
ROUTE_MODES = {"chunks_in_order": "in_order", "chunks_parallel": "parallel_chunks"}


@dataclass(frozen=True)
class ForwardArrays:
    """One forward's arrays (checked, laid out as the kernels take them, outputs allocated) and
    options, as the launchers take them: `seg` is the (batch, seqlen) int32 segment ids of
    seq_idx, or None; `errors` the call's error word (kernels.errors), None in a plan that is
    never run."""
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

    # every array but A, D and dt_bias is batch-first (the inputs may be strided views)
    BATCH_FIRST = ("x", "dt", "B", "C", "z", "initial_states", "seg", "dt_out", "dA_cumsum",
                   "chunk_states", "final_states", "y")

    def batch_slice(self, lo: int, hi: int) -> ForwardArrays:
        """The forward of batch elements lo..hi-1: views of the batch-first arrays."""
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


def rules_batch_parts(dims, kind: str, itemsize: int, sm_count: int, given=(),
                      state_itemsize: int = 4, *, layouts=None, route=None) -> int:
    """How many batch slices ssd_forward runs concurrently (see BATCH_PARTS): on a GPU of
    `sm_count` SMs, an even batch whose in-order fwd_pass_state grid exceeds SPLIT_MIN_WAVES
    programs per SM and whose second slice starts 16-byte aligned in every batch-first array
    the call has (ct.launch specializes kernels on the alignment: a misaligned slice would lose
    TMA loads). `itemsize`: the activations' (x, B, C, z, y); `given`: the optional batch-first
    arrays passed (z, initial_states, seq_idx); `state_itemsize`: the chunk states';
    `layouts`: (batch stride in elements, item size) of each input by name where it is not a
    C-contiguous array of those item sizes (strided views, 16-bit dt or initial_states);
    `route`: the call's (ROUTES; None: the rules', judged by _scans)."""
    scans = route == "scan" or (route is None and _scans(dims, sm_count))
    if kind == "numpy" or dims.batch % BATCH_PARTS or scans:
        return 1
    programs = in_order_programs(dims.batch, dims.nheads, dims.headdim, dims.dstate)
    if programs <= SPLIT_MIN_WAVES * sm_count:
        return 1
    for name in _BATCH_FIRST + tuple(given):
        stride, size = (layouts or {}).get(name, (math.prod(dims.shape(name)[1:]), (
            itemsize if name in _NARROW else state_itemsize if name == "chunk_states" else 4)))
        if dims.batch // BATCH_PARTS * stride * size % 16:
            return 1
    return BATCH_PARTS


def _scans(dims, sm_count: int) -> bool:
    """Whether the call's forward is the scan (kernels.ssd_scan.scan_runs), judged from its
    dimensions alone, as for float32 inputs (past SPLIT_MIN_WAVES every dtype's scan runs; a
    call whose arrays need int64 indices runs the two kernels, unsplit)."""
    stand_in = lambda name: _Slot(name, dims.shape(name), "float32")
    return scan_runs(stand_in("x"), stand_in("B"), stand_in("dt_out"), (), sm_count)


# the item sizes of the dtypes a call's arrays may have
ITEMSIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}
# every batch-first array of a call without options; z, initial_states, seq_idx where given
_BATCH_FIRST = ("x", "dt", "B", "C", "y", "dt_out", "dA_cumsum", "chunk_states", "final_states")
_NARROW = ("x", "B", "C", "z", "y")


def ssd_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                return_final_states=False, return_varlen_states=False, *, check_values=None,
                batch_parts=None, state_dtype=None, route=None):
    """y (batch, seqlen, nheads, headdim), or (y, final_states) with return_final_states;
    arrays of the caller's type (NumPy: the CPU interpreter; CuPy or torch CUDA: the GPU, on the
    current stream). x, B, C, z: float32, bfloat16 or float16, all four alike (read in that
    dtype; products as kernels.arrays.mma_operand says, accumulated in float32); y has x's
    dtype. dt, A, dt_bias, D, initial_states: each float32 or x's dtype (read and widened to
    float32 in the kernels, as mamba_ssm reads them); final_states is float32.

    Arrays are read where they lie, strided views included (x, B, C, z, dt as torch.split
    views of one projection, a batch or token slice, token-major views): any layout whose
    strides are non-negative runs without a copy; one with a negative stride is copied
    C-contiguous first (contract.kernel_layout; launch_plan(...).copies names them).

    Every argument's shape, dtype and device is checked before the first launch; then the
    kernels run in order (forward_launches: chunk_cumsum and the scan where its grid fills the
    GPU, else chunk_cumsum, fwd_pass_state and compute_out); on the GPU, for large even batches
    that run the three kernels, for each of two batch slices, the second slice on a side stream
    forked from and joined into the current one (BATCH_PARTS; results bit-identical to the
    whole batch's). `batch_parts` (keyword only): run the batch as that many slices (at most one
    per element) instead of the rule's count; 1 never splits. `route` (keyword only): one of
    ROUTES instead of the rules' ("scan": a dstate of at most SCAN_MAX_DSTATE's tile), for
    tests and measurements: every route gives y and final_states within the same bounds.

    `state_dtype` (keyword only; mamba_ssm's name): the dtype the chunk states are stored in
    between fwd_pass_state and compute_out, float32, or bfloat16 for bfloat16 inputs (float16
    states would overflow past 65504), by name or as a NumPy, ml_dtypes or torch dtype; None:
    STATE_DTYPES' for x's dtype. With fwd_pass_state's chunks in parallel bfloat16 states add
    one rounding to the carried state's path (in order, y is bit-identical; properties/
    bounds.py); the scan and the packed path keep their state in float32 registers, and
    final_states is float32 always.

    The values of A, D and dt_bias (A < 0, all finite) are checked on the device, by
    chunk_cumsum (kernels.errors): a bad value makes every output it feeds NaN and is raised as a
    ValueError naming the argument by the first later call that sees it without waiting (or by
    kernels.raise_pending_errors(), which waits). So on the GPU a call neither synchronises nor
    copies to the host. `check_values=True` (keyword only) checks them on the host before the
    launch instead, raising at once: on the GPU a synchronisation per call, for debugging. The
    default, None, is True for NumPy inputs (the interpreter: no synchronisation to save) and
    False on the GPU; False on NumPy defers the error as on the GPU.

    Packed variable-length rows (mamba_ssm's names): `cu_seqlens` (num_seqs + 1,) int32 or
    int64, the offsets of the sequences packed in a row of batch 1 (starting at 0,
    non-decreasing, ending at seqlen; an empty sequence is two equal offsets). Each sequence
    runs as its own forward (run_varlen_forward: chunk_cumsum, then ssd_varlen, a program per
    sequence and head); `initial_states`, where given, is one state per sequence, (num_seqs,
    nheads, headdim, dstate). `return_varlen_states=True` returns (y, varlen_states), each
    sequence's state after its last token (an empty one's: its initial state, or zeros),
    (num_seqs, nheads, headdim, dstate) float32. seq_idx, where given with cu_seqlens, must be
    each token's sequence (checked where values are checked on the host; the kernels read
    cu_seqlens only). Under torch the packed forward is forward only (no autograd and no
    torch.compile op: refused by name). Offsets that are wrong are found as A's values are:
    on the host for NumPy inputs, else on the device (all of y and every state NaN, a
    ValueError naming cu_seqlens from a later call).
    """
    errors.check_flag(check_values)
    if return_varlen_states and cu_seqlens is None:
        raise ValueError("return_varlen_states: needs cu_seqlens (the sequences' offsets)")
    if cu_seqlens is not None:
        if return_final_states:
            raise ValueError("return_final_states: with cu_seqlens each sequence has its own "
                             "final state: pass return_varlen_states=True instead")
        if batch_parts is not None:
            raise ValueError("batch_parts: a packed row (cu_seqlens) is one batch element")
        if route is not None:
            raise ValueError("route: a packed row (cu_seqlens) has one route (chunk_cumsum, "
                             "then ssd_varlen)")
        y, varlen_states = run_varlen_forward(
            x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, cu_seqlens,
            dt_softplus, check_dt_limit(dt_limit), check_values, state_dtype)
        return (y, varlen_states) if return_varlen_states else y
    _check_batch_parts(batch_parts)
    _check_route(route)
    dt_limit = check_dt_limit(dt_limit)
    given = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
    if (torch_op is not None and _is_torch(x) and isinstance(chunk_size, int)
            and all(a is None or _is_torch(a) for a in given)):
        # torch tensors: one node of a torch.compile graph (kernels/torch_op.py), which runs
        # run_forward; anything else runs it directly (and is refused there, by name)
        y, final_states = torch_op.ssd_forward(
            run_forward, x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
            dt_softplus, dt_limit, check_values, batch_parts, state_dtype_name(state_dtype, x),
            route)
    else:
        y, final_states = run_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states,
                                      seq_idx, dt_softplus, dt_limit, check_values, batch_parts,
                                      state_dtype, route)
    return (y, final_states) if return_final_states else y


def run_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                dt_softplus, dt_limit, check_values, batch_parts, state_dtype=None, route=None):
    """(y, final_states): ssd_forward's work for any array kind, by the launch plan of the call's
    signature (launch_plan: built and checked on the signature's first call, then reused)."""
    given = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
    plan = launch_plan(*given[:5], chunk_size, *given[5:], dt_softplus, dt_limit, batch_parts,
                       state_dtype, route=route)
    backend = plan.backend
    with backend.on_device():
        arrays = plan.arrays(given)
        if errors.check_on_host(check_values, backend):  # last before the launch: it waits
            check_vector_values(arrays["A"], D=arrays["D"], dt_bias=arrays["dt_bias"])
        stream = backend.current_stream()
        word = errors.open_word(backend, "ssd_forward", stream)
        arrays["errors"] = word.array
        backend.launch_parts(plan.bind(arrays), stream)
        word.close()
    return arrays["y"], arrays["final_states"]


def run_varlen_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                       cu_seqlens, dt_softplus, dt_limit, check_values, state_dtype=None):
    """(y, varlen_states) of a packed row: every argument checked first (the values of A, D,
    dt_bias and cu_seqlens as ssd_forward says; state_dtype, which changes nothing here: no
    chunk states), then chunk_cumsum (dt_out; it checks A, D and dt_bias) and ssd_varlen on the
    caller's current stream."""
    backend = backend_of(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                         initial_states=initial_states, seq_idx=seq_idx, cu_seqlens=cu_seqlens)
    dims = check_forward_args(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                              seq_idx=seq_idx, dt_limit=dt_limit, float_dtypes=weight_dtypes(x),
                              activation_dtypes=ACTIVATION_DTYPES, check_values=False)
    num_seqs = check_cu_seqlens(cu_seqlens, dims, initial_states, float_dtypes=weight_dtypes(x))
    state_dtype_name(state_dtype, x)
    if num_seqs > GRID_YZ_MAX:
        raise ValueError(f"cu_seqlens: at most {GRID_YZ_MAX} sequences (a grid axis), got "
                         f"{num_seqs}")
    check_grid(1, dims.nheads)
    if backend.kind == "torch":
        _check_forward_only(x, dt, A, B, C, D, z, dt_bias, initial_states)
    states_shape = (num_seqs, dims.nheads, dims.headdim, dims.dstate)
    # the launches planned on the inputs and stand-ins of the outputs: what they refuse (an
    # array of 2^31 elements or more) is refused before anything is allocated or launched
    stand_in = lambda shape: types.SimpleNamespace(shape=shape)
    varlen_launches(ForwardArrays(x, dt, A, B, C, D, z, dt_bias, initial_states, None,
                                  dt_softplus, dt_limit, stand_in(dims.shape("dt_out")),
                                  stand_in(dims.shape("dA_cumsum")), None, None,
                                  stand_in(dims.shape("y"))),
                    cu_seqlens, stand_in(states_shape))
    on_host = errors.check_on_host(check_values, backend)
    if on_host and seq_idx is not None:
        check_seq_idx_of_offsets(seq_idx, cu_seqlens_values(cu_seqlens, dims.seqlen))
    with backend.on_device():
        x, B, C, z, dt, A, D, dt_bias, initial_states = (backend.laid_out(a) for a in (
            x, B, C, z, dt, A, D, dt_bias, initial_states))
        cu = backend.offsets_int32(cu_seqlens, dims.seqlen)
        y = backend.empty(dims.shape("y"), like=x)  # every token written (NaN if refused)
        # dA_cumsum is written, not read: ssd_varlen takes each block's cumsum itself
        arrays = ForwardArrays(x, dt, A, B, C, D, z, dt_bias, initial_states, None, dt_softplus,
                               dt_limit, backend.empty(dims.shape("dt_out")),
                               backend.empty(dims.shape("dA_cumsum")), None, None, y)
        varlen_states = backend.empty(states_shape)
        if on_host:  # last before the launch: it waits
            check_vector_values(A, D=D, dt_bias=dt_bias)
            cu_seqlens_values(cu_seqlens, dims.seqlen)
        stream = backend.current_stream()
        word = errors.open_word(backend, "ssd_forward", stream)
        for launch in varlen_launches(dataclasses.replace(arrays, errors=word.array), cu,
                                      varlen_states):
            backend.launch(*launch, stream)
        word.close()
    return y, varlen_states


def varlen_launches(arrays: ForwardArrays, cu_seqlens, varlen_states) -> list[tuple]:
    """[(kernel, grid, args)] of a packed row (run_varlen_forward), the one place they are
    chosen, from shapes and dtypes alone (the compile gate and the reach model plan them on
    stand-ins too): chunk_cumsum (dt_out; it checks A, dt_bias, D and the offsets), then
    ssd_varlen (y and varlen_states; arrays.initial_states is one state per sequence, or
    None)."""
    a = arrays
    return [_cumsum_launch(a, cu_seqlens),
            *ssd_varlen_launches(a.x, a.B, a.C, a.dt_out, a.A, cu_seqlens, a.initial_states, a.D,
                                 a.z, a.y, varlen_states, errors=a.errors)]


def _cumsum_launch(a: ForwardArrays, cu_seqlens=None) -> tuple:
    """The forward's chunk_cumsum launch: dt_out and dA_cumsum; it checks A, dt_bias, D and a
    packed row's offsets."""
    return chunk_cumsum_launch(a.dt, a.A, a.dt_bias, a.dt_out, a.dA_cumsum, a.dt_softplus,
                               a.dt_limit, errors=a.errors, D=a.D, cu_seqlens=cu_seqlens)


def _check_forward_only(*tensors):
    """The packed forward has no backward and no torch.compile op: refuse tensors that require
    grad (no gradient would flow through y) and a torch.compile trace (fake tensors)."""
    import torch
    if any(t is not None and t.requires_grad for t in tensors):
        raise ValueError("cu_seqlens: the packed forward is forward only; inputs that require "
                         "grad are refused (no gradient would flow through y)")
    if torch.compiler.is_compiling():
        raise ValueError("cu_seqlens: the packed forward has no torch.compile op; call it "
                         "outside the compiled region")


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
        torch_op.register(run_forward)


def _check_batch_parts(batch_parts):
    if batch_parts is not None and not (isinstance(batch_parts, int) and batch_parts >= 1):
        raise ValueError(f"batch_parts: must be a positive int or None, got {batch_parts!r}")


def _check_route(route):
    if route is not None and not (isinstance(route, str) and route in ROUTES):
        raise ValueError(f"route: must be one of {ROUTES} or None, got {route!r}")


# ssd_forward's array arguments in order (x, B, C, z read in their own dtype: _NARROW)
INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seq_idx")
# ForwardArrays' inputs in its order (seq_idx as its segment ids) and outputs
FORWARD_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seg")
OUTPUTS = ("dt_out", "dA_cumsum", "chunk_states", "final_states", "y")


def _checked(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_limit,
             batch_parts, route=None):
    """(backend, Dims, dt_limit): every check of the arguments but the values of A, D and
    dt_bias, in the order ssd_forward documents (a ValueError or TypeError naming the
    argument)."""
    _check_batch_parts(batch_parts)
    _check_route(route)
    backend = backend_of(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                         initial_states=initial_states, seq_idx=seq_idx)
    dims = check_forward_args(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                              initial_states=initial_states, seq_idx=seq_idx, dt_limit=dt_limit,
                              float_dtypes=weight_dtypes(x), activation_dtypes=ACTIVATION_DTYPES,
                              check_values=False)
    check_grid(dims.batch, dims.nheads)
    return backend, dims, check_dt_limit(dt_limit)


def prepare_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                    dt_softplus, dt_limit, batch_parts=None, state_dtype=None):
    """(backend, [ForwardPart], y, final_states): ssd_forward's arguments checked (all but the
    values of A, D and dt_bias), made contiguous, its outputs allocated, the batch sliced
    (`batch_parts` slices, or rules_batch_parts' count where None), as the call's launch plan
    does them: the forward's arrays for the tuner and the benchmarks, which launch its parts
    themselves."""
    given = (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx)
    plan = launch_plan(*given[:5], chunk_size, *given[5:], dt_softplus, dt_limit, batch_parts,
                       state_dtype)
    backend = plan.backend
    with backend.on_device():
        a = plan.arrays(given)
    arrays = ForwardArrays(*(a.get(n) for n in FORWARD_INPUTS), dt_softplus,
                           check_dt_limit(dt_limit), *(a.get(n) for n in OUTPUTS))
    return (backend, forward_parts(arrays, backend.sm_count, len(plan.parts)), a["y"],
            a["final_states"])


# --------------------------------------------------------------------------------------------
# The launch plan: what a call of one signature launches, built once per signature


class _Slot:
    """A stand-in for one of a call's arrays while its plan is built: its name, shape, dtype
    name and strides in elements (all the launchers read; None: C-contiguous) and, for a batch
    slice of it, its rows (lo, hi)."""

    __slots__ = ("name", "shape", "dtype", "strides", "rows")

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, strides=None, rows=None):
        self.name, self.shape, self.dtype, self.rows = name, shape, dtype, rows
        self.strides = strides

    def stride(self) -> tuple[int, ...]:
        """The strides in elements, as torch names them (contract.element_strides reads it)."""
        return self.strides or contiguous_strides(self.shape)

    def __getitem__(self, index: slice) -> _Slot:
        lo, hi, _ = index.indices(self.shape[0])
        if (lo, hi) == (0, self.shape[0]):  # the whole batch: the array itself, not a view
            return self
        return _Slot(self.name, (hi - lo, *self.shape[1:]), self.dtype, self.strides, (lo, hi))


@dataclass(frozen=True)
class PlannedLaunch:
    """One launch of a plan: its kernel object and grid, its arguments with None where an
    array goes, and where each array goes: (position, array name, rows or None)."""
    kernel: Any
    grid: tuple[int, int, int]
    args: tuple
    arrays: tuple[tuple[int, str, tuple[int, int] | None], ...]

    def bind(self, values: dict) -> tuple:
        """(kernel, grid, args) with the call's arrays: `values` maps (name, rows) to them."""
        args = list(self.args)
        for at, name, rows in self.arrays:
            args[at] = values[name, rows]
        return self.kernel, self.grid, tuple(args)


@dataclass(frozen=True)
class LaunchPlan:
    """Everything a call of one signature does but allocate and launch: where it runs, which
    inputs it copies (to C-contiguous, where their layout is not one the kernels read in place:
    contract.kernel_layout), the outputs' shapes and whether each has x's dtype (else float32),
    and the launches of each batch slice (kernel objects, grids, tile constants and the tuned
    choice included)."""
    backend: Any
    copies: tuple[str, ...]
    outputs: tuple[tuple[str, tuple[int, ...], bool], ...]
    parts: tuple[tuple[PlannedLaunch, ...], ...]
    # every (array name, rows) the launches take, once
    needs: tuple[tuple[str, tuple[int, int] | None], ...]

    def arrays(self, given: tuple) -> dict:
        """The call's arrays by name, on the current device (the caller makes it the arrays'):
        `given` (ssd_forward's array arguments in INPUTS' order), copied where the plan says
        (copies), the segment ids of seq_idx, and the outputs allocated."""
        backend = self.backend
        arrays = dict(zip(INPUTS, given))
        for name in self.copies:
            arrays[name] = backend.laid_out(arrays[name])
        arrays["seg"] = backend.segment_ids(arrays["seq_idx"])
        for name, shape, like_x in self.outputs:
            arrays[name] = backend.empty(shape, like=arrays["x"] if like_x else None)
        return arrays

    def bind(self, arrays: dict) -> list[list[tuple]]:
        """Each slice's [(kernel, grid, args)] with the call's arrays (by name; batch slices
        of them taken here)."""
        values = {(name, rows): arrays[name] if rows is None else arrays[name][rows[0]:rows[1]]
                  for name, rows in self.needs}
        return [[launch.bind(values) for launch in part] for part in self.parts]


def build_plan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
               seq_idx=None, dt_softplus=False, dt_limit=(0.0, math.inf),
               batch_parts=None, state_dtype=None, *, route=None) -> LaunchPlan:
    """The launch plan of a call with these arguments, checked as ssd_forward checks them (all
    but the values of A, D and dt_bias): the launchers run on stand-ins of its arrays, so the
    plan holds no array and reads no value."""
    backend, dims, dt_limit = _checked(x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                       initial_states, seq_idx, dt_limit, batch_parts, route)
    states = state_dtype_name(state_dtype, x) or STATE_DTYPES[dtype_name(x)]
    given = {n: a for n, a in zip(INPUTS, (x, dt, A, B, C, D, z, dt_bias, initial_states,
                                           seq_idx)) if a is not None}
    copies, slots = [], {}
    for name, a in given.items():
        if name == "seq_idx":  # the kernels read its segment ids, made C-contiguous
            slots["seg"] = _Slot("seg", dims.shape("seq_idx"), "int32")
            continue
        laid_out = kernel_layout(a)
        copies += [] if laid_out else [name]
        slots[name] = _Slot(name, tuple(int(s) for s in a.shape), dtype_name(a),
                            element_strides(a) if laid_out else None)
    # y in x's dtype, the chunk states in `states`, the rest float32
    outputs = tuple((name, dims.shape(name), name == "y" or (name == "chunk_states"
                                                            and states != "float32"))
                    for name in OUTPUTS)
    for name, shape, like_x in outputs:
        slots[name] = _Slot(name, shape, dtype_name(x) if like_x else "float32")
    arrays = ForwardArrays(*(slots.get(n) for n in FORWARD_INPUTS), dt_softplus, dt_limit,
                           *(slots[n] for n in OUTPUTS), errors=_Slot("errors", (1,), "int32"))
    table = tuning_table.table(backend)
    parts = tuple(tuple(PlannedLaunch(kernel, grid, tuple(None if isinstance(a, _Slot) else a
                                                          for a in args),
                                      tuple((at, a.name, a.rows) for at, a in enumerate(args)
                                            if isinstance(a, _Slot)))
                        for kernel, grid, args in forward_launches(part.arrays, part.sm_count,
                                                                   tuned=table, route=route))
                  for part in forward_parts(arrays, backend.sm_count,
                                            _parts(dims, backend, x, slots, batch_parts,
                                                   states, route)))
    needs = tuple(dict.fromkeys((name, rows) for part in parts for launch in part
                                for _, name, rows in launch.arrays))
    # the outputs the launches write (the scan takes no chunk_states), y and final_states always
    needed = {name for name, _ in needs} | {"y", "final_states"}
    outputs = tuple(output for output in outputs if output[0] in needed)
    return LaunchPlan(backend, tuple(copies), outputs, parts, needs)


def _parts(dims, backend, x, slots: dict, batch_parts, states: str, route) -> int:
    """The batch slices of a call: `batch_parts` where given, else rules_batch_parts' count
    (`slots`: the stand-ins of the inputs passed, seq_idx's as "seg"; `states`: the chunk
    states' dtype name; `route`: the call's)."""
    if batch_parts is None:
        optional = [n for n in ("z", "initial_states", "seq_idx")
                    if ("seg" if n == "seq_idx" else n) in slots]
        state_itemsize = 4 if states == "float32" else x.dtype.itemsize
        layouts = {name: (slot.stride()[0], ITEMSIZES[slot.dtype])
                   for name, slot in slots.items() if len(slot.shape) > 1 and name != "seg"}
        batch_parts = rules_batch_parts(dims, backend.kind, x.dtype.itemsize, backend.sm_count,
                                        optional, state_itemsize, layouts=layouts, route=route)
    return min(batch_parts, dims.batch)


# plans kept, by signature (plan_key); the oldest is dropped past MAX_PLANS
MAX_PLANS = 1024
_PLANS: dict[tuple, LaunchPlan] = {}
_PLANS_LOCK = threading.Lock()


def launch_plan(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                seq_idx=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                batch_parts=None, state_dtype=None, *, route=None) -> LaunchPlan:
    """build_plan's plan for these arguments, built once per signature (plan_key) and kept."""
    _check_batch_parts(batch_parts)  # before the key: a key holds only what these checks pass
    _check_route(route)
    key = plan_key(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                   dt_softplus, dt_limit, batch_parts, state_dtype, route=route)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = build_plan(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                          dt_softplus, dt_limit, batch_parts, state_dtype, route=route)
        if key is not None:
            with _PLANS_LOCK:  # another thread's insert must not break the eviction
                if len(_PLANS) >= MAX_PLANS:
                    _PLANS.pop(next(iter(_PLANS)), None)
                _PLANS[key] = plan
    return plan


def plan_key(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus,
             dt_limit, batch_parts, state_dtype=None, *, route=None) -> tuple | None:
    """Everything build_plan reads, hashable: each array's type, shape, strides, dtype and
    device (the device fixes the SM count), chunk_size and batch_parts with their types (256 and
    numpy's 256 are told apart: a plan holds for arguments its checks passed), dt_softplus as
    the launchers read it (bool), dt_limit (checked floats), state_dtype (a dtype object by its
    type and name), the route and the tuned table's version (batch_parts and route checked by
    the caller: hashable); None where an array is of no supported type (no plan is kept:
    build_plan refuses it)."""
    arrays = []
    for a in (x, dt, A, B, C, D, z, dt_bias, initial_states, seq_idx):
        if a is None:
            arrays.append(None)
            continue
        kind = type(a)
        if kind not in _DESCRIBE:
            _DESCRIBE[kind] = _describer(kind)
        describe = _DESCRIBE[kind]
        if describe is None:
            return None
        arrays.append((kind, describe(a)))
    if not (state_dtype is None or isinstance(state_dtype, str)):  # a dtype object, by name
        state_dtype = (type(state_dtype), str(state_dtype))
    return (tuple(arrays), type(chunk_size), chunk_size, bool(dt_softplus), tuple(dt_limit),
            type(batch_parts), batch_parts, state_dtype, route, tuning_table.version())


def _describer(kind: type):
    """A function giving an array's (shape, strides, dtype, device) for arrays of `kind`."""
    module = kind.__module__.partition(".")[0]
    if module == "numpy":
        return lambda a: (a.shape, a.strides, a.dtype)
    if module == "cupy":
        return lambda a: (a.shape, a.strides, a.dtype, a.device.id)
    if module == "torch":
        return lambda a: (a.shape, a.stride(), a.dtype, a.device)
    return None


_DESCRIBE: dict[type, Any] = {}


def forward_plan(arrays: ForwardArrays, sm_count, parts: int, *,
                 route: str | None = None) -> list[list[tuple]]:
    """The launches of one forward as `parts` slices of the batch, by the launchers' rules on
    `route` (None: the rules' route): [forward_launches of each] (forward_parts)."""
    return [forward_launches(*part, route=route)
            for part in forward_parts(arrays, sm_count, parts)]


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


def forward_launches(arrays: ForwardArrays, sm_count, tuned=None, *,
                     route: str | None = None) -> list[tuple]:
    """The launches of one forward, in order: [(kernel, grid, args)].

    Reads only shapes and dtypes (and which optional arrays are given) and the device's SM
    count, so the compile gate derives the specializations ssd_forward uses from here, with
    stand-in arrays. `tuned`: compute_out's tuned choices for the device, or None (the rules).
    `route`: one of ROUTES, or None: the rules' (the scan where kernels.ssd_scan.scan_runs, else
    the chunk states in fwd_pass_state's rules' mode).
    1. chunk_cumsum: dt_out, dA_cumsum (log2 units), (batch, nheads, nchunks, chunk_size); it
       checks A, dt_bias and D
    2. on the scan's route, ssd_scan: y and the final state in one pass through the sequence (no
       chunk_states); else
    2. fwd_pass_state: the state entering every chunk, and the final state (one launch, or two
       when the chunks go in parallel)
    3. compute_out: y (NaN where D is not finite; reported by chunk_cumsum)
    """
    a = arrays
    cumsum = _cumsum_launch(a)
    scan_arrays = (a.x, a.B, a.C, a.dt_out, a.dA_cumsum, a.initial_states, a.D, a.z, a.seg,
                   a.y, a.final_states)
    if route is None and scan_runs(a.x, a.B, a.dt_out, scan_arrays, sm_count):
        route = "scan"
    if route == "scan":  # asked for: refused where it cannot run, before anything is allocated
        if not scan_fits(int(a.B.shape[3]), scan_arrays):
            raise ValueError(f"route: the scan holds a dstate tile of at most {SCAN_MAX_DSTATE} "
                             f"and indexes in int32, got dstate {int(a.B.shape[3])} "
                             f"({'int64' if needs_int64(*scan_arrays) else 'int32'} indices)")
        return [cumsum, ssd_scan_launch(*scan_arrays, sm_count, errors=a.errors,
                                        check_D=False)]
    return [
        cumsum,
        *fwd_pass_state_launches(a.x, a.B, a.dt_out, a.dA_cumsum, a.initial_states, a.seg,
                                 a.chunk_states, a.final_states, sm_count,
                                 mode=ROUTE_MODES.get(route)),
        compute_out_launch(*a.compute_out_arrays(), sm_count, tuned, errors=a.errors,
                           check_D=False),
    ]
