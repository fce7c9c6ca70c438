"""A call of ssd_forward: its arguments as given (Call, built once per call) and their checks
(validate: every shape, dtype, device and option, run once per signature: kernels.plan keeps
what it finds)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from contract import (ForwardArgs, check_call, check_dt_limit, check_flag, dtype_name,
                      state_dtype_name)
from kernels.arrays import Backend, backend_of
from kernels.launches import ROUTES

# The dtype the chunk states are stored in between fwd_pass_state and compute_out where the call
# leaves state_dtype None, by the activations' dtype: bfloat16 for bfloat16 (half the states'
# traffic), float32 else (float16 states would overflow past 65504); DECISIONS.md "Chunk
# states' dtype".
STATE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}

# ssd_forward's array arguments in order (x, B, C, z read in their own dtype), cu_seqlens aside
INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "seq_idx")


class Call(NamedTuple):
    """ssd_forward's arguments as the caller gave them, in its order (nothing checked)."""
    x: Any
    dt: Any
    A: Any
    B: Any
    C: Any
    chunk_size: Any
    D: Any = None
    z: Any = None
    dt_bias: Any = None
    initial_states: Any = None
    seq_idx: Any = None
    cu_seqlens: Any = None
    dt_softplus: Any = False
    dt_limit: Any = (0.0, math.inf)
    return_final_states: Any = False
    return_varlen_states: Any = False
    check_values: Any = None
    batch_parts: Any = None
    state_dtype: Any = None
    route: Any = None


class Options(NamedTuple):
    """A call's options, checked: dt_softplus as the launchers read it, dt_limit as floats,
    check_values (None, True or False), batch_parts and route (None: the rules'), the chunk
    states' dtype name (STATE_DTYPES' where the call leaves it None)."""
    dt_softplus: bool
    dt_limit: tuple[float, float]
    check_values: bool | None
    batch_parts: int | None
    route: str | None
    state_dtype: str


class Checked(NamedTuple):
    """What validate finds: where the call runs, what the contract finds of its arguments
    (contract.ForwardArgs: dimensions, layouts, a packed row's number of sequences) and its
    options."""
    backend: Backend
    args: ForwardArgs
    options: Options


def options(call: Call) -> Options:
    """The call's options checked, in the order ssd_forward documents (a ValueError or TypeError
    naming the option), state_dtype last (as x's dtype allows: x is read for its dtype only):
    for the torch op's schema (kernels.torch_op), which takes them without the arrays' checks."""
    _flags(call)
    check_flag(call.check_values)
    dt_limit = check_dt_limit(call.dt_limit)
    return _options(call, dt_limit, state_dtype_name(call.state_dtype, call.x), dtype_name(call.x))


def _options(call: Call, dt_limit: tuple[float, float], state_dtype: str | None,
             dtype: str) -> Options:
    """The Options of a call whose options are checked: `state_dtype` its checked name (None:
    STATE_DTYPES' for the activations' dtype `dtype`)."""
    return Options(bool(call.dt_softplus), dt_limit, call.check_values, call.batch_parts,
                   call.route, state_dtype or STATE_DTYPES[dtype])


def _flags(call: Call):
    """The options only the forward's routes read: the returns, batch_parts and route (refused
    with cu_seqlens, which has one route and one batch element)."""
    c = call
    if c.return_varlen_states and c.cu_seqlens is None:
        raise ValueError("return_varlen_states: needs cu_seqlens (the sequences' offsets)")
    if c.cu_seqlens is not None:
        if c.return_final_states:
            raise ValueError("return_final_states: with cu_seqlens each sequence has its own "
                             "final state: pass return_varlen_states=True instead")
        if c.batch_parts is not None:
            raise ValueError("batch_parts: a packed row (cu_seqlens) is one batch element")
        if c.route is not None:
            raise ValueError("route: a packed row (cu_seqlens) has one route (chunk_cumsum, "
                             "then ssd_varlen)")
    if c.batch_parts is not None and not (isinstance(c.batch_parts, int)
                                          and c.batch_parts >= 1):
        raise ValueError(f"batch_parts: must be a positive int or None, got {c.batch_parts!r}")
    if c.route is not None and not (isinstance(c.route, str) and c.route in ROUTES):
        raise ValueError(f"route: must be one of {ROUTES} or None, got {c.route!r}")


def validate(call: Call) -> Checked:
    """Every check of a call but those that read values (of A, D, dt_bias, and of cu_seqlens
    and seq_idx with it), in the order ssd_forward documents: the options the routes read
    (_flags), where its arrays lie (one kind, one device: kernels.arrays.backend_of), then the
    contract's checks (contract.check_call: check_values, dt_limit, shapes and dtypes, a packed
    row's offsets, state_dtype, the grid's limits); a ValueError or TypeError naming the
    argument. One call into each module."""
    c = call
    _flags(c)
    backend = backend_of(x=c.x, dt=c.dt, A=c.A, B=c.B, C=c.C, D=c.D, z=c.z, dt_bias=c.dt_bias,
                         initial_states=c.initial_states, seq_idx=c.seq_idx,
                         cu_seqlens=c.cu_seqlens)
    args = check_call(c.x, c.dt, c.A, c.B, c.C, c.chunk_size, D=c.D, z=c.z, dt_bias=c.dt_bias,
                      initial_states=c.initial_states, seq_idx=c.seq_idx,
                      cu_seqlens=c.cu_seqlens, dt_limit=c.dt_limit,
                      check_values=c.check_values, state_dtype=c.state_dtype)
    return Checked(backend, args, _options(c, args.dt_limit, args.state_dtype,
                                           args.layouts["x"].dtype))
