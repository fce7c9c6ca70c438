"""The layout contract of the SSD forward, written once.

Every tensor's shape is named here with the project's dimension names
(batch, seqlen, nheads, headdim, ngroups, dstate, nchunks, chunk_size); the
references, the kernels' launchers and the property strategies all validate
their arguments through the checkers below, so a shape means the same thing
everywhere and bad input fails the same way everywhere: a ``ValueError`` or
``TypeError`` naming the argument, before any kernel launch.

The checkers only read ``.shape``/``.dtype``/``.ndim`` of their arguments (NumPy,
CuPy and torch arrays all qualify); value checks read small per-head vectors only
(``A``, ``dt_bias``, ``D``), never the big activations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

# Shapes of every tensor, by dimension name. D also accepts ("nheads",).
SHAPES = {
    "x": ("batch", "seqlen", "nheads", "headdim"),
    "dt": ("batch", "seqlen", "nheads"),
    "A": ("nheads",),
    "B": ("batch", "seqlen", "ngroups", "dstate"),
    "C": ("batch", "seqlen", "ngroups", "dstate"),
    "D": ("nheads", "headdim"),
    "z": ("batch", "seqlen", "nheads", "headdim"),
    "dt_bias": ("nheads",),
    "initial_states": ("batch", "nheads", "headdim", "dstate"),
    "seq_idx": ("batch", "seqlen"),
    # chunk_cumsum outputs; dA_cumsum is in log2 units (natural log * log2(e))
    "dt_out": ("batch", "nheads", "nchunks", "chunk_size"),
    "dA_cumsum": ("batch", "nheads", "nchunks", "chunk_size"),
    # fwd_pass_state outputs: the state entering every chunk, and after the last token
    "chunk_states": ("batch", "nchunks", "nheads", "headdim", "dstate"),
    "final_states": ("batch", "nheads", "headdim", "dstate"),
    "y": ("batch", "seqlen", "nheads", "headdim"),
}

CHUNK_SIZES = (16, 32, 64, 128, 256)

FLOAT_DTYPES = ("float16", "bfloat16", "float32", "float64")

# The dtypes the kernels read the activations x, B, C, z in (the four of one call alike). The
# other float inputs of the forward, dt, A, dt_bias, D and initial_states, are float32 or the
# activations' dtype, each on its own (weight_dtypes: read and widened to float32 in the
# kernels, as mamba_ssm reads them); the states are float32, but for the chunk states, which
# may be stored in bfloat16 for bfloat16 activations (state_dtype_name).
ACTIVATION_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Dims:
    batch: int
    seqlen: int
    nheads: int
    headdim: int
    ngroups: int
    dstate: int
    chunk_size: int | None = None

    @property
    def nchunks(self) -> int:
        return -(-self.seqlen // self.chunk_size)

    @property
    def heads_per_group(self) -> int:
        return self.nheads // self.ngroups

    def shape(self, name: str) -> tuple[int, ...]:
        """The contract shape of tensor `name` for these dimensions."""
        return tuple(getattr(self, d) for d in SHAPES[name])


# NumPy dtype -> its name: str() of a NumPy dtype costs microseconds per call
_DTYPE_NAMES: dict[np.dtype, str] = {}


def dtype_name(a) -> str:
    """'float32', 'bfloat16', ... for NumPy, CuPy and torch arrays alike."""
    dtype = a.dtype
    if not isinstance(dtype, np.dtype):
        # torch: named directly (torch.compile traces this call, and its dict lookups cannot
        # hash the NumPy dtypes the memo holds)
        return str(dtype).removeprefix("torch.")
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def weight_dtypes(x) -> tuple[str, ...]:
    """The dtypes the kernels take dt, A, dt_bias, D and initial_states in, for activations
    like x (x itself, for chunk_cumsum alone: dt): float32, and x's dtype where it is 16-bit."""
    name = dtype_name(x)
    return ("float32", name) if name in ("bfloat16", "float16") else ("float32",)


