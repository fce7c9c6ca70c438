"""Array types and launch dispatch shared by the launchers.

The launchers accept NumPy arrays (the kernels then run on the CPU tile interpreter,
`kernels.interpreter`), CuPy arrays or torch CUDA tensors (the kernels run on the GPU with
`ct.launch`, on the caller's current stream). All array arguments of one call must be of one kind
and on one device; outputs are of that kind. The grid, tile sizes and specializations are chosen
by the launchers once, whatever the backend: this module only moves arrays and launches.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
import types
import typing
from dataclasses import dataclass

import numpy as np

import cuda.tile as ct
from cuda.tile._stub import ArrayAnnotation

from contract import Dims, dtype_name, element_strides, kernel_layout
from kernels.constants import ERROR_D
from kernels.constants import LOG2E  # the z gate's sigmoid is taken with exp2 too


@dataclass(frozen=True)
class LaunchDims:
    """What a launcher's rules read of a launch, the first argument of every kernel module's
    rules_choice(dims, sm_count): its dimensions, the activations' dtype name, whether seq_idx's
    segment ids are given, and whether the launch indexes in int64 (needs_int64)."""
    dims: Dims
    dtype: str = "float32"
    segments: bool = False
    int64: bool = False


def launch_dims(x, B, dt_out, *, seg=None, int64: bool = False) -> LaunchDims:
    """The LaunchDims of a launch on these arrays (shapes and x's dtype read, no value)."""
    batch, seqlen, nheads, headdim = (int(s) for s in x.shape)
    dims = Dims(batch, seqlen, nheads, headdim, int(B.shape[2]), int(B.shape[3]),
                int(dt_out.shape[3]))
    return LaunchDims(dims, dtype_name(x), seg is not None, int64)


def gpu_available() -> bool:
    """True when a CUDA device can be used (getDeviceCount raises, not 0, without a driver)."""
    return _gpu_available()


@functools.cache
def _gpu_available() -> bool:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _kind(a) -> str:
    """'numpy', 'cupy' or 'torch' for a supported array; TypeError for anything else."""
    module = type(a).__module__.split(".")[0]
    if isinstance(a, np.ndarray):
        return "numpy"
    if module == "cupy":
        return "cupy"
    if module == "torch":
        if not a.is_cuda:
            raise TypeError("a torch CPU tensor is not supported: pass a CUDA tensor (GPU) or a "
                            "NumPy array (CPU interpreter)")
        return "torch"
    raise TypeError(f"unsupported array type {type(a).__name__}")


def _device(kind: str, a):
    if kind == "cupy":
        return a.device.id
    if kind == "torch":
        return a.device.index
    return None


@dataclass(frozen=True)
class Backend:
    """Where one call runs: the array kind of its arguments and, for GPU arrays, the device."""

    kind: str  # 'numpy' (CPU interpreter), 'cupy' or 'torch' (GPU)
    device: int | None

    @property
    def xp(self):
        if self.kind == "cupy":
            import cupy
            return cupy
        if self.kind == "torch":
            import torch
            return torch
        return np

    def laid_out(self, a):
        """`a` as the kernels take it: itself where its layout is one they read in place
        (contract.kernel_layout: views of one projection included), else a C-contiguous copy
        of the same kind and dtype. None (an absent optional argument) stays None."""
        if a is None or kernel_layout(a):
            return a
        if self.kind == "torch":
            return a.contiguous()
        return self.xp.ascontiguousarray(a)

    def empty(self, shape: tuple[int, ...], like=None):
        """A new output array, uninitialized, float32 or of `like`'s dtype (on the interpreter
        with a written-mask where kernels.interpreter.track_writes is active)."""
        dtype = self.xp.float32 if like is None else like.dtype
        if self.kind == "torch":
            return self.xp.empty(shape, dtype=dtype, device=f"cuda:{self.device}")
        out = self.xp.empty(shape, dtype=dtype)
        if self.kind == "numpy":
            from kernels.interpreter import allocated
            allocated(out)
        return out

    def zeros(self, shape: tuple[int, ...]):
        """A new float32 array of zeros (written: never a read of unwritten memory)."""
        if self.kind == "torch":
            return self.xp.zeros(shape, dtype=self.xp.float32, device=f"cuda:{self.device}")
        return self.xp.zeros(shape, dtype=self.xp.float32)

    def offsets_int32(self, a, limit: int):
        """Integer offsets `a` as a C-contiguous int32 array of the same kind, converted on its
        device: a value outside [0, limit] becomes -1 (an int64 offset must not wrap into a
        plausible one), which the kernel reading them refuses."""
        xp = self.xp
        if self.kind == "torch":
            return xp.where((a < 0) | (a > limit), -1, a).to(dtype=xp.int32).contiguous()
        return xp.ascontiguousarray(xp.where((a < 0) | (a > limit), -1, a), dtype=xp.int32)

    def segment_ids(self, seq_idx):
        """(batch, seqlen) int32 segment ids: the count of changes of seq_idx up to each token.

        The state resets wherever seq_idx changes, whatever its values, so the kernels compare
        these ids for equality: equal ids <=> no change in between. None (no seq_idx) stays None.
        """
        if seq_idx is None:
            return None
        xp = self.xp
        changed = seq_idx[:, 1:] != seq_idx[:, :-1]
        if self.kind == "torch":
            counts = xp.cumsum(changed.to(xp.int32), dim=1, dtype=xp.int32)
            zero = xp.zeros((seq_idx.shape[0], 1), dtype=xp.int32, device=seq_idx.device)
            return xp.cat([zero, counts], dim=1).contiguous()
        counts = xp.cumsum(changed, axis=1, dtype=xp.int32)
        zero = xp.zeros((seq_idx.shape[0], 1), dtype=xp.int32)
        return xp.ascontiguousarray(xp.concatenate([zero, counts], axis=1))

    @property
    def sm_count(self) -> int:
        """The device's streaming multiprocessors (1 for the interpreter, which runs one program
        at a time): the launchers that size programs by the grid read it. So the interpreter
        takes the large-grid choices (fwd_pass_state in order) for every shape; the
        small-grid ones run on the GPU, and tests and properties pass each (`choice=`)."""
        return _sm_count(self.kind, self.device)

    def launch(self, kernel, grid: tuple[int, int, int], args: tuple, stream=None):
        """Run `kernel` over `grid`: on the interpreter for NumPy, else on `stream`, on which the
        caller has made the arrays' device current (launch_parts), or, where None, on the
        current stream of the arrays' device."""
        if self.kind == "numpy":
            from kernels import interpreter
            interpreter.launch(grid, kernel, args)
        elif stream is not None:
            ct.launch(stream, grid, kernel, args)
        else:
            with self.on_device():
                ct.launch(self.current_stream(), grid, kernel, args)

    def on_device(self):
        """A context in which the arrays' device is the current one (none for the
        interpreter)."""
        if self.kind == "cupy":
            import cupy
            return cupy.cuda.Device(self.device)
        if self.kind == "torch":
            import torch
            return torch.cuda.device(self.device)
        return contextlib.nullcontext()

    def stream_handle(self, stream) -> int:
        """A CuPy or torch stream's CUDA handle."""
        return stream.cuda_stream if self.kind == "torch" else stream.ptr

    def current_stream(self):
        """The caller's current stream on the arrays' device (None for the interpreter)."""
        if self.kind == "cupy":
            import cupy
            return cupy.cuda.get_current_stream(self.device)
        if self.kind == "torch":
            import torch
            return torch.cuda.current_stream(self.device)
        return None

    def launch_parts(self, parts: list[list[tuple]], stream=None):
        """Run independent lists of launches [(kernel, grid, args)], each in its order: the first
        on `stream` (default: the current stream), each other on a side stream (_side_stream)
        that starts after the work already queued on that stream and that it then waits for,
        so that to the caller the whole runs on its stream (CUDA graph capture included). The
        lists' kernels may overlap on the GPU. The interpreter runs the lists one after another.
        """
        if self.kind == "numpy":
            for launches in parts:
                for kernel, grid, args in launches:
                    self.launch(kernel, grid, args)
            return
        with self.on_device():
            main = self.current_stream() if stream is None else stream
            if len(parts) == 1:
                for kernel, grid, args in parts[0]:
                    self.launch(kernel, grid, args, main)
                return
            if self.kind == "cupy":
                import cupy
                event = lambda: cupy.cuda.Event(disable_timing=True)
            else:
                import torch
                event = lambda: torch.cuda.Event()
            fork = event()
            fork.record(main)
            joins = []
            try:
                for k, launches in enumerate(parts[1:]):
                    side = _side_stream(self.kind, self.device, self.stream_handle(main), k)
                    side.wait_event(fork)
                    try:
                        for kernel, grid, args in launches:
                            self.launch(kernel, grid, args, side)
                    finally:  # joined even when a launch fails: its buffers are the caller's
                        done = event()
                        done.record(side)
                        joins.append(done)
                for kernel, grid, args in parts[0]:
                    self.launch(kernel, grid, args, main)
            finally:
                for done in joins:
                    main.wait_event(done)


_SIDE_STREAMS = threading.local()


def _side_stream(kind: str, device: int, caller: int, k: int):
    """The k-th side stream of launch_parts for the caller's stream `caller` (its handle) in this
    thread, created once: a non-blocking stream, so only the events order it with the caller's
    stream (the legacy default stream too). One per thread and caller stream, so that one
    thread's graph capture never takes in another's launches, nor one caller stream's work wait
    for another's. (torch hands its streams out of a pool of 32 per device: a torch side stream
    may be another component's too; that orders work, it does not reorder it.)"""
    streams = getattr(_SIDE_STREAMS, "by_key", None)
    if streams is None:
        streams = _SIDE_STREAMS.by_key = {}
    key = (kind, device, caller, k)
    if key not in streams:
        if kind == "cupy":
            import cupy
            with cupy.cuda.Device(device):
                streams[key] = cupy.cuda.Stream(non_blocking=True)
        else:
            import torch
            streams[key] = torch.cuda.Stream(device=device)
    return streams[key]


@functools.lru_cache
def _sm_count(kind: str, device: int | None) -> int:
    if kind == "numpy":
        return 1
    if kind == "cupy":
        import cupy
        return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])
    import torch
    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def backend_of(**arrays) -> Backend:
    """The one backend of the named arrays (None entries skipped).

    Raises TypeError naming the first argument whose kind or device differs from the others'.
    """
    first = None
    for name, a in arrays.items():
        if a is None:
            continue
        try:
            kind = _kind(a)
        except TypeError as e:
            raise TypeError(f"{name}: {e}") from None
        backend = Backend(kind, _device(kind, a))
        if first is None:
            first = (name, backend)
        elif backend != first[1]:
            where = lambda b: b.kind if b.device is None else f"{b.kind} on device {b.device}"
            raise TypeError(f"{name} is a {where(backend)} array but {first[0]} is a "
                            f"{where(first[1])} array: all arrays must be of one kind and device")
    if first is None:
        raise TypeError(f"{next(iter(arrays))} must be an array, got None")
    return first[1]



