"""Running a case: a problem's arrays on a backend (the CPU interpreter's NumPy arrays, CuPy, or
torch for bfloat16 on the GPU), laid out as its layout says (on_backend), and a kernel or the
forward run on them with every output pre-filled with NaN (run_on, run_filled, forward)."""

from __future__ import annotations

import contextlib
import math

import ml_dtypes
import numpy as np

from kernels import ssd_forward
from kernels.arrays import Backend, gpu_available
from kernels.call import Call
from kernels.plan import plan_of
from properties.strategies import (LAID_OUT, Problem, conv_columns, projection_columns,
                                   to_backend)

BACKENDS = ("interpreter", "gpu")


def resolve_backend(choice: str) -> str:
    """'gpu' or 'interpreter' for a command line's --backend (auto: GPU if one is present),
    with the same device detection as pytest's `backend` fixture (conftest.py)."""
    if choice == "auto":
        return "gpu" if gpu_available() else "interpreter"
    if choice == "gpu" and not gpu_available():
        raise SystemExit("--backend gpu was asked for but no CUDA device is available")
    return choice


# --------------------------------------------------------------------------------------------
# Arrays on the backend, kernels with NaN-filled outputs


def to_host(a) -> np.ndarray:
    """A host NumPy copy (a torch bfloat16 tensor as ml_dtypes' bfloat16, the same bits)."""
    if hasattr(a, "get"):
        return a.get()
    if hasattr(a, "detach"):
        import torch
        if a.dtype == torch.bfloat16:
            return a.detach().view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
        return a.detach().cpu().numpy()
    return np.asarray(a)


@contextlib.contextmanager
def outputs_filled_with(value: float):
    """Within the block, every float output the launchers allocate (Backend.empty) is filled
    with `value` first: NaN makes an element no program writes fail every comparison (an int32
    one, the segmented scan's flags where nothing reads them, is left as allocated)."""
    empty = Backend.empty

    def filled(self, shape, like=None, dtype=None):
        out = empty(self, shape, like, dtype)
        if dtype is None:
            out[...] = value
        return out
    Backend.empty = filled
    try:
        yield
    finally:
        Backend.empty = empty


def run_on(kernel, backend: str, *args, laid_out_as: Problem | None = None, **kwargs):
    """`kernel` on backend copies of the arguments (C-contiguous; those that are arrays of
    problem `laid_out_as` laid out as its layout says: on_backend), every output pre-filled with
    NaN (an element the kernel fails to write cannot pass); outputs back as NumPy arrays."""
    views = {} if laid_out_as is None else {
        id(getattr(laid_out_as, n)): a for n, a in on_backend(laid_out_as, backend).items()
        if a is not None}

    def move(a):
        if not isinstance(a, np.ndarray):
            return a
        return views[id(a)] if id(a) in views else to_backend(a, backend)
    return run_filled(kernel, *map(move, args), **{k: move(v) for k, v in kwargs.items()})


def run_filled(kernel, *args, **kwargs):
    """`kernel` on arguments already on the backend, every output pre-filled with NaN; outputs
    back as NumPy arrays."""
    with outputs_filled_with(math.nan):
        out = kernel(*args, **kwargs)
    return tuple(to_host(o) for o in out) if isinstance(out, tuple) else to_host(out)


def on_backend(p: Problem, backend: str, names=Problem.ARRAYS) -> dict:
    """p's arrays `names` (None where absent) on `backend`, laid out as p.layout says
    (strategies.LAYOUTS): those it lays out are views of a larger array built on the backend,
    whose other elements are NaN (-1 for seq_idx), so that a kernel reading past a view's
    elements cannot pass; the others C-contiguous copies (to_backend)."""
    present = {n: getattr(p, n) for n in names if getattr(p, n) is not None}
    laid = {n: a for n, a in present.items() if n in LAID_OUT[p.layout]}
    out = {n: None for n in names} | {n: to_backend(a, backend) for n, a in present.items()
                                      if n not in laid}
    if p.layout in ("projection", "token_major"):
        d = p.dims
        # token-major x, B, C: channels of one (batch, channels, seqlen) array, transposed
        conv = {n: a for n, a in laid.items()
                if p.layout == "token_major" and n in conv_columns(d)}
        rest = {n: a for n, a in laid.items() if n not in conv}
        return (out | _column_views(conv, conv_columns(d), backend, tokens_last=True)
                | _column_views(rest, projection_columns(d), backend, tokens_last=False))
    # a slice [1:] of the batch axis or of the token axis of an array one longer there
    axis = 0 if p.layout == "batch_slice" else 1
    index = (slice(None),) * axis + (slice(1, None),)
    for n, a in laid.items():
        shape = list(a.shape)
        shape[axis] += 1
        whole = np.full(shape, _outside(a.dtype), a.dtype)
        whole[index] = a
        out[n] = to_backend(whole, backend)[index]
    return out


