"""The plan of a call: everything a call of one signature does but allocate and launch, built and
validated on the signature's first call (build), kept by its key (plan_of), then bound to each
call's arrays (Plan.arrays, Plan.bind)."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from contract import check_seq_idx_of_offsets, check_vector_values, cu_seqlens_values
from kernels import tuning_table
from kernels.call import INPUTS, Call, Options, validate
from kernels.launches import (FORWARD_OUTPUTS, ForwardArrays, ForwardPart, Slot, call_launches,
                              forward_parts)


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
class Plan:
    """Everything a call of one signature does but allocate and launch: where it runs, its
    checked options, which inputs it copies (to C-contiguous, where their layout is not one the
    kernels read in place: contract.kernel_layout), the outputs' shapes and whether each has
    x's dtype (else float32), and the launches of each batch slice (kernel objects, grids, tile
    constants and the tuned choice included). `offsets`: a packed row's seqlen (its offsets'
    bound), None for a batch; `on_host`: whether a call checks the values of A, D, dt_bias
    (and a packed row's offsets) on the host before its launch."""
    backend: Any
    options: Options
    copies: tuple[str, ...]
    outputs: tuple[tuple[str, tuple[int, ...], bool], ...]
    parts: tuple[tuple[PlannedLaunch, ...], ...]
    # every (array name, rows) the launches take, once
    needs: tuple[tuple[str, tuple[int, int] | None], ...]
    offsets: int | None
    on_host: bool

    def arrays(self, call: Call) -> dict:
        """The call's arrays by name, on the current device (the caller makes it the arrays'):
        its inputs, copied where the plan says (copies), the segment ids of seq_idx or a packed
        row's int32 offsets, and the outputs allocated (Backend.call_arrays)."""
        arrays = {name: getattr(call, name) for name in INPUTS}
        return self.backend.call_arrays(arrays, copies=self.copies, outputs=self.outputs,
                                        offsets=self.offsets, cu_seqlens=call.cu_seqlens)

    def check_values(self, call: Call, arrays: dict):
        """The host's checks of the values (a GPU copy waits): A, D and dt_bias; a packed row's
        offsets and, where given, its seq_idx against them."""
        check_vector_values(arrays["A"], D=arrays["D"], dt_bias=arrays["dt_bias"])
        if self.offsets is not None:
            offsets = cu_seqlens_values(call.cu_seqlens, self.offsets)
            if call.seq_idx is not None:
                check_seq_idx_of_offsets(call.seq_idx, offsets)

    def bind(self, arrays: dict) -> list[list[tuple]]:
        """Each slice's [(kernel, grid, args)] with the call's arrays (by name; batch slices
        of them taken here)."""
        values = {(name, rows): arrays[name] if rows is None else arrays[name][rows[0]:rows[1]]
                  for name, rows in self.needs}
        return [[launch.bind(values) for launch in part] for part in self.parts]

    def forward_parts(self, arrays: dict) -> list[ForwardPart]:
        """The batch slices of a call's arrays (Plan.arrays; the error word where set), for
        callers that launch them with other choices (the tuner, the benchmarks)."""
        forward = ForwardArrays.of(arrays, self.options.dt_softplus, self.options.dt_limit)
        return forward_parts(forward, self.backend.sm_count, len(self.parts))


def build(call: Call) -> Plan:
    """The plan of a call with these arguments, validated (kernels.call.validate: all but the
    values): the launchers run on stand-ins of its arrays (kernels.launches.call_launches), so
    the plan holds no array and reads no value; what they refuse (an array past their index
    width, a route that cannot run) is refused here, before anything is allocated. One call
    into each module."""
    backend, args, options = validate(call)
    dims, shapes, num_seqs = args.dims, args.shapes, args.num_seqs
    dtype = args.layouts["x"].dtype
    # seq_idx is read through its segment ids, made C-contiguous whatever its strides
    copies = tuple(name for name, layout in args.layouts.items()
                   if layout.strides is None and name != "seq_idx")
    if num_seqs is None:
        # y in x's dtype, the chunk states in the options' dtype, the rest float32
        outputs = tuple((name, shapes[name], name == "y" or (
            name == "chunk_states" and options.state_dtype != "float32"))
            for name in FORWARD_OUTPUTS)
    else:
        # a packed row: no chunk states; one state per sequence
        outputs = (("y", shapes["y"], True), ("dt_out", shapes["dt_out"], False),
                   ("dA_cumsum", shapes["dA_cumsum"], False),
                   ("varlen_states", (num_seqs, dims.nheads, dims.headdim, dims.dstate), False))
    launches = call_launches(
        dims, args.layouts,
        {name: (shape, dtype if like_x else "float32") for name, shape, like_x in outputs},
        kind=backend.kind, sm_count=backend.sm_count, num_seqs=num_seqs,
        dt_softplus=options.dt_softplus, dt_limit=options.dt_limit,
        tuned=tuning_table.table(backend) if num_seqs is None else None, route=options.route,
        batch_parts=options.batch_parts)
    parts = tuple(tuple(PlannedLaunch(kernel, grid, tuple(None if isinstance(a, Slot) else a
                                                          for a in values),
                                      tuple((at, a.name, a.rows) for at, a in enumerate(values)
                                            if isinstance(a, Slot)))
                        for kernel, grid, values in part) for part in launches)
    needs = tuple(dict.fromkeys((name, rows) for part in parts for launch in part
                                for _, name, rows in launch.arrays))
    # the outputs the launches write (the scan takes no chunk_states), y and final_states always
    needed = {name for name, _ in needs} | {"y", "final_states"}
    outputs = tuple(output for output in outputs if output[0] in needed)
    on_host = (backend.kind == "numpy" if options.check_values is None
               else options.check_values)
    return Plan(backend, options, copies, outputs, parts, needs,
                None if num_seqs is None else dims.seqlen, on_host)


# plans kept, by signature (key); the oldest is dropped past MAX_PLANS
MAX_PLANS = 1024
_PLANS: dict[tuple, Plan] = {}
_PLANS_LOCK = threading.Lock()


def plan_of(call: Call) -> Plan:
    """build's plan for this call, built once per signature (key) and kept: a call whose
    signature has a plan runs no check (an option that cannot be hashed is checked and planned
    on every call)."""
    signature = key(call)
    try:
        plan = _PLANS.get(signature)
    except TypeError:
        signature = plan = None
    if plan is None:
        plan = build(call)
        if signature is not None:
            with _PLANS_LOCK:  # another thread's insert must not break the eviction
                if len(_PLANS) >= MAX_PLANS:
                    _PLANS.pop(next(iter(_PLANS)), None)
                _PLANS[signature] = plan
    return plan


def key(call: Call) -> tuple | None:
    """Everything build reads, as given: each array's type, shape, strides, dtype and device
    (the device fixes the SM count), each option with its type (256 and numpy's 256 compare
    equal but are checked apart; a plan holds for the arguments its checks passed), and the
    tuned table's version; None where an array is of no supported type (no plan is kept:
    build refuses it). An unhashable option (but a list dt_limit) makes a key that cannot be
    looked up."""
    arrays = []
    for a in (call.x, call.dt, call.A, call.B, call.C, call.D, call.z, call.dt_bias,
              call.initial_states, call.seq_idx, call.cu_seqlens):
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
    c = call
    # a list dt_limit is keyed as its tuple (its type kept): it is checked as the same values
    dt_limit = tuple(c.dt_limit) if type(c.dt_limit) is list else c.dt_limit
    return (tuple(arrays),
            type(c.chunk_size), c.chunk_size,
            type(c.dt_softplus), c.dt_softplus,
            type(c.dt_limit), dt_limit,
            type(c.return_final_states), c.return_final_states,
            type(c.return_varlen_states), c.return_varlen_states,
            type(c.check_values), c.check_values,
            type(c.batch_parts), c.batch_parts,
            type(c.state_dtype), c.state_dtype,
            type(c.route), c.route,
            tuning_table.version())


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
