"""Compile gate (marker compile, CPU): every kernel, in the specializations ssd_forward uses for a
representative set of shapes, compiles to cubin for sm_80, sm_90, sm_100 and sm_120.

The specializations come from ssd_forward's own launch code (`part_launches`: the whole batch,
and its batch slices where a device of that SM count splits it; each `forward_launches`, the one
place the tile sizes are chosen), run on stand-in arrays that only carry a shape and a dtype;
the signature
of each launch is what ct.launch would compile for it (`array_constraint`): arrays by dtype and
rank with ct.launch's assumptions on unit dimensions, strides and alignment, the index width of
the kernel object (int64 where its function asks for ct.IndexedWithInt64), the launcher's
constants.
"""

import concurrent.futures
import dataclasses
import importlib
import inspect
import io
import itertools
import math
import multiprocessing
import os
import typing

import pytest

import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   export_kernel)

from contract import Dims
from kernels.arrays import index_dtype, needs_int64
from kernels.compute_out import Choice as OutChoice
from kernels.compute_out import compute_out_launch
from kernels.call import STATE_DTYPES
from kernels.launches import (ForwardArrays, part_launches, rules_batch_parts,
                              varlen_launches)
from kernels.ssd_scan import Choice as ScanChoice
from kernels.ssd_scan import ssd_scan_launches

ARCHS = ("sm_80", "sm_90", "sm_100", "sm_120")
# The default run compiles every specialization for the H200's architecture and, for the others,
# each kernel object's cover (`covering`: every option on and off, every array dtype); the rest
# of those is marked slow, so `pytest -m compile` (the review gate) compiles all of it. The
# whole gate is about 430 tileiras runs, half of CI's time on 2 cores; the cover about 230.
FULL_ARCH = "sm_90"


ITEMSIZE = {"float32": 4, "int32": 4, "bfloat16": 2, "float16": 2}


class ArraySpec:
    """A stand-in array for the launchers: a shape and a dtype name, no data; a slice of its
    first dimension (a batch slice) is a stand-in of that length."""

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype, self.ndim = tuple(shape), dtype, len(shape)

    def __getitem__(self, index: slice) -> "ArraySpec":
        return ArraySpec((len(range(self.shape[0])[index]), *self.shape[1:]), self.dtype)


# (id, dims, options): the Mamba-2 2.7B layout at chunk 256 and 64, every option at chunk 128 with
# groups, odd headdim / dstate with every option at chunk 16, the largest headdim / dstate at
# chunk 32; narrow inputs (x, B, C, z and y in bfloat16 or float16): the 2.7B layout in
# bfloat16, every option in float16; arrays of 2^31 elements or more (the int64-indexed kernel
# objects).
ALL_OPTIONS = dict(D="channel", z=True, dt_bias=True, dt_softplus=True, initial_states=True,
                   seq_idx=True, dt_limit=(0.001, 0.1))
