"""GPU conformance of the CPU interpreter: the same kernels on the same inputs, on the H200 and on
`kernels.interpreter`, agree exactly where the computation is exact and within the TF32 bound
elsewhere (marker `gpu`: skipped without a CUDA device).

Exact: copies, padding, partial-tile stores, transposed loads, TF32/bf16/fp16 rounding of chosen
bit patterns, cumsums of exactly representable values, masks, the grid, the processed dt.
Bounded: matrix products (accumulation order), exp2 (ex2.approx vs NumPy), and the project's
kernels: each backend is within kappa u M of the float64 reference (properties/bounds.py), so the
two are within 2 kappa u M of each other (triangle inequality). Every bounded comparison prints
its worst difference in units of its bound's scale (run with -s) and appends it to $SSD_ERR_LOG.

Run on the GPU machine: python -m pytest tests/test_conformance.py -m gpu -s
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import cuda.tile as ct

import reference as R
from kernels import chunk_cumsum, compute_out, fwd_pass_state, ssd_forward
from kernels.interpreter import launch
from properties import bounds
from properties.runner import to_host
from shapes import Case, make_inputs, on_backend, step_options
from test_interpreter import (BF16_CASES, CAST_DTYPES, MMA_DTYPES, PADDINGS, TF32_CASES, U32,
                              _causal_decay_kernel, _copy_2d_kernel, _cumsum_kernel, _grid_kernel,
                              _loop_kernel, _mma_kernel, _pad_kernel, _roundtrip_kernel,
                              _transposed_copy_kernel, from_bits)
from test_ssd_forward import expected

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("nan_filled_outputs")]


def report(name: str, worst: float):
    print(f"CONFORMANCE {name}: worst {worst:.4g}")
    if os.environ.get("SSD_ERR_LOG"):
        with open(os.environ["SSD_ERR_LOG"], "a") as f:
            f.write(f"conformance\t{name}\t{worst:.4f}\n")


def run_both(grid, kernel, args):
    """Launch `kernel` on the interpreter and on the GPU with copies of the same NumPy args;
    return (interpreter arrays, GPU arrays as NumPy), one per array argument."""
    import cupy
    cpu = tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)
    gpu = tuple(cupy.asarray(a) if isinstance(a, np.ndarray) else a for a in args)
    launch(grid, kernel, cpu)
    ct.launch(cupy.cuda.get_current_stream(), grid, kernel, gpu)
    cupy.cuda.get_current_stream().synchronize()
    arrays = [i for i, a in enumerate(args) if isinstance(a, np.ndarray)]
    return [cpu[i] for i in arrays], [to_host(gpu[i]) for i in arrays]


def assert_identical(cpu, gpu, what):
    """Bit for bit (NaN included: same positions)."""
    cpu, gpu = np.asarray(cpu), np.asarray(gpu)
    assert cpu.dtype == gpu.dtype and cpu.shape == gpu.shape
    as_bytes = lambda a: a.view(np.uint8).reshape(a.shape + (-1,))
    same = (as_bytes(cpu) == as_bytes(gpu)).all(-1)
    if cpu.dtype.kind == "f":
        same |= np.isnan(cpu) & np.isnan(gpu)
    if not same.all():
        first = tuple(np.argwhere(~same)[0])
        raise AssertionError(f"{what}: {int((~same).sum())} elements differ, first at {first}: "
                             f"interpreter {cpu[first]!r}, GPU {gpu[first]!r}")


def assert_close(cpu, gpu, bound, scale, what):
    """|cpu - gpu| <= bound per element (NaN fails); reports the worst |cpu - gpu| / scale."""
    cpu, gpu = np.asarray(cpu, np.float64), np.asarray(gpu, np.float64)
    err = np.abs(cpu - gpu)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(scale > 0, err / scale, np.where(err > 0, np.inf, 0.0))
    worst = float(np.nanmax(ratio)) if ratio.size else 0.0
    report(what, worst)
    bad = ~(err <= bound)
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements outside the bound; "
                           f"worst {worst:.4g}")


# ---------------------------------------------------------------------------------------------
# Op kernels: exact


def _roundtrip_inputs(cases):
    values = from_bits(np.array([i for i, _ in cases.values()], np.uint32))
    n = 1 << (len(values) - 1).bit_length()
    x = np.zeros(n, np.float32)
    x[:len(values)] = values
    return x, n


def _normal(cases):
    """The cases whose input and result are normal numbers, inf or zero (no subnormals)."""
    def subnormal(b):
        return (b & 0x7F800000) == 0 and (b & 0x007FFFFF) != 0
    return {k: v for k, v in cases.items() if not subnormal(v[0]) and not subnormal(v[1])}


@pytest.mark.parametrize("dtype, cases", [(ct.tfloat32, _normal(TF32_CASES)),
                                          (ct.bfloat16, _normal(BF16_CASES))],
                         ids=["tfloat32", "bfloat16"])
def test_astype_rounding_is_identical(dtype, cases):
    x, n = _roundtrip_inputs(cases)
    (_, y_cpu), (_, y_gpu) = run_both(
        (1,), _roundtrip_kernel, (x, np.full(n, np.nan, np.float32), n, CAST_DTYPES.index(dtype)))
    assert_identical(y_cpu, y_gpu, f"astype {dtype}")


@pytest.mark.parametrize("dtype", [ct.tfloat32, ct.bfloat16, ct.float16],
                         ids=["tfloat32", "bfloat16", "float16"])
def test_astype_rounding_of_random_patterns_is_identical(dtype):
    rng = np.random.default_rng(11)
    x = from_bits(rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32))
    x[~np.isfinite(x) | (np.abs(x) < 2.0**-126)] = 1.0  # subnormals: see the next test
    (_, y_cpu), (_, y_gpu) = run_both((1,), _roundtrip_kernel,
                                      (x, np.full(4096, np.nan, np.float32), 4096,
                                       CAST_DTYPES.index(dtype)))
    assert_identical(y_cpu, y_gpu, f"astype {dtype}")


def test_astype_tfloat32_subnormals():
    """The interpreter keeps subnormals (rounded at their quantum); a GPU that flushes them to
    zero in the conversion shows up here (the kernels' bounds allow it: spec, flush-to-zero)."""
    cases = {k: v for k, v in TF32_CASES.items() if k not in _normal(TF32_CASES)}
    x, n = _roundtrip_inputs(cases)
    (_, y_cpu), (_, y_gpu) = run_both((1,), _roundtrip_kernel,
                                      (x, np.full(n, np.nan, np.float32), n,
                                       CAST_DTYPES.index(ct.tfloat32)))
    assert_identical(y_cpu, y_gpu, "astype tfloat32 of subnormals")


@pytest.mark.parametrize("mode", [m for m in PADDINGS if m != ct.PaddingMode.UNDETERMINED],
                         ids=lambda m: m.name.lower())
def test_padding_is_identical(mode):
    x = np.arange(1, 11, dtype=np.float32)
    (_, y_cpu), (_, y_gpu) = run_both((1,), _pad_kernel, (x, np.full(4, 5.0, np.float32), 4, 2,
                                                          PADDINGS.index(mode)))
    assert_identical(y_cpu, y_gpu, f"padding {mode}")


@pytest.mark.parametrize("shape, block",
                         [((6, 10), (4, 4)), ((7, 5), (2, 8)), ((33, 65), (16, 32))],
                         ids=["ragged", "tile_wider_than_array", "many_tiles"])
def test_partial_tile_copies_are_identical(shape, block):
    x = np.random.default_rng(12).standard_normal(shape).astype(np.float32)
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    (_, y_cpu), (_, y_gpu) = run_both(grid, _copy_2d_kernel, (x, np.full(shape, np.nan, np.float32),
                                                              *block))
    assert_identical(y_cpu, y_gpu, "partial-tile copy")
    assert_identical(y_cpu, x, "partial-tile copy (interpreter vs input)")


def test_transposed_loads_are_identical():
    x = np.random.default_rng(13).standard_normal((37, 21)).astype(np.float32)
    bm, bn = 4, 8
    grid = (-(-21 // bn), -(-37 // bm))
    (_, y_cpu), (_, y_gpu) = run_both(grid, _transposed_copy_kernel,
                                      (x, np.full((21, 37), np.nan, np.float32), bm, bn))
    assert_identical(y_cpu, y_gpu, "order='F' load")


@pytest.mark.parametrize("axis, reverse", [(0, False), (1, True)], ids=["axis0", "axis1_reverse"])
def test_cumsum_of_representable_values_is_identical(axis, reverse):
    x = (np.random.default_rng(14).integers(-64, 64, (16, 32)) / 8).astype(np.float32)
    (_, y_cpu), (_, y_gpu) = run_both(
        (1,), _cumsum_kernel, (x, np.full(x.shape, np.nan, np.float32), 16, 32, axis, reverse))
    assert_identical(y_cpu, y_gpu, "cumsum")


def test_grid_and_runtime_loops_are_identical():
    (o_cpu,), (o_gpu,) = run_both((2, 3, 4), _grid_kernel, (np.full((4, 3, 2), -1, np.int32),))
    assert_identical(o_cpu, o_gpu, "bid / num_blocks")
    x = np.arange(32, dtype=np.float32)
    (_, y_cpu), (_, y_gpu) = run_both((1,), _loop_kernel, (x, np.full(8, np.nan, np.float32), 3, 8))
    assert_identical(y_cpu, y_gpu, "runtime trip count")


# ---------------------------------------------------------------------------------------------
# Op kernels: bounded


def test_causal_decay_mask_exact_values_within_exp2_bound():
    """Masked entries identical (exact zeros, no NaN); kept entries: NumPy's exp2 (<= 1 ulp) and
    ex2.approx (<= 2 ulp) of the same exact difference, so <= 3 ulp apart (ulp <= 2^-23 relative);
    below 2^-126 the GPU may flush to zero."""
    a = -26.75 * np.arange(16, dtype=np.float32)
    (_, o_cpu), (_, o_gpu) = run_both((1,), _causal_decay_kernel,
                                      (a, np.full((16, 16), np.nan, np.float32), 16))
    upper = ~np.tril(np.ones((16, 16), bool))
    assert_identical(o_cpu[upper], o_gpu[upper], "causal mask")
    scale = np.abs(o_cpu.astype(np.float64)) * 2.0**-23
    assert_close(o_cpu, o_gpu, 3 * scale + bounds.FTZ_MIN, np.where(scale > 0, scale, 1.0),
                 "exp2 (ulp)")


@pytest.mark.parametrize("dtype", MMA_DTYPES, ids=lambda d: d.name)
def test_mma_within_accumulation_bound(dtype):
    """Same rounded operands (the rounding itself is checked bit for bit above), products exact
    (TF32/bf16/fp16) or rounded once (fp32): each side is within (K + 1) * 2 u32 (|x| |y| + |acc|)
    of the exact sum (tensor cores: 2 u32 per addition, bounds.ACCUMULATION_U32), so the two are
    within twice that. Operands not rounded on one side would differ by ~2^-11 relative."""
    m, k, n = 64, 64, 32
    rng = np.random.default_rng(15)
    x = rng.standard_normal((m, k)).astype(np.float32)
    y = rng.standard_normal((k, n)).astype(np.float32)
    acc = rng.standard_normal((m, n)).astype(np.float32)
    (_, _, _, o_cpu), (_, _, _, o_gpu) = run_both(
        (1,), _mma_kernel, (x, y, acc, np.full((m, n), np.nan, np.float32), m, k, n,
                            MMA_DTYPES.index(dtype)))
    mag = np.abs(x.astype(np.float64)) @ np.abs(y) + np.abs(acc)
    per_side = (k + 1) * bounds.ACCUMULATION_U32 * U32 * mag
    assert_close(o_cpu, o_gpu, 2 * per_side, U32 * mag, f"mma {dtype.name} (u32 |x||y|)")


# ---------------------------------------------------------------------------------------------
# The project's kernels and ssd_forward


CASES = [
    Case("base_chunk64", 2, 256, 4, 64, 1, 64, 64),
    Case("chunk16_ragged", 1, 53, 2, 16, 1, 16, 16),
    Case("headdim_3_dstate_5", 1, 40, 2, 3, 1, 5, 16),
    Case("ngroups_2_of_8", 1, 96, 8, 16, 2, 16, 32),
    Case("all_options_chunk256", 2, 300, 4, 24, 2, 40, 256, D="channel", z=True, dt="softplus",
         initial_states=True, seq_idx="arbitrary"),
]


def _gpu(a):
    import cupy
    return None if a is None else cupy.asarray(a)


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_chunk_cumsum_conforms(case):
    kw = make_inputs(case)
    cs = case.chunk_size
    dt_cpu, dA_cpu = chunk_cumsum(kw["dt"], kw["A"], cs, **step_options(kw))
    dt_gpu, dA_gpu = (to_host(a) for a in chunk_cumsum(
        _gpu(kw["dt"]), _gpu(kw["A"]), cs, **on_backend("gpu", step_options(kw))))
    if case.dt == "plain":  # the processed dt is the raw dt, clamped at (0, inf): exact
        assert_identical(dt_cpu, dt_gpu, "dt_out")
    else:  # exp, log (GPU approximations) in softplus: each side within C_DT u32 of exact
        assert_close(dt_cpu, dt_gpu, 2.01 * bounds.C_DT * U32 * np.abs(dt_cpu),
                     U32 * np.abs(dt_cpu), f"{case.id} dt_out (u32 |dt|)")
    # each side within cumsum_gamma |a| of the exact cumsum (its dt error included in gamma)
    gamma = bounds.cumsum_gamma(cs)
    scale = np.abs(dA_cpu.astype(np.float64))
    assert_close(dA_cpu, dA_gpu, 2.01 * gamma * scale, U32 * scale,
                 f"{case.id} dA_cumsum (u32 |a|)")


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_fwd_pass_state_conforms(case):
    kw = make_inputs(case)
    dt_out, dA = chunk_cumsum(kw["dt"], kw["A"], case.chunk_size, **step_options(kw))
    init, seq_idx = kw.get("initial_states"), kw.get("seq_idx")
    states_cpu, final_cpu = fwd_pass_state(kw["x"], kw["B"], dt_out, dA, init, seq_idx)
    states_gpu, final_gpu = (to_host(a) for a in fwd_pass_state(
        _gpu(kw["x"]), _gpu(kw["B"]), _gpu(dt_out), _gpu(dA), _gpu(init), _gpu(seq_idx)))
    # the state entering chunk 0 is a copy of initial_states (or zeros) on both
    assert_identical(states_cpu[:, 0], states_gpu[:, 0], "chunk_states[:, 0]")
    states_M, final_M = R.fwd_pass_state_magnitude(kw["x"], kw["B"], dt_out, dA, init, seq_idx)
    k = bounds.kappa("fwd_pass_state", case.seqlen, case.chunk_size, case.dstate)
    u = bounds.U_TF32
    assert_close(states_cpu, states_gpu, 2 * bounds.tf32_bound(states_M, k), u * states_M,
                 f"{case.id} chunk_states (u M)")
    assert_close(final_cpu, final_gpu, 2 * bounds.tf32_bound(final_M, k), u * final_M,
                 f"{case.id} final_states (u M)")


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_compute_out_conforms(case):
    kw = make_inputs(case)
    dt_out, dA = chunk_cumsum(kw["dt"], kw["A"], case.chunk_size, **step_options(kw))
    states, _ = fwd_pass_state(kw["x"], kw["B"], dt_out, dA, kw.get("initial_states"),
                               kw.get("seq_idx"))
    opts = {k: kw.get(k) for k in ("D", "z", "seq_idx")}
    y_cpu = compute_out(kw["x"], kw["B"], kw["C"], dt_out, dA, states, **opts)
    y_gpu = to_host(compute_out(*(_gpu(a) for a in (kw["x"], kw["B"], kw["C"], dt_out, dA, states)),
                                **{k: _gpu(v) for k, v in opts.items()}))
    M = R.compute_out_magnitude(kw["x"], kw["B"], kw["C"], dt_out, dA, states, **opts)
    k = bounds.kappa("compute_out", case.seqlen, case.chunk_size, case.dstate)
    assert_close(y_cpu, y_gpu, 2 * bounds.tf32_bound(M, k), bounds.U_TF32 * M, f"{case.id} y (u M)")


@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_ssd_forward_conforms(case):
    kw = make_inputs(case)
    y_cpu, final_cpu = ssd_forward(**kw, return_final_states=True)
    y_gpu, final_gpu = (to_host(a) for a in ssd_forward(**on_backend("gpu", kw),
                                                        return_final_states=True))
    _, _, b = expected(kw)
    u = bounds.U_TF32
    assert_close(y_cpu, y_gpu, 2 * b.y, u * b.M, f"{case.id} ssd_forward y (u M)")
    assert_close(final_cpu, final_gpu, 2 * b.final, u * b.final_M,
                 f"{case.id} ssd_forward final_states (u M)")