def kernel_layout(a) -> bool:
    """Whether the kernels take array `a` as it is, without a copy: every stride non-negative
    (torch, CuPy and NumPy alike: views of one projection, batch and token slices, token-major
    views; cuTile specializes each launch on the strides' divisibility and unit strides). A
    negative stride (a reversed NumPy or CuPy view) is copied to C-contiguous first (a named
    copy of the call's plan: kernels.plan)."""
    return _in_place(element_strides(a))


def _in_place(strides: tuple[int, ...]) -> bool:
    return all(s >= 0 for s in strides)


def element_strides(a) -> tuple[int, ...]:
    """An array's strides in elements: torch's stride(), NumPy's and CuPy's bytes divided by
    the item size; C-contiguous ones for a stand-in with a shape alone."""
    if callable(getattr(a, "stride", None)):  # torch
        return tuple(int(s) for s in a.stride())
    strides = getattr(a, "strides", None)
    if strides is None:
        return contiguous_strides(tuple(int(n) for n in a.shape))
    itemsize = getattr(a, "itemsize", None) or a.dtype.itemsize
    return tuple(int(s) // itemsize for s in strides)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides in elements of a C-contiguous array of `shape`."""
    return tuple(math.prod(shape[k + 1:]) for k in range(len(shape)))


def state_dtypes(x) -> tuple[str, ...]:
    """The dtypes the kernels store chunk states in for activations like x: float32, and
    bfloat16 for bfloat16 ones."""
    return ("float32", "bfloat16") if dtype_name(x) == "bfloat16" else ("float32",)


def state_dtype_name(state_dtype, x) -> str | None:
    """ssd_forward's `state_dtype` (the dtype of the chunk states between the kernels) as a
    dtype name: None stays None (the forward's default); else float32, or bfloat16 where x is
    bfloat16, given by name or as a NumPy, ml_dtypes or torch dtype (a TypeError or ValueError
    naming it otherwise)."""
    if state_dtype is None:
        return None
    if isinstance(state_dtype, str):
        name = state_dtype
    elif type(state_dtype).__module__.partition(".")[0] == "torch":
        name = str(state_dtype).removeprefix("torch.")
    else:
        try:
            name = np.dtype(state_dtype).name
        except TypeError:
            raise TypeError(f"state_dtype: must be a dtype or a dtype's name, got "
                            f"{state_dtype!r}") from None
    allowed = state_dtypes(x)
    if name not in allowed:
        raise ValueError(f"state_dtype: must be one of {allowed} (float32, or bfloat16 for "
                         f"bfloat16 inputs: float16 states would overflow past 65504 where "
                         f"float32 holds them), got {name}")
    return name


def _shape(name, a, rank):
    if a is None or not hasattr(a, "shape") or not hasattr(a, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(a).__name__}")
    shape = tuple(int(s) for s in a.shape)
    if len(shape) != rank:
        raise ValueError(f"{name} must have {rank} dimensions {SHAPES.get(name, '')}, got shape "
                         f"{shape}")
    return shape


def _expect(name, a, expected: tuple[int, ...], dims: tuple[str, ...] | None = None):
    shape = _shape(name, a, len(expected))
    if shape != tuple(expected):
        named = dims or SHAPES[name]
        want = ", ".join(f"{d}={v}" for d, v in zip(named, expected))
        raise ValueError(f"{name} must have shape ({want}), got {shape}")


def _float(name, a, allowed):
    dt = dtype_name(a)
    if dt not in allowed:
        raise TypeError(f"{name} must have a floating dtype in {allowed}, got {dt}")


def _activation(name, a, x, float_dtypes, activation_dtypes):
    """x, B, C or z: with `activation_dtypes` (the kernels' checks), a dtype among them and x's;
    without (the references), any of `float_dtypes`."""
    if activation_dtypes is None:
        _float(name, a, float_dtypes)
        return
    _float(name, a, activation_dtypes)
    if dtype_name(a) != dtype_name(x):
        raise TypeError(f"{name} must have x's dtype ({dtype_name(x)}), got {dtype_name(a)}")


def _host(a) -> np.ndarray:
    """A NumPy copy of a NumPy, CuPy or torch array, copied as it is (a GPU copy waits for the
    GPU's queue); a torch floating tensor is widened to float64 (bfloat16 has no NumPy view)."""
    if hasattr(a, "get"):  # cupy
        return a.get()
    if hasattr(a, "detach"):  # torch
        a = a.detach().cpu()
        return (a.double() if a.is_floating_point() else a).numpy()
    return np.asarray(a)


def _host_vectors(*arrays) -> list[np.ndarray]:
    """Small vectors as float64 NumPy arrays: GPU arrays are copied to the host one by one as
    they are, then widened on the host: cheaper than three small kernels that widen and
    concatenate them on the device before one copy."""
    return [np.asarray(_host(a), dtype=np.float64).ravel() for a in arrays]


def check_chunk_size(chunk_size) -> int:
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)):
        raise TypeError(f"chunk_size must be an int, got {type(chunk_size).__name__}")
    if int(chunk_size) not in CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {CHUNK_SIZES}, got {chunk_size}")
    return int(chunk_size)


