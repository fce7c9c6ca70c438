"""Times the kernels' declared launch choices on the anchor rows (GPU only).

    python -m benchmarks.sweep [--rows mamba2_2p7b,chunk_64] [--reps 20] [--json out.json]
    python -m benchmarks.sweep --all [--rows ...]
    python -m benchmarks.sweep --only whole_chunks/h2/occ1/t64,h8 [--rows ...]
    python -m benchmarks.sweep --ablate [--rows ...] [--only abl_no_exp2]
    python -m benchmarks.sweep --candidate compute_out=path/to/compute_out.py [--rows ...]
    python -m benchmarks.sweep --forward [--rows ...]
    python -m benchmarks.sweep --tune [--rows ...]

Rows are benchmarks.configs.ANCHORS (float32, D per head). Each kernel module declares the launch
choices it can take, CHOICES (kernels/chunk_cumsum.py, fwd_pass_state.py, compute_out.py,
ssd_scan.py), and the one its rules pick for a shape and device (rules_choice; ssd_scan's
RULES_CHOICE); the sweep launches each choice by passing
it to the kernel's launcher (`choice=`), so nothing is patched.

Default: for each row and kernel (chunk_cumsum, fwd_pass_state, compute_out, ssd_scan), the rules'
choice
(marked `rules`, timed first: the reference) and every declared choice one field away from it that
the shape can run (compute_out: those in compute_out_choices; fwd_pass_state: those whose mode
modes(chunk_size) allows). A choice that makes the same launches as one timed before it (a field
the shape clamps or does not read, e.g. pass_block in order) is reported and not timed. `--all`
times every choice the shape can run instead of the neighbours. `--only LABEL,...` times just those
choices (any the shape can run) after the rules'; kernels it names no choice of are left out.
Choices are labelled by their fields in order: `h16` (chunk_cumsum: block_h),
`in_order/k128/p64/n128/occ2/pass32` (fwd_pass_state: mode, block_k, block_p, block_n, occupancy,
"default" for the compiler's, pass_block), `whole_chunks/h2/occ2/t64` (compute_out: layout,
heads, occupancy, block_t), `scan_h1/occ2/p64/wdefault/seg0` (ssd_scan: heads, occupancy, block_p,
worker warps, segments).

Each choice's outputs are compared with the rules' choice's: rel = max |diff| / max |reference|
(inf where a NaN appears; the outputs are NaN-filled before the launch; TF32 rounding moves them
by ~1e-3), and timed with CUDA events, L2 flushed before every launch, median of --reps. The
kernels' inputs come from the rules' kernels before them. A choice that fails to compile is
printed as FAILED and recorded with its error.

--ablate times the committed fwd_pass_state and compute_out beside copies of their source with
one stage left out (text edits; wrong results by design, `rel` says how wrong), all with the
rules' choice (compute_out with its program per token block, whose source the edits cut): the
differences place the time inside the kernel without hardware counters.

--candidate MODULE=FILE (repeatable) times FILE, another source of kernels/MODULE.py with the same
launcher interface (e.g. a rewrite under review), right after the committed kernel's reference,
launched without `choice=` (its own rules' choice); its outputs are compared with the reference.

--forward times ssd_forward itself (D, final states) as called by default (A, D checked by the
kernels), with check_values=True (A, D read on the host: a synchronisation inside the timed span)
and with check_values=False, the latter also with batch_parts=1 and 2 (the batch whole and in
two slices) and on each of its routes (kernels.launches.ROUTES; --rows may also name
benchmarks.configs.SMALL_GRID_ROWS, where the route is decided): the GPU time behind a
prefill (rounds whose start the GPU reached before the host had enqueued them are counted as
starved: their medians hold host time), and the median host time of a call enqueued on an idle
GPU.

--tune runs kernels.tune_forward on each row (D on, float32) and prints every compute_out choice
with its mean time as cuda.tile.tune measured it, the fastest marked `best`, the rules' `rules`.

--json FILE writes every result (row, kernel, variant, choice, ms, rel, ...) as a JSON list. The
measured reasons of the rules are kept in benchmarks/DECISIONS.md.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import importlib.util
import json
import math
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.configs import ANCHORS, SMALL_GRID_ROWS, dims_of, row_inputs

REPO = Path(__file__).resolve().parents[1]

KERNELS = ("chunk_cumsum", "fwd_pass_state", "compute_out", "ssd_scan")
# a label's prefix of each of the kernel's Choice fields, in field order
LABEL_PREFIXES = {
    "chunk_cumsum": ("h",),  # block_h
    "fwd_pass_state": ("", "k", "p", "n", "occ", "pass"),  # mode, block_k/p/n, occupancy, pass
    "compute_out": ("", "h", "occ", "t"),  # layout, heads, occupancy, block_t
    "ssd_scan": ("scan_h", "occ", "p", "w", "seg"),  # heads, occupancy, block_p, warps, segments
}
# each kernel's outputs (NaN-filled before every launch, compared with the reference's)
OUTPUTS = {"chunk_cumsum": ("dt_out", "dA_cumsum"),
           "fwd_pass_state": ("chunk_states", "final_states"),
           "compute_out": ("y",),
           "ssd_scan": ("y", "final_states")}
# Ablations: (name, textual edits [(old, new, count)]) that leave one stage out, timed beside the
# committed kernel; each edit must match the source exactly `count` times.
# fwd_pass_state: the chunk_states store of the chunks in order (where the rules run the chunks
# in parallel it leaves nothing out), the exp2 of the weights.
# compute_out (its program per token block, forced by the choice): the intra-chunk loop (whole /
# diagonal block only), its exp2, its second product, the carried-state product.
ABLATIONS = {
    "fwd_pass_state": [
        ("abl_no_chunk_store", [
            ("ct.store(chunk_states, (i_b, i_c, i_h, i_p, i_n),\n                     "
             "ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)).astype(\n"
             "                         chunk_states.dtype))",
             "pass", 1)]),
        ("abl_no_exp2", [("dtk * ct.exp2(ct.minimum(a_last - ak, 0.0))",
                          "dtk * ct.minimum(a_last - ak, 0.0)", 1)]),
    ],
    "compute_out": [
        ("abl_no_intra", [("for i_sc in range(i_tc + 1):", "for i_sc in range(0):", 1)]),
        ("abl_diag_only", [("for i_sc in range(i_tc + 1):",
                            "for i_sc in range(i_tc, i_tc + 1):", 1)]),
        ("abl_no_exp2", [("ct.exp2(ct.minimum(a_ts[i_k] - a_s, 0.0))",
                          "ct.minimum(a_ts[i_k] - a_s, 0.0)", 1)]),
        ("abl_no_x_mma", [("new_accs += (mma_product(xsT, W, accs[i_k], x.dtype),)",
                           "new_accs += (accs[i_k] + W.astype(ct.float32) * "
                           "xsT.astype(ct.float32),)", 1)]),
        ("abl_no_state_mma", [
            ("acc = mma_product(ct.reshape(S, (BLOCK_P, DSTATE)), CtT,\n"
             "                          ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.float32), x.dtype)",
             "acc = ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.float32)", 1)]),
    ],
}
# rows whose kernel specializations differ: chunk 256 / dstate 128, chunk 64, chunk 128 / dstate 64
DEFAULT_ROWS = ("mamba2_2p7b", "chunk_64", "groups_8")


def kernel_module(kernel: str):
    """The committed module kernels/<kernel>.py."""
    return importlib.import_module(f"kernels.{kernel}")


# ---------------------------------------------------------------------------------------------
# labels
# ---------------------------------------------------------------------------------------------

def label(kernel: str, choice) -> str:
    """A choice's label: its fields in order, each behind its prefix (LABEL_PREFIXES), joined by
    "/"; None (the compiler's own occupancy or warp count) reads "default"."""
    prefixes = LABEL_PREFIXES[kernel]
    if len(choice) != len(prefixes):
        raise ValueError(f"{kernel}: a choice has {len(prefixes)} fields, got {choice!r}")
    return "/".join(f"{p}{'default' if v is None else v}" for p, v in zip(prefixes, choice))


def labels() -> dict:
    """{label: (kernel, Choice)} of every declared choice of the three kernels."""
    found = {}
    for kernel in KERNELS:
        for choice in kernel_module(kernel).CHOICES:
            name = label(kernel, choice)
            if name in found:
                raise ValueError(f"label {name!r}: {found[name]} and {(kernel, choice)}")
            found[name] = (kernel, choice)
    return found


def choice_of(name: str) -> tuple:
    """(kernel, Choice) of a label; ValueError naming the closest labels when none is declared."""
    found = labels()
    if name not in found:
        close = difflib.get_close_matches(name, list(found), n=3, cutoff=0.5)
        examples = [label(k, kernel_module(k).CHOICES[0]) for k in KERNELS]
        raise ValueError(f"no declared choice is labelled {name!r} ("
                         + (f"closest: {', '.join(close)}" if close else
                            f"labels look like {', '.join(examples)}") + ")")
    return found[name]


# ---------------------------------------------------------------------------------------------
# the choices of a row: rules' first, then its neighbours (or all, or those asked for)
# ---------------------------------------------------------------------------------------------

class StandIn:
    """A stand-in array for the launchers, which read only shapes and dtypes."""

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), dtype


