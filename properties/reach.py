"""Reach: the classes of launch the product can make, derived from its launchers, and the check
that the property suite launched every class reachable at the profile's caps.

A launch's classes (`classes`) are read from what the launcher passes, not from the problem: the
kernel object (function, index width, occupancy hint); for each tiled dimension, the count of its
blocks (1, 2, 3+) and whether the last block is full or partial; the program's choices (heads per
program, the token block, products per chunk, the mode); each option flag; the layout of each of the
call's arrays it takes (contiguous, strided, or strided in its last axis too, as the properties lay
them out: strategies.LAYOUTS), and the dtype of each weight (dt, A, dt_bias, D, initial_states). The
classes reachable at a profile's caps (`reachable`) come from running the launchers on stand-in
arrays (a shape, a dtype and strides, no data) over the sizes, layouts and weights the strategies
can draw (`strategies.drawable`), each launch the properties make: the forward by the rules and on
each of its routes (and in two batch slices) in float32, bfloat16 and float16, fwd_pass_state in
each mode at the rules' and at small tiles, compute_out and ssd_scan in each of their choices, each
kernel alone in bfloat16. `cover` picks a few problems that launch every such class: the property
tests run them as explicit examples, so the check rests on no drawn example's luck. Classes that
need sizes beyond the caps (`beyond_caps`: arrays of 2^31 elements or more, the int64-indexed
objects) are listed with where they are tested instead.

    python -m properties.reach            # the classes reachable at the active profile's caps
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import itertools
import json
import math
import os
import typing
from collections import Counter, defaultdict
from pathlib import Path

import cuda.tile as ct

from contract import Dims, dtype_name, element_strides
from kernels.arrays import Backend, LaunchDims, index_dtype, needs_int64
from kernels.compute_out import BLOCK_TS, OCCUPANCIES, compute_out_choices, compute_out_launch
from kernels.fwd_pass_state import MODES, fwd_pass_state_launches
from kernels.fwd_pass_state import rules_choice as fwd_pass_state_rules
from kernels.launches import ROUTES, ForwardArrays, part_launches, varlen_launches
from kernels.ssd_scan import OCCUPANCIES as SCAN_OCCUPANCIES
from kernels.ssd_scan import WORKER_WARPS as SCAN_WORKER_WARPS
from kernels.ssd_scan import scan_scratch, ssd_scan_choices, ssd_scan_launches
from properties.checks import FWD_PASS_STATE_TILES, compute_out_alone_choices
from properties.runner import route_of
from properties.profiles import Caps
from properties.strategies import LAID_OUT, LAYOUTS, drawable, forward_routes, layout_strides

# Where the classes that no size within the caps reaches are tested.
BEYOND_CAPS_COVERED_BY = {
    "int64": "GPU tests: tests/test_ssd_forward.py::test_seqlen_2_pow_20_beyond_int32_offsets "
             "(-m 'gpu and slow'); the compile gate compiles every int64 object",
}


def _count(n: int) -> str:
    return "1" if n == 1 else "2" if n == 2 else "3+"


def _blocks(extent: int, tile: int) -> str:
    """'count/last': the blocks of `tile` that cover `extent`, and whether the last is full."""
    return f"{_count(-(-extent // tile))}/{'full' if extent % tile == 0 else 'partial'}"


@functools.cache
def _names(pyfunc) -> tuple[str, ...]:
    return tuple(inspect.signature(pyfunc).parameters)


def _params(kernel, args) -> dict:
    return dict(zip(_names(kernel._pyfunc), args, strict=True))


@functools.cache
def _width(pyfunc) -> str:
    hints = typing.get_type_hints(pyfunc, include_extras=True)
    return "int64" if any(index_dtype(h) is ct.int64 for h in hints.values()) else "int32"


def _index_width(kernel) -> str:
    return _width(kernel._annotated_function.pyfunc)


def _chunk_cumsum(a: dict) -> dict:
    dt = a["dt"]
    return {"head blocks": _blocks(dt.shape[2], a["BLOCK_H"]),
            "chunks": _blocks(dt.shape[1], a["CHUNK"]), "chunk": a["CHUNK"],
            "dt_bias": a["HAS_DT_BIAS"], "softplus": a["DT_SOFTPLUS"],
            "dt_limit low": a["DT_MIN"] > 0.0, "dt_limit high": a["DT_MAX"] < math.inf}


def _fwd_pass_state(a: dict) -> dict:
    x, B = a["x"], a["B"]
    return {"headdim blocks": _blocks(x.shape[3], a["BLOCK_P"]),
            "dstate blocks": _blocks(B.shape[3], a["BLOCK_N"]),
            "products per chunk": _count(a["CHUNK"] // a["BLOCK_K"]),
            "chunks": _blocks(x.shape[1], a["CHUNK"]),
            "heads per group": _count(x.shape[2] // B.shape[2]), "groups": _count(B.shape[2]),
            "mode": "parallel_chunks" if a["PARALLEL_CHUNKS"] else "in_order",
            "initial_states": a["HAS_INITIAL_STATES"], "seq_idx": a["HAS_SEQ_IDX"]}


def _state_pass(a: dict) -> dict:
    states = a["chunk_states"]
    return {"headdim blocks": _blocks(states.shape[3], a["BLOCK_P"]),
            "dstate blocks": _blocks(states.shape[4], a["BLOCK_N"]),
            "chunks": _count(states.shape[1]),
            "initial_states": a["HAS_INITIAL_STATES"], "seq_idx": a["HAS_SEQ_IDX"]}


def _compute_out(a: dict) -> dict:
    x, B = a["x"], a["B"]
    per_group = x.shape[2] // B.shape[2]
    seqlen, chunk = x.shape[1], a["CHUNK"]
    # a program per token block: the grid's token blocks; a program per chunk: the token blocks
    # it loops over in the last chunk
    tokens = seqlen if "seg" in a else seqlen - (-(-seqlen // chunk) - 1) * chunk
    out = {"headdim blocks": _blocks(x.shape[3], a["BLOCK_P"]),
           "token blocks per chunk": _count(chunk // a["BLOCK_T"]),
           "token blocks" if "seg" in a else "last chunk's token blocks":
               _blocks(tokens, a["BLOCK_T"]),
           "chunks": _blocks(seqlen, chunk), "block_t": a["BLOCK_T"],
           "dstate tile": "full" if B.shape[3] == a["DSTATE"] else "padded",
           "heads per program": a["HEADS"],
           "head blocks per group": _count(per_group // a["HEADS"]),
           "groups": _count(B.shape[2]), "D": ("channel" if a["D_PER_HEADDIM"] else "head")
           if a["HAS_D"] else "none", "z": a["HAS_Z"]}
    if "HAS_SEQ_IDX" in a:
        out["seq_idx"] = a["HAS_SEQ_IDX"]
    return out


def _ssd_scan(a: dict) -> dict:
    x, B = a["x"], a["B"]
    return {"headdim blocks": _blocks(x.shape[3], a["BLOCK_P"]),
            "token blocks": _blocks(x.shape[1], a["BLOCK_T"]),
            "token blocks per chunk": _count(a["CHUNK"] // a["BLOCK_T"]),
            "chunks": _blocks(x.shape[1], a["CHUNK"]),
            "dstate tile": "full" if B.shape[3] == a["DSTATE"] else "padded",
            "heads per program": a["HEADS"],
            "head blocks per group": _count(x.shape[2] // B.shape[2] // a["HEADS"]),
            "groups": _count(B.shape[2]), "D": ("channel" if a["D_PER_HEADDIM"] else "head")
            if a["HAS_D"] else "none", "z": a["HAS_Z"],
            "initial_states": a["HAS_INITIAL_STATES"], "seq_idx": a["HAS_SEQ_IDX"]}


def _ssd_varlen(a: dict) -> dict:
    x, B = a["x"], a["B"]
    return {"headdim blocks": _blocks(x.shape[3], a["BLOCK_P"]), "block_t": a["BLOCK_T"],
            "dstate tile": "full" if B.shape[3] == a["DSTATE"] else "padded",
            "groups": _count(B.shape[2]), "D": ("channel" if a["D_PER_HEADDIM"] else "head")
            if a["HAS_D"] else "none", "z": a["HAS_Z"],
            "initial_states": a["HAS_INITIAL_STATES"]}


def _ssd_varlen_refused(a: dict) -> dict:
    # its object and batch only: the properties send good offsets, where it stores nothing (its
    # NaN tiles are tested by tests/test_ssd_varlen.py's bad offsets)
    return {}


CLASSES_OF = {"_chunk_cumsum_kernel": _chunk_cumsum, "_fwd_pass_state_kernel": _fwd_pass_state,
              "_state_pass_kernel": _state_pass, "_compute_out_kernel": _compute_out,
              "_compute_out_chunk_kernel": _compute_out, "_ssd_scan_kernel": _ssd_scan,
              "_ssd_varlen_kernel": _ssd_varlen,
              "_ssd_varlen_refused_kernel": _ssd_varlen_refused}

# The call's arrays (ssd_forward's, by the names the kernels give them), each with the flag that
# says a launch takes it where it is optional (a kernel gets a placeholder array else); those
# the properties lay out (strategies.LAID_OUT; seq_idx reaches the kernels as its segment ids,
# made C-contiguous), and the weights, which may be float32 or the activations' 16-bit dtype
CALL_ARRAYS = {"x": None, "dt": None, "A": None, "B": None, "C": None, "D": "HAS_D",
               "z": "HAS_Z", "dt_bias": "HAS_DT_BIAS", "initial_states": "HAS_INITIAL_STATES"}
LAID_OUT_ARRAYS = {n for names in LAID_OUT.values() for n in names} - {"seq_idx"}
WEIGHTS = ("dt", "A", "dt_bias", "D", "initial_states")


def _call_arrays(a: dict) -> dict:
    """Each of the call's arrays a launch takes, where the properties lay it out: contiguous,
    strided (a view that is not C-contiguous: strides other than C-contiguous ones in a
    dimension of 2 elements or more) with a unit last stride, or strided in its last axis too
    (token-major views: cuTile specializes a launch on unit strides); each weight's dtype."""
    out = {}
    for name, flag in CALL_ARRAYS.items():
        if name not in a or (flag is not None and not a[flag]):
            continue
        if name in LAID_OUT_ARRAYS:
            shape, strides = tuple(int(n) for n in a[name].shape), element_strides(a[name])
            contiguous = (math.prod(shape[k + 1:]) for k in range(len(shape)))
            strided = [n > 1 and s != c for n, s, c in zip(shape, strides, contiguous)]
            out[f"{name} layout"] = ("strided last axis" if strided[-1] else "strided"
                                     if any(strided) else "contiguous")
        if name in WEIGHTS:
            out[f"{name} dtype"] = dtype_name(a[name])
    return out


