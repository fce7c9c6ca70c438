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
import threading
import types
import typing
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

import cuda.tile as ct
from cuda.tile._stub import ArrayAnnotation

from contract import Dims, dtype_name, element_strides, kernel_layout


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


def _detect(a) -> Backend:
    """The backend of one array (the one place an array's kind is read): NumPy (the
    interpreter), CuPy or torch CUDA (the GPU, with its device); TypeError for anything else."""
    if isinstance(a, np.ndarray):
        return NumpyBackend(None)
    module = type(a).__module__.partition(".")[0]
    if module == "cupy":
        return CupyBackend(a.device.id)
    if module == "torch":
        if not a.is_cuda:
            raise TypeError("a torch CPU tensor is not supported: pass a CUDA tensor (GPU) or a "
                            "NumPy array (CPU interpreter)")
        return TorchBackend(a.device.index)
    raise TypeError(f"unsupported array type {type(a).__name__}")


@dataclass(frozen=True)
class Backend:
    """Where one call runs: the array kind of its arguments (a subclass per kind: NumpyBackend
    for the CPU interpreter, CupyBackend and TorchBackend for the GPU) and, for GPU arrays, the
    device. The methods here are what the launchers call; each kind supplies its primitives."""

    device: int | None
    kind: ClassVar[str]  # 'numpy', 'cupy' or 'torch'

    @staticmethod
    def of(kind: str, device: int | None = None) -> Backend:
        """The backend of that kind and device."""
        return {"numpy": NumpyBackend, "cupy": CupyBackend, "torch": TorchBackend}[kind](device)

    def laid_out(self, a):
        """`a` as the kernels take it: itself where its layout is one they read in place
        (contract.kernel_layout: views of one projection included), else a C-contiguous copy
        of the same kind and dtype. None (an absent optional argument) stays None."""
        if a is None or kernel_layout(a):
            return a
        return self._contiguous(a)

    def call_arrays(self, inputs: dict, *, copies: tuple[str, ...], outputs: tuple,
                    offsets: int | None = None, cu_seqlens=None) -> dict:
        """A call's arrays by name as its launches take them (kernels.plan's one call into this
        module when it binds a call): `inputs` (the array arguments by name) with those named in
        `copies` copied C-contiguous (the plan found the kernels cannot read them in place);
        seq_idx's segment ids as "seg", or, for a packed row (`offsets`: its seqlen, the
        offsets' bound), `cu_seqlens` as int32 offsets; and `outputs` allocated: (name, shape,
        like_x) each, in x's dtype where like_x, else float32."""
        arrays = dict(inputs)
        for name in copies:
            arrays[name] = self._contiguous(arrays[name])
        if offsets is None:
            arrays["seg"] = self.segment_ids(arrays["seq_idx"])
        else:
            arrays["cu_seqlens"] = self.offsets_int32(cu_seqlens, offsets)
        for name, shape, like_x in outputs:
            arrays[name] = self.empty(shape, like=arrays["x"] if like_x else None)
        return arrays

    def empty(self, shape: tuple[int, ...], like=None, dtype: str | None = None):
        """A new output array, uninitialized, float32, of `like`'s dtype or of `dtype` (a name:
        "int32") (on the interpreter with a written-mask where
        kernels.interpreter.track_writes is active)."""
        if dtype is not None:
            return self._empty(shape, getattr(self.xp, dtype))
        return self._empty(shape, self.xp.float32 if like is None else like.dtype)

    @property
    def sm_count(self) -> int:
        """The device's streaming multiprocessors (1 for the interpreter, which runs one program
        at a time): the launchers that size programs by the grid read it. So the interpreter
        takes the large-grid choices (fwd_pass_state in order) for every shape; the
        small-grid ones run on the GPU, and tests and properties pass each (`choice=`)."""
        return _sm_count(self)

    def launch(self, kernel, grid: tuple[int, int, int], args: tuple, stream=None):
        """Run `kernel` over `grid`: on the interpreter for NumPy, else on `stream`, on which the
        caller has made the arrays' device current (launch_parts), or, where None, on the
        current stream of the arrays' device."""
        self._launch(kernel, grid, args, stream)

    def launch_parts(self, parts: list[list[tuple]], stream=None):
        """Run independent lists of launches [(kernel, grid, args)], each in its order: the first
        on `stream` (default: the current stream), each other on a side stream (_side_stream)
        that starts after the work already queued on that stream and that it then waits for,
        so that to the caller the whole runs on its stream (CUDA graph capture included). The
        lists' kernels may overlap on the GPU. The interpreter runs the lists one after another.
        """
        self._launch_parts(parts, stream)


