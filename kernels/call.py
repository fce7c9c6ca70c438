"""A call of ssd_forward: its arguments as given (Call, built once per call) and their checks
(validate: every shape, dtype, device and option, run once per signature: kernels.plan keeps
what it finds)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from contract import (ACTIVATION_DTYPES, Dims, check_cu_seqlens, check_dt_limit,
                      check_forward_args, dtype_name, state_dtype_name, weight_dtypes)
from kernels import errors
from kernels.arrays import GRID_YZ_MAX, Backend, backend_of, check_grid
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
    """What validate finds: where the call runs, its dimensions, its options and, for a packed
    row, its number of sequences (else None)."""
    backend: Backend
    dims: Dims
    options: Options
    num_seqs: int | None


def options(call: Call) -> Options:
    """The call's options checked, in the order ssd_forward documents (a ValueError or TypeError
    naming the option), state_dtype last (as x's dtype allows: x is read for its dtype only)."""
    return _options(call, _flags(call))


def _options(call: Call, dt_limit: tuple[float, float]) -> Options:
    """The Options of a call whose flags are checked (`dt_limit`: _flags'), state_dtype checked
    here: the chunk states' dtype name, or STATE_DTYPES' for x's dtype."""
    states = state_dtype_name(call.state_dtype, call.x) or STATE_DTYPES[dtype_name(call.x)]
    return Options(bool(call.dt_softplus), dt_limit, call.check_values, call.batch_parts,
                   call.route, states)


def _flags(call: Call) -> tuple[float, float]:
    """The checked dt_limit, after check_values, the returns, batch_parts and route (refused
    with cu_seqlens, which has one route and one batch element)."""
    c = call
    errors.check_flag(c.check_values)
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
    return check_dt_limit(c.dt_limit)


def validate(call: Call) -> Checked:
    """Every check of a call but those that read values (of A, D, dt_bias, and of cu_seqlens
    and seq_idx with it), in the order ssd_forward documents: its options (state_dtype last,
    once x's dtype is known good), then where its arrays lie (one kind, one device), their
    shapes and dtypes, the grid's limits; a ValueError or TypeError naming the argument."""
    c = call
    dt_limit = _flags(c)
    packed = c.cu_seqlens is not None
    backend = backend_of(x=c.x, dt=c.dt, A=c.A, B=c.B, C=c.C, D=c.D, z=c.z, dt_bias=c.dt_bias,
                         initial_states=c.initial_states, seq_idx=c.seq_idx,
                         cu_seqlens=c.cu_seqlens)
    dims = check_forward_args(c.x, c.dt, c.A, c.B, c.C, c.chunk_size, D=c.D, z=c.z,
                              dt_bias=c.dt_bias,
                              initial_states=None if packed else c.initial_states,
                              seq_idx=c.seq_idx, dt_limit=dt_limit,
                              float_dtypes=weight_dtypes(c.x),
                              activation_dtypes=ACTIVATION_DTYPES, check_values=False)
    num_seqs = None
    if packed:  # initial_states: one state per sequence
        num_seqs = check_cu_seqlens(c.cu_seqlens, dims, c.initial_states,
                                    float_dtypes=weight_dtypes(c.x))
        if num_seqs > GRID_YZ_MAX:
            raise ValueError(f"cu_seqlens: at most {GRID_YZ_MAX} sequences (a grid axis), got "
                             f"{num_seqs}")
    checked = _options(c, dt_limit)
    check_grid(dims.batch, dims.nheads)
    return Checked(backend, dims, checked, num_seqs)