def classes(kernel, grid, args) -> set[str]:
    """The classes of one launch: 'kernel function: what = value' strings."""
    name = kernel._pyfunc.__name__
    a = _params(kernel, args)
    batch = a.get("dt_out", a.get("dA_cumsum", a.get("y"))).shape[0]
    found = {f"{name}: object = {_index_width(kernel)}, occupancy "
             f"{kernel._compiler_options.occupancy or 'default'}",
             f"{name}: batch = {_count(batch)}"}
    found |= {f"{name}: {what} = {value}"
              for what, value in (CLASSES_OF[name](a) | _call_arrays(a)).items()}
    return found


def forward_classes(parts: list[list[tuple]]) -> set[str]:
    """The classes of one forward call's launches, by batch slice (Backend.launch_parts' lists
    of (kernel, grid, args)): its route with its activations' dtype, and its count of batch
    slices (properties.runner.route_of); none for a packed row (one route: its kernels' own
    classes say it)."""
    if any(kernel._pyfunc.__name__.startswith("_ssd_varlen") for part in parts
           for kernel, _, _ in part):
        return set()
    route, count = route_of([[kernel for kernel, _, _ in part] for part in parts])
    kernel, _, args = parts[0][-1]  # the scan or compute_out: they take x
    x = _params(kernel, args)["x"]
    return {f"ssd_forward: route = {route}, x = {dtype_name(x)}",
            f"ssd_forward: batch parts = {_count(count)}"}