class _NumpyApi:
    """What NumPy and CuPy arrays share: the NumPy API, on the backend's `xp`."""

    def _contiguous(self, a):
        return self.xp.ascontiguousarray(a)

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32"):
        """A new array of zeros, float32 or int32 (written: never a read of unwritten
        memory)."""
        return self.xp.zeros(shape, dtype=getattr(self.xp, dtype))

    def offsets_int32(self, a, limit: int):
        """Integer offsets `a` as a C-contiguous int32 array of the same kind, converted on its
        device: a value outside [0, limit] becomes -1 (an int64 offset must not wrap into a
        plausible one), which the kernel reading them refuses."""
        xp = self.xp
        return xp.ascontiguousarray(xp.where((a < 0) | (a > limit), -1, a), dtype=xp.int32)

    def segment_ids(self, seq_idx):
        """(batch, seqlen) int32 segment ids: the count of changes of seq_idx up to each token.

        The state resets wherever seq_idx changes, whatever its values, so the kernels compare
        these ids for equality: equal ids <=> no change in between. None (no seq_idx) stays None.
        """
        if seq_idx is None:
            return None
        xp = self.xp
        counts = xp.cumsum(seq_idx[:, 1:] != seq_idx[:, :-1], axis=1, dtype=xp.int32)
        zero = xp.zeros((seq_idx.shape[0], 1), dtype=xp.int32)
        return xp.ascontiguousarray(xp.concatenate([zero, counts], axis=1))


@dataclass(frozen=True)
class NumpyBackend(_NumpyApi, Backend):
    """NumPy arrays: the kernels run on the CPU tile interpreter, one program at a time."""

    kind: ClassVar[str] = "numpy"
    xp: ClassVar = np

    def _empty(self, shape, dtype):
        from kernels.interpreter import allocated
        out = np.empty(shape, dtype=dtype)
        allocated(out)
        return out

    def _launch(self, kernel, grid, args, stream):
        from kernels import interpreter
        interpreter.launch(grid, kernel, args)

    def _launch_parts(self, parts, stream):
        for launches in parts:
            for kernel, grid, args in launches:
                self.launch(kernel, grid, args)

    def _multiprocessors(self) -> int:
        return 1

    def on_device(self):
        """A context in which the arrays' device is the current one: none for the interpreter."""
        return contextlib.nullcontext()

    def current_stream(self):
        """The caller's current stream: none for the interpreter."""
        return None


@dataclass(frozen=True)
class _GpuBackend(Backend):
    """What CuPy and torch arrays share: ct.launch on a stream of the arrays' device, and the
    side streams of a split batch, ordered with the caller's stream by events."""

    def _launch(self, kernel, grid, args, stream):
        if stream is not None:
            ct.launch(stream, grid, kernel, args)
        else:
            with self.on_device():
                ct.launch(self.current_stream(), grid, kernel, args)

    def _launch_parts(self, parts, stream):
        with self.on_device():
            main = self.current_stream() if stream is None else stream
            if len(parts) == 1:
                for kernel, grid, args in parts[0]:
                    self.launch(kernel, grid, args, main)
                return
            fork = self._event()
            fork.record(main)
            joins = []
            try:
                for k, launches in enumerate(parts[1:]):
                    side = _side_stream(self, self.stream_handle(main), k)
                    side.wait_event(fork)
                    try:
                        for kernel, grid, args in launches:
                            self.launch(kernel, grid, args, side)
                    finally:  # joined even when a launch fails: its buffers are the caller's
                        done = self._event()
                        done.record(side)
                        joins.append(done)
                for kernel, grid, args in parts[0]:
                    self.launch(kernel, grid, args, main)
            finally:
                for done in joins:
                    main.wait_event(done)


