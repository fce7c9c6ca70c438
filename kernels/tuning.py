"""Per-shape tuning of compute_out (the forward's largest kernel) on the GPU: a search with
`cuda.tile.tune.exhaustive_search` over the choices it can run (program layout, heads per
program, occupancy hint; kernels.compute_out.compute_out_choices), cached per shape and device.

    y = ssd_forward(...)                        # the launchers' rules (measured on the H200)
    tune_forward(x, dt, A, B, C, chunk_size, ...)  # once per shape: search, remember the best
    y = ssd_forward(...)                        # the tuned choice for that shape on this device

A tuned choice is kept for the process, and in the JSON file named by $CUTILE_SSD_TUNING where
that is set (read on first use; after each search, merged with what the file holds then and
written whole, under a lock file), under the device's name, SM count and the cuda-tile version:
entries of another device or cuda-tile version are not used, and a choice compute_out cannot
run on its shape is refused at launch (compute_out_launch). Choices are per launch signature:
where ssd_forward runs the batch as slices, per slice. layout_as (tests) overrides them. Only
an explicit tune_forward call searches; ssd_forward and compute_out only look choices up. The
interpreter (NumPy arrays) never uses a tuned choice.

Tile sizes and latency hints are not among the choices, so a search compiles at most eight
kernels: on the H200 (benchmarks/NOTES.md runs 2-12, the program per token block) no other
token-block size was faster on the anchor rows at the adopted occupancy, and latency hints were
within 0.5 % or slower on three of them; on the program per chunk (runs 21-22) 32-token
blocks were slower than 64 on four of the five anchor rows, and on the fifth slower than the
program per token block the launcher takes there.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import math
import os
import tempfile
import threading
from pathlib import Path

import cuda.tile as ct

from contract import check_vector_values
from kernels.arrays import backend_of
from kernels.compute_out import (Choice, compute_out_choices, compute_out_launch,
                                 compute_out_signature)

ENV = "CUTILE_SSD_TUNING"
FORMAT = 1  # the file's layout: {"format": 1, "tables": {device key: [{signature, choice}]}}
_LOCK = threading.Lock()
_TABLES: dict[str, dict[tuple, Choice]] = {}  # device key -> signature -> choice
_LOADED: set[str] = set()  # files read into _TABLES


def device_key(kind: str, device: int, sm_count: int) -> str:
    """The device's name, SM count and the cuda-tile version: what a tuned choice holds for."""
    return f"{_device_name(kind, device)} | {sm_count} SMs | cuda-tile {ct.__version__}"


@functools.lru_cache
def _device_name(kind: str, device: int) -> str:
    if kind == "cupy":
        import cupy
        name = cupy.cuda.runtime.getDeviceProperties(device)["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    import torch
    return torch.cuda.get_device_name(device)


def table(backend) -> dict[tuple, Choice] | None:
    """The tuned choices of `backend`'s device (signature -> Choice; compute_out_launch's
    `tuned`), None for the interpreter."""
    if backend.kind == "numpy":
        return None
    return _table(device_key(backend.kind, backend.device, backend.sm_count))


def _table(key: str) -> dict[tuple, Choice]:
    with _LOCK:
        path = os.environ.get(ENV)
        if path and path not in _LOADED:
            _merge(_read(Path(path)))
            _LOADED.add(path)  # after the read: a file that is not one fails every time
        return _TABLES.setdefault(key, {})


def _merge(tables: dict[str, dict[tuple, Choice]]):
    for key, entries in tables.items():
        _TABLES.setdefault(key, {}).update(entries)


def _read(path: Path) -> dict[str, dict[tuple, Choice]]:
    """The file's tables; none for a missing file. A file that is not one fails loudly: a tuned
    table silently dropped would look like a slower kernel."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if data["format"] != FORMAT:
            raise ValueError(f"format {data['format']!r}, not {FORMAT}")
        return {key: {tuple(e["signature"]): Choice(*e["choice"]) for e in entries}
                for key, entries in data["tables"].items()}
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"${ENV}: {path} is not a tuning file of this project ({e})") from None


@contextlib.contextmanager
def _file_lock(path: Path):
    """Other processes' writers of `path` wait (an advisory lock on a file beside it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _write(path: Path):
    """The file merged with what this process holds (its entries win), written whole."""
    with _file_lock(path):
        for key, entries in _read(path).items():  # what other processes wrote meanwhile
            mine = _TABLES.setdefault(key, {})
            for signature, choice in entries.items():
                mine.setdefault(signature, choice)
        tables = {key: [dict(signature=list(sig), choice=list(choice))
                        for sig, choice in sorted(entries.items(), key=str)]
                  for key, entries in _TABLES.items() if entries}
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".")
        with os.fdopen(fd, "w") as f:
            json.dump({"format": FORMAT, "tables": tables}, f, indent=1)
        os.replace(tmp, path)