def stand_ins(config) -> dict:
    """A row's arrays (as row_inputs draws them, and the kernels' outputs) as stand-ins."""
    dims = dims_of(config)
    names = ("x", "dt", "A", "B", "C", "dt_out", "dA_cumsum", "chunk_states", "final_states", "y")
    arrays = {n: StandIn(dims.shape(n)) for n in names}
    arrays["D"] = StandIn((dims.nheads,))  # one skip weight per head, as row_inputs
    arrays["errors"] = StandIn((1,), "int32")  # an error word (kernels.errors)
    return arrays


def launches_of(kernel: str, mod, a: dict, sm_count, choice) -> list:
    """[(kernel, grid, args)] of `kernel`'s launcher in module `mod` on arrays `a` (D on, no z,
    no seq_idx, no initial states, no dt_bias or softplus), with `choice=choice`, each as
    ssd_forward launches it (chunk_cumsum checks D, compute_out does not)."""
    if kernel == "chunk_cumsum":
        return [mod.chunk_cumsum_launch(a["dt"], a["A"], None, a["dt_out"], a["dA_cumsum"],
                                        False, (0.0, math.inf), choice=choice,
                                        errors=a["errors"], D=a["D"])]
    if kernel == "fwd_pass_state":
        return list(mod.fwd_pass_state_launches(a["x"], a["B"], a["dt_out"], a["dA_cumsum"], None,
                                                None, a["chunk_states"], a["final_states"],
                                                sm_count, choice=choice))
    if kernel == "ssd_scan":  # the segmented kernel's arrays: stand-ins, or zeros on the GPU
        scratch = {name: StandIn(shape, "int32" if name == "ready" else "float32")
                   if isinstance(a["x"], StandIn) else _zeros(shape, name == "ready")
                   for name, shape in mod.scan_scratch(a["x"], a["B"], choice).items()}
        return mod.ssd_scan_launches(a["x"], a["B"], a["C"], a["dt_out"], a["dA_cumsum"], None,
                                     a["D"], None, None, a["y"], a["final_states"], sm_count,
                                     choice, errors=a["errors"], check_D=False, **scratch)
    return [mod.compute_out_launch(*compute_out_arrays(a), sm_count, choice=choice,
                                   errors=a["errors"], check_D=False)]