# Index width. The kernels' sources annotate their large arrays ct.IndexedWithInt64, so that
# arrays of 2^31 elements or more are addressed correctly; with int32 indices instead, tileiras
# loads the tiles with TMA and needs fewer registers (benchmarks/DECISIONS.md "Index width").
# Each kernel is therefore compiled twice: from `int32_indexed(f)` for the usual sizes and from
# `f` itself when an array reaches 2^31 elements.
INT32_MAX = 2**31 - 1


def index_dtype(hint):
    """The index dtype a kernel parameter's annotation asks for: ct.int64 for
    ct.IndexedWithInt64, else ct.int32 (cuTile's default)."""
    for meta in getattr(hint, "__metadata__", ()):
        if isinstance(meta, ArrayAnnotation) and meta.index_dtype is not None:
            return meta.index_dtype
    return ct.int32


def int32_indexed(kernel_function):
    """A copy of the kernel function (same code, name and source) whose ct.IndexedWithInt64
    arrays are indexed in int32: for arrays of fewer than 2^31 elements (`needs_int64`)."""
    hints = typing.get_type_hints(kernel_function, include_extras=True)
    f = types.FunctionType(kernel_function.__code__, kernel_function.__globals__,
                           kernel_function.__name__, kernel_function.__defaults__,
                           kernel_function.__closure__)
    f.__module__, f.__qualname__ = kernel_function.__module__, kernel_function.__qualname__
    f.__doc__ = kernel_function.__doc__
    f.__annotations__ = {name: hint for name, hint in hints.items()
                         if index_dtype(hint) is not ct.int64}
    return f