def _slices(launches: list) -> list[list[tuple]]:
    """A forward's launches, flat, as its batch slices: each starts with its chunk_cumsum."""
    parts: list[list[tuple]] = []
    for launch in launches:
        if launch[0]._pyfunc.__name__ == "_chunk_cumsum_kernel":
            parts.append([])
        parts[-1].append(launch)
    return parts


# --------------------------------------------------------------------------------------------
# The classes reachable at a profile's caps: the launchers on stand-ins


class _Stand:
    """A stand-in array: a shape, a dtype name and strides in elements (None: C-contiguous); a
    slice of its first dimension is one."""

    def __init__(self, shape, dtype="float32", strides=None):
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)
        self.strides_in_elements = strides or tuple(math.prod(self.shape[k + 1:])
                                                    for k in range(self.ndim))

    def stride(self) -> tuple[int, ...]:
        """The strides in elements, as torch names them (contract.element_strides reads it)."""
        return self.strides_in_elements

    def __getitem__(self, index: slice) -> _Stand:
        return _Stand((len(range(self.shape[0])[index]), *self.shape[1:]), self.dtype,
                      self.strides_in_elements)


# every option on its own and all of them at once, and none
_ALL = dict(D="channel", z=True, dt_bias=True, softplus=True, dt_limit=(1e-4, 1.0),
            initial_states=True, seq_idx=True)
