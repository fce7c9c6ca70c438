"""Tile-size / hint sweep of the cuTile kernels on the anchor rows (GPU only).

    python -m benchmarks.sweep [--rows mamba2_2p7b,chunk_64] [--reps 20] [--json out.json]
    python -m benchmarks.sweep --forward [--rows ...]
    python -m benchmarks.sweep --ablate [--rows ...]
    python -m benchmarks.sweep --tune [--rows ...]
    python -m benchmarks.sweep --candidate compute_out=path/to/compute_out.py [--only launcher]

--ablate times variants that leave one stage of a kernel out (wrong results by design, `rel`
says how wrong): the differences place the time inside the kernel without hardware counters.
--candidate times another source file of a kernel module (same launcher interface) beside the
committed one, e.g. a rewrite under review; its output is compared with the committed kernel's.

--forward times ssd_forward itself (D, final states) with check_values=True (the default: A, D
read on the host, a synchronisation inside the timed span) and check_values=False, the latter
also with the batch whole and in two slices: GPU time behind a prefill, and host time per call.

--tune runs kernels.tune_forward on each row (D on, float32) and prints every compute_out choice
with its mean time as cuda.tile.tune measured it, the fastest marked, and the rules' choice.

Each variant is a kernel module (kernels/compute_out.py or kernels/fwd_pass_state.py) loaded
from a copy of its source with textual edits applied (e.g. a `latency=` hint on a load) and
module constants or functions overridden (the MAX_BLOCK_*, MAX_HEADS and WHOLE_CHUNK_K the
launcher reads, compute_out's _LAYOUT to force a program layout, its needs_int64 to time the
int64 object), plus compiler hints (`kernel.replace_hints(occupancy=...)`); a variant's
"sm_count" replaces the device's SM count both launchers read. Every variant's output is
compared with the default variant's (max |diff| / max |default|, TF32 noise is ~1e-3) and timed
with CUDA events, L2 flushed before every launch, median of --reps launches. The kernels' inputs
come from the default kernels before them. Prints one table; the notes (benchmarks/NOTES.md)
keep the results.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.configs import ANCHORS, row_inputs

REPO = Path(__file__).resolve().parents[1]

# launcher arguments a variant may set among its constants (the others are module constants):
# the device's SM count, which both launchers read
LAUNCH_ARGS = ("sm_count",)
# each swept module's launcher: fwd_pass_state's returns its launches, compute_out's its launch
LAUNCHERS = {"fwd_pass_state": "fwd_pass_state_launches", "compute_out": "compute_out_launch"}
# (name, module constants, textual edits [(old, new, count)], compiler hints); the first of each
# list is the code as committed (its output is the reference of the others). Hints replace the
# ones of the kernel object the launcher chose for the row's shape; a variant without an occ
# suffix keeps the launcher's occupancy.
T128 = {"MAX_BLOCK_T": 128, "TILE_ELEMENTS": 16384}
# int64 indexing: the kernel object for arrays of 2^31 elements or more, timed on the usual sizes
INT64 = {"needs_int64": lambda *arrays: True}
COMPUTE_OUT_VARIANTS = [
    ("launcher", {}, [], {}),
    ("int64", INT64, [], {}),
    # the two program layouts, whatever the launcher picks for the row
    ("token_blocks", {"_LAYOUT": "token_blocks"}, [], {}),
    ("whole_chunks", {"_LAYOUT": "whole_chunks"}, [], {}),
    ("occ1", {}, [], {"occupancy": 1}),
    ("occ3", {}, [], {"occupancy": 3}),
    ("occ4", {}, [], {"occupancy": 4}),
    ("w8", {}, [], {"num_worker_warps": 8}),
    ("T128_occ1", T128, [], {"occupancy": 1}),
    ("T128_occ2", T128, [], {"occupancy": 2}),
    ("T32", {"MAX_BLOCK_T": 32}, [], {}),
    # heads of a group per program (C B^T formed once for them), where the launcher takes more
    # than one (float32, chunks of several token blocks)
    ("H1", {"MAX_HEADS": 1}, [], {}),
    ("H4", {"MAX_HEADS": 4}, [], {}),
    ("H4_occ1", {"MAX_HEADS": 4}, [], {"occupancy": 1}),
    ("H4_T32", {"MAX_HEADS": 4, "MAX_BLOCK_T": 32}, [], {}),
]
FWD_PASS_STATE_VARIANTS = [
    ("launcher", {}, [], {}),
    ("int64", INT64, [], {}),
    ("occ1", {}, [], {"occupancy": 1}),
    ("occ2", {}, [], {"occupancy": 2}),
    # the launcher's choice for a grid of fewer programs than SMs / of as many or more: the
    # chunks in parallel then the pass / the chunks in order
    ("small_grid", {"sm_count": 2**31}, [], {}),
    ("large_grid", {"sm_count": 1}, [], {}),
    ("K64", {"WHOLE_CHUNK_K": 64}, [], {}),  # chunk 128 as two products
    ("N64", {"MAX_BLOCK_N": 64}, [], {}),
    ("N64_occ2", {"MAX_BLOCK_N": 64}, [], {"occupancy": 2}),
    ("P32", {"MAX_BLOCK_P": 32}, [], {}),
    # the chunks in parallel: products of 64 tokens; the pass on larger slices
    ("small_grid_K64", {"sm_count": 2**31, "WHOLE_CHUNK_K": 64}, [], {}),
    ("small_grid_pass64", {"sm_count": 2**31, "PASS_BLOCK_P": 64, "PASS_BLOCK_N": 64}, [], {}),
]
# Ablations: (name, textual edits) that leave one stage out, timed beside the committed kernel.
# compute_out (its program per token block, forced, the baseline too): the intra-chunk loop
# (whole / diagonal block only), its exp2, its second product, the carried-state product.
# fwd_pass_state: the chunk_states store of the chunks in order (where the launcher runs them in
# parallel it leaves nothing out), the exp2 of the weights.
COMPUTE_OUT_ABLATIONS = [
    ("abl_no_intra", [("for j in range(i + 1):", "for j in range(0):", 1)]),
    ("abl_diag_only", [("for j in range(i + 1):", "for j in range(i, i + 1):", 1)]),
    ("abl_no_exp2", [("ct.exp2(ct.minimum(a_ts[k] - a_s, 0.0))",
                      "ct.minimum(a_ts[k] - a_s, 0.0)", 1)]),
    ("abl_no_x_mma", [("new_accs += (ct.mma(xsT, W, accs[k]),)",
                       "new_accs += (accs[k] + W.astype(ct.float32) * xsT.astype(ct.float32),)",
                       1)]),
    ("abl_no_state_mma", [("acc = ct.mma(S, CtT, ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.float32))",
                           "acc = ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.float32)", 1)]),
]
FWD_PASS_STATE_ABLATIONS = [
    ("abl_no_chunk_store",
     [("ct.store(chunk_states, (b, c, h, pb, nb),\n"
       "                     ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)))", "pass",
       1)]),
    ("abl_no_exp2", [("dtk * ct.exp2(ct.minimum(a_last - ak, 0.0))",
                      "dtk * ct.minimum(a_last - ak, 0.0)", 1)]),
]
# rows whose kernel specializations differ: chunk 256 / dstate 128, chunk 64, chunk 128 / dstate 64
DEFAULT_ROWS = ("mamba2_2p7b", "chunk_64", "groups_8")


def load_variant(module: str, constants: dict, edits: list, tmpdir: Path, tag: str,
                 source: Path | None = None):
    """The kernel module `kernels/<module>.py` (or `source`) with edits and constants applied,
    loaded anew."""
    src = (source or REPO / "kernels" / f"{module}.py").read_text()
    for old, new, count in edits:
        n = src.count(old)
        if n == 0 or (count is not None and n != count):
            raise ValueError(f"{module} {tag}: edit {old!r} matches {n} times")
        src = src.replace(old, new)
    path = tmpdir / f"{module}_{tag}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"sweep_{module}_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    for k, v in constants.items():
        if k in LAUNCH_ARGS:
            continue
        if not hasattr(mod, k):
            raise ValueError(f"{module} has no constant {k}")
        setattr(mod, k, v)
    return mod


def gpu_time(launch, reps: int, flush) -> float:
    """Median ms of `launch()` over `reps` rounds, L2 flushed before each."""
    return fed_gpu_time(launch, reps, flush, 1)[0]


def fed_gpu_time(launch, reps: int, flush, prefill: int) -> tuple[float, int]:
    """(median ms, starved rounds) of `launch()` over `reps` rounds, each behind `prefill` L2
    flushes; a round is starved when the GPU reached its start before the host had enqueued it
    (its time then holds host time)."""
    import cupy
    times, starved = [], 0
    for _ in range(reps):
        for _ in range(prefill):
            flush()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        launch()
        starved += bool(start.done)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    times.sort()
    return times[len(times) // 2], starved


def variant_lists(ablate: bool, candidates: dict) -> tuple:
    """((module, [(tag, constants, edits, hints, source)]), ...): the tile / hint variants, or the
    committed kernel and its ablations; each candidate file after the committed kernel."""
    lists = []
    for module, variants, ablations in (
            ("fwd_pass_state", FWD_PASS_STATE_VARIANTS, FWD_PASS_STATE_ABLATIONS),
            ("compute_out", COMPUTE_OUT_VARIANTS, COMPUTE_OUT_ABLATIONS)):
        entries = [(*v, None) for v in variants]
        if ablate:  # compute_out's ablations edit its program per token block, forced
            forced = {"_LAYOUT": "token_blocks"} if module == "compute_out" else {}
            tag, constants, edits, hints, source = entries[0]
            entries = [(tag, {**constants, **forced}, edits, hints, source)] + [
                (tag, forced, edits, {}, None) for tag, edits in ablations]
        if module in candidates:
            path = Path(candidates[module])
            entries.insert(1, (f"file:{path.stem}", {}, [], {}, path))
        lists.append((module, entries))
    return tuple(lists)


def sweep_row(name, reps, flush, tmpdir, results, only=None, lists=()):
    import cupy
    import cuda.tile as ct
    import kernels
    from kernels.arrays import Backend
    config = ANCHORS[name]
    inp = row_inputs(config)
    Q = config[-1]
    stream = cupy.cuda.get_current_stream()
    sm_count = Backend("cupy", cupy.cuda.Device().id).sm_count
    dt_out, dA_cumsum = kernels.chunk_cumsum(inp["dt"], inp["A"], Q)
    from kernels.chunk_cumsum import chunk_cumsum_launch
    kernel, grid, args = chunk_cumsum_launch(inp["dt"], inp["A"], None, cupy.empty_like(dt_out),
                                             cupy.empty_like(dA_cumsum), False, (0.0, math.inf))
    ms = gpu_time(lambda: ct.launch(stream, grid, kernel, args), reps, flush)
    results.append(dict(row=name, kernel="chunk_cumsum", variant="default", ms=ms, rel=0.0,
                        compile_s=0.0))
    print(f"{name:12s} chunk_cumsum   default          {ms:8.4f} ms", flush=True)
    chunk_states, _ = kernels.fwd_pass_state(inp["x"], inp["B"], dt_out, dA_cumsum)
    cupy.cuda.runtime.deviceSynchronize()

    for module, variants in lists:
        ref = None
        for tag, constants, edits, hints, source in variants:
            if only and tag not in only and tag != variants[0][0] and source is None:
                continue
            sms = constants.get("sm_count", sm_count)
            mod = load_variant(module, constants, edits, tmpdir, tag.replace(":", "_"), source)
            if module == "fwd_pass_state":
                out = (cupy.full(chunk_states.shape, math.nan, cupy.float32),
                       cupy.full(chunk_states.shape[:1] + chunk_states.shape[2:], math.nan,
                                 cupy.float32))
                launches = getattr(mod, LAUNCHERS[module])(
                    inp["x"], inp["B"], dt_out, dA_cumsum, None, None, *out, sms)
                check = out[0]
            else:
                out = cupy.full(inp["x"].shape, math.nan, cupy.float32)
                launches = [getattr(mod, LAUNCHERS[module])(
                    inp["x"], inp["B"], inp["C"], dt_out, dA_cumsum, chunk_states, inp["D"],
                    None, None, out, sms)]
                check = out
            if hints:  # on the stage's first kernel (fwd_pass_state's state products)
                kernel, grid, args = launches[0]
                launches[0] = (kernel.replace_hints(**hints), grid, args)

            def launch_all(launches=launches):
                for kernel, grid, args in launches:
                    ct.launch(stream, grid, kernel, args)
            t0 = time.perf_counter()
            try:
                launch_all()
                cupy.cuda.runtime.deviceSynchronize()
            except Exception as e:  # a variant that does not compile is a result too
                print(f"{name:12s} {module:14s} {tag:16s} FAILED {type(e).__name__}: "
                      f"{str(e)[:200]}", flush=True)
                results.append(dict(row=name, kernel=module, variant=tag, error=str(e)[:500]))
                continue
            compile_s = time.perf_counter() - t0
            if ref is None:
                ref = check.copy()
            rel = float(cupy.nanmax(cupy.abs(check - ref)) / cupy.max(cupy.abs(ref)))
            if bool(cupy.isnan(check).any()):
                rel = math.inf
            ms = gpu_time(launch_all, reps, flush)
            grids = [list(grid) for _, grid, _ in launches]
            results.append(dict(row=name, kernel=module, variant=tag, ms=ms, rel=rel,
                                compile_s=compile_s, grid=grids))
            print(f"{name:12s} {module:14s} {tag:16s} {ms:8.4f} ms  rel {rel:.2e}  "
                  f"compile {compile_s:5.1f} s  grid {' '.join(map(str, grids))}", flush=True)


def time_forward(name, reps, flush, results):
    """ssd_forward on row `name`: as called by default, without the value read, and without it
    with the batch whole and in two slices (kernels.ssd_forward.BATCH_PARTS) where the batch
    allows. Each variant: the median GPU time of `reps` calls, each behind MAX_PREFILL flushes
    (the number of calls whose start the GPU reached before the host had enqueued them is
    printed: those medians include host time), and the median host time of a call enqueued on
    an idle GPU (its Python, checks, read and launches)."""
    import time
    from contextlib import nullcontext
    import cupy
    import kernels
    from kernels.ssd_forward import batch_parts_as
    from benchmarks.timing import MAX_PREFILL
    config = ANCHORS[name]
    inp = row_inputs(config)
    for check, parts in ((True, None), (False, None), (False, 1), (False, 2)):
        if parts is not None and parts > config[0]:
            continue
        def call():
            return kernels.ssd_forward(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"],
                                       config[-1], D=inp["D"], return_final_states=True,
                                       check_values=check)
        with batch_parts_as(parts) if parts else nullcontext():
            call()
            host = []
            for _ in range(reps):
                cupy.cuda.runtime.deviceSynchronize()
                t0 = time.perf_counter()
                call()
                host.append((time.perf_counter() - t0) * 1e6)
            ms, starved = fed_gpu_time(call, reps, flush, MAX_PREFILL)
        host_us = sorted(host)[reps // 2]
        tag = f"check_values={check}" + ("" if parts is None else f",slices={parts}")
        results.append(dict(row=name, kernel="ssd_forward", variant=tag, ms=ms,
                            host_us=host_us, starved=starved))
        print(f"{name:12s} ssd_forward    {tag:28s} {ms:8.4f} ms  host {host_us:7.1f} us  "
              f"starved {starved}/{reps}", flush=True)


def tune_row(name, results):
    """kernels.tune_forward on row `name` (CuPy, float32, D): each launch signature's choices
    with cuda.tile.tune's mean time and 95 % margin, fastest first; the one the launchers' rules
    take is marked `rules`, the fastest `best`, a choice that failed (to compile) `FAILED`."""
    import kernels
    from kernels.compute_out import compute_out_signature, rules_choice
    from kernels.ssd_forward import compute_out_arrays, prepare_forward
    config = ANCHORS[name]
    inp = row_inputs(config)
    args = (inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], config[-1], inp["D"], None, None,
            None, None, False, (0.0, math.inf))
    _, parts, _, _ = prepare_forward(*args)
    rules = {}  # signature -> the rules' choice
    for part in parts:
        signature = compute_out_signature(*compute_out_arrays(part))
        rules[signature] = rules_choice(part["x"], part["B"], part["dt_out"], None,
                                        signature[-1], part["sm_count"])
    found = kernels.tune_forward(*args[:6], D=inp["D"])
    for signature, result in found.items():
        for m in sorted(result.successes, key=lambda m: m.mean_us):
            marks = " ".join(t for t, on in (("best", m.config == result.best.config),
                                             ("rules", m.config == rules[signature])) if on)
            print(f"{name:12s} {str(tuple(m.config)):32s} {m.mean_us:9.1f} +- "
                  f"{m.error_margin_us:5.1f} us  {marks}", flush=True)
            results.append(dict(row=name, signature=list(signature), choice=list(m.config),
                                us=m.mean_us, margin_us=m.error_margin_us, marks=marks))
        for choice, error, message in result.failures:
            print(f"{name:12s} {str(tuple(choice)):32s} FAILED {error.__name__}: "
                  f"{message.splitlines()[0][:120]}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS))
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--only", default="", help="comma-separated variant tags (plus the default)")
    p.add_argument("--forward", action="store_true",
                   help="time ssd_forward: checks on / off, batch whole / in two slices")
    p.add_argument("--tune", action="store_true",
                   help="tune_forward on each row: every compute_out choice's time")
    p.add_argument("--ablate", action="store_true",
                   help="the committed kernels and their ablations instead of the variants")
    p.add_argument("--candidate", action="append", default=[], metavar="MODULE=FILE",
                   help="time FILE, a rewrite of kernels/MODULE.py, beside the committed one")
    p.add_argument("--json")
    a = p.parse_args(argv)
    if any("=" not in c for c in a.candidate):
        p.error("--candidate takes MODULE=FILE, e.g. compute_out=rewrite.py")
    candidates = dict(c.split("=", 1) for c in a.candidate)
    unknown = set(candidates) - {"compute_out", "fwd_pass_state"}
    if unknown:
        p.error(f"--candidate: no kernel module {sorted(unknown)}")
    lists = variant_lists(a.ablate, candidates)
    from benchmarks.timing import cupy_flush
    flush = cupy_flush()
    results: list = []
    only = set(filter(None, a.only.split(",")))
    with tempfile.TemporaryDirectory() as d:
        for name in a.rows.split(","):
            if a.tune:
                tune_row(name, results)
            elif a.forward:
                time_forward(name, a.reps, flush, results)
            else:
                sweep_row(name, a.reps, flush, Path(d), results, only, lists)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
