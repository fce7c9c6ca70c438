"""ssd_forward on torch CUDA tensors as a torch.library custom op, `cutile_ssd::ssd_forward`.

torch.compile traces a call as one node of its graph (no graph break): the fake implementation
gives the outputs' shapes and dtypes without running anything, the real one is the forward's
own (kernels.ssd_forward.run_forward, handed to `register` when kernels.ssd_forward is imported:
this module sits below the forward and imports none of it; registering then, not on a first
call, lets a first call that torch.compile traces find the op). Forward only: a backward through
it raises a RuntimeError saying so, never a wrong gradient. Imported only where torch is
installed (an optional dependency).
"""

from collections.abc import Callable
from typing import Optional

import torch

OP = "cutile_ssd::ssd_forward"

# check_values as the op's int argument (its schema has no Optional[bool])
CHECK_CODE = {False: 0, True: 1, None: 2}
_CHECK = {code: value for value, code in CHECK_CODE.items()}
_REGISTERED: list = []  # the op, once registered


def register(run_forward: Callable):
    """Register torch.ops.cutile_ssd.ssd_forward with `run_forward` (ssd_forward's work:
    (y, final_states)) as its implementation; once per process."""
    if not _REGISTERED:
        _register(run_forward)


def _register(run_forward: Callable):
    @torch.library.custom_op(OP, mutates_args=())
    def op(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
           chunk_size: int, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
           dt_bias: Optional[torch.Tensor], initial_states: Optional[torch.Tensor],
           seq_idx: Optional[torch.Tensor], dt_softplus: bool, dt_min: float, dt_max: float,
           check_values: int, batch_parts: int, state_dtype: str,
           route: str) -> tuple[torch.Tensor, torch.Tensor]:
        return run_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                           dt_softplus, (dt_min, dt_max), _CHECK[check_values],
                           batch_parts or None, state_dtype or None, route or None)

    @op.register_fake
    def _(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, dt_softplus,
          dt_min, dt_max, check_values, batch_parts, state_dtype, route):
        batch, _, nheads, headdim = x.shape
        return (x.new_empty(x.shape),
                x.new_empty((batch, nheads, headdim, B.shape[3]), dtype=torch.float32))

    def backward(ctx, grad_y, grad_final):
        raise RuntimeError(f"{OP} (kernels.ssd_forward) is forward only: it has no backward")

    torch.library.register_autograd(OP, backward,
                                    setup_context=lambda ctx, inputs, output: None)
    _REGISTERED.append(torch.ops.cutile_ssd.ssd_forward)


def ssd_forward(run_forward: Callable, x, dt, A, B, C, chunk_size, D, z, dt_bias,
                initial_states, seq_idx, dt_softplus, dt_limit, check_values, batch_parts,
                state_dtype: Optional[str], route: Optional[str]):
    """(y, final_states): through the custom op where torch.compile traces the call or autograd
    records it (its backward then refuses), else run_forward itself (the op's dispatch would only
    add host time to an eager call). `state_dtype`: a dtype name, or None; `route`: one of
    kernels.ssd_forward.ROUTES, or None."""
    grad = torch.is_grad_enabled() and any(
        a is not None and a.requires_grad for a in (x, dt, A, B, C, D, z, dt_bias, initial_states))
    if not (grad or torch.compiler.is_compiling()):
        return run_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                           dt_softplus, dt_limit, check_values, batch_parts, state_dtype, route)
    lo, hi = dt_limit
    return _REGISTERED[0](
        x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx, bool(dt_softplus),
        float(lo), float(hi), CHECK_CODE[check_values], batch_parts or 0, state_dtype or "",
        route or "")
