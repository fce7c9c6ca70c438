"""The forward's launches: what each of ssd_forward's routes launches, in order, chosen from the
arrays' shapes and dtypes and the device's SM count alone (kernels.plan runs these on stand-ins
of a call's arrays once per signature; the compile gate and the reach model run them on their
own stand-ins): the batch slices (rules_batch_parts, forward_parts), a slice's launches
(forward_launches) and a packed row's (varlen_launches)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

from contract import Dims, contiguous_strides, element_strides
from kernels.arrays import needs_int64
from kernels.chunk_cumsum import chunk_cumsum_launch
from kernels.compute_out import compute_out_launch
from kernels.fwd_pass_state import fwd_pass_state_launches, in_order_programs
from kernels.ssd_scan import SCAN_MAX_DSTATE, scan_fits, scan_runs, ssd_scan_launches
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

# The forward's routes (ssd_forward's `route`; None: the rules choose, forward_launches): the
# scan, or the chunk states through memory, fwd_pass_state's chunks in order or in parallel
# (then its state pass), then compute_out. Every route computes the same forward within the
# same bounds (properties/bounds.py); the rules pick by speed and the device's SM count.
ROUTES = ("scan", "chunks_in_order", "chunks_parallel")
# fwd_pass_state's mode on each route of the chunk states
ROUTE_MODES = {"chunks_in_order": "in_order", "chunks_parallel": "parallel_chunks"}


# ForwardArrays' inputs in its order (seq_idx as its segment ids) and outputs
FORWARD_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seg")
FORWARD_OUTPUTS = ("dt_out", "dA_cumsum", "chunk_states", "final_states", "y")


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

    @classmethod
    def of(cls, arrays: dict, dt_softplus: bool, dt_limit: tuple[float, float]) -> ForwardArrays:
        """The forward of a call's arrays by name (absent ones None; "errors": the error
        word)."""
        return cls(*(arrays.get(n) for n in FORWARD_INPUTS), dt_softplus, dt_limit,
                   *(arrays.get(n) for n in FORWARD_OUTPUTS), errors=arrays.get("errors"))

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
    stand_in = lambda name: Slot(name, dims.shape(name), "float32")
    return scan_runs(stand_in("x"), stand_in("B"), stand_in("dt_out"), (), sm_count)


# the item sizes of the dtypes a call's arrays may have
ITEMSIZES = {"float32": 4, "bfloat16": 2, "float16": 2, "int32": 4}
# every batch-first array of a call without options; z, initial_states, seq_idx where given
_BATCH_FIRST = ("x", "dt", "B", "C", "y", "dt_out", "dA_cumsum", "chunk_states", "final_states")
_NARROW = ("x", "B", "C", "z", "y")


class Slot:
    """A stand-in for one of a call's arrays while its launches are chosen (kernels.plan): its
    name, shape, dtype name, item size and strides in bytes (NumPy's names: the launchers read
    them through contract.element_strides as any array's, with no call back into this module)
    and, for a batch slice of it, its rows (lo, hi)."""

    __slots__ = ("name", "shape", "dtype", "itemsize", "strides", "rows")

    def __init__(self, name: str, shape: tuple[int, ...], dtype: str, strides=None, rows=None):
        """`strides`: in elements; None: C-contiguous."""
        self.name, self.shape, self.dtype, self.rows = name, shape, dtype, rows
        self.itemsize = ITEMSIZES[dtype]
        self.strides = tuple(s * self.itemsize for s in strides or contiguous_strides(shape))

    def __getitem__(self, index: slice) -> Slot:
        lo, hi, _ = index.indices(self.shape[0])
        if (lo, hi) == (0, self.shape[0]):  # the whole batch: the array itself, not a view
            return self
        return Slot(self.name, (hi - lo, *self.shape[1:]), self.dtype, element_strides(self),
                    (lo, hi))


def call_launches(dims: Dims, layouts: dict, outputs: dict, *, kind: str, sm_count: int,
                  num_seqs: int | None, dt_softplus: bool, dt_limit: tuple[float, float],
                  tuned=None, route: str | None = None,
                  batch_parts: int | None = None) -> list[list[tuple]]:
    """A call's launches on stand-ins (Slot) of its arrays, [[(kernel, grid, args)] of each
    batch slice]: kernels.plan's one call into this module. `dims`: the call's (contract.Dims);
    `dt_softplus`, `dt_limit`: its checked options, as chunk_cumsum takes them; `layouts`: each
    array argument given, (shape, dtype name, strides in elements, None where it is copied
    C-contiguous: contract.Layout), seq_idx read as its int32 segment ids; `outputs`: each
    output's (shape, dtype name); `kind`, `sm_count`: the backend's; `num_seqs`: a packed
    row's sequences (varlen_launches), else None: the batch as batch_parts slices (None:
    rules_batch_parts' count), each sliced forward_launches on `route` with compute_out's
    `tuned` choices."""
    slots = {}
    for name, (shape, dtype, strides) in layouts.items():
        if name != "seq_idx":
            slots[name] = Slot(name, shape, dtype, strides)
        elif num_seqs is None:  # the kernels read its segment ids, made C-contiguous
            slots["seg"] = Slot("seg", shape, "int32")
    for name, (shape, dtype) in outputs.items():
        slots[name] = Slot(name, shape, dtype)
    slots["errors"] = Slot("errors", (1,), "int32")
    arrays = ForwardArrays.of(slots, dt_softplus, dt_limit)
    if num_seqs is not None:
        return [varlen_launches(arrays, Slot("cu_seqlens", (num_seqs + 1,), "int32"),
                                slots["varlen_states"])]
    if batch_parts is None:
        given = [n for n in ("z", "initial_states", "seq_idx")
                 if ("seg" if n == "seq_idx" else n) in slots]
        batch_layouts = {name: (element_strides(slot)[0], slot.itemsize)
                         for name, slot in slots.items() if len(slot.shape) > 1 and name != "seg"}
        batch_parts = rules_batch_parts(dims, kind, slots["x"].itemsize, sm_count, given,
                                        slots["chunk_states"].itemsize, layouts=batch_layouts,
                                        route=route)
    return part_launches(arrays, sm_count, min(batch_parts, dims.batch), tuned=tuned,
                         route=route)


def part_launches(arrays: ForwardArrays, sm_count, parts: int, *, tuned=None,
                  route: str | None = None) -> list[list[tuple]]:
    """The launches of one forward as `parts` slices of the batch, by the launchers' rules on
    `route` (None: the rules' route) with compute_out's `tuned` choices (None: the rules'):
    [forward_launches of each] (forward_parts)."""
    return [forward_launches(*part, tuned, route=route)
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
        return [cumsum, *ssd_scan_launches(*scan_arrays, sm_count, errors=a.errors,
                                           check_D=False)]
    return [
        cumsum,
        *fwd_pass_state_launches(a.x, a.B, a.dt_out, a.dA_cumsum, a.initial_states, a.seg,
                                 a.chunk_states, a.final_states, sm_count,
                                 mode=ROUTE_MODES.get(route)),
        compute_out_launch(*a.compute_out_arrays(), sm_count, tuned, errors=a.errors,
                           check_D=False),
    ]


def varlen_launches(arrays: ForwardArrays, cu_seqlens, varlen_states) -> list[tuple]:
    """[(kernel, grid, args)] of a packed row (ssd_forward with cu_seqlens), the one place they are
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
