"""The review gate for a kernel change: one command, every check a reviewer needs.

    python -m properties.gate [--backend auto|gpu|interpreter]

1. compile gate: `pytest -m compile` (every kernel to cubin for sm_80, sm_90, sm_100, sm_120)
2. the kernels' own tests: every stage against its float64 reference over the named shapes
   (tests/shapes.py), the launchers' rules, the tuner's wiring (KERNEL_TESTS; on the
   interpreter, and on the GPU where there is one)
3. the property suite with the ci profile: `pytest -m properties` (HYPOTHESIS_PROFILE=ci), and
   in the same run the reach check (properties/reach.py: every class of launch reachable at the
   ci caps launched)
4. every stored reproducer (properties/reproducers/*.npz) replayed: each must pass now
5. on a GPU, the benchmark regression check against benchmarks/baseline/h200.json
   (`pytest -m benchmark` then `python -m benchmarks.compare ... --threshold 0.10`); where only
   latencies regressed, those rows run again in benchmarks.compare.LATENCY_RETRIES fresh pytest
   processes and each is judged by the median of its runs (`--retry`: a latency holds the
   host's Python, whose speed varies between processes); skipped, saying why, without a GPU or
   without a stored baseline
6. on a GPU, compute-sanitizer's four tools over the reach model's cover problems
   (`python -m properties.sanitize`: every report explained); skipped, saying why, without a
   GPU or without compute-sanitizer
Prints one line per step and exits 1 if any step failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPRODUCERS = REPO / "properties" / "reproducers"
BASELINE = REPO / "benchmarks" / "baseline" / "h200.json"
THRESHOLD = "0.10"  # the regression threshold of benchmarks/baseline/README.md
KERNEL_TESTS = ["tests/test_chunk_cumsum.py", "tests/test_fwd_pass_state.py",
                "tests/test_compute_out.py", "tests/test_ssd_scan.py", "tests/test_ssd_forward.py",
                "tests/test_narrow_inputs.py", "tests/test_tensor_core_products.py",
                "tests/test_tuning.py"]


def _run(args: list[str], **env) -> int:
    print(f"$ {' '.join(args)}", flush=True)
    return subprocess.run(args, cwd=REPO, env=dict(os.environ, **env)).returncode


def benchmark_gate(run, tmp: Path, baseline: Path = BASELINE) -> str:
    """Step 4's verdict. `run(json_path, node_ids)`: a benchmark run (every benchmark when
    `node_ids` is empty) writing pytest-benchmark JSON, its exit status returned. Where every
    failure is a latency that regressed, those rows run again LATENCY_RETRIES times, each in a
    fresh process, and each is judged by the median of its runs (`benchmarks.compare --retry`)."""
    from benchmarks import compare
    current = tmp / "current.json"
    if run(current, []) != 0:
        return "FAIL (benchmark run)"
    retries: list[Path] = []

    def verdict() -> int:
        return _run([sys.executable, "-m", "benchmarks.compare", str(baseline), str(current),
                     "--threshold", THRESHOLD, *(a for r in retries for a in ("--retry", str(r)))])
    status = verdict()
    if status == 1:
        base = compare.load(str(baseline))
        rows, _ = compare.compare(base, compare.load(str(current)), float(THRESHOLD))
        again = compare.latency_regressions(base, rows)
        if again:
            for k in range(1, compare.LATENCY_RETRIES + 1):
                retries.append(tmp / f"retry{k}.json")
                if run(retries[-1], again) != 0:
                    return "FAIL (benchmark rerun)"
                if not retries[-1].exists():
                    return "FAIL (a rerun wrote no results: its rows were skipped?)"
            status = verdict()
    if status != 0:
        return "FAIL"
    return f"pass (latencies: the median of {1 + len(retries)} runs)" if retries else "pass"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=("auto", "gpu", "interpreter"), default="auto")
    args = parser.parse_args(argv)
    from properties.runner import resolve_backend
    backend = resolve_backend(args.backend)
    py = sys.executable
    results = []

    def step(name, fn):
        start = time.time()
        status = fn()
        results.append((name, status, time.time() - start))

    step("compile gate (sm_80, sm_90, sm_100, sm_120)",
         lambda: "pass" if _run([py, "-m", "pytest", "-m", "compile", "-q"]) == 0 else "FAIL")
    step("kernel tests over the named shapes",
         lambda: "pass" if _run([py, "-m", "pytest", "-q", *KERNEL_TESTS]) == 0 else "FAIL")
    step(f"properties and reach, ci profile, {backend}",
         lambda: "pass" if _run([py, "-m", "pytest", "-m", "properties", "-q", "--backend",
                                 backend], HYPOTHESIS_PROFILE="ci") == 0 else "FAIL")

    def reproducers():
        paths = sorted(str(p) for p in REPRODUCERS.glob("*.npz"))
        if not paths:
            return "skipped: no stored reproducers"
        ok = _run([py, "-m", "properties.replay", "--backend", backend, *paths]) == 0
        return f"pass ({len(paths)})" if ok else "FAIL"
    step("stored reproducers", reproducers)

    def benchmarks():
        if backend != "gpu":
            return "skipped: no GPU (the benchmark regression check needs the H200)"
        if not BASELINE.exists():
            return f"skipped: no stored baseline {BASELINE.relative_to(REPO)} yet"
        with tempfile.TemporaryDirectory() as tmp:
            # mamba_ssm's source, where the machine has it, for the comparison rows
            ext = REPO / ".ext"
            path = os.pathsep.join(filter(None, [str(ext) if ext.exists() else "",
                                                 os.environ.get("PYTHONPATH", "")]))

            def run(json_path, node_ids):
                return _run([py, "-m", "pytest", "-m", "benchmark", "-q", *node_ids,
                             f"--benchmark-json={json_path}"], PYTHONPATH=path)
            return benchmark_gate(run, Path(tmp))
    step("benchmark regression vs baseline", benchmarks)

    def sanitizers():
        from properties.sanitize import sanitizer_path
        if backend != "gpu":
            return "skipped: no GPU (compute-sanitizer watches the kernels on the device)"
        if sanitizer_path() is None:
            return ("skipped: no compute-sanitizer (not on PATH, in $CUDA_HOME/bin nor "
                    "/usr/local/cuda/bin)")
        return "pass" if _run([py, "-m", "properties.sanitize"]) == 0 else "FAIL"
    step("compute-sanitizer: memcheck, initcheck, racecheck, synccheck", sanitizers)

    print("\nreview gate:")
    for name, status, seconds in results:
        print(f"  {name:<50} {status}  ({seconds:.0f} s)")
    failed = [name for name, status, _ in results if status.startswith("FAIL")]
    print("GATE FAILED: " + ", ".join(failed) if failed else "gate passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