def needs_int64(*kernel_args) -> bool:
    """Whether one of the arrays among a launch's kernel arguments (anything with a shape;
    constants skipped) spans 2^31 elements or more, so that an element offset exceeds int32:
    the span of a C-contiguous array is its size; of a strided view, its largest offset + 1.
    The launchers pass all their arguments, so no array can be left out."""
    return any(span(a) > INT32_MAX for a in kernel_args if hasattr(a, "shape"))


def span(a) -> int:
    """The elements from an array's first to its last, both counted: 1 + the largest element
    offset (0 for an empty array)."""
    shape = tuple(int(n) for n in a.shape)
    if 0 in shape:
        return 0
    return 1 + sum((n - 1) * s for n, s in zip(shape, element_strides(a)))


# Smallest tile extent the launchers feed to ct.mma; smaller dimensions are zero padded up to it.
MMA_MIN = 16


def mma_operand(t, dtype):
    """A tile as a ct.mma operand, for kernels whose inputs have `dtype`: bfloat16 for bfloat16
    inputs (their values as they are, computed values rounded to nearest), else TF32 (float32
    and float16 inputs, rounded to nearest; float16 values are TF32 values). A tile that
    already is a TF32 operand stays as it is.

    float16 inputs do not take float16 operands: a computed value past float16's range (65504)
    would round to inf where float32 holds it, and a guard that sends such a product to TF32
    operands costs more than it saves (benchmarks/DECISIONS.md "float16 products")."""
    if dtype == ct.bfloat16:
        return t.astype(dtype)
    if t.dtype == ct.tfloat32:
        return t
    return t.astype(ct.float32).astype(ct.tfloat32)