_OPTIONS = [dict(), dict(D="head"), dict(D="channel"), dict(z=True), dict(dt_bias=True),
            dict(softplus=True), dict(dt_limit=(1e-3, 0.1)), dict(initial_states=True),
            dict(seq_idx=True), _ALL]
# each layout other than C-contiguous with every option, and without seq_idx (compute_out's
# program per chunk runs without it only); the weights in the activations' dtype, A too
_LAYOUTS_AND_WEIGHTS = [
    *(dict(options, layout=layout) for layout in LAYOUTS[1:]
      for options in (_ALL, dict(z=True, initial_states=True))),
    dict(_ALL, weights="activation", narrow_A=True)]


def _arrays(d: Dims, opts: dict, activations: str = "float32") -> ForwardArrays:
    """Stand-ins of ssd_forward's arrays as the properties pass them (properties.checks:
    on_backend, _as_bfloat16, _as_float16): x, B, C, z and y in `activations`; dt, dt_bias, D
    and initial_states in it too where opts' weights are "activation" and it is 16-bit, A where
    opts' narrow_A and it is bfloat16; the rest float32; laid out as opts' layout says
    (strategies.layout_strides; seq_idx's segment ids C-contiguous)."""
    layout = opts.get("layout", "contiguous")
    narrow = activations != "float32" and opts.get("weights") == "activation"
    weight = activations if narrow else "float32"
    A = activations if activations == "bfloat16" and opts.get("narrow_A") else "float32"
    s = lambda name, dtype="float32": _Stand(
        d.shape(name), dtype, layout_strides(layout, d, name) if name in LAID_OUT[layout]
        else None)
    a = lambda name: s(name, activations)
    w = lambda name: s(name, weight)
    D = {"head": _Stand((d.nheads,), weight), "channel": w("D")}.get(opts.get("D"))
    return ForwardArrays(
        a("x"), w("dt"), s("A", A), a("B"), a("C"), D, a("z") if opts.get("z") else None,
        w("dt_bias") if opts.get("dt_bias") else None,
        w("initial_states") if opts.get("initial_states") else None,
        _Stand(d.shape("seq_idx"), "int32") if opts.get("seq_idx") else None,
        opts.get("softplus", False), opts.get("dt_limit", (0.0, math.inf)), s("dt_out"),
        s("dA_cumsum"), s("chunk_states"), s("final_states"), a("y"), _Stand((1,), "int32"))


def kind_launches(kind: str, d: Dims, opts: dict, sm_count: int, params=None) -> list:
    """The launches one property kind makes on a problem, its arrays as opts' layout and weights
    say (_arrays): "forward", "forward_bf16", "forward_fp16" (ssd_forward by the rules, its
    activations in FORWARD_KINDS' dtype), "fwd_pass_state_alone" (each mode at each tile set of
    FWD_PASS_STATE_TILES), "compute_out_alone" (its choices at `params`' occupancy and token
    block, as properties.checks.compute_out_alone runs them, every choice where params is
    None), "ssd_scan_alone" (its choices at `params`' occupancy, all where params is None),
    each of the three also in bfloat16 (_narrow_launches), "varlen_packed" (ssd_forward on the
    problem's first row packed, initial states per sequence: chunk_cumsum and ssd_varlen,
    float32 and bfloat16 activations)."""
    return (_own_launches(kind, d, opts, sm_count, params)
            + _narrow_launches(kind, d, opts, sm_count))


