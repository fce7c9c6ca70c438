"""ssd_forward against the float64 reference on the table of shapes, on both backends; array
types, streams, non-contiguous inputs, batch slices on concurrent streams; a sequence of 2^20
tokens on the GPU."""

import dataclasses
import math

import numpy as np
import pytest

import reference as R
from contract import Dims
from kernels import ssd_forward
from kernels.launches import ForwardArrays, part_launches, rules_batch_parts
from properties.bounds import kappa
from properties.compare import forward_bounds
from properties.runner import to_host
from properties.strategies import Problem
from shapes import BACKENDS, CASES, Case, check_within, make_inputs, on_backend


pytestmark = pytest.mark.usefixtures("nan_filled_outputs")


def expected(kw: dict):
    """(y_ref, final_ref, bounds) for the NumPy inputs `kw`: the float64 forward and the property
    suite's ForwardBounds (kappa for these sizes, the fp32-cumsum decay term, the FTZ floor)."""
    y_ref, final_ref = R.ssd_chunked(**kw)
    return y_ref, final_ref, forward_bounds(Problem(**kw))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_ssd_forward_matches_reference(case, backend, request):
    kw = make_inputs(case)
    y_ref, final_ref, b = expected(kw)
    y, final = ssd_forward(**on_backend(backend, kw), return_final_states=True)
    assert y.shape == y_ref.shape and final.shape == final_ref.shape
    check_within("y", y, y_ref, b.M, b.kappa_y, request.node.name, b.extra_y)
    check_within("final_states", final, final_ref, b.final_M, b.kappa_final, request.node.name,
                 b.extra_final)


SMALL = Case("small_all_options", 1, 70, 4, 8, 2, 8, 32, D="head", z=True, dt="softplus",
             initial_states=True, seq_idx="sorted")