CONFIGS = [
    ("mamba2_2p7b_chunk256", Dims(4, 4096, 80, 64, 1, 128, 256), dict(D="head")),
    ("mamba2_2p7b_chunk64", Dims(4, 4096, 80, 64, 1, 128, 64), dict(D="head")),
    ("all_options_chunk128", Dims(4, 4096, 64, 64, 8, 64, 128), ALL_OPTIONS),
    ("odd_dims_all_options_chunk16", Dims(1, 100, 4, 3, 1, 5, 16), ALL_OPTIONS),
    # odd headdim / dstate where fwd_pass_state may run its chunks in parallel (the pass's
    # smallest slices)
    ("odd_dims_chunk128", Dims(1, 300, 4, 3, 1, 5, 128), dict()),
    ("dims_256_chunk32", Dims(1, 1000, 2, 256, 1, 256, 32), dict(initial_states=True)),
    ("mamba2_2p7b_chunk256_bf16", Dims(4, 4096, 80, 64, 1, 128, 256),
     dict(D="head", dtype="bfloat16")),
    ("all_options_chunk128_fp16", Dims(4, 4096, 64, 64, 8, 64, 128),
     dict(ALL_OPTIONS, dtype="float16")),
    # every option at chunk 256 (as every config: fwd_pass_state in order or its chunks in
    # parallel, by the SM count); the 2.7B layout at chunk 128 (one product of 128 tokens x
    # dstate 128, fwd_pass_state's largest tile)
    ("all_options_chunk256_fp16", Dims(2, 1000, 8, 64, 2, 128, 256),
     dict(ALL_OPTIONS, dtype="float16")),
    ("mamba2_2p7b_chunk128", Dims(4, 4096, 80, 64, 1, 128, 128), dict(D="head")),
    # compute_out's program per chunk (float32, two heads per program, chunk 256, dstate tile
    # 128, no seq_idx): every other option on, and off
    ("options_but_seq_idx_chunk256", Dims(2, 1000, 8, 64, 2, 128, 256),
     dict(ALL_OPTIONS, seq_idx=False)),
    ("no_options_chunk256", Dims(1, 300, 4, 64, 1, 100, 256), dict()),
    ("all_options_chunk256_bf16", Dims(2, 1000, 8, 64, 2, 128, 256),
     dict(ALL_OPTIONS, dtype="bfloat16")),
    ("no_options_chunk256_bf16", Dims(1, 300, 4, 64, 1, 100, 256), dict(dtype="bfloat16")),
    # dstate 256 at chunk 256: the two kernels where the scan runs elsewhere (one SM), so
    # fwd_pass_state runs in order in 128-token products (its two-per-SM object)
    ("dstate_256_chunk256", Dims(2, 1000, 8, 64, 1, 256, 256), dict(D="head")),
    # bfloat16 inputs with float32 chunk states (state_dtype float32; by default bfloat16 inputs
    # store them in bfloat16): fwd_pass_state in order (dstate 256 at one SM) and with its
    # chunks in parallel, the pass and compute_out
    ("dstate_256_chunk256_bf16_float32_states", Dims(2, 1000, 8, 64, 1, 256, 256),
     dict(ALL_OPTIONS, dtype="bfloat16", states="float32")),
    ("all_options_chunk256_bf16_float32_states", Dims(2, 1000, 8, 64, 2, 128, 256),
     dict(ALL_OPTIONS, dtype="bfloat16", states="float32")),
    # 2^31 elements in dt (2^37 in x): the int64-indexed kernel objects, every option off (in
    # float16) and on, at chunk 256 and at chunk 64 (fwd_pass_state's other object)
    ("int64_chunk256_fp16", Dims(1, 2**24, 128, 64, 1, 128, 256), dict(dtype="float16")),
    ("int64_all_options_chunk256", Dims(1, 2**24, 128, 64, 1, 128, 256), ALL_OPTIONS),
    ("int64_chunk64_fp16", Dims(1, 2**24, 128, 64, 1, 64, 64), dict(dtype="float16")),
    ("int64_all_options_chunk64", Dims(1, 2**24, 128, 64, 1, 64, 64), ALL_OPTIONS),
]

# the configurations whose standalone compute_out and ssd_scan launches (check_D on: ssd_forward
# checks D in chunk_cumsum instead) are compiled too: one per compute_out kernel object, every
# option on (ssd_scan: where its arrays stay below 2^31 elements), and compute_out's program per
# chunk with D per head and with no option (the forward takes the scan wherever that layout
# would pay: it runs standalone, or tuned); in bfloat16 every option and none, in float16 every
# option, whose standalone scans on an unbounded GPU are grids of fewer programs than SMs (the
# scan's other rules' object)
STANDALONE_COMPUTE_OUT = ("all_options_chunk128", "options_but_seq_idx_chunk256",
                          "int64_all_options_chunk256", "mamba2_2p7b_chunk256",
                          "no_options_chunk256", "all_options_chunk256_bf16",
                          "no_options_chunk256_bf16", "all_options_chunk256_bf16_float32_states",
                          "all_options_chunk256_fp16")

# packed rows (cu_seqlens, batch 1): ssd_forward's launches of chunk_cumsum and ssd_varlen, every
# option (D per channel, z, initial states per sequence) on and off, float32 and bfloat16, at the
# chunk sizes whose token block differs (chunk 16: 16 tokens; 64: 64)
VARLEN_CONFIGS = [
    ("varlen_all_options_chunk64", Dims(1, 3000, 8, 64, 2, 128, 64), 300,
     dict(ALL_OPTIONS, seq_idx=False)),
    ("varlen_no_options_chunk16_bf16", Dims(1, 1000, 4, 64, 1, 32, 16), 7,
     dict(dtype="bfloat16")),
    ("varlen_all_options_chunk64_bf16", Dims(1, 3000, 64, 64, 8, 32, 64), 300,
     dict(ALL_OPTIONS, seq_idx=False, dtype="bfloat16")),
    ("varlen_no_options_chunk128", Dims(1, 1000, 4, 64, 1, 32, 128), 7, dict()),
]