def mma_product(a, b, acc, dtype):
    """acc + a @ b on the fp32 accumulator acc, in a kernel whose inputs have `dtype`: each of a
    and b is an input's tile (as mma_operand made it) or a tile the kernel computed in float32,
    rounded here, both as mma_operand says."""
    return ct.mma(mma_operand(a, dtype), mma_operand(b, dtype), acc)


def head_D(D, i_h, i_p, BLOCK_P, D_PER_HEADDIM):
    """Head i_h's skip weights for headdim block i_p: [BLOCK_P, 1] per channel, else [1, 1],
    in float32 (a 16-bit D widened, exact)."""
    if D_PER_HEADDIM:
        skip = ct.load(D, (i_h, i_p), shape=(1, BLOCK_P), padding_mode=ct.PaddingMode.ZERO)
        skip = ct.reshape(skip, (BLOCK_P, 1))
    else:
        skip = ct.reshape(ct.load(D, (i_h,), shape=(1,)), (1, 1))
    return skip.astype(ct.float32)


def checked_D(D, i_h, i_p, BLOCK_P, D_PER_HEADDIM):
    """head_D's skip weights, NaN where one is not finite (NaN fails the comparison too), so
    that every y it feeds is NaN (NaN x 0 is NaN, where inf x 0 would be NaN and inf x 1 inf)."""
    skip = head_D(D, i_h, i_p, BLOCK_P, D_PER_HEADDIM)
    return ct.where(ct.abs(skip) < math.inf, skip, math.nan)


def report_D(errors, skip, CHECK_D):
    """With CHECK_D, ERROR_D OR-ed into errors[0] where a skip weight checked_D gave is NaN: its
    D is not finite (only by a program that has one: index 1 is out of bounds). A program calls
    it after its loop, so that the check holds no registers through it (at its start it made
    the program per chunk spill). Without CHECK_D the call checks D elsewhere (ssd_forward: in
    chunk_cumsum, where the atomic costs no time)."""
    if CHECK_D:
        or_error(errors, ct.max(ct.where(skip == skip, 0, ERROR_D)))


def or_error(errors, flags):
    """ORs the error bits `flags` (an int32 scalar tile, 0 where there are none) into the call's
    error word errors[0], by a program that has some only (the index 1 is out of bounds: no
    atomic). Relaxed: the word is read after the launch ends (the host's copy, a later kernel),
    so nothing orders it with the program's other accesses; the default acquire-release atomic
    costs every program a GPU-wide barrier and an L1 invalidation (MEMBAR.ALL.GPU and
    CCTL.IVALL in its SASS), whether it fires or not."""
    ct.atomic_or(errors, ct.where(flags != 0, 0, 1), flags, memory_order=ct.MemoryOrder.RELAXED)


def z_gated(acc, z, i_b, i_t, i_h, i_p, BLOCK_T, BLOCK_P):
    """y^T [BLOCK_P, BLOCK_T] of head i_h's token block i_t times its gate z * sigmoid(z)."""
    zt = ct.load(z, (i_b, i_t, i_h, i_p), shape=(1, BLOCK_T, 1, BLOCK_P),
                 padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)  # narrow z: widened, exact
    zt = ct.transpose(ct.reshape(zt, (BLOCK_T, BLOCK_P)))  # [BLOCK_P, BLOCK_T]
    return acc * gate(zt)


def gate(zt):
    """z * sigmoid(z) of a float32 tile, as z / (1 + 2^(-z log2 e)): for very negative z the
    denominator is inf and the gate is -0, its limit."""
    return zt / (1.0 + ct.exp2(-zt * LOG2E))


# The grid's 2nd and 3rd axes (nheads, batch in every launcher) are limited to 65535 by CUDA.
GRID_YZ_MAX = 65535


def check_grid(batch: int, nheads: int):
    if batch > GRID_YZ_MAX:
        raise ValueError(f"batch must be <= {GRID_YZ_MAX} (a grid axis), got {batch}")
    if nheads > GRID_YZ_MAX:
        raise ValueError(f"nheads must be <= {GRID_YZ_MAX} (a grid axis), got {nheads}")


def pow2_tile(n: int, lo: int = 1, hi: int | None = None) -> int:
    """The tile extent covering `n` elements: the next power of two (cuTile tile dimensions are
    powers of two), at least `lo` and, when `hi` is given, at most `hi` (then a loop or the grid
    covers the rest)."""
    t = max(lo, 1 << max(0, (n - 1).bit_length()))
    return t if hi is None else min(t, hi)