def check_dt_limit(dt_limit) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in dt_limit)
    except (TypeError, ValueError):
        raise TypeError(f"dt_limit must be a pair of floats (lo, hi), got {dt_limit!r}") from None
    if math.isnan(lo) or math.isnan(hi) or lo < 0.0 or lo > hi:
        raise ValueError(f"dt_limit must satisfy 0 <= lo <= hi, got {dt_limit!r}")
    return lo, hi


def check_flag(check_values):
    """A call's `check_values`, refused unless None, True or False."""
    if check_values is not None and not isinstance(check_values, bool):
        raise TypeError(f"check_values: must be None, True or False, got {check_values!r}")
    return check_values


# The grid's 2nd and 3rd axes (nheads, batch in every launcher; a packed row's sequences) are
# limited to 65535 by CUDA.
GRID_YZ_MAX = 65535


def check_grid(batch: int, nheads: int):
    if batch > GRID_YZ_MAX:
        raise ValueError(f"batch must be <= {GRID_YZ_MAX} (a grid axis), got {batch}")
    if nheads > GRID_YZ_MAX:
        raise ValueError(f"nheads must be <= {GRID_YZ_MAX} (a grid axis), got {nheads}")


def check_vector_values(A=None, D=None, dt_bias=None):
    """A finite and < 0 for every head, D and dt_bias finite (those given): the value checks,
    which read the values (for GPU arrays: a device-to-host copy per vector, the first of which
    waits for the GPU)."""
    given = [(n, v) for n, v in (("A", A), ("D", D), ("dt_bias", dt_bias)) if v is not None]
    for (name, _), values in zip(given, _host_vectors(*(v for _, v in given))):
        if not np.all(np.isfinite(values)):
            raise ValueError(f"{name} must be finite")
        if name == "A" and not np.all(values < 0):
            raise ValueError(f"A must be < 0 for every head (decays); got max "
                             f"{float(values.max())!r}")


def check_seq_idx(seq_idx, batch: int, seqlen: int):
    _expect("seq_idx", seq_idx, (batch, seqlen))
    if dtype_name(seq_idx) not in ("int32", "int64"):
        raise TypeError(f"seq_idx must be int32 (or int64), got {dtype_name(seq_idx)}")


def check_cu_seqlens(cu_seqlens, dims: Dims, initial_states=None, float_dtypes=FLOAT_DTYPES
                     ) -> int:
    """cu_seqlens (num_seqs + 1,) int32/int64 offsets of the sequences packed in one row (batch
    1), and initial_states, where given, one per sequence (num_seqs, nheads, headdim, dstate):
    shapes and dtypes only (no value read); returns num_seqs. The values: cu_seqlens_values."""
    (length,) = _shape("cu_seqlens", cu_seqlens, 1)
    if dtype_name(cu_seqlens) not in ("int32", "int64"):
        raise TypeError(f"cu_seqlens must be int32 or int64, got {dtype_name(cu_seqlens)}")
    if length < 2:
        raise ValueError(f"cu_seqlens must hold num_seqs + 1 >= 2 offsets, got {length}")
    if dims.batch != 1:
        raise ValueError(f"cu_seqlens packs sequences in one row: x must have batch 1, got "
                         f"{dims.batch}")
    num_seqs = length - 1
    if initial_states is not None:
        _expect("initial_states", initial_states,
                (num_seqs, dims.nheads, dims.headdim, dims.dstate),
                ("num_seqs", "nheads", "headdim", "dstate"))
        _float("initial_states", initial_states, float_dtypes)
    return num_seqs