# the arrays in the inputs' dtype (options' "dtype", default float32); every other one is float32
NARROW = ("x", "B", "C", "z", "y")


# The launchers choose by the device's SM count (fwd_pass_state: its chunks in parallel when its
# sequential grid has fewer programs than SMs). The gate compiles the choices of a one-SM device,
# whole batch and batch slices (it splits every even batch whose slices stay aligned), and of an
# unbounded one (never splits), so every mode of every kernel is compiled.
SM_COUNTS = (1, 2**31)


def config_launches(dims: Dims, opts: dict, sm_count: int, split: bool = True,
                    alone: bool = False):
    """ssd_forward's [(kernel, grid, args)] for these dimensions and options, on stand-ins, on a
    GPU of `sm_count` SMs: the whole batch's launches, then, where such a GPU splits the batch
    (and `split`), its slices' (a slice of one batch element specializes unlike the whole: a unit
    dimension), then, with `alone`, the standalone compute_out's and ssd_scan's launches of the
    whole batch (they check D themselves, check_D)."""
    optional = {"z": opts.get("z"), "initial_states": opts.get("initial_states"),
                "seq_idx": opts.get("seq_idx")}
    arrays = stand_in_arrays(dims, opts)
    dtype = opts.get("dtype", "float32")
    parts = rules_batch_parts(dims, "cupy", ITEMSIZE[dtype], sm_count,
                              [name for name, on in optional.items() if on],
                              ITEMSIZE[opts.get("states", STATE_DTYPES[dtype])]) if split else 1
    # the rules' route, and the chunks in parallel at any chunk size as an explicit route takes
    # them (ssd_forward's route=; the rules run them from PARALLEL_MIN_CHUNK only)
    plans = part_launches(arrays, sm_count, 1) + (
        part_launches(arrays, sm_count, parts) if parts > 1 else []) + part_launches(
        arrays, sm_count, 1, route="chunks_parallel")
    if alone:
        plans.append([compute_out_launch(*arrays.compute_out_arrays(), sm_count,
                                         errors=arrays.errors)])
        scan = (arrays.x, arrays.B, arrays.C, arrays.dt_out, arrays.dA_cumsum,
                arrays.initial_states, arrays.D, arrays.z, arrays.seg, arrays.y,
                arrays.final_states)
        if not needs_int64(*scan):
            plans.append(ssd_scan_launches(*scan, sm_count, errors=arrays.errors))
    return [launch for launches in plans for launch in launches]


def stand_in_arrays(dims: Dims, opts: dict) -> ForwardArrays:
    """ssd_forward's arrays for these dimensions and options, as stand-ins: x, B, C, z and y in
    the options' "dtype" (default float32), the chunk states in its "states" (default
    ssd_forward's for that dtype, STATE_DTYPES), every other one float32."""
    dtype = opts.get("dtype", "float32")
    states = opts.get("states", STATE_DTYPES[dtype])
    a = lambda name: ArraySpec(dims.shape(name), dtype if name in NARROW else states
                               if name == "chunk_states" else "float32")
    return ForwardArrays(
        a("x"), a("dt"), a("A"), a("B"), a("C"),
        {"head": ArraySpec((dims.nheads,)), "channel": a("D")}.get(opts.get("D")),
        a("z") if opts.get("z") else None, a("dt_bias") if opts.get("dt_bias") else None,
        a("initial_states") if opts.get("initial_states") else None,
        ArraySpec(dims.shape("seq_idx"), "int32") if opts.get("seq_idx") else None,
        opts.get("dt_softplus", False), opts.get("dt_limit", (0.0, math.inf)),
        a("dt_out"), a("dA_cumsum"), a("chunk_states"), a("final_states"), a("y"),
        ArraySpec((1,), "int32"))  # the error word (kernels.errors)


def packed_launches(dims: Dims, num_seqs: int, opts: dict) -> list:
    """ssd_forward's [(kernel, grid, args)] of a packed row of num_seqs sequences
    (kernels.launches.varlen_launches), on stand-ins: initial states one per sequence."""
    states = ArraySpec((num_seqs, dims.nheads, dims.headdim, dims.dstate))
    arrays = dataclasses.replace(stand_in_arrays(dims, opts),
                                 initial_states=states if opts.get("initial_states") else None)
    return varlen_launches(arrays, ArraySpec((num_seqs + 1,), "int32"), states)


