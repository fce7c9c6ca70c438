"""cuTile's ssd_forward beside mamba_ssm, flash-linear-attention and fused-5 on the anchor rows, in
one process (GPU only; torch, and each peer where it imports).

    python -m benchmarks.peers [--rows mamba2_2p7b,long_seq] [--dtype bfloat16] [--reps 10]
    python -m benchmarks.peers --varlen [--dtype bfloat16] [--reps 10]

Each row's inputs are benchmarks.configs.row_inputs (D per head, final states returned), x, B, C
in --dtype. Timed: ssd_forward as called by default; mamba_ssm's mamba_chunk_scan_combined;
flash-linear-attention's chunk_simple_gla, the core of the same recurrence, on inputs prepared
before the timing (fla_inputs: q and k are C and B expanded to every head of their group, v is
x dt, g the log decays dt A; its y lacks the D x term); fused-5, the one-kernel Triton forward of
the PyTorch/IBM "Accelerating Mamba2 with kernel fusion" work (`_fused5_ssd`, file
mamba_ssm/ops/triton/ssd_fused5.py of the repository RishiAstra/mamba: that fork installed, or the
file alone on PYTHONPATH as `ssd_fused5`), called as its authors do, D and chunk_size given. A peer
that fails on a row (fused-5 compiles for float16 and float32 only) is printed as failed, the
rest of the table goes on. Each round runs behind an L2 flush and a
~1 ms GPU sleep (so the host's enqueueing is hidden), timed with CUDA events; the median of
--reps rounds, in ms. The full benchmark (checks against the reference, every kernel, the gate)
is `python -m pytest -m benchmark`; this is its peers' table alone, quick.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import statistics

from benchmarks.configs import ANCHORS, row_inputs

SLEEP_CYCLES = 1_500_000  # ~1 ms of GPU time before each round
FLUSH_BYTES = 512 * 2**20


def fla_inputs(x, dt, A, B, C) -> dict:
    """chunk_simple_gla's q, k, v, g for a Mamba-2 forward's torch inputs (see the module doc)."""
    per_group = x.shape[2] // B.shape[2]
    return {"q": C.repeat_interleave(per_group, dim=2).contiguous(),
            "k": B.repeat_interleave(per_group, dim=2).contiguous(),
            "v": (x.float() * dt[..., None]).to(x.dtype).contiguous(),
            "g": (dt * A).contiguous()}


def fla_core(chunk_simple_gla, q, k, v, g):
    """(o, final state (batch, nheads, dstate, headdim)) of chunk_simple_gla on fla_inputs."""
    return chunk_simple_gla(q, k, v, g=g, scale=1.0, output_final_state=True)


def rounds_ms(calls: dict, reps: int) -> dict:
    """{name: [ms of each round]} of the named calls, timed in turn within each of `reps`
    rounds, each call behind an L2 flush and a GPU sleep (host time hidden): a drift of the
    GPU's clocks between rounds shifts every call alike, so a round's differences stay paired."""
    import torch
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    for call in calls.values():
        call()
    torch.cuda.synchronize()
    events = {name: [] for name in calls}
    for _ in range(reps):
        for name, call in calls.items():
            flush.zero_()
            torch.cuda._sleep(SLEEP_CYCLES)
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            call()
            end.record()
            events[name].append((start, end))
    torch.cuda.synchronize()
    return {name: [s.elapsed_time(e) for s, e in pairs] for name, pairs in events.items()}


def gpu_ms(fn, reps: int) -> float:
    """Median ms of fn() over reps rounds, each behind an L2 flush and a GPU sleep."""
    return statistics.median(rounds_ms({"fn": fn}, reps)["fn"])


def row_tensors(config, dtype: str) -> dict:
    """A row's inputs (benchmarks.configs.row_inputs) as torch tensors, x, B, C in `dtype`."""
    import torch
    a = {k: torch.from_dlpack(v) for k, v in row_inputs(config).items()}
    for k in ("x", "B", "C"):
        a[k] = a[k].to(getattr(torch, dtype))
    return a


def row_calls(name: str, dtype: str) -> dict:
    """{implementation: call} of one row: cuTile, and each peer that imports."""
    import kernels
    config = ANCHORS[name]
    chunk_size = config[-1]
    a = row_tensors(config, dtype)
    args = (a["x"], a["dt"], a["A"], a["B"], a["C"], chunk_size)
    calls = {"cutile": lambda: kernels.ssd_forward(*args, D=a["D"], return_final_states=True)}
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as e:  # ImportError, or a broken triton/torch install under it
        print(f"mamba_ssm not timed ({type(e).__name__}: {e})")
    else:
        calls["mamba_ssm"] = lambda: mamba_chunk_scan_combined(*args, D=a["D"],
                                                               return_final_states=True)
    try:
        from fla.ops.simple_gla.chunk import chunk_simple_gla
    except Exception as e:
        print(f"flash-linear-attention not timed ({type(e).__name__}: {e})")
    else:
        inputs = fla_inputs(a["x"], a["dt"], a["A"], a["B"], a["C"])
        calls["fla"] = lambda: fla_core(chunk_simple_gla, **inputs)
    fused5 = fused5_ssd()
    if fused5 is not None:
        calls["fused5"] = lambda: fused5(*args[:5], a["D"], chunk_size=chunk_size)
    return calls


@functools.cache
def fused5_ssd():
    """fused-5's `_fused5_ssd` (see the module doc), or None where it does not import (said
    once)."""
    errors = []
    for module in ("mamba_ssm.ops.triton.ssd_fused5", "ssd_fused5"):
        try:
            return importlib.import_module(module)._fused5_ssd
        except Exception as e:  # ImportError, or a broken triton/torch install under it
            errors.append(f"{module}: {type(e).__name__}: {e}")
    print(f"fused-5 not timed ({'; '.join(errors)})")
    return None