def _zeros(shape, int32: bool):
    import cupy
    return cupy.zeros(shape, cupy.int32 if int32 else cupy.float32)


def compute_out_arrays(a: dict) -> tuple:
    """compute_out_launch's arrays (x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y)."""
    return (a["x"], a["B"], a["C"], a["dt_out"], a["dA_cumsum"], a["chunk_states"], a["D"], None,
            None, a["y"])


def rules_and_runnable(kernel: str, a: dict, sm_count) -> tuple:
    """(the rules' choice, [the declared choices the shape can run]) of `kernel` on arrays `a`."""
    from kernels.arrays import launch_dims
    mod = kernel_module(kernel)
    arrays = compute_out_arrays(a)
    int64 = kernel == "compute_out" and kernel_module("compute_out").compute_out_signature(
        *arrays)[-1]
    rules = mod.rules_choice(launch_dims(a["x"], a["B"], a["dt_out"], int64=int64), sm_count)
    if kernel == "chunk_cumsum":
        return rules, list(mod.CHOICES)
    if kernel == "ssd_scan":
        return rules, mod.ssd_scan_choices(a["x"], a["B"])
    if kernel == "fwd_pass_state":
        return rules, [c for c in mod.CHOICES if c.mode in mod.modes(int(a["dt_out"].shape[3]))]
    return rules, mod.compute_out_choices(*arrays)