def _own_launches(kind: str, d: Dims, opts: dict, sm_count: int, params) -> list:
    """kind_launches less _narrow_launches (which are the same whatever the params: the reach
    model computes them once per problem)."""
    if kind == "varlen_packed":
        found = []
        for activations in ("float32", "bfloat16"):
            a = _arrays(dataclasses.replace(d, batch=1), dict(opts, initial_states=True),
                        activations)
            # 2 sequences: a stand-in count; their initial states in the weights' dtype
            states = _Stand((2, d.nheads, d.headdim, d.dstate), a.initial_states.dtype)
            if not needs_int64(a.x, a.B, a.C, a.dt_out, states):  # int32 indices only
                found += varlen_launches(dataclasses.replace(a, initial_states=states),
                                         _Stand((3,), "int32"), states)
        return found
    if kind in FORWARD_KINDS:  # on opts' route and batch slices (the rules' where absent)
        a = _arrays(d, opts, FORWARD_KINDS[kind])
        parts = min(opts.get("batch_parts") or 1, d.batch)
        return [launch for part in part_launches(a, sm_count, parts, route=opts.get("route"))
                for launch in part]
    a = _arrays(d, opts)
    if kind == "fwd_pass_state_alone":
        rules = fwd_pass_state_rules(LaunchDims(d), sm_count)
        return [launch for mode, tiles in itertools.product(MODES, FWD_PASS_STATE_TILES.values())
                for launch in fwd_pass_state_launches(
                    a.x, a.B, a.dt_out, a.dA_cumsum, a.initial_states, a.seg, a.chunk_states,
                    a.final_states, sm_count, rules._replace(mode=mode, **tiles))]
    if kind == "ssd_scan_alone":  # int32 indices only: none at 2^31 elements
        scan = _scan_arrays(a)
        return [] if needs_int64(*scan) else [
            launch for c in ssd_scan_choices(a.x, a.B)
            if params is None or (c.occupancy, c.warps) == (params["occupancy"], params["warps"])
            for launch in ssd_scan_launches(*scan, sm_count, c, errors=a.errors, **{
                name: _Stand(shape, "int32" if name == "ready" else "float32")
                for name, shape in scan_scratch(a.x, a.B, c).items()})]
    choices = compute_out_choices(*a.compute_out_arrays())
    if params is not None:
        choices = compute_out_alone_choices(choices, params)
    return [compute_out_launch(*a.compute_out_arrays(), sm_count, choice=c, errors=a.errors)
            for c in choices]


def _scan_arrays(a: ForwardArrays) -> tuple:
    """ssd_scan_launches' arrays of a forward's."""
    return (a.x, a.B, a.C, a.dt_out, a.dA_cumsum, a.initial_states, a.D, a.z, a.seg, a.y,
            a.final_states)


def _narrow_launches(kind: str, d: Dims, opts: dict, sm_count: int) -> list:
    """The launches of a kernel's property alone in bfloat16, whatever its params: by the
    rules, and fwd_pass_state with bfloat16 chunk states in each mode too."""
    a = _arrays(d, opts, "bfloat16")
    if kind == "fwd_pass_state_alone":
        rules = fwd_pass_state_rules(LaunchDims(d), sm_count)
        states = _Stand(d.shape("chunk_states"), "bfloat16")
        return [launch for chunk_states, choice in [(a.chunk_states, None), *(
                    (states, rules._replace(mode=mode)) for mode in MODES)]
                for launch in fwd_pass_state_launches(
                    a.x, a.B, a.dt_out, a.dA_cumsum, a.initial_states, a.seg, chunk_states,
                    a.final_states, sm_count, choice)]
    if kind == "ssd_scan_alone":
        scan = _scan_arrays(a)
        return [] if needs_int64(*scan) else ssd_scan_launches(*scan, sm_count, errors=a.errors)
    if kind == "compute_out_alone":
        return [compute_out_launch(*a.compute_out_arrays(), sm_count, errors=a.errors)]
    return []


def launches(d: Dims, opts: dict, sm_count: int):
    """Every launch the properties make on a problem of these dimensions and options (each
    kind's: kind_launches): the forward by the rules in each activation dtype, fwd_pass_state in
    each mode and tile set (FWD_PASS_STATE_TILES), compute_out and ssd_scan in each of their
    choices, each of the three in bfloat16, the packed row."""
    return [launch for kind in KINDS for launch in kind_launches(kind, d, opts, sm_count)]