@dataclass(frozen=True)
class CupyBackend(_NumpyApi, _GpuBackend):
    """CuPy arrays on one GPU: the kernels run with ct.launch on the caller's current stream."""

    kind: ClassVar[str] = "cupy"

    @property
    def xp(self):
        import cupy
        return cupy

    def _empty(self, shape, dtype):
        return self.xp.empty(shape, dtype=dtype)

    def on_device(self):
        return self.xp.cuda.Device(self.device)

    def current_stream(self):
        return self.xp.cuda.get_current_stream(self.device)

    def stream_handle(self, stream) -> int:
        """A stream's CUDA handle."""
        return stream.ptr

    def _event(self):
        return self.xp.cuda.Event(disable_timing=True)

    def _new_stream(self):
        with self.on_device():
            return self.xp.cuda.Stream(non_blocking=True)

    def _multiprocessors(self) -> int:
        return int(self.xp.cuda.Device(self.device).attributes["MultiProcessorCount"])


@dataclass(frozen=True)
class TorchBackend(_GpuBackend):
    """torch CUDA tensors on one GPU: the kernels run with ct.launch on torch's current
    stream."""

    kind: ClassVar[str] = "torch"

    @property
    def xp(self):
        import torch
        return torch

    def _contiguous(self, a):
        return a.contiguous()

    def _empty(self, shape, dtype):
        return self.xp.empty(shape, dtype=dtype, device=f"cuda:{self.device}")

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32"):
        return self.xp.zeros(shape, dtype=getattr(self.xp, dtype), device=f"cuda:{self.device}")

    def offsets_int32(self, a, limit: int):
        xp = self.xp
        return xp.where((a < 0) | (a > limit), -1, a).to(dtype=xp.int32).contiguous()

    def segment_ids(self, seq_idx):
        if seq_idx is None:
            return None
        xp = self.xp
        changed = seq_idx[:, 1:] != seq_idx[:, :-1]
        counts = xp.cumsum(changed.to(xp.int32), dim=1, dtype=xp.int32)
        zero = xp.zeros((seq_idx.shape[0], 1), dtype=xp.int32, device=seq_idx.device)
        return xp.cat([zero, counts], dim=1).contiguous()

    def on_device(self):
        return self.xp.cuda.device(self.device)

    def current_stream(self):
        return self.xp.cuda.current_stream(self.device)

    def stream_handle(self, stream) -> int:
        """A stream's CUDA handle."""
        return stream.cuda_stream

    def _event(self):
        return self.xp.cuda.Event()

    def _new_stream(self):
        return self.xp.cuda.Stream(device=self.device)

    def _multiprocessors(self) -> int:
        return int(self.xp.cuda.get_device_properties(self.device).multi_processor_count)


_SIDE_STREAMS = threading.local()


def _side_stream(backend: _GpuBackend, caller: int, k: int):
    """The k-th side stream of launch_parts for the caller's stream `caller` (its handle) in this
    thread, created once: a non-blocking stream, so only the events order it with the caller's
    stream (the legacy default stream too). One per thread and caller stream, so that one
    thread's graph capture never takes in another's launches, nor one caller stream's work wait
    for another's. (torch hands its streams out of a pool of 32 per device: a torch side stream
    may be another component's too; that orders work, it does not reorder it.)"""
    streams = getattr(_SIDE_STREAMS, "by_key", None)
    if streams is None:
        streams = _SIDE_STREAMS.by_key = {}
    key = (backend, caller, k)
    if key not in streams:
        streams[key] = backend._new_stream()
    return streams[key]


@functools.lru_cache
def _sm_count(backend: Backend) -> int:
    return backend._multiprocessors()


def backend_of(**arrays) -> Backend:
    """The one backend of the named arrays (None entries skipped).

    Raises TypeError naming the first argument whose kind or device differs from the others'.
    """
    first = None
    for name, a in arrays.items():
        if a is None:
            continue
        try:
            backend = _detect(a)
        except TypeError as e:
            raise TypeError(f"{name}: {e}") from None
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


def pow2_tile(n: int, lo: int = 1, hi: int | None = None) -> int:
    """The tile extent covering `n` elements: the next power of two (cuTile tile dimensions are
    powers of two), at least `lo` and, when `hi` is given, at most `hi` (then a loop or the grid
    covers the rest)."""
    t = max(lo, 1 << max(0, (n - 1).bit_length()))
    return t if hi is None else min(t, hi)