def array_constraint(a: ArraySpec, index_dtype) -> ArrayConstraint:
    """What ct.launch assumes of a C-contiguous, 16-byte aligned array of this shape (read from
    the symbols of kernels it launched on the H200): unit dimensions and the last stride are
    constants, strides and lengths divisible by 16 bytes / 16 elements are marked so. These
    assumptions decide whether tileiras loads tiles with TMA."""
    strides = [1] * a.ndim
    for i in range(a.ndim - 2, -1, -1):
        strides[i] = strides[i + 1] * a.shape[i + 1]
    per_16_bytes = 16 // ITEMSIZE[a.dtype]
    return ArrayConstraint(
        getattr(ct, a.dtype), a.ndim, index_dtype=index_dtype,
        stride_lower_bound_incl=tuple(None if s == 1 else 0 for s in strides),
        alias_groups=(), may_alias_internally=False,
        stride_constant=tuple(1 if s == 1 else None for s in strides),
        shape_constant=tuple(1 if n == 1 else None for n in a.shape),
        stride_divisible_by=tuple(per_16_bytes if s % per_16_bytes == 0 and s != 1 else 1
                                  for s in strides),
        shape_divisible_by=tuple(16 if n % 16 == 0 and n != 1 else 1 for n in a.shape),
        base_addr_divisible_by=16)


def signature(kernel, args) -> KernelSignature:
    pyfunc = kernel._annotated_function.pyfunc
    hints = typing.get_type_hints(pyfunc, include_extras=True)
    params = []
    for name, arg in zip(inspect.signature(pyfunc).parameters, args, strict=True):
        if isinstance(arg, ArraySpec):
            params.append(array_constraint(arg, index_dtype(hints.get(name))))
        else:
            params.append(arg)
    return KernelSignature(params, CallingConvention.cutile_python_v2())


# every kernel object the kernel modules define, by its name there: the int32 and the int64
# object of a kernel, and one with other compiler hints (occupancy), are compiled on their own
KERNELS = {name: obj for stage in ("chunk_cumsum", "fwd_pass_state", "compute_out", "ssd_scan",
                                   "ssd_varlen")
           for name, obj in vars(importlib.import_module(f"kernels.{stage}")).items()
           if isinstance(obj, ct.kernel)}
KERNEL_NAMES = {id(obj): name for name, obj in KERNELS.items()}


def specializations() -> dict:
    """{kernel name: (kernel, [launch args])}, each distinct specialization once."""
    found = {}
    launches = [(config, launch) for (config, dims, opts), sm_count in itertools.product(
        CONFIGS, SM_COUNTS) for launch in config_launches(
            dims, opts, sm_count, alone=config in STANDALONE_COMPUTE_OUT)]
    launches += [(config, launch) for config, dims, num_seqs, opts in VARLEN_CONFIGS
                 for launch in packed_launches(dims, num_seqs, opts)]
    for config, (kernel, _, args) in launches:
        name = KERNEL_NAMES.get(id(kernel))
        assert name is not None, (
            f"{config}: the launcher chose a {kernel._pyfunc.__name__} object that no kernel "
            f"module defines at top level, so the compile gate cannot name it")
        key = tuple(repr(array_constraint(a, ct.int32)) if isinstance(a, ArraySpec)
                    else (type(a), a) for a in args)
        entry = found.setdefault(name, (kernel, {}))
        entry[1].setdefault(key, args)
    return {name: (kernel, list(by_key.values())) for name, (kernel, by_key) in found.items()}


SPECIALIZATIONS = specializations()


@pytest.mark.compile
def test_every_kernel_object_is_compiled_with_every_option():
    # the configurations reach every kernel object (each index width and hint variant) ...
    assert set(SPECIALIZATIONS) == set(KERNELS), (
        f"kernel objects never launched by the configurations: "
        f"{sorted(set(KERNELS) - set(SPECIALIZATIONS))}")
    # ... and each one with every boolean specialization (an option) both off and on
    seen = {}  # (kernel name, parameter) -> the values it was compiled with
    for name, (kernel, arg_lists) in SPECIALIZATIONS.items():
        params = inspect.signature(kernel._pyfunc).parameters
        for args in arg_lists:
            for param, arg in zip(params, args, strict=True):
                if isinstance(arg, bool):
                    seen.setdefault((name, param), set()).add(arg)
    assert seen, "no boolean specialization found"
    for (name, param), values in seen.items():
        if param == "HAS_CU_SEQLENS" and name.endswith("_int64"):
            # a packed row runs with int32 indices only (its launches refuse 2^31 elements)
            assert values == {False}, f"{name}: {param} compiled as {values}"
        elif param == "LAST_BY_MIN":
            # ssd_scan's: both on the object at the compiler's warp count, never on the one of
            # eight worker warps (LAST_BY_MIN_WARPS)
            assert values == ({False, True} if name == "_ssd_scan" else {False}), (
                f"{name}: {param} compiled as {values}")
        elif param == "SEGMENTED":
            # ssd_scan's segmented kernel runs on declared choices only, never the rules'
            assert values == {False}, f"{name}: {param} compiled as {values}"
        else:
            assert values == {False, True}, f"{name}: {param} only compiled as {values}"