KINDS = ("forward", "forward_bf16", "forward_fp16", "fwd_pass_state_alone", "compute_out_alone",
         "ssd_scan_alone", "varlen_packed")
# the property that runs a cover problem of each kind (tests/test_properties.py,
# properties/sanitize.py)
COVER_PROPERTY = {"forward": "forward_tf32_bound", "forward_bf16": "forward_bf16_bound",
                  "forward_fp16": "forward_fp16_bound",
                  "fwd_pass_state_alone": "fwd_pass_state_alone",
                  "compute_out_alone": "compute_out_alone", "ssd_scan_alone": "ssd_scan_alone",
                  "varlen_packed": "varlen_packed"}
# the forward's kinds and the dtype of their activations
FORWARD_KINDS = {"forward": "float32", "forward_bf16": "bfloat16", "forward_fp16": "float16"}


def _sizes(cap: int) -> list[int]:
    """1, the cap and each side of every power of two and multiple of 64 up to it."""
    edges = {1, cap} | {n + e for n in [1 << k for k in range(cap.bit_length())]
                        + list(range(64, cap + 1, 64)) for e in (-1, 0, 1)}
    return sorted(n for n in edges if 1 <= n <= cap)


def _problems(c: Caps):
    """(dimensions, options) the strategies can draw under caps `c`: every option set on a small
    base at every chunk size and seqlen edge, and each layout and the 16-bit weights at a few
    seqlens; each size at the edges of the tiles, one at a time, at two seqlens per chunk size,
    options off and all on."""
    nheads_cap = max(c.nheads, c.wide_nheads)
    headdim_cap, dstate_cap = max(c.headdim, c.wide_headdim), max(c.dstate, c.wide_dstate)
    for chunk in c.chunk_sizes:
        seqlens = sorted({1, chunk - 1, chunk, chunk + 1, 2 * chunk, 2 * chunk + 1, 4 * chunk + 1,
                          c.seqlen, c.wide_seqlen, 65, 129} - {0})
        base = dict(batch=1, seqlen=1, nheads=min(4, c.nheads), headdim=min(16, c.headdim),
                    ngroups=1, dstate=min(16, c.dstate), chunk_size=chunk)
        for seqlen, batch, opts in itertools.product(seqlens, (1, c.batch), _OPTIONS):
            yield Dims(**{**base, "seqlen": seqlen, "batch": batch}), opts
        # a layout's views are strided where a dimension before the last has 2 elements or
        # more: a few seqlens tell them
        for seqlen, batch, opts in itertools.product(sorted({1, chunk + 1, c.seqlen}),
                                                     (1, c.batch), _LAYOUTS_AND_WEIGHTS):
            yield Dims(**{**base, "seqlen": seqlen, "batch": batch}), opts
        varied = ([("headdim", n) for n in _sizes(headdim_cap)]
                  + [("dstate", n) for n in _sizes(dstate_cap)]
                  + [("nheads", n) for n in range(1, nheads_cap + 1)])
        for seqlen, (what, n), opts in itertools.product(
                (chunk + 1, max(1, min(c.wide_seqlen, 4 * chunk + 1))), varied, (dict(), _ALL)):
            for ngroups in {1, 2, n if what == "nheads" else base["nheads"]}:
                yield Dims(**{**base, "seqlen": seqlen, what: n, "ngroups": ngroups}), opts


@functools.lru_cache
def _candidates(c: Caps, sm_count: int) -> tuple:
    """((kind, dims, options, params), classes) of every problem the strategies can draw under
    caps `c` (_problems), for each property kind and its params (KIND_PARAMS)."""
    found = []
    for d, opts in _problems(c):
        if not drawable(d, c) or (opts.get("seq_idx") and d.seqlen < 2):
            continue
        for kind in KINDS:
            narrow = _classes_of(kind, _narrow_launches(kind, d, opts, sm_count), opts)
            for params in KIND_PARAMS.get(kind, (None,)):
                for routed in _routed(kind, d, opts):
                    launched = narrow | _classes_of(kind, _own_launches(
                        kind, d, routed, sm_count, params), routed)
                    found.append(((kind, d, tuple(sorted(routed.items())), params), launched))
    return tuple(found)