def launch_key(launches: list) -> tuple:
    """What makes two launch lists the same work: the kernel objects, grids and constants."""
    return tuple((id(k), tuple(grid), tuple(None if hasattr(v, "shape") else v for v in args))
                 for k, grid, args in launches)


def fields_apart(c1, c2) -> int:
    return sum(u != v for u, v in zip(c1, c2))


def sweep_choices(kernel: str, config, sm_count, everything: bool = False,
                  only=None) -> tuple[list, list]:
    """([(label, Choice)] to time, the rules' first; [(label, label of the same launch)] left
    out) of `kernel` on row `config` on a device of `sm_count` SMs: the rules' choice and the
    runnable choices one field away from it, or every runnable choice (`everything`), or the
    runnable ones whose label is in `only`; a choice whose launches equal an earlier one's is
    left out."""
    mod = kernel_module(kernel)
    a = stand_ins(config)
    rules, runnable = rules_and_runnable(kernel, a, sm_count)
    if rules not in runnable:
        raise RuntimeError(f"{kernel}: the rules' choice {rules} is not one the shape can run")
    if only is not None:
        picked = [c for c in runnable if label(kernel, c) in only]
    elif everything:
        picked = runnable
    else:
        picked = [c for c in runnable if fields_apart(c, rules) == 1]
    timed, same, seen = [], [], {}
    for choice in [rules] + [c for c in picked if c != rules]:
        key = launch_key(launches_of(kernel, mod, a, sm_count, choice))
        name = label(kernel, choice)
        if key in seen:
            same.append((name, seen[key]))
            continue
        seen[key] = name
        timed.append((name, choice))
    return timed, same


def ablation_choice(kernel: str, rules):
    """The choice the ablations (and their reference) launch: the rules', compute_out's with its
    program per token block (the kernel the edits cut)."""
    return rules._replace(layout="token_blocks") if kernel == "compute_out" else rules


# ---------------------------------------------------------------------------------------------
# module copies: ablations and candidates
# ---------------------------------------------------------------------------------------------

def load_variant(module: str, edits: list, tmpdir: Path, tag: str, source: Path | None = None):
    """The kernel module `kernels/<module>.py` (or `source`) with textual edits [(old, new,
    count)] applied (ValueError unless `old` matches exactly `count` times), loaded anew from a
    copy in `tmpdir`."""
    src = Path(source or REPO / "kernels" / f"{module}.py").read_text()
    for old, new, count in edits:
        n = src.count(old)
        if n != count:
            raise ValueError(f"{module} {tag}: edit {old!r} matches {n} times, not {count}")
        src = src.replace(old, new)
    path = Path(tmpdir) / f"{module}_{tag}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"sweep_{module}_{tag}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


_LOADED: dict = {}  # (module, tag, source) -> the module copy, loaded once per process


def loaded_variant(module: str, edits: list, tmpdir: Path, tag: str, source: Path | None = None):
    """load_variant, once per (module, tag, source) in this process: its kernel objects (and so
    their compiled code) serve every row."""
    key = (module, tag, None if source is None else str(Path(source).resolve()))
    if key not in _LOADED:
        _LOADED[key] = load_variant(module, edits, tmpdir, tag, source)
    return _LOADED[key]


def relative_error(outputs, references) -> float:
    """max |out - ref| / max |ref| over the pairs (NumPy or CuPy arrays); inf where an output
    holds a NaN (or the references are all zero and an output is not)."""
    rel = 0.0
    for out, ref in zip(outputs, references):
        if bool((out != out).any()):
            return math.inf
        diff, scale = float(abs(out - ref).max()), float(abs(ref).max())
        rel = max(rel, diff / scale if scale else (0.0 if diff == 0 else math.inf))
    return rel


# ---------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------

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


def row_arrays(name: str) -> tuple[dict, int]:
    """(the row's inputs and the rules' chunk_cumsum / fwd_pass_state outputs, the device's SM
    count) on the GPU."""
    import cupy
    import kernels
    from kernels.arrays import backend_of
    config = ANCHORS[name]
    a = row_inputs(config)
    a["dt_out"], a["dA_cumsum"] = kernels.chunk_cumsum(a["dt"], a["A"], config[-1])
    a["chunk_states"], a["final_states"] = kernels.fwd_pass_state(a["x"], a["B"], a["dt_out"],
                                                                  a["dA_cumsum"])
    a["y"] = cupy.empty_like(a["x"])
    a["errors"] = cupy.zeros(1, cupy.int32)  # an error word (kernels.errors): the values are good
    cupy.cuda.runtime.deviceSynchronize()
    return a, backend_of(x=a["x"]).sm_count