def cu_seqlens_values(cu_seqlens, seqlen: int) -> list[int]:
    """The offsets of a host (NumPy) cu_seqlens, checked: starting at 0, non-decreasing, ending
    at seqlen."""
    offsets = [int(v) for v in _host(cu_seqlens).ravel()]
    if offsets[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got {offsets[0]}")
    if any(b < a for a, b in zip(offsets, offsets[1:])):
        k = next(i for i, (a, b) in enumerate(zip(offsets, offsets[1:])) if b < a)
        raise ValueError(f"cu_seqlens must be non-decreasing, got {offsets[k]} then "
                         f"{offsets[k + 1]} at {k}")
    if offsets[-1] != seqlen:
        raise ValueError(f"cu_seqlens must end at seqlen ({seqlen}), got {offsets[-1]}")
    return offsets


def check_seq_idx_of_offsets(seq_idx, offsets: list[int]):
    """seq_idx given with cu_seqlens (its checked `offsets`): each token's sequence, 0 for the
    first sequence's tokens, 1 for the next, ... (reads its values: a GPU copy waits)."""
    each = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))
    if not np.array_equal(_host(seq_idx).reshape(-1), each):
        raise ValueError("seq_idx: with cu_seqlens it must be each token's sequence (0 for the "
                         "first sequence's tokens, 1 for the next, ...)")


def _x_B_sizes(x, B, float_dtypes, activation_dtypes):
    """x and B checked together: (batch, seqlen, nheads, headdim, ngroups, dstate)."""
    batch, seqlen, nheads, headdim = _shape("x", x, 4)
    if min(batch, seqlen, nheads, headdim) < 1:
        raise ValueError(f"x must have no empty dimension, got shape {tuple(x.shape)}")
    _activation("x", x, x, float_dtypes, activation_dtypes)
    _shape("B", B, 4)
    if int(B.shape[0]) != batch or int(B.shape[1]) != seqlen:
        raise ValueError(f"B must have shape (batch={batch}, seqlen={seqlen}, ngroups, dstate), "
                         f"got {tuple(B.shape)}")
    ngroups, dstate = int(B.shape[2]), int(B.shape[3])
    if ngroups < 1 or dstate < 1:
        raise ValueError(f"B must have no empty dimension, got shape {tuple(B.shape)}")
    if nheads % ngroups != 0:
        raise ValueError(f"nheads ({nheads}) must be divisible by ngroups ({ngroups}, from B)")
    _activation("B", B, x, float_dtypes, activation_dtypes)
    return batch, seqlen, nheads, headdim, ngroups, dstate


def _check_states_seq_idx(initial_states, seq_idx, dims: Dims, float_dtypes):
    if initial_states is not None:
        _expect("initial_states", initial_states, dims.shape("initial_states"))
        _float("initial_states", initial_states, float_dtypes)
    if seq_idx is not None:
        check_seq_idx(seq_idx, dims.batch, dims.seqlen)


def _check_D_z(D, z, dims: Dims, float_dtypes, x=None, activation_dtypes=None):
    if D is not None:
        if getattr(D, "ndim", None) == 1:
            _expect("D", D, (dims.nheads,), ("nheads",))
        else:
            _expect("D", D, dims.shape("D"))
        _float("D", D, float_dtypes)
    if z is not None:
        _expect("z", z, dims.shape("z"))
        _activation("z", z, x, float_dtypes, activation_dtypes)