def _routed(kind: str, d: Dims, opts: dict) -> list[dict]:
    """opts, and for the forward's kinds opts on each of its routes that d's dstate allows
    (strategies.forward_routes) and on the chunks in parallel in two batch slices
    (ROUTED_SLICES): the route and slices a problem draws (Problem.route, batch_parts)."""
    if kind not in FORWARD_KINDS:
        return [opts]
    routes = [r for r in forward_routes(d.dstate) if r is not None]
    return [opts, *(dict(opts, route=r) for r in routes), dict(opts, **ROUTED_SLICES)]


def kind_classes(kind: str, d: Dims, opts: dict, sm_count: int, params=None) -> frozenset[str]:
    """The classes a property kind's launches on a problem count for (_classes_of)."""
    return _classes_of(kind, kind_launches(kind, d, opts, sm_count, params), opts)


def _classes_of(kind: str, launches: list, opts: dict) -> frozenset[str]:
    """The classes of a kind's launches, but the scan's where the forward runs it by the rules
    (SCAN_KERNELS); a forward on a route opts name counts for its route's classes too
    (forward_classes)."""
    routed = kind in FORWARD_KINDS and opts.get("route") is not None
    found = frozenset().union(*(classes(*launch) for launch in launches
                                if kind not in FORWARD_KINDS or routed
                                or launch[0]._pyfunc.__name__ not in SCAN_KERNELS))
    return found | forward_classes(_slices(launches)) if routed else found


@functools.lru_cache
def reachable(c: Caps, sm_count: int) -> frozenset[str]:
    """Every class the property suite can launch under caps `c` on a device of `sm_count` SMs."""
    return frozenset(_stored("reachable", c, sm_count, lambda: sorted(frozenset().union(
        *(launched for _, launched in _candidates(c, sm_count))))))


@functools.lru_cache
def cover(c: Caps, sm_count: int) -> tuple:
    """A few problems that launch every class reachable at caps `c`, derived from the reach
    model by a greedy set cover: ((kind, dims, options, params), ...), each kind a property
    that runs them as explicit examples (tests/test_properties.py) before its drawn ones."""
    def greedy():
        candidates = _candidates(c, sm_count)
        missing, chosen = set(reachable(c, sm_count)), []
        while missing:
            best, found = max(candidates, key=lambda cand: len(cand[1] & missing))
            chosen.append(best)
            missing -= found
        return [(kind, dataclasses.astuple(d), opts, params)
                for kind, d, opts, params in chosen]
    return tuple((kind, Dims(*d), tuple((k, tuple(v) if isinstance(v, list) else v)
                                        for k, v in opts), params)
                 for kind, d, opts, params in _stored("cover", c, sm_count, greedy))


# Where reachable() and cover() keep their results between runs (each process of a run, and
# each run, would otherwise enumerate the drawable problems anew: seconds): one JSON file per
# caps, SM count and version of the sources they are derived from.
STORE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "cutile-ssd" / "reach"
_SOURCES = ("contract.py", "kernels", "properties")


@functools.cache
def _sources_digest() -> str:
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in _SOURCES:
        for path in sorted((root / name).rglob("*.py")) if (root / name).is_dir() else [
                root / name]:
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def _stored(what: str, c: Caps, sm_count: int, compute):
    """compute()'s JSON-able result, read from STORE where an earlier process stored it for the
    same caps, SM count and sources, else computed and stored."""
    key = hashlib.sha256(repr((what, c, int(sm_count), _sources_digest())).encode())
    path = STORE / f"{what}-{key.hexdigest()[:24]}.json"
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text())
    value = compute()
    with contextlib.suppress(OSError):  # a read-only home only loses the saving
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.part")
        partial.write_text(json.dumps(value))
        partial.replace(path)
    return value


# Whether the forward runs the scan by the rules depends on the SM count (a GPU's small grids run
# the two kernels), so the cover, derived for one SM count and run on every backend, takes the
# scan's classes from ssd_scan_alone and the forward's explicit routes alone (not from
# FORWARD_KINDS by the rules), which launch the scan at every SM count
SCAN_KERNELS = ("_ssd_scan_kernel",)
# the route of the forward's kinds in two batch slices (_routed): the one with the most kernels
ROUTED_SLICES = dict(route=ROUTES[2], batch_parts=2)

