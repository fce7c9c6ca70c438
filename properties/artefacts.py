"""compute-sanitizer's reports that are not bugs, each shown on a minimal cuTile kernel (GPU).

    python -m properties.artefacts

Each case is a kernel of a few lines that makes the same report as a line of the product's
kernels, for the reason benchmarks/DECISIONS.md gives under the case's section; the rules of
properties.sanitize.EXPLAINED that suppress those lines name the section. This runs each case in
its own process under its tool and checks that the report appears (so the explanation still
holds for the installed compiler and tool), and for racecheck that every hazard of the case
writes the value that is already there. Exit 1 where a case does not reproduce.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from dataclasses import dataclass

import numpy as np

import cuda.tile as ct

N = 64  # tile side: large enough that the loop's loads are pipelined through shared memory


def _replicated_async_copy_kernel(a, x, y, out):
    """acc <- 2^min(a_i, 0) acc + x_i @ y_i over i: the loop holds a product, so its loads are
    pipelined as asynchronous copies into shared memory; the [1, 1] tile of a_i is owned by
    several threads, and each of them copies the same 4 bytes to the same place."""
    acc = ct.zeros((N, N), dtype=ct.float32)
    for i in range(a.shape[0]):
        s = ct.load(a, (i, 0), shape=(1, 1))  # [1, 1]: the reported line
        xs = ct.reshape(ct.load(x, (i, 0, 0), shape=(1, N, N)), (N, N)).astype(ct.tfloat32)
        ys = ct.reshape(ct.load(y, (i, 0, 0), shape=(1, N, N)), (N, N)).astype(ct.tfloat32)
        acc = ct.mma(xs, ys, acc * ct.exp2(ct.minimum(s, 0.0)))
    ct.store(out, (0, 0), acc)


def _tma_store_kernel(x, y, out):
    """out = x @ y, [N, N]: stored through the tensor memory accelerator (a bulk copy from
    shared memory, which initcheck does not count as a write)."""
    xs = ct.load(x, (0, 0), shape=(N, N)).astype(ct.tfloat32)
    ys = ct.load(y, (0, 0), shape=(N, N)).astype(ct.tfloat32)
    ct.store(out, (0, 0), ct.mma(xs, ys, ct.zeros((N, N), dtype=ct.float32)))


def _scalar_read_kernel(src, dst):
    """dst[i] = src[i, N - 1]: one element per program, read by an ordinary load."""
    i = ct.bid(0)
    ct.store(dst, (i,), ct.reshape(ct.load(src, (i, N - 1), shape=(1, 1)), (1,)))


_replicated_async_copy = ct.kernel(_replicated_async_copy_kernel)
_tma_store = ct.kernel(_tma_store_kernel)
_scalar_read = ct.kernel(_scalar_read_kernel)


@dataclass(frozen=True)
class Case:
    name: str
    tool: str
    kind: str  # the start of the report the case makes
    line: str  # the start of the reported line in this file (its code, indentation stripped)
    section: str  # benchmarks/DECISIONS.md's section that explains it


CASES = (
    Case("replicated_async_copy", "racecheck",
         "Error: Race reported between Write access and Write access",
         "s = ct.load(a, (i, 0), shape=(1, 1))",
         "compute-sanitizer: racecheck and a replicated tile's asynchronous copy"),
    Case("tma_store_then_load", "initcheck", "Uninitialized __global__ memory read",
         "ct.store(dst, (i,), ct.reshape(ct.load(src, (i, N - 1), shape=(1, 1)), (1,)))",
         "compute-sanitizer: initcheck and TMA stores"),
)


def run_case(name: str) -> None:
    """The watched process: case `name` on the GPU, on arrays it fills itself."""
    import cupy
    cupy.cuda.set_allocator(None)  # fresh allocations: nothing written before the case
    rng = np.random.default_rng(0)
    stream = cupy.cuda.get_current_stream()

    def filled(*shape):
        return cupy.asarray(rng.random(shape, dtype=np.float32))
    if name == "replicated_async_copy":
        steps = 4
        ct.launch(stream, (1, 1, 1), _replicated_async_copy,
                  (-filled(steps, 1), filled(steps, N, N), filled(steps, N, N),
                   cupy.empty((N, N), cupy.float32)))
    else:
        out = cupy.empty((N, N), cupy.float32)  # written by the kernel alone
        ct.launch(stream, (1, 1, 1), _tma_store, (filled(N, N), filled(N, N), out))
        ct.launch(stream, (N, 1, 1), _scalar_read, (out, cupy.empty((N,), cupy.float32)))
    stream.synchronize()


def reproduce(case: Case, sanitizer: str) -> list[str]:
    """The case under its tool: what does not hold (empty where it reproduces)."""
    from properties.sanitize import parse
    line = f"artefacts.py:{_line_of(case.line)}"
    base = [sanitizer, "--tool", case.tool, "--show-backtrace", "no", "--print-limit", "1000"]
    child = [sys.executable, "-m", "properties.artefacts", "--case", case.name]
    out = subprocess.run(base + child, capture_output=True, text=True, timeout=300)
    reports, _ = parse(case.tool, out.stdout + out.stderr)
    failures = []
    if out.returncode != 0:
        failures.append(f"the process failed ({out.returncode}): {out.stderr[-1000:]}")
    if not any(r.kind.startswith(case.kind) and r.where == (line,) for r in reports):
        failures.append(f"no {case.kind!r} report at {line}: "
                        f"{sorted({(r.kind, r.where) for r in reports})}")
    if case.tool == "racecheck":  # each hazard: the value written is the one already there
        hazards = subprocess.run(base + ["--racecheck-report", "hazard"] + child,
                                 capture_output=True, text=True, timeout=300).stdout
        values = re.findall(r"Current Value : (\d+), Incoming Value : (\d+)", hazards)
        if not values or any(now != incoming for now, incoming in values):
            failures.append(f"hazards that change a value: {values[:8]}")
    return failures


def _line_of(text: str) -> int:
    with open(__file__) as f:
        found = [i for i, line in enumerate(f, 1) if line.strip().startswith(text)]
    if len(found) != 1:
        raise ValueError(f"{text!r} occurs {len(found)} times in {__file__} (must be once)")
    return found[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", help=argparse.SUPPRESS)  # a watched process
    args = parser.parse_args(argv)
    if args.case is not None:
        run_case(args.case)
        return 0
    from kernels.arrays import gpu_available
    from properties.sanitize import sanitizer_path
    sanitizer = sanitizer_path()
    if not gpu_available() or sanitizer is None:
        print("properties.artefacts needs a CUDA device and compute-sanitizer", file=sys.stderr)
        return 2
    failed = 0
    for case in CASES:
        failures = reproduce(case, sanitizer)
        failed += bool(failures)
        print(f"{case.name} ({case.tool}): " + ("reproduces" if not failures else
                                                 "DOES NOT REPRODUCE: " + "; ".join(failures)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