@pytest.mark.parametrize("backend", BACKENDS)
def test_ssd_forward_returns_y_alone_by_default(backend):
    kw = on_backend(backend, make_inputs(SMALL))
    y = ssd_forward(**kw)
    y2, _ = ssd_forward(**kw, return_final_states=True)
    assert np.array_equal(to_host(y), to_host(y2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_noncontiguous_inputs_read_correctly(backend):
    """Transposed / strided views give exactly the result of their contiguous copies."""
    kw = make_inputs(SMALL)
    rng = np.random.default_rng(1)
    views = dict(kw)
    # x as a transposed view, B and C as every other dstate column, z as a reversed-stride view
    x_t = np.ascontiguousarray(kw["x"].transpose(0, 1, 3, 2))
    views["x"] = x_t.transpose(0, 1, 3, 2)
    wide = rng.standard_normal(kw["B"].shape[:3] + (2 * kw["B"].shape[3],)).astype(np.float32)
    views["B"] = wide[..., ::2]
    views["C"] = wide[..., 1::2]
    views["z"] = np.ascontiguousarray(kw["z"][:, ::-1])[:, ::-1]
    copies = {k: np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v
              for k, v in views.items()}
    assert not views["x"].flags.c_contiguous and not views["B"].flags.c_contiguous
    dev_views = on_backend(backend, views)
    if backend == "gpu":  # keep them non-contiguous on the device too
        import cupy
        dev_views["x"] = cupy.asarray(x_t).transpose(0, 1, 3, 2)
        dev_views["B"] = cupy.asarray(wide)[..., ::2]
        dev_views["C"] = cupy.asarray(wide)[..., 1::2]
    y_views, f_views = ssd_forward(**dev_views, return_final_states=True)
    y_copies, f_copies = ssd_forward(**on_backend(backend, copies), return_final_states=True)
    assert np.array_equal(to_host(y_views), to_host(y_copies))
    assert np.array_equal(to_host(f_views), to_host(f_copies))


@pytest.mark.gpu
def test_cupy_on_a_nondefault_stream():
    import cupy
    kw = make_inputs(SMALL)
    want = to_host(ssd_forward(**on_backend("gpu", kw)))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        y = ssd_forward(**on_backend("gpu", kw))
        assert isinstance(y, cupy.ndarray)
    stream.synchronize()
    assert np.array_equal(y.get(), want)


@pytest.mark.gpu
def test_torch_cuda_tensors_in_torch_tensors_out_on_the_current_stream():
    torch = pytest.importorskip("torch")
    kw = make_inputs(SMALL)
    want_y, want_f = (to_host(a) for a in
                      ssd_forward(**on_backend("gpu", kw), return_final_states=True))
    tkw = on_backend("torch", kw)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y, f = ssd_forward(**tkw, return_final_states=True)
    stream.synchronize()
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.dtype == torch.float32
    assert np.array_equal(to_host(y), want_y)
    assert np.array_equal(to_host(f), want_f)


# batch slices (kernels.launches.BATCH_PARTS): every option, batch 3 so that a split is uneven
SLICED = Case("sliced_all_options", 3, 70, 4, 8, 2, 8, 32, D="channel", z=True, dt="softplus",
              initial_states=True, seq_idx="arbitrary")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("parts", [2, 3], ids=["uneven_halves", "one_element_each"])
def test_batch_slices_give_the_whole_batch_result_bit_for_bit(backend, parts):
    """Each batch element's programs are the same whether its slice or the whole batch is
    launched (on the GPU the slices on concurrent streams): the results are identical."""
    kw = on_backend(backend, make_inputs(SLICED))
    want_y, want_f = (to_host(a) for a in ssd_forward(**kw, return_final_states=True,
                                                      batch_parts=1))
    y, f = (to_host(a) for a in ssd_forward(**kw, return_final_states=True, batch_parts=parts))
    assert np.array_equal(y, want_y) and np.array_equal(f, want_f)
    assert not np.isnan(y).any()


BUSY_BYTES, BUSY_FILLS = 1 << 28, 24  # ~2 ms of fills on the H200: work a stream must wait out


@pytest.mark.gpu
@pytest.mark.parametrize("busy", ["side", "caller"],
                         ids=["join_waits_for_side", "fork_waits_for_caller"])
def test_batch_slices_fork_from_and_join_into_the_callers_stream(busy):
    """On a non-blocking caller stream, the result read after a synchronisation of that stream
    alone. join: the side stream is kept busy for ~2 ms before the call; without the join its
    slice of y would still be NaN (outputs are NaN-filled). fork: x is written on the caller's
    stream after ~2 ms of other work; without the fork the side slice would read the stale x."""
    import cupy
    from kernels.arrays import Backend, _side_stream
    kw = make_inputs(SLICED)
    want = to_host(ssd_forward(**on_backend("gpu", kw), batch_parts=1))
    dev = on_backend("gpu", kw)
    stale = cupy.asarray(make_inputs(SLICED, seed=1)["x"])
    work = cupy.empty(BUSY_BYTES, dtype=cupy.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.runtime.deviceSynchronize()
    with stream:
        x = stale.copy()  # the stale values, until the caller's stream overwrites them
        side = _side_stream(Backend.of("cupy", stream.device_id), stream.ptr, 0)
        delayed = side if busy == "side" else stream
        with delayed:
            for _ in range(BUSY_FILLS):
                work.fill(1)
        x[...] = dev["x"]
        y = ssd_forward(**{**dev, "x": x}, batch_parts=2)
    stream.synchronize()
    assert np.array_equal(y.get(), want)


@pytest.mark.gpu
def test_batch_slices_in_torch_on_its_current_stream():
    torch = pytest.importorskip("torch")
    kw = make_inputs(SLICED)
    want = to_host(ssd_forward(**on_backend("gpu", kw), batch_parts=1))
    tkw = on_backend("torch", kw)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        y = ssd_forward(**tkw, batch_parts=2)
    stream.synchronize()
    assert isinstance(y, torch.Tensor) and np.array_equal(to_host(y), want)


@pytest.mark.parametrize("dims, itemsize, kind, given, parts", [
    # dstate 256 (two kernels: the scan holds a dstate tile of at most 128): 640 state programs
    (Dims(4, 4096, 80, 64, 1, 256, 256), 4, "cupy", (), 2),
    (Dims(4, 4096, 80, 64, 1, 256, 256), 2, "torch", ("z", "initial_states", "seq_idx"), 2),
    (Dims(4, 4096, 80, 64, 1, 256, 64), 4, "cupy", (), 2),
    (Dims(4, 4096, 80, 64, 1, 128, 256), 4, "cupy", (), 1),  # the scan: its 320 programs
    (Dims(4, 4096, 80, 64, 1, 128, 256), 4, "numpy", (), 1),  # the interpreter: nothing to overlap
    (Dims(4, 4096, 64, 64, 8, 64, 128), 4, "cupy", (), 1),  # 256 programs: one wave of two per SM
    (Dims(8, 2048, 24, 64, 1, 128, 256), 4, "cupy", (), 1),  # 192
    (Dims(2, 4096, 80, 64, 1, 128, 256), 4, "cupy", (), 1),  # 160
    (Dims(5, 4096, 80, 64, 1, 128, 256), 4, "cupy", (), 1),  # odd batch
    # the second slice's offset in bytes: 2 elements of 1001 * 81 * 4 (dt) / 1002 * 81 * 7 * 2
    # (x, y) / 1001 * 4 (seq_idx, only where given)
    (Dims(4, 1001, 81, 64, 1, 128, 256), 4, "cupy", (), 1),
    (Dims(4, 1002, 81, 7, 1, 128, 256), 2, "cupy", (), 1),
    (Dims(4, 1001, 80, 64, 1, 128, 256), 4, "cupy", ("seq_idx",), 1),
    (Dims(4, 1001, 80, 64, 1, 256, 256), 4, "cupy", (), 2),
], ids=["dstate_256", "dstate_256_bf16_all_options", "dstate_256_chunk_64", "mamba2_2p7b_scan",
        "interpreter",
        "groups_8_one_wave", "mamba2_130m_one_wave", "batch_2_one_wave", "odd_batch",
        "dt_slice_misaligned", "narrow_x_slice_misaligned", "seq_idx_slice_misaligned",
        "seq_idx_absent_aligned"])
def test_batch_parts_rule(dims, itemsize, kind, given, parts):
    """On the H200's 132 SMs: slices where the call runs the two kernels (not the scan) and the
    in-order state grid runs past two programs per SM (where they were measured to gain), the
    batch even and the second slice aligned in every array the call has."""
    assert rules_batch_parts(dims, kind, itemsize, 132, given) == parts


@pytest.mark.parametrize("parts", [0, -1, 1.5, "2"])
def test_batch_parts_must_be_a_positive_int(parts):
    kw = make_inputs(SLICED)
    with pytest.raises(ValueError, match="^batch_parts: must be a positive int"):
        ssd_forward(**kw, batch_parts=parts)


@pytest.mark.parametrize("route", ["Scan", "chunks", 1, ("scan",)])
def test_route_must_be_one_of_the_routes(route):
    kw = make_inputs(SLICED)
    with pytest.raises(ValueError, match="^route: must be one of"):
        ssd_forward(**kw, route=route)


def test_a_route_the_call_cannot_take_is_refused_by_name():
    """The scan holds a dstate tile of at most 128 (SCAN_MAX_DSTATE); a packed row has one
    route: both refused before any launch, naming route."""
    kw = make_inputs(SLICED)
    wide = make_inputs(dataclasses.replace(SLICED, dstate=200))
    with pytest.raises(ValueError, match="^route: the scan holds a dstate tile of at most 128"):
        ssd_forward(**wide, route="scan")
    ssd_forward(**wide, route="chunks_parallel")  # the chunk states' routes take any dstate
    row = {**kw, **{n: kw[n][:1] for n in ("x", "dt", "B", "C")}}
    cu = np.array([0, 3, int(row["x"].shape[1])], np.int32)
    with pytest.raises(ValueError, match="^route: a packed row"):
        ssd_forward(**row, cu_seqlens=cu, route="scan")


def test_batch_slices_choose_as_the_whole_batch():
    """Each slice sizes its grids for its share of the SMs: batch 8, 12 heads, dstate 256 (two
    kernels: the scan holds dstate tiles of at most 128) on 132 SMs keeps fwd_pass_state in
    order (192 programs), where a slice of 4 on the whole device would go to chunks in parallel
    (96 < 132), and the same compute_out layout."""
    from tests.test_compile import ArraySpec
    dims = Dims(8, 2048, 12, 64, 1, 256, 256)
    a = lambda name: ArraySpec(dims.shape(name))
    arrays = ForwardArrays(a("x"), a("dt"), a("A"), a("B"), a("C"), None, None, None, None, None,
                           False, (0.0, math.inf), a("dt_out"), a("dA_cumsum"),
                           a("chunk_states"), a("final_states"), a("y"))
    (whole,) = part_launches(arrays, 132, 1)
    halves = part_launches(arrays, 132, 2)
    kernel_names = lambda launches: [k._pyfunc.__name__ for k, _, _ in launches]
    constants = lambda launches: [[v for v in args if isinstance(v, (bool, int))]
                                  for _, _, args in launches]
    assert len(halves) == 2 and len(whole) == 3  # cumsum, the state in order, compute_out
    for half in halves:
        assert kernel_names(half) == kernel_names(whole)
        assert constants(half) == constants(whole)
        assert [g[:2] for _, g, _ in half] == [g[:2] for _, g, _ in whole]
        assert [g[2] for _, g, _ in half] == [g[2] // 2 for _, g, _ in whole]


# 2^20 tokens, x and y of 2^32 elements each (16 GiB): offsets past 2^31 elements (mamba_ssm
# issue #1015's bug class). The float64 reference cannot run on all of it, so the decays are
# strong (dt in [0.5, 1], A = -1: >= 0.5 nat per token) and the reference runs on windows of
# WINDOW tokens: the first window exactly (it starts at token 0); in the last window, whose
# reference starts from a zero state, only the tokens at least SETTLE tokens in are compared: the
# state that really entered the window reaches them scaled by <= e^(-SETTLE / 2) = e^-256, far
# below u * M. The final state is compared likewise (>= WINDOW tokens of decay).
LONG = dict(batch=1, seqlen=2 ** 20, nheads=16, headdim=256, ngroups=1, dstate=16, chunk_size=64)
WINDOW, SETTLE = 1024, 512


@pytest.mark.gpu
@pytest.mark.slow
def test_seqlen_2_pow_20_beyond_int32_offsets(request):
    import cupy
    b, L, h, p, g, n, cs = LONG.values()
    assert L * h * p > 2 ** 31
    rng = cupy.random.default_rng(0)
    x = cupy.empty((b, L, h, p), dtype=cupy.float32)
    block = 4096
    for k in range(0, L, block):  # cupy's own generators stay below 2^31 elements
        x[:, k:k + block] = rng.standard_normal((b, block, h, p), dtype=cupy.float32)
    B = rng.standard_normal((b, L, g, n), dtype=cupy.float32)
    C = rng.standard_normal((b, L, g, n), dtype=cupy.float32)
    dt = rng.uniform(0.5, 1.0, (b, L, h), dtype=cupy.float32)
    A = -cupy.ones(h, dtype=cupy.float32)
    D = rng.standard_normal(h, dtype=cupy.float32)
    y, final = ssd_forward(x, dt, A, B, C, cs, D=D, return_final_states=True)
    cupy.cuda.runtime.deviceSynchronize()
    kap = kappa("forward", WINDOW, cs, n)
    for name, window, compared in (("first", slice(0, WINDOW), slice(0, WINDOW)),
                                   ("last", slice(L - WINDOW, L), slice(SETTLE, WINDOW))):
        kw = dict(x=x[:, window].get(), dt=dt[:, window].get(), A=A.get(), B=B[:, window].get(),
                  C=C[:, window].get(), chunk_size=cs, D=D.get())
        y_ref, final_ref, b = expected(kw)
        got = to_host(y[:, window])[:, compared]
        check_within(f"y_{name}_window", got, y_ref[:, compared], b.M[:, compared], kap,
                     request.node.name, b.extra_y[:, compared])
        if name == "last":
            check_within("final_states", final, final_ref, b.final_M, kap, request.node.name,
                         b.extra_final)
    assert not bool(cupy.isnan(y).any())
