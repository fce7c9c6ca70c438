"""The tuned choices of compute_out, per launch signature and device: what kernels.tuning's
search records and compute_out_launch looks up before its rules.

A choice is kept for the process, and in the JSON file named by $CUTILE_SSD_TUNING where that is
set (read on first use; after each search, merged with what the file holds then and written
whole, under a lock file), under the device's name, SM count and the cuda-tile version: entries
of another device or cuda-tile version are not used. Entries are plain tuples (the fields of
kernels.compute_out.Choice): this module sits below the kernels and knows none of them.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import tempfile
import threading
from pathlib import Path

import cuda.tile as ct

ENV = "CUTILE_SSD_TUNING"
FORMAT = 2  # the file's layout: {"format": 2, "tables": {device key: [{signature, choice}]}}
_LOCK = threading.Lock()
_TABLES: dict[str, dict[tuple, tuple]] = {}  # device key -> signature -> choice
_LOADED: set[str] = set()  # files read into _TABLES
_CHANGES = [0]  # how often _TABLES changed: a plan built from them holds for one count


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


def version() -> tuple[int, str | None]:
    """What the tables a launch plan read depend on (kernels.plan's cache): the
    count of changes to them and the file $CUTILE_SSD_TUNING names (read on the next use)."""
    return _CHANGES[0], os.environ.get(ENV)


def table(backend) -> dict[tuple, tuple] | None:
    """The tuned choices of `backend`'s device (signature -> choice fields; compute_out_launch's
    `tuned`), None for the interpreter."""
    if backend.kind == "numpy":
        return None
    return _table(device_key(backend.kind, backend.device, backend.sm_count))


def _table(key: str) -> dict[tuple, tuple]:
    with _LOCK:
        path = os.environ.get(ENV)
        if path and path not in _LOADED:
            _merge(_read(Path(path)))
            _LOADED.add(path)  # after the read: a file that is not one fails every time
        return _TABLES.setdefault(key, {})


def _merge(tables: dict[str, dict[tuple, tuple]]):
    _CHANGES[0] += 1
    for key, entries in tables.items():
        _TABLES.setdefault(key, {}).update(entries)


def _read(path: Path) -> dict[str, dict[tuple, tuple]]:
    """The file's tables; none for a missing file. A file that is not one fails loudly: a tuned
    table silently dropped would look like a slower kernel."""
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        if data["format"] != FORMAT:
            raise ValueError(f"format {data['format']!r}, not {FORMAT}: its keys differ, "
                             "tune again")
        return {key: {tuple(e["signature"]): tuple(e["choice"]) for e in entries}
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


def record(key: str, signature: tuple, choice: tuple):
    """Remember `choice` for `signature` on device `key` (and in $CUTILE_SSD_TUNING's file)."""
    entries = _table(key)
    with _LOCK:
        entries[signature] = tuple(choice)
        path = os.environ.get(ENV)
        if path:
            _write(Path(path))  # merges in what other processes wrote
        _CHANGES[0] += 1


def forget():
    """Drop every choice this process holds (a file is read again on next use)."""
    with _LOCK:
        _TABLES.clear()
        _LOADED.clear()
        _CHANGES[0] += 1