def check_forward_args(x, dt, A, B, C, chunk_size=None, *, D=None, z=None, dt_bias=None,
                       initial_states=None, seq_idx=None, dt_limit=(0.0, math.inf),
                       float_dtypes=FLOAT_DTYPES, activation_dtypes=None,
                       check_values=True) -> Dims:
    """Validate the arguments of the whole forward; return its dimensions.

    `chunk_size=None` means the caller has no chunks (the recurrent and quadratic forms).
    `activation_dtypes`: the dtypes x, B, C, z may have, all four x's (default: each any of
    `float_dtypes`, the references' rule).
    `check_values=False` leaves out check_vector_values (the only check that reads values).
    """
    batch, seqlen, nheads, headdim, ngroups, dstate = _x_B_sizes(x, B, float_dtypes,
                                                                 activation_dtypes)
    _expect("dt", dt, (batch, seqlen, nheads))
    _float("dt", dt, float_dtypes)
    dims = Dims(batch, seqlen, nheads, headdim, ngroups, dstate,
                None if chunk_size is None else check_chunk_size(chunk_size))
    _expect("C", C, dims.shape("C"))
    _activation("C", C, x, float_dtypes, activation_dtypes)
    _expect("A", A, (nheads,))
    _float("A", A, float_dtypes)
    _check_D_z(D, z, dims, float_dtypes, x, activation_dtypes)
    if dt_bias is not None:
        _expect("dt_bias", dt_bias, (nheads,))
        _float("dt_bias", dt_bias, float_dtypes)
    _check_states_seq_idx(initial_states, seq_idx, dims, float_dtypes)
    check_dt_limit(dt_limit)
    if check_values:
        check_vector_values(A, D=D, dt_bias=dt_bias)
    return dims


class Layout(NamedTuple):
    """An array argument as a plan reads it: its shape, dtype name and strides in elements, the
    strides None where the kernels cannot read it in place (kernel_layout: it is copied
    C-contiguous first)."""
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...] | None


@dataclass(frozen=True)
class ForwardArgs:
    """What check_call finds of a forward's arguments: its dimensions, dt_limit as floats, the
    chunk states' dtype name as the call gives it (None: the forward's default), a packed row's
    number of sequences (else None), every contract shape of the call by name (SHAPES) and the
    Layout of each array argument given (cu_seqlens aside)."""
    dims: Dims
    dt_limit: tuple[float, float]
    state_dtype: str | None
    num_seqs: int | None
    shapes: dict[str, tuple[int, ...]]
    layouts: dict[str, Layout]


def check_call(x, dt, A, B, C, chunk_size, *, D=None, z=None, dt_bias=None,
               initial_states=None, seq_idx=None, cu_seqlens=None, dt_limit=(0.0, math.inf),
               check_values=None, state_dtype=None) -> ForwardArgs:
    """The contract's checks of ssd_forward's arguments (kernels.call checks the options only
    the routes read, returns, batch_parts, route, and where the arrays lie, first), reading no
    value: check_values and dt_limit, the shapes and dtypes (dt, A, dt_bias, D, initial_states in
    float32 or x's 16-bit dtype: weight_dtypes), a packed row's offsets (cu_seqlens: one
    initial state per sequence), state_dtype (x's dtype known good), the grid's limits; a
    ValueError or TypeError naming the argument. Returns what a plan is built from."""
    check_flag(check_values)
    dt_limit = check_dt_limit(dt_limit)
    packed = cu_seqlens is not None
    weights = weight_dtypes(x)
    dims = check_forward_args(x, dt, A, B, C, chunk_size, D=D, z=z, dt_bias=dt_bias,
                              initial_states=None if packed else initial_states,
                              seq_idx=seq_idx, dt_limit=dt_limit, float_dtypes=weights,
                              activation_dtypes=ACTIVATION_DTYPES, check_values=False)
    num_seqs = None
    if packed:
        num_seqs = check_cu_seqlens(cu_seqlens, dims, initial_states, float_dtypes=weights)
        if num_seqs > GRID_YZ_MAX:
            raise ValueError(f"cu_seqlens: at most {GRID_YZ_MAX} sequences (a grid axis), got "
                             f"{num_seqs}")
    states = state_dtype_name(state_dtype, x)
    check_grid(dims.batch, dims.nheads)
    given = dict(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                 initial_states=initial_states, seq_idx=seq_idx)
    layouts = {}
    for name, a in given.items():
        if a is not None:
            strides = element_strides(a)
            layouts[name] = Layout(tuple(int(n) for n in a.shape), dtype_name(a),
                                   strides if _in_place(strides) else None)
    return ForwardArgs(dims, dt_limit, states, num_seqs,
                       {name: dims.shape(name) for name in SHAPES}, layouts)