def cubin(kernel, args, arch: str) -> bytes:
    """The cubin of one launch's specialization for `arch` (one tileiras run)."""
    out = io.BytesIO()
    export_kernel(kernel, [signature(kernel, args)], out, gpu_code=arch, output_format="cubin")
    return out.getvalue()


def _export(name: str, arch: str, index: int) -> bytes:
    """The cubin of one of SPECIALIZATIONS, for a pool process."""
    kernel, arg_lists = SPECIALIZATIONS[name]
    try:
        return cubin(kernel, arg_lists[index], arch)
    except Exception as e:  # as text: the compiler's error class may not survive the pickling
        raise RuntimeError(f"{type(e).__name__}: {e}") from None


def _features(kernel, args) -> set:
    """(parameter, value) of a specialization's boolean options, (parameter, dtype) of its
    arrays."""
    params = inspect.signature(kernel._pyfunc).parameters
    return {(p, a if isinstance(a, bool) else a.dtype)
            for p, a in zip(params, args, strict=True) if isinstance(a, (bool, ArraySpec))}


def covering(kernel, arg_lists) -> list[int]:
    """Indices of a few of a kernel object's specializations that between them compile every
    boolean option both on and off and every array parameter in each of its dtypes (greedy)."""
    features = [_features(kernel, args) for args in arg_lists]
    needed, chosen = set().union(*features), []
    while needed or not chosen:
        best = max(range(len(arg_lists)), key=lambda i: (len(features[i] & needed), -i))
        chosen.append(best)
        needed -= features[best]
    return sorted(chosen)


def _indices(name: str, part: str) -> list[int]:
    """The specializations of one compile test: "all" of them, the "cover" or the "rest"."""
    kernel, arg_lists = SPECIALIZATIONS[name]
    everything = range(len(arg_lists))
    if part == "all":
        return list(everything)
    cover = covering(kernel, arg_lists)
    return cover if part == "cover" else [i for i in everything if i not in cover]


def _compile_cases():
    for name in sorted(SPECIALIZATIONS):
        for arch in ARCHS:
            if arch == FULL_ARCH:
                yield pytest.param(name, arch, "all", id=f"{name}-{arch}")
                continue
            yield pytest.param(name, arch, "cover", id=f"{name}-{arch}-cover")
            if _indices(name, "rest"):
                yield pytest.param(name, arch, "rest", id=f"{name}-{arch}-rest",
                                   marks=pytest.mark.slow)


@pytest.fixture(scope="module")
def cubins(request):
    """{(name, arch, part): {index: future of its cubin}} for the selected compile tests.

    Each export is a tileiras run of about a second, so they go to a pool of processes, one
    per core, as soon as the first compile test starts; each test waits for its own."""
    wanted = [(item.callspec.params["name"], item.callspec.params["arch"],
               item.callspec.params["part"])
              for item in request.session.items
              if getattr(item, "originalname", None) == "test_kernel_compiles_to_cubin"]
    context = multiprocessing.get_context("fork")  # the children inherit SPECIALIZATIONS
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=context) as pool:
        yield {(name, arch, part): {index: pool.submit(_export, name, arch, index)
                                    for index in _indices(name, part)}
               for name, arch, part in wanted}
        pool.shutdown(cancel_futures=True)


@pytest.mark.compile
@pytest.mark.parametrize("name, arch, part", list(_compile_cases()))
def test_kernel_compiles_to_cubin(name, arch, part, cubins):
    futures = cubins[name, arch, part]
    assert futures, (name, arch, part)
    for index, future in futures.items():
        assert future.result()[:4] == b"\x7fELF", (name, arch, SPECIALIZATIONS[name][1][index])