# the table's implementations, in its column order
IMPLEMENTATIONS = ("cutile", "mamba_ssm", "fla", "fused5")


def timed_cells(calls: dict, reps: int, timer=None) -> list[str]:
    """A table row's cells: each of IMPLEMENTATIONS' median ms ("-" where it was not called,
    "failed" where a peer raised; cuTile's errors are raised), then cuTile's speedup over the
    fastest peer."""
    timer = timer or gpu_ms
    times = {}
    for impl, call in calls.items():
        try:
            times[impl] = timer(call, reps)
        except Exception as e:  # a peer that does not compile this row: the table goes on
            if impl == "cutile":
                raise
            print(f"{impl} failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            times[impl] = None
    cells = ["-" if i not in times else "failed" if times[i] is None else f"{times[i]:.3f}"
             for i in IMPLEMENTATIONS]
    peers = [t for i, t in times.items() if i != "cutile" and t is not None]
    speedup = (f"{min(peers) / times['cutile']:.2f}x"
               if peers and times.get("cutile") is not None else "-")
    return cells + [speedup]


# --varlen: mamba_ssm's own varlen test shape, VARLEN_SEQS sequences of 1 to 199 tokens packed in
# one row (seeded), nheads 64, headdim 64, dstate 32, at each (ngroups, chunk_size)
VARLEN_SEQS = 300
VARLEN_DIMS = dict(nheads=64, headdim=64, dstate=32)
VARLEN_ROWS = tuple((g, q) for g in (1, 8) for q in (64, 128))


def varlen_calls(ngroups: int, chunk_size: int, dtype: str) -> dict:
    """{implementation: call} of one varlen row: cuTile (cu_seqlens, varlen states), mamba_ssm
    (seq_idx, cu_seqlens, return_varlen_states), fla (cu_seqlens, a final state per sequence),
    each peer where it imports."""
    import numpy as np
    import torch
    import kernels
    rng = np.random.default_rng(VARLEN_SEQS)
    lengths = rng.integers(1, 200, VARLEN_SEQS)
    seqlen, h, p, n = int(lengths.sum()), *VARLEN_DIMS.values()
    gen = torch.Generator(device="cuda").manual_seed(ngroups * 1000 + chunk_size)
    dev, narrow = "cuda", getattr(torch, dtype)
    x = torch.randn(1, seqlen, h, p, device=dev, generator=gen).to(narrow)
    dt = torch.exp(torch.empty(1, seqlen, h, device=dev).uniform_(-6.9, -2.3, generator=gen))
    A = -torch.empty(h, device=dev).uniform_(1.0, 16.0, generator=gen)
    B = torch.randn(1, seqlen, ngroups, n, device=dev, generator=gen).to(narrow)
    C = torch.randn(1, seqlen, ngroups, n, device=dev, generator=gen).to(narrow)
    D = torch.randn(h, device=dev, generator=gen)
    cu = torch.tensor(np.concatenate([[0], np.cumsum(lengths)]), dtype=torch.int32, device=dev)
    seq_idx = torch.repeat_interleave(torch.arange(VARLEN_SEQS, dtype=torch.int32, device=dev),
                                      torch.from_numpy(lengths).to(dev))[None]
    args = (x, dt, A, B, C, chunk_size)
    calls = {"cutile": lambda: kernels.ssd_forward(*args, D=D, cu_seqlens=cu,
                                                   return_varlen_states=True)}
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except Exception as e:
        print(f"mamba_ssm not timed ({type(e).__name__}: {e})")
    else:
        calls["mamba_ssm"] = lambda: mamba_chunk_scan_combined(
            *args, D=D, seq_idx=seq_idx, cu_seqlens=cu, return_varlen_states=True)
    try:
        from fla.ops.simple_gla.chunk import chunk_simple_gla
    except Exception as e:
        print(f"flash-linear-attention not timed ({type(e).__name__}: {e})")
    else:
        inputs = fla_inputs(x, dt, A, B, C)
        cu_long = cu.long()
        calls["fla"] = lambda: chunk_simple_gla(**inputs, scale=1.0, output_final_state=True,
                                                cu_seqlens=cu_long)
    return calls


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.peers",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default=",".join(ANCHORS))
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--varlen", action="store_true",
                        help="the packed varlen rows (VARLEN_ROWS) instead of the anchors")
    args = parser.parse_args(argv)
    if args.varlen:
        print("| ngroups | chunk | dtype | cuTile ms | mamba_ssm ms | fla ms |\n"
              "|---|---|---|---|---|---|")
        for ngroups, chunk_size in VARLEN_ROWS:
            calls = varlen_calls(ngroups, chunk_size, args.dtype)
            times = {impl: gpu_ms(call, args.reps) for impl, call in calls.items()}
            cells = [f"{times[i]:.3f}" if i in times else "-"
                     for i in ("cutile", "mamba_ssm", "fla")]
            print(f"| {ngroups} | {chunk_size} | {args.dtype} | " + " | ".join(cells) + " |",
                  flush=True)
        return 0
    rows = args.rows.split(",")
    unknown = [r for r in rows if r not in ANCHORS]
    if unknown:
        parser.error(f"--rows: unknown rows {unknown}; known: {', '.join(ANCHORS)}")
    print("| row | dtype | cuTile ms | mamba_ssm ms | fla ms | fused-5 ms | cuTile vs best peer |\n"
          "|---|---|---|---|---|---|---|")
    for name in rows:
        cells = timed_cells(row_calls(name, args.dtype), args.reps)
        print(f"| {name} | {args.dtype} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