def check_chunk_cumsum_args(dt, A, chunk_size, *, dt_bias=None, dt_limit=(0.0, math.inf),
                            float_dtypes=FLOAT_DTYPES,
                            check_values=True) -> tuple[int, int, int, int]:
    """Validate chunk_cumsum's arguments; return (batch, seqlen, nheads, chunk_size)."""
    batch, seqlen, nheads = _shape("dt", dt, 3)
    if min(batch, seqlen, nheads) < 1:
        raise ValueError(f"dt must have no empty dimension, got shape {tuple(dt.shape)}")
    _float("dt", dt, float_dtypes)
    chunk_size = check_chunk_size(chunk_size)
    _expect("A", A, (nheads,))
    _float("A", A, float_dtypes)
    if dt_bias is not None:
        _expect("dt_bias", dt_bias, (nheads,))
        _float("dt_bias", dt_bias, float_dtypes)
    check_dt_limit(dt_limit)
    if check_values:
        check_vector_values(A, dt_bias=dt_bias)
    return batch, seqlen, nheads, chunk_size


def _chunked_dims(x, B, dt_out, dA_cumsum, float_dtypes, activation_dtypes) -> Dims:
    batch, seqlen, nheads, headdim, ngroups, dstate = _x_B_sizes(x, B, float_dtypes,
                                                                 activation_dtypes)
    _shape("dt_out", dt_out, 4)
    chunk_size = check_chunk_size(int(dt_out.shape[3]))
    dims = Dims(batch, seqlen, nheads, headdim, ngroups, dstate, chunk_size)
    # chunk_cumsum's outputs: float32 for the kernels (activation_dtypes given)
    outputs = float_dtypes if activation_dtypes is None else ("float32",)
    _expect("dt_out", dt_out, dims.shape("dt_out"))
    _float("dt_out", dt_out, outputs)
    _expect("dA_cumsum", dA_cumsum, dims.shape("dA_cumsum"))
    _float("dA_cumsum", dA_cumsum, outputs)
    return dims


def check_fwd_pass_state_args(x, B, dt_out, dA_cumsum, *, initial_states=None, seq_idx=None,
                              float_dtypes=FLOAT_DTYPES, activation_dtypes=None) -> Dims:
    dims = _chunked_dims(x, B, dt_out, dA_cumsum, float_dtypes, activation_dtypes)
    _check_states_seq_idx(initial_states, seq_idx, dims, float_dtypes)
    return dims


def check_ssd_scan_args(x, B, C, dt_out, dA_cumsum, *, D=None, z=None, initial_states=None,
                        seq_idx=None, float_dtypes=FLOAT_DTYPES, activation_dtypes=None,
                        check_values=True) -> Dims:
    dims = _chunked_dims(x, B, dt_out, dA_cumsum, float_dtypes, activation_dtypes)
    _expect("C", C, dims.shape("C"))
    _activation("C", C, x, float_dtypes, activation_dtypes)
    _check_D_z(D, z, dims, float_dtypes, x, activation_dtypes)
    _check_states_seq_idx(initial_states, seq_idx, dims, float_dtypes)
    if check_values and D is not None:
        check_vector_values(D=D)
    return dims


def check_compute_out_args(x, B, C, dt_out, dA_cumsum, chunk_states, *, D=None, z=None,
                           seq_idx=None, float_dtypes=FLOAT_DTYPES, activation_dtypes=None,
                           check_values=True) -> Dims:
    dims = _chunked_dims(x, B, dt_out, dA_cumsum, float_dtypes, activation_dtypes)
    _expect("C", C, dims.shape("C"))
    _activation("C", C, x, float_dtypes, activation_dtypes)
    _expect("chunk_states", chunk_states, dims.shape("chunk_states"))
    # the kernels (activation_dtypes given) take state_dtypes(x); the references float_dtypes
    _float("chunk_states", chunk_states,
           float_dtypes if activation_dtypes is None else state_dtypes(x))
    _check_D_z(D, z, dims, float_dtypes, x, activation_dtypes)
    if seq_idx is not None:
        check_seq_idx(seq_idx, dims.batch, dims.seqlen)
    if check_values and D is not None:
        check_vector_values(D=D)
    return dims