def time_entries(name: str, kernel: str, entries: list, a: dict, sm_count, reps: int, flush,
                 results: list):
    """Time each entry (tag, module, choice, mark) of `kernel` on the row's arrays `a`: outputs
    NaN-filled, launched, compared with the first entry that ran, timed."""
    import cupy
    import cuda.tile as ct
    stream = cupy.cuda.get_current_stream()
    ref = None
    for tag, mod, choice, mark in entries:
        outs = {n: cupy.full(a[n].shape, math.nan, a[n].dtype) for n in OUTPUTS[kernel]}
        record = dict(row=name, kernel=kernel, variant=tag, mark=mark,
                      choice=None if choice is None else list(choice))
        t0 = time.perf_counter()
        try:  # a choice that does not compile (or that the launcher refuses) is a result too
            launches = launches_of(kernel, mod, {**a, **outs}, sm_count, choice)

            def launch_all(launches=launches):
                for k, grid, args in launches:
                    ct.launch(stream, grid, k, args)
            launch_all()
            cupy.cuda.runtime.deviceSynchronize()
        except Exception as e:
            print(f"{name:12s} {kernel:14s} {tag:48s} {mark:5s} FAILED {type(e).__name__}: "
                  f"{str(e)[:200]}", flush=True)
            results.append(dict(record, error=f"{type(e).__name__}: {str(e)[:500]}"))
            continue
        compile_s = time.perf_counter() - t0
        checks = [outs[n] for n in OUTPUTS[kernel]]
        if ref is None:
            ref = [c.copy() for c in checks]
        rel = relative_error(checks, ref)
        ms = gpu_time(launch_all, reps, flush)
        grids = [list(grid) for _, grid, _ in launches]
        results.append(dict(record, ms=ms, rel=rel, compile_s=compile_s, grid=grids))
        print(f"{name:12s} {kernel:14s} {tag:48s} {mark:5s} {ms:8.4f} ms  rel {rel:.2e}  "
              f"compile {compile_s:5.1f} s  grid {' '.join(map(str, grids))}", flush=True)


def candidate_entries(kernel: str, candidates: dict, tmpdir: Path) -> list:
    if kernel not in candidates:
        return []
    path = Path(candidates[kernel])
    tag = f"file:{path.stem}"
    return [(tag, loaded_variant(kernel, [], tmpdir, tag.replace(":", "_"), path), None, "")]


def sweep_row(name: str, reps: int, flush, tmpdir: Path, results: list, *, everything=False,
              only=None, candidates=None):
    """Each kernel's choices on row `name` (sweep_choices), each candidate after the rules'."""
    candidates = candidates or {}
    a, sm_count = row_arrays(name)
    for kernel in KERNELS:
        asked = None if only is None else {n for n in only if choice_of(n)[0] == kernel}
        if asked is not None and not asked and kernel not in candidates:
            continue
        timed, same = sweep_choices(kernel, ANCHORS[name], sm_count, everything, asked)
        mod = kernel_module(kernel)
        entries = [(n, mod, c, "rules" if i == 0 else "") for i, (n, c) in enumerate(timed)]
        entries[1:1] = candidate_entries(kernel, candidates, tmpdir)
        time_entries(name, kernel, entries, a, sm_count, reps, flush, results)
        for n, twin in same:
            print(f"{name:12s} {kernel:14s} {n:48s} same launches as {twin}: not timed",
                  flush=True)
        for n in sorted((asked or set()) - {n for n, _ in timed} - {n for n, _ in same}):
            print(f"{name:12s} {kernel:14s} {n:48s} not one the shape can run", flush=True)