# the occupancy hint and token block a compute_out_alone example may draw, the occupancy hint an
# ssd_scan_alone example may draw
COMPUTE_OUT_PARAMS = tuple(dict(occupancy=o, block_t=t) for o in OCCUPANCIES for t in BLOCK_TS)
KIND_PARAMS = {"compute_out_alone": COMPUTE_OUT_PARAMS,
               "ssd_scan_alone": tuple(dict(occupancy=o, warps=w) for o in SCAN_OCCUPANCIES
                                         for w in SCAN_WORKER_WARPS)}


def beyond_caps(sm_count: int) -> set[str]:
    """Classes that need arrays of 2^31 elements or more (never within a profile's caps)."""
    d = Dims(1, 2**24, 128, 64, 1, 128, 256)  # dt of 2^31 elements: the int64 objects
    found = set()
    for opts in (dict(), _ALL):
        for kernel, grid, args in launches(d, opts, sm_count):
            found |= {c for c in classes(kernel, grid, args) if "int64" in c}
    return found


# --------------------------------------------------------------------------------------------
# Recording the suite's launches


class Record:
    """Every class the suite launched, with the count per property, and the SM counts of the
    backends that ran them (1: the interpreter)."""

    def __init__(self):
        self.launched: dict[str, Counter] = defaultdict(Counter)
        self.sm_counts: set[int] = set()

    @contextlib.contextmanager
    def recording(self, prop: str):
        """Within the block, each launch through Backend.launch is recorded for `prop`, and each
        forward's route and batch slices through Backend.launch_parts (forward_classes)."""
        launch, launch_parts = Backend.launch, Backend.launch_parts

        def recorded(backend, kernel, grid, args, stream=None):
            self.sm_counts.add(int(backend.sm_count))
            for c in classes(kernel, grid, args):
                self.launched[c][prop] += 1
            return launch(backend, kernel, grid, args, stream)

        def recorded_parts(backend, parts, stream=None):
            for c in forward_classes(parts):
                self.launched[c][prop] += 1
            return launch_parts(backend, parts, stream)
        Backend.launch, Backend.launch_parts = recorded, recorded_parts
        try:
            yield
        finally:
            Backend.launch, Backend.launch_parts = launch, launch_parts

    def properties(self) -> set[str]:
        return {prop for counts in self.launched.values() for prop in counts}

    def merge(self, other: dict):
        """Add a record written by `as_dict` (another process's)."""
        for c, counts in other["launched"].items():
            self.launched[c].update(counts)
        self.sm_counts |= set(other["sm_counts"])

    def as_dict(self) -> dict:
        return dict(launched={c: dict(counts) for c, counts in self.launched.items()},
                    sm_counts=sorted(self.sm_counts))

    def check(self, c: Caps) -> tuple[list[str], str]:
        """(missing classes, the reach table): the classes reachable at caps `c` on each SM
        count recorded that were never launched."""
        sm_counts = self.sm_counts or {1}  # nothing launched: every class is missing
        reach = functools.reduce(frozenset.intersection, (reachable(c, n) for n in sm_counts))
        beyond = set().union(*(beyond_caps(n) for n in sm_counts))
        return report(self.as_dict()["launched"], reach, beyond)


def report(launched: dict, reach: set[str], beyond: set[str]) -> tuple[list[str], str]:
    """(missing classes, the reach table as text): each reachable class, times launched and by
    which properties; then the classes beyond the caps and where they are tested."""
    missing = sorted(reach - set(launched))
    lines = [f"{'class':78s} {'launches':>8s}  properties"]
    for c in sorted(reach | set(launched)):
        counts = launched.get(c, {})
        props = ", ".join(f"{p} {n}" for p, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        status = "MISSING" if c in missing else f"{sum(counts.values()):8d}"
        lines.append(f"{c:78s} {status:>8s}  {props[:120]}")
    for c in sorted(beyond - reach):
        where = next((v for k, v in BEYOND_CAPS_COVERED_BY.items() if k in c), "not tested")
        lines.append(f"{c:78s} {'beyond':>8s}  the caps: {where}")
    return missing, "\n".join(lines)


def main():
    from properties.profiles import caps, profile_name
    c = caps()
    reach = reachable(c, 1)
    print(f"profile {profile_name()}: {len(reach)} classes reachable at {c} (interpreter)")
    for line in sorted(reach):
        print(" ", line)


if __name__ == "__main__":
    main()
