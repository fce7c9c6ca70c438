"""Bad values found on the device, reported without a synchronisation.

A, D and dt_bias are read by the kernels, not by the host: where a value is bad (A not finite
and < 0, D or dt_bias not finite) the kernels write NaN to every output it feeds and one of
them ORs the argument's bit (kernels.constants.ERROR_*) into the call's *error word* (in
ssd_forward chunk_cumsum sets all three; compute_out makes a bad D's y NaN). Each call
takes the next word of a ring per device (`SLOTS` int32 words on the device and their pinned
host copy, allocated once): the word is zeroed on the caller's stream before the kernels and
copied to the host after them, both asynchronously. The host reads the pinned copies when it
can see them without waiting: at the start of every later call (`open_word`, before
anything is launched), or in `raise_pending_errors()`, which waits for the devices first. A bad
value is raised there as the ValueError naming the argument, with the call it came from; the
word is then cleared, so later good calls are not blamed.

Two kinds of call also read their word on the device: a packed call's (cu_seqlens) last kernel
NaNs the outputs when the word holds ERROR_CU_SEQLENS; a float16 scan's second launch redoes
the call on TF32 operands when the first set FLOAT16_RANGE (a note, never raised; batch slices
on two streams share one word, so one slice's note may redo both). A word is a call's alone
while it runs unless the ring wraps under it: a call still in flight (a captured CUDA graph
replayed later keeps its slot) 1024 calls later shares its slot with the new one, and their
bits mix (a zeroing between a float16 scan's two launches loses its redo).

On the CPU interpreter (NumPy arrays) the words are host memory and the kernels run before the
call returns: `check_values=False` defers the error as on the GPU; the default checks on the
host at once (it costs no synchronisation there).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

import numpy as np

from contract import check_flag
from kernels.constants import ERROR_A, ERROR_CU_SEQLENS, ERROR_D, ERROR_DT_BIAS, ERRORS

SLOTS = 1024
# int32 words from one slot to the next: each word starts 16-byte aligned, as every array
# ct.launch is given (it specializes kernels on the alignment)
STRIDE = 4

MESSAGES = {ERROR_A: "A must be finite and < 0 for every head",
            ERROR_DT_BIAS: "dt_bias must be finite", ERROR_D: "D must be finite",
            ERROR_CU_SEQLENS: "cu_seqlens must start at 0, be non-decreasing and end at seqlen"}


def describe(bits: int) -> list[str]:
    """The messages of the bits set in an error word."""
    return [text for bit, text in MESSAGES.items() if bits & bit]


class _Ring:
    """The error words of one (array kind, device): device words, their host copies (one int32
    a slot), the (1,) view of each word the kernels take, and which call each word belongs to."""

    def __init__(self, backend):
        self.backend = backend
        self.calls: list[tuple[str, int] | None] = [None] * SLOTS
        self.next = 0
        self.host = np.zeros(SLOTS, dtype=np.int32)
        if backend.kind == "numpy":
            self.words = np.zeros(SLOTS * STRIDE, dtype=np.int32)
        else:
            import cupy
            with backend.on_device():
                self._pinned = cupy.cuda.alloc_pinned_memory(SLOTS * 4)
                self.host = np.frombuffer(self._pinned, dtype=np.int32, count=SLOTS)
                self.host[:] = 0
                # each word is zeroed on the caller's stream when a call takes it
                if backend.kind == "torch":
                    import torch
                    self.words = torch.empty(SLOTS * STRIDE, dtype=torch.int32,
                                             device=f"cuda:{backend.device}")
                    self._words_ptr = self.words.data_ptr()
                else:
                    self.words = cupy.empty(SLOTS * STRIDE, dtype=cupy.int32)
                    self._words_ptr = self.words.data.ptr
        self.views = [self.words[at:at + 1] for at in range(0, SLOTS * STRIDE, STRIDE)]

    def take(self, call: tuple[str, int], stream) -> Word:
        """The next word, zeroed on `stream` (its handle: an int; None for NumPy)."""
        slot = self.next
        self.next = (slot + 1) % SLOTS
        self.calls[slot] = call
        self.host[slot] = 0
        if stream is None:
            self.words[slot * STRIDE] = 0
        else:
            import cupy
            cupy.cuda.runtime.memsetAsync(self._words_ptr + 4 * STRIDE * slot, 0, 4, stream)
        return Word(self, slot, self.views[slot], stream)

    def copy_to_host(self, slot: int, stream):
        if stream is None:
            self.host[slot] = self.words[slot * STRIDE]
        else:
            import cupy
            runtime = cupy.cuda.runtime
            runtime.memcpyAsync(self._pinned.ptr + 4 * slot, self._words_ptr + 4 * STRIDE * slot,
                                4, runtime.memcpyDeviceToHost, stream)

    def pending(self) -> list[tuple[str, int]]:
        """(call, bits) of every word whose host copy shows an error (ERRORS; the other bits
        are the kernels' notes, FLOAT16_RANGE), each word cleared."""
        if not np.count_nonzero(self.host):
            return []
        found = []
        for slot in np.flatnonzero(self.host):
            call, bits = self.calls[slot], int(self.host[slot]) & ERRORS
            if bits:
                found.append((f"{call[0]} (call #{call[1]})" if call else "an earlier call",
                              bits))
            self.host[slot] = 0
        return found


@dataclass(frozen=True)
class Word:
    """A call's error word: `array` (the kernels' (1,) int32 argument) and its slot."""
    ring: _Ring
    slot: int
    array: object
    stream: int | None  # the handle of the stream it was zeroed on; None for NumPy

    def close(self):
        """After the call's kernels: the word's copy to the host, on the stream it was zeroed
        on (for NumPy, the copy itself)."""
        self.ring.copy_to_host(self.slot, self.stream)

    def __enter__(self) -> Word:
        return self

    def __exit__(self, *exc):
        """Closes the word around a call's launches, whether they were all queued or not."""
        self.close()


_RINGS: dict[tuple[str, int | None], _Ring] = {}
_LOCK = threading.Lock()
_COUNT = itertools.count(1)


def scratch_word(backend):
    """A zeroed error word of the backend's kind that no call reports: for launches whose
    values were checked on the host (kernels.tuning's timed runs)."""
    if backend.kind == "torch":
        import torch
        return torch.zeros(1, dtype=torch.int32, device=f"cuda:{backend.device}")
    with backend.on_device():
        return backend.xp.zeros(1, dtype=backend.xp.int32)


def check_on_host(check_values, backend) -> bool:
    """Whether a call checks the values of A, D and dt_bias on the host before its launch: its
    `check_values`, where None means on NumPy inputs only (no synchronisation to save there)."""
    if check_flag(check_values) is None:
        return backend.kind == "numpy"
    return check_values


def open_word(backend, call: str, stream=None) -> Word:
    """The next error word of the backend's ring, zeroed on `stream` (the caller's current
    stream where None), for a call of `call` (a function name): raises first what earlier calls
    on this backend left pending."""
    if backend.kind == "numpy":
        handle = None
    else:
        if stream is None:
            stream = backend.current_stream()
        handle = backend.stream_handle(stream)
    with _LOCK:
        ring = _RINGS.get((backend.kind, backend.device))
        if ring is None:
            ring = _RINGS[backend.kind, backend.device] = _Ring(backend)
        _raise(ring.pending())
        return ring.take((call, next(_COUNT)), handle)


def raise_pending_errors():
    """Wait for every device a call ran on, then raise the ValueError of any bad value the
    kernels found (naming the argument and the call), if any."""
    with _LOCK:
        rings = list(_RINGS.values())
    for ring in rings:
        if ring.backend.kind != "numpy":
            import cupy
            with ring.backend.on_device():
                cupy.cuda.runtime.deviceSynchronize()
    with _LOCK:
        _raise([found for ring in rings for found in ring.pending()])


def _raise(found: list[tuple[str, int]]):
    if found:
        parts = [f"{'; '.join(describe(bits))} (found on the device by {call}, whose outputs "
                 f"it fed are NaN)" for call, bits in found]
        raise ValueError("; ".join(parts))