def _column_views(arrays: dict, columns: dict, backend: str, tokens_last: bool) -> dict:
    """`arrays` (batch, seqlen, ...) as views of their columns (`columns`: first, count) of one
    (batch, seqlen, width) array per dtype among them, built on `backend`, NaN elsewhere; where
    `tokens_last`, that array lies (batch, width, seqlen), C-contiguous, and is viewed
    transposed."""
    views = {}
    width = sum(w for _, w in columns.values())
    for dtype in {a.dtype for a in arrays.values()}:  # dt may be float32 beside 16-bit x
        rows = {n: a for n, a in arrays.items() if a.dtype == dtype}
        batch, seqlen = next(iter(rows.values())).shape[:2]
        whole = np.full((batch, seqlen, width), _outside(dtype), dtype)
        for n, a in rows.items():
            lo, w = columns[n]
            whole[:, :, lo:lo + w] = a.reshape(batch, seqlen, w)
        if tokens_last:
            whole = to_backend(np.ascontiguousarray(whole.swapaxes(1, 2)),
                               backend).swapaxes(1, 2)
        else:
            whole = to_backend(whole, backend)
        for n, a in rows.items():
            lo, w = columns[n]
            views[n] = whole[:, :, lo:lo + w].reshape(a.shape)  # a view: its last axis split
    return views


def _outside(dtype):
    """What on_backend puts outside its views: NaN, or -1 for integers (seq_idx)."""
    return -1 if np.dtype(dtype).kind in "iu" else math.nan


def forward(p: Problem, backend: str):
    """(y, final_states) of ssd_forward on the backend, its arrays laid out as p.layout says
    (on the GPU, a problem in bfloat16 runs on torch tensors, every array alike: CuPy has no
    bfloat16), on p's route and batch slices. Every layout is one the kernels read in place, and
    the call takes the route and the slices asked: AssertionError where the call's launch plan
    copies an array or launches another route or count of slices (route_of)."""
    if p.x.dtype == ml_dtypes.bfloat16:
        backend = narrow_backend(backend)
    arrays = on_backend(p, backend)
    options = dict(chunk_size=p.chunk_size, dt_softplus=p.dt_softplus, dt_limit=p.dt_limit,
                   route=p.route, batch_parts=p.batch_parts)
    plan = plan_of(Call(**arrays, **options))
    if plan.copies:
        raise AssertionError(f"ssd_forward copies {plan.copies} of layout {p.layout!r} (every "
                             f"layout of strategies.LAYOUTS is read in place)\n  {p.describe()}")
    taken = route_of([[launch.kernel for launch in part] for part in plan.parts])
    parts = None if p.batch_parts is None else min(p.batch_parts, p.dims.batch)
    if (p.route or taken[0], parts or taken[1]) != taken:
        raise AssertionError(f"ssd_forward asked for route {p.route}, {p.batch_parts} batch "
                             f"slices launches {taken}\n  {p.describe()}")
    return run_filled(ssd_forward, **arrays, **options, return_final_states=True)


def route_of(parts: list[list]) -> tuple[str, int]:
    """(route, batch slices) of a forward's launches, given as each slice's kernel objects in
    order: the scan where a slice runs ssd_scan, the chunks in parallel where fwd_pass_state's
    state pass runs, else in order (kernels.launches.ROUTES); AssertionError where the slices
    take different routes."""
    routes = set()
    for kernels in parts:
        names = {kernel._pyfunc.__name__ for kernel in kernels}
        routes.add("scan" if "_ssd_scan_kernel" in names else "chunks_parallel"
                   if "_state_pass_kernel" in names else "chunks_in_order")
    if len(routes) != 1:
        raise AssertionError(f"a forward's batch slices take different routes: {routes}")
    return routes.pop(), len(parts)


def narrow_backend(backend: str) -> str:
    """The backend of a call with bfloat16 arrays: torch tensors on the GPU (CuPy has none)."""
    return "torch" if backend == "gpu" else backend