def record(key: str, signature: tuple, choice: Choice):
    """Remember `choice` for `signature` on device `key` (and in $CUTILE_SSD_TUNING's file)."""
    entries = _table(key)
    with _LOCK:
        entries[signature] = Choice(*choice)
        path = os.environ.get(ENV)
        if path:
            _write(Path(path))


def forget():
    """Drop every choice this process holds (a file is read again on next use)."""
    with _LOCK:
        _TABLES.clear()
        _LOADED.clear()


def search(stream, launch_of, choices: list[Choice]):
    """cuda.tile.tune's exhaustive search: `launch_of(choice)` -> (kernel, grid, args), each
    timed on `stream` with L2 flushed; its TuningResult (best, successes, failures)."""
    from cuda.tile.tune import exhaustive_search
    launches = {c: launch_of(c) for c in choices}
    return exhaustive_search(choices, stream, lambda c: launches[c][1],
                             lambda c: launches[c][0], lambda c: launches[c][2], quiet=True)


def tune_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                 seq_idx=None, dt_softplus=False, dt_limit=(0.0, math.inf)) -> dict:
    """Search compute_out's choices for the launches ssd_forward makes with these arguments (GPU
    arrays: CuPy or torch CUDA), remember the fastest per launch signature for this device, and
    return {signature: cuda.tile.tune.TuningResult}. Arguments are checked as ssd_forward checks
    them; the search runs the forward's first two kernels to give compute_out real inputs, then
    times each choice (compiling it first: seconds per choice on a first run)."""
    from kernels.ssd_forward import prepare_forward
    if backend_of(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                  initial_states=initial_states, seq_idx=seq_idx).kind == "numpy":
        raise TypeError("x: tune_forward times kernels on the GPU: pass CuPy arrays or torch "
                        "CUDA tensors, got NumPy arrays")
    backend, parts, _, _ = prepare_forward(x, dt, A, B, C, chunk_size, D, z, dt_bias,
                                           initial_states, seq_idx, dt_softplus, dt_limit)
    check_vector_values(A, D=D, dt_bias=dt_bias)
    return tune_parts(backend, device_key(backend.kind, backend.device, backend.sm_count), parts,
                      search)


def tune_parts(backend, key: str, parts: list[dict], search_fn) -> dict:
    """tune_forward's search over a forward's parts (ssd_forward.forward_parts): each part's
    chunk_cumsum and fwd_pass_state run, then its compute_out signature, where this call has not
    searched it yet, is searched with `search_fn(stream, launch_of, choices)` (search's
    signature) on the arrays' device and current stream, and its best choice recorded for
    device `key`."""
    from kernels.ssd_forward import compute_out_arrays, forward_launches
    results = {}
    with backend.on_device():
        stream = backend.current_stream()
        for part in parts:
            for kernel, grid, args in forward_launches(**part)[:-1]:
                backend.launch(kernel, grid, args)
            arrays = compute_out_arrays(part)
            signature = compute_out_signature(*arrays)
            if signature in results:
                continue
            result = search_fn(stream, lambda c, arrays=arrays, part=part: compute_out_launch(
                *arrays, part["sm_count"], choice=c), compute_out_choices(*arrays))
            record(key, signature, result.best.config)
            results[signature] = result
    return results