def ablate_row(name: str, reps: int, flush, tmpdir: Path, results: list, *, only=None,
               candidates=None):
    """The committed fwd_pass_state and compute_out with the rules' choice (ablation_choice)
    beside their ablations (those in `only` where given) and candidates."""
    candidates = candidates or {}
    a, sm_count = row_arrays(name)
    for kernel, ablations in ABLATIONS.items():
        rules, _ = rules_and_runnable(kernel, a, sm_count)
        choice = ablation_choice(kernel, rules)
        mod = kernel_module(kernel)
        entries = [(label(kernel, choice), mod, choice, "ref")]
        entries += candidate_entries(kernel, candidates, tmpdir)
        entries += [(tag, loaded_variant(kernel, edits, tmpdir, tag), choice, "")
                    for tag, edits in ablations if only is None or tag in only]
        time_entries(name, kernel, entries, a, sm_count, reps, flush, results)


def time_forward(name, reps, flush, results):
    """ssd_forward on row `name`: as called by default, without the value read, and without it
    with batch_parts=1 and 2 (the batch whole and in two slices) where the batch allows and on
    each route the shape can take (kernels.launches.ROUTES). Each:
    the median GPU time of `reps` calls, each behind MAX_PREFILL flushes (the number of calls
    whose start the GPU reached before the host had enqueued them is printed: those medians
    include host time), and the median host time of a call enqueued on an idle GPU (its Python,
    checks, read and launches)."""
    import cupy
    import kernels
    from benchmarks.timing import MAX_PREFILL
    from kernels.launches import ROUTES
    from kernels.ssd_scan import scan_fits
    config = (ANCHORS | SMALL_GRID_ROWS)[name]
    inp = row_inputs(config)
    routes = [r for r in ROUTES if r != "scan" or scan_fits(config[4])]
    variants = [(None, None, None), (True, None, None), (False, None, None), (False, 1, None),
                (False, 2, None)] + [(False, None, route) for route in routes]
    for check, parts, route in variants:
        if parts is not None and parts > config[0]:
            continue

        def call(check=check, parts=parts, route=route):
            return kernels.ssd_forward(inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"],
                                       config[-1], D=inp["D"], return_final_states=True,
                                       check_values=check, batch_parts=parts, route=route)
        call()
        host = []
        for _ in range(reps):
            cupy.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            call()
            host.append((time.perf_counter() - t0) * 1e6)
        ms, starved = fed_gpu_time(call, reps, flush, MAX_PREFILL)
        host_us = sorted(host)[reps // 2]
        tag = (f"check_values={check}" + ("" if parts is None else f",batch_parts={parts}")
               + ("" if route is None else f",route={route}"))
        results.append(dict(row=name, kernel="ssd_forward", variant=tag, ms=ms,
                            host_us=host_us, starved=starved))
        print(f"{name:12s} ssd_forward    {tag:40s} {ms:8.4f} ms  host {host_us:7.1f} us  "
              f"starved {starved}/{reps}", flush=True)


def tune_row(name, results):
    """kernels.tune_forward on row `name` (CuPy, float32, D): each launch signature's choices
    with cuda.tile.tune's mean time and 95 % margin, fastest first; the one the launcher's rules
    take is marked `rules`, the fastest `best`, a choice that failed (to compile) `FAILED`."""
    import kernels
    from kernels.arrays import launch_dims
    from kernels.compute_out import Choice, compute_out_signature, rules_choice
    from kernels.call import Call
    from kernels.plan import plan_of
    config = ANCHORS[name]
    inp = row_inputs(config)
    args = (inp["x"], inp["dt"], inp["A"], inp["B"], inp["C"], config[-1], inp["D"], None, None,
            None, None, False, (0.0, math.inf))
    call = Call(*args[:7])
    plan = plan_of(call)
    parts = plan.forward_parts(plan.arrays(call))
    rules = {}  # signature -> the rules' choice
    for part in parts:
        arrays = part.arrays.compute_out_arrays()
        signature = compute_out_signature(*arrays)
        x, B, _, dt_out, _, _, _, _, seg, _ = arrays
        rules[signature] = rules_choice(launch_dims(x, B, dt_out, seg=seg, int64=signature[-1]),
                                        part.sm_count)
    found = kernels.tune_forward(*args[:6], D=inp["D"])
    for signature, result in found.items():
        for m in sorted(result.successes, key=lambda m: m.mean_us):
            choice = Choice(*m.config)
            marks = " ".join(t for t, on in (("best", choice == tuple(result.best.config)),
                                             ("rules", choice == rules.get(signature))) if on)
            print(f"{name:12s} {label('compute_out', choice):32s} {m.mean_us:9.1f} +- "
                  f"{m.error_margin_us:5.1f} us  {marks}", flush=True)
            results.append(dict(row=name, signature=list(signature), choice=list(choice),
                                variant=label("compute_out", choice), us=m.mean_us,
                                margin_us=m.error_margin_us, marks=marks))
        for choice, error, message in result.failures:
            print(f"{name:12s} {label('compute_out', Choice(*choice)):32s} FAILED "
                  f"{error.__name__}: {message.splitlines()[0][:120]}", flush=True)


def parse_args(argv=None):
    """The parsed arguments, every one checked before anything runs on the GPU: rows, --only
    labels (choices; ablation names with --ablate), --candidate MODULE=FILE."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", default=",".join(DEFAULT_ROWS),
                   help=f"comma-separated rows of {', '.join(ANCHORS)} (--forward: also "
                        f"{', '.join(SMALL_GRID_ROWS)})")
    p.add_argument("--reps", type=int, default=20)
    modes = p.add_mutually_exclusive_group()
    modes.add_argument("--all", action="store_true",
                       help="every declared choice the shape can run, not only the neighbours")
    modes.add_argument("--ablate", action="store_true",
                       help="the committed kernels beside copies with one stage left out")
    modes.add_argument("--forward", action="store_true",
                       help="time ssd_forward: value read on / off, batch whole / in two slices")
    modes.add_argument("--tune", action="store_true",
                       help="tune_forward on each row: every compute_out choice's time")
    p.add_argument("--only", default="", metavar="LABEL,...",
                   help="time only these choices (with --ablate: ablations) beside the rules'")
    p.add_argument("--candidate", action="append", default=[], metavar="MODULE=FILE",
                   help="time FILE, a rewrite of kernels/MODULE.py, beside the committed one")
    p.add_argument("--json")
    a = p.parse_args(argv)
    a.rows = a.rows.split(",")
    rows = ANCHORS | SMALL_GRID_ROWS if a.forward else ANCHORS
    unknown = [r for r in a.rows if r not in rows]
    if unknown:
        p.error(f"--rows: no {'' if a.forward else 'anchor '}row "
                f"{', '.join(map(repr, unknown))} (rows: {', '.join(rows)})")
    if a.reps < 1:
        p.error("--reps: at least 1")
    a.only = [n for n in a.only.split(",") if n] or None
    if a.only and (a.forward or a.tune):
        p.error("--only selects kernel choices or ablations: not with --forward or --tune")
    if a.only and a.ablate:
        names = {tag for ablations in ABLATIONS.values() for tag, _ in ablations}
        bad = [n for n in a.only if n not in names]
        if bad:
            p.error(f"--only: with --ablate it names ablations ({', '.join(sorted(names))}), "
                    f"got {', '.join(map(repr, bad))}")
    elif a.only:
        for n in a.only:
            try:
                choice_of(n)
            except ValueError as e:
                p.error(f"--only: {e}")
    if a.candidate and (a.forward or a.tune):
        p.error("--candidate: not with --forward or --tune")
    candidates = {}
    for c in a.candidate:
        module, eq, path = c.partition("=")
        if not eq or not path:
            p.error(f"--candidate takes MODULE=FILE, e.g. compute_out=rewrite.py, got {c!r}")
        kernels = tuple(ABLATIONS) if a.ablate else KERNELS
        if module not in kernels:
            p.error(f"--candidate: no kernel module {module!r} (one of {', '.join(kernels)})")
        if module in candidates:
            p.error(f"--candidate: {module} given twice")
        if not Path(path).is_file():
            p.error(f"--candidate: {module}: no file {path}")
        candidates[module] = path
    a.candidate = candidates
    return a


def main(argv=None):
    a = parse_args(argv)
    from benchmarks.timing import cupy_flush
    flush = cupy_flush()
    results: list = []
    with tempfile.TemporaryDirectory() as d:
        for name in a.rows:
            if a.tune:
                tune_row(name, results)
            elif a.forward:
                time_forward(name, a.reps, flush, results)
            elif a.ablate:
                ablate_row(name, a.reps, flush, Path(d), results, only=a.only,
                           candidates=a.candidate)
            else:
                sweep_row(name, a.reps, flush, Path(d), results, everything=a.all,
                          only=a.only, candidates=a.candidate)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
