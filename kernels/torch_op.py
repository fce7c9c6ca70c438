"""ssd_forward on torch CUDA tensors as a torch.library custom op, `cutile_ssd::ssd_forward`.

torch.compile traces a call as one node of its graph (no graph break): the fake implementation
gives the outputs' shapes and dtypes without running anything, the real one is the forward's
own (kernels.ssd_forward.run, handed to `register` when kernels.ssd_forward is imported: this
module sits below the forward; registering then, not on a first call, lets a first call that
torch.compile traces find the op). The op's schema is the one place a call's arguments are
flattened: the options checked (kernels.call.options), dt_limit as two floats. Forward only: a
backward through it raises a RuntimeError saying so, never a wrong gradient. Imported only where
torch is installed (an optional dependency).
"""

from collections.abc import Callable
from typing import Optional

import torch

from kernels.call import Call, options

OP = "cutile_ssd::ssd_forward"

# check_values as the op's int argument (its schema has no Optional[bool])
CHECK_CODE = {False: 0, True: 1, None: 2}
_CHECK = {code: value for value, code in CHECK_CODE.items()}
_REGISTERED: list = []  # the op, once registered


def register(run: Callable):
    """Register torch.ops.cutile_ssd.ssd_forward with `run` (ssd_forward's work: a Call in, its
    arrays by name out) as its implementation; once per process."""
    if not _REGISTERED:
        _register(run)


def _register(run: Callable):
    @torch.library.custom_op(OP, mutates_args=())
    def op(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
           chunk_size: int, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
           dt_bias: Optional[torch.Tensor], initial_states: Optional[torch.Tensor],
           seq_idx: Optional[torch.Tensor], dt_softplus: bool, dt_min: float, dt_max: float,
           check_values: int, batch_parts: int, state_dtype: str,
           route: str) -> tuple[torch.Tensor, torch.Tensor]:
        arrays = run(Call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                          dt_softplus=dt_softplus, dt_limit=(dt_min, dt_max),
                          check_values=_CHECK[check_values], batch_parts=batch_parts or None,
                          state_dtype=state_dtype or None, route=route or None))
        return arrays["y"], arrays["final_states"]

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


def forward(run: Callable, call: Call) -> dict:
    """A call of torch tensors: through the custom op where torch.compile traces it or autograd
    records it (its backward then refuses), else `run` itself (the op's dispatch would only add
    host time to an eager call). A packed row (cu_seqlens) has no op: refused by name where
    either would need one. Arguments the op's schema cannot take (a chunk_size that is not an
    int, an array that is not a tensor) run through `run`, which refuses them by name."""
    c = call
    tensors = (c.x, c.dt, c.A, c.B, c.C, c.D, c.z, c.dt_bias, c.initial_states)
    requires_grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in tensors)
    if c.cu_seqlens is not None:
        if requires_grad:
            raise ValueError("cu_seqlens: the packed forward is forward only; inputs that "
                             "require grad are refused (no gradient would flow through y)")
        if torch.compiler.is_compiling():
            raise ValueError("cu_seqlens: the packed forward has no torch.compile op; call it "
                             "outside the compiled region")
        return run(call)
    flat = isinstance(c.chunk_size, int) and all(
        a is None or isinstance(a, torch.Tensor) for a in (*tensors, c.seq_idx))
    grad = torch.is_grad_enabled() and requires_grad
    if not flat or not (grad or torch.compiler.is_compiling()):
        return run(call)
    checked = options(call)
    lo, hi = checked.dt_limit
    y, final_states = _REGISTERED[0](
        c.x, c.dt, c.A, c.B, c.C, c.chunk_size, c.D, c.z, c.dt_bias, c.initial_states, c.seq_idx,
        checked.dt_softplus, lo, hi, CHECK_CODE[checked.check_values],
        checked.batch_parts or 0, checked.state_dtype, checked.route or "")
    return {"y": y, "final_states": final_states}