def test_the_cover_compiles_every_option_and_dtype_of_each_kernel_object():
    """Each kernel object's cover (what the default run compiles for the other architectures)
    holds every boolean option both on and off and every array dtype its specializations have;
    cover and rest together are all of them."""
    for name, (kernel, arg_lists) in SPECIALIZATIONS.items():
        cover = _indices(name, "cover")
        assert set().union(*(_features(kernel, arg_lists[i]) for i in cover)) == set().union(
            *(_features(kernel, args) for args in arg_lists)), name
        assert sorted(cover + _indices(name, "rest")) == list(range(len(arg_lists)))


def _crashed_compute_out():
    a = stand_in_arrays(Dims(1, 256, 4, 16, 1, 16, 128), dict(D="channel"))
    return compute_out_launch(*a.compute_out_arrays(), 132, errors=a.errors,
                              choice=OutChoice("whole_chunks", 1, 1, 64))


def _crashed_ssd_scan():
    a = stand_in_arrays(Dims(1, 300, 4, 100, 2, 100, 256),
                        dict(D="channel", z=True, initial_states=True))
    [launch] = ssd_scan_launches(a.x, a.B, a.C, a.dt_out, a.dA_cumsum, a.initial_states, a.D,
                                 a.z, None, a.y, a.final_states, 132,
                                 ScanChoice(1, 1, 32, None), errors=a.errors)
    return launch


# Choices off the rules' path that tileiras 13.4 crashed compiling for sm_90 (SIGSEGV, met by
# the property cover and the GPU tests on the H200) while the kernels' error atomics were
# acquire-release (kernels.tiles.or_error): compute_out's program per chunk at one program per
# SM, D per channel, headdim and dstate 16; the scan's 32-channel block at one program per SM,
# D per channel, z and initial states
CRASHED = {"compute_out_whole_chunks_one_per_sm_dims_16": _crashed_compute_out,
           "ssd_scan_block_p32_one_per_sm_options": _crashed_ssd_scan}


@pytest.mark.compile
@pytest.mark.parametrize("name", CRASHED)
def test_choices_tileiras_crashed_on_compile_for_sm90(name):
    kernel, _, args = CRASHED[name]()
    assert cubin(kernel, args, "sm_90")[:4] == b"\x7fELF"


def test_kernel_objects_index_as_their_names_say():
    """The *_int64 objects index every ct.IndexedWithInt64 array in int64, the others in int32
    (kernels.arrays.int32_indexed): a no-op int32_indexed would leave TMA off unnoticed."""
    for name, obj in KERNELS.items():
        pyfunc = obj._annotated_function.pyfunc
        hints = typing.get_type_hints(pyfunc, include_extras=True)
        # the kernel function as its module defines it (the int32 objects hold a copy)
        defined = getattr(importlib.import_module(pyfunc.__module__), pyfunc.__name__)
        source = typing.get_type_hints(defined, include_extras=True)
        wide = [p for p in inspect.signature(pyfunc).parameters
                if index_dtype(source.get(p)) is ct.int64]
        assert wide, f"{name}: no IndexedWithInt64 array in its source"
        want = ct.int64 if "_int64" in name else ct.int32
        assert {index_dtype(hints.get(p)) for p in wide} == {want}, name


@pytest.mark.parametrize("dims", [
    pytest.param(Dims(1, 2**24, 128, 64, 1, 64, 128), id="x_and_dt_over_2_pow_31"),
    # dt_out / dA_cumsum (batch, nheads, nchunks, chunk_size) exceed 2^31 elements while x,
    # chunk_states and y stay below: the index width must follow every array
    pytest.param(Dims(4200, 100, 2048, 2, 1, 16, 256), id="only_dt_out_over_2_pow_31"),
])
@pytest.mark.parametrize("sm_count", SM_COUNTS)
def test_launchers_choose_int64_objects_when_an_array_reaches_2_pow_31(dims, sm_count):
    # whole arrays: a batch slice may stay below 2^31 elements
    launches = config_launches(dims, {}, sm_count, split=False)
    for kernel, _, _ in launches:
        assert KERNEL_NAMES[id(kernel)].endswith(("_int64", "_int64_two_per_sm")), (
            KERNEL_NAMES[id(kernel)])


def test_needs_int64_at_the_int32_limit():
    from kernels.arrays import INT32_MAX, needs_int64
    assert not needs_int64(ArraySpec((INT32_MAX,)), 256, True, None)
    assert needs_int64(ArraySpec((2, 2**30)), 256, True, None)
    assert not needs_int64(ArraySpec((4, 4096, 80, 64)), ArraySpec((4, 16, 80, 64, 128)))
