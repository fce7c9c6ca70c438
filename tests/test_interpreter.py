"""The CPU tile interpreter, operation by operation, against the NumPy meaning of each operation.

Small `@ct.kernel`s written here run through `kernels.interpreter.launch`; a few of them are also
compiled to sm_90 cubins (marker `compile`) to show that they are valid cuTile. Outputs are filled
with NaN before a kernel writes them. Where a result is exact (copies, padding, rounding of chosen
bit patterns, sums of small integers) it is compared bit for bit; where it is not (matrix products,
exp2) the bound is stated next to the comparison.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest

import cuda.tile as ct
from cuda.tile.compilation import (ArrayConstraint, CallingConvention, KernelSignature,
                                   ScalarConstraint, export_kernel)

from kernels import ssd_forward
from kernels.interpreter import NAMESPACE as cti
from kernels.arrays import Backend
from kernels.interpreter import Tile, launch

U32 = 2.0 ** -24  # fp32 unit roundoff


def nan_like(a, dtype=None):
    return np.full(np.shape(a), np.nan, dtype=dtype or np.float32)


def bits(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).view(np.uint32)


def from_bits(b) -> np.ndarray:
    return np.asarray(b, dtype=np.uint32).view(np.float32)


def gamma(n: int, u: float = U32) -> float:
    """Higham's gamma_n = n u / (1 - n u): the bound of n roundings, any summation order."""
    return n * u / (1 - n * u)


# ---------------------------------------------------------------------------------------------
# Kernels under test


# Kernel constants are ints (export_kernel takes no dtype, enum or string constants): indices here.
CAST_DTYPES = (ct.tfloat32, ct.bfloat16, ct.float16)
MMA_DTYPES = (ct.float32, ct.tfloat32, ct.bfloat16, ct.float16)
PADDINGS = tuple(ct.PaddingMode)


@ct.kernel
def _roundtrip_kernel(x, y, N: ct.Constant[int], DTYPE: ct.Constant[int]):
    """One program: y = x converted to CAST_DTYPES[DTYPE] and back to float32 (N elements)."""
    t = ct.load(x, (0,), shape=(N,))
    ct.store(y, (0,), t.astype(CAST_DTYPES[DTYPE]).astype(ct.float32))


@ct.kernel
def _copy_2d_kernel(x, y, BM: ct.Constant[int], BN: ct.Constant[int]):
    """One program per (BM, BN) tile of x: copied to y (partial tiles at the edges)."""
    t = ct.load(x, (ct.bid(0), ct.bid(1)), shape=(BM, BN), padding_mode=ct.PaddingMode.NAN)
    ct.store(y, (ct.bid(0), ct.bid(1)), t)


@ct.kernel
def _transposed_copy_kernel(x, y, BM: ct.Constant[int], BN: ct.Constant[int]):
    """One program per (BN, BM) tile of y = x^T, loaded from x with order='F'."""
    j, i = ct.bid(0), ct.bid(1)
    t = ct.load(x, (j, i), shape=(BN, BM), order="F", padding_mode=ct.PaddingMode.ZERO)
    ct.store(y, (j, i), t)


@ct.kernel
def _pad_kernel(x, y, N: ct.Constant[int], INDEX: ct.Constant[int], PADDING: ct.Constant[int]):
    """One program: tile INDEX of shape N of x, padded with PADDINGS[PADDING], stored into y."""
    ct.store(y, (0,), ct.load(x, (INDEX,), shape=(N,), padding_mode=PADDINGS[PADDING]))


@ct.kernel
def _mma_kernel(x, y, acc, out, M: ct.Constant[int], K: ct.Constant[int], N: ct.Constant[int],
                DTYPE: ct.Constant[int]):
    """One program: out = x @ y + acc, operands cast to MMA_DTYPES[DTYPE] (0, float32: no cast)."""
    a = ct.load(x, (0, 0), shape=(M, K))
    b = ct.load(y, (0, 0), shape=(K, N))
    if DTYPE > 0:
        a = a.astype(MMA_DTYPES[DTYPE])
        b = b.astype(MMA_DTYPES[DTYPE])
    ct.store(out, (0, 0), ct.mma(a, b, ct.load(acc, (0, 0), shape=(M, N))))


@ct.kernel
def _cumsum_kernel(x, y, R: ct.Constant[int], N: ct.Constant[int], AXIS: ct.Constant[int],
                   REVERSE: ct.Constant[bool]):
    """One program: y = cumsum of the [R, N] tile x along AXIS."""
    ct.store(y, (0, 0), ct.cumsum(ct.load(x, (0, 0), shape=(R, N)), axis=AXIS, reverse=REVERSE))


@ct.kernel
def _running_min_kernel(x, y, R: ct.Constant[int], N: ct.Constant[int],
                        REVERSE: ct.Constant[bool]):
    """One program: y = running minimum (ct.scan with ct.minimum) of the [R, N] tile x, axis 0."""
    t = ct.load(x, (0, 0), shape=(R, N))
    ct.store(y, (0, 0), ct.scan(t, 0, ct.minimum, math.inf, reverse=REVERSE))


@ct.kernel
def _causal_decay_kernel(a, out, N: ct.Constant[int]):
    """One program: out[t, s] = 2^(a_t - a_s) for s <= t, else 0, selected before use."""
    col = ct.reshape(ct.load(a, (0,), shape=(N,)), (N, 1))
    row = ct.reshape(ct.load(a, (0,), shape=(N,)), (1, N))
    t = ct.reshape(ct.arange(N, dtype=ct.int32), (N, 1))
    s = ct.reshape(ct.arange(N, dtype=ct.int32), (1, N))
    ct.store(out, (0, 0), ct.where(t >= s, ct.exp2(col - row), 0.0))


@ct.kernel
def _grid_kernel(out):
    """One program per grid point: out[z, y, x] = linear id + 1000 * (nx + 10 ny + 100 nz)."""
    x, y, z = ct.bid(0), ct.bid(1), ct.bid(2)
    nx, ny, nz = ct.num_blocks(0), ct.num_blocks(1), ct.num_blocks(2)
    v = x + nx * (y + ny * z) + 1000 * (nx + 10 * ny + 100 * nz)
    ct.store(out, (z, y, x), v)


@ct.kernel
def _loop_kernel(x, y, n, BLOCK: ct.Constant[int]):
    """One program: y[0:BLOCK] = sum over the first n blocks of x (a runtime trip count)."""
    acc = ct.zeros((BLOCK,), dtype=ct.float32)
    for k in range(n):
        acc = acc + ct.load(x, (k,), shape=(BLOCK,))
    ct.store(y, (0,), acc)


# ---------------------------------------------------------------------------------------------
# Rounding: astype to tfloat32, bfloat16, float16


TF32_CASES = {  # input bits -> expected bits, round to nearest even on a 10-bit mantissa
    "one_exact": (0x3F800000, 0x3F800000),
    "tie_to_even_down": (0x3F801000, 0x3F800000),
    "tie_to_even_up": (0x3F803000, 0x3F804000),
    "above_tie": (0x3F801001, 0x3F802000),
    "below_tie": (0x3F800FFF, 0x3F800000),
    "carry_into_exponent": (0x3FFFF000, 0x40000000),
    "negative_tie_down": (0xBF801000, 0xBF800000),
    "negative_tie_up": (0xBF803000, 0xBF804000),
    "largest_tf32": (0x7F7FEFFF, 0x7F7FE000),
    "fp32_max_to_inf": (0x7F7FFFFF, 0x7F800000),
    "inf": (0x7F800000, 0x7F800000),
    "minus_inf": (0xFF800000, 0xFF800000),
    "minus_zero": (0x80000000, 0x80000000),
    "subnormal_below_half": (0x00000FFF, 0x00000000),
    "subnormal_tie_down": (0x00001000, 0x00000000),
    "subnormal_tie_up": (0x00003000, 0x00004000),
    "subnormal_carry_to_normal": (0x007FF000, 0x00800000),
    "negative_subnormal": (0x80001800, 0x80002000),
}

BF16_CASES = {  # round to nearest even on a 7-bit mantissa
    "tie_to_even_down": (0x3F808000, 0x3F800000),
    "tie_to_even_up": (0x3F818000, 0x3F820000),
    "above_tie": (0x3F808001, 0x3F810000),
    "carry_into_exponent": (0x3FFF8000, 0x40000000),
    "negative": (0xC0490FDB, 0xC0490000),
    "fp32_max_to_inf": (0x7F7FFFFF, 0x7F800000),
    "subnormal_tie_up": (0x00018000, 0x00020000),
}


def _roundtrip(values: np.ndarray, dtype) -> np.ndarray:
    n = 1 << (len(values) - 1).bit_length()
    x = np.zeros(n, dtype=values.dtype)
    x[:len(values)] = values
    y = nan_like(x)
    launch((1,), _roundtrip_kernel, (x, y, n, CAST_DTYPES.index(dtype)))
    return y[:len(values)]


@pytest.mark.parametrize("dtype, cases", [(ct.tfloat32, TF32_CASES), (ct.bfloat16, BF16_CASES)],
                         ids=["tfloat32", "bfloat16"])
def test_astype_rounds_chosen_bit_patterns(dtype, cases):
    inputs = np.array([i for i, _ in cases.values()], dtype=np.uint32)
    expected = np.array([e for _, e in cases.values()], dtype=np.uint32)
    got = bits(_roundtrip(from_bits(inputs), dtype))
    wrong = {name: hex(g) for name, g, e in zip(cases, got, expected) if g != e}
    assert not wrong, f"wrong roundings: {wrong}"


@pytest.mark.parametrize("dtype", [ct.tfloat32, ct.bfloat16], ids=["tfloat32", "bfloat16"])
def test_astype_keeps_nan(dtype):
    got = _roundtrip(from_bits(np.array([0x7FC00000, 0xFFFFFFFF, 0x7F800001], np.uint32)), dtype)
    assert np.all(np.isnan(got))


@pytest.mark.parametrize("dtype, mantissa", [(ct.tfloat32, 10), (ct.bfloat16, 7)],
                         ids=["tfloat32", "bfloat16"])
def test_astype_random_patterns_match_exact_rounding(dtype, mantissa):
    """Random finite fp32 patterns: the result is the nearest value with `mantissa` bits (ties
    to even), found independently in float64 with Python's round-half-even on the scaled value."""
    rng = np.random.default_rng(4)
    x = from_bits(rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32))
    x = x[np.isfinite(x) & (np.abs(x) < 2.0**127)]
    got = _roundtrip(x, dtype).astype(np.float64)
    xd = x.astype(np.float64)
    e = np.maximum(np.floor(np.log2(np.abs(np.where(xd == 0, 1.0, xd)))), -126)
    quantum = 2.0 ** (e - mantissa)
    expected = np.round(xd / quantum) * quantum  # np.round: half to even
    np.testing.assert_array_equal(got, expected)


def test_astype_float16_matches_numpy():
    x = np.array([1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65520.0, 2.0**-24, 2.0**-25, -0.1, 1e-8],
                 dtype=np.float32)
    with np.errstate(over="ignore"):  # 65520 rounds to inf, as it should
        expected = x.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(_roundtrip(x, ct.float16), expected)


@ct.kernel
def _bf16_array_kernel(x, y, N: ct.Constant[int]):
    """One program: y = bfloat16(float32(x) * 3 + 1), x and y bfloat16 arrays (N elements)."""
    t = ct.load(x, (0,), shape=(N,), padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    ct.store(y, (0,), (t * 3.0 + 1.0).astype(ct.bfloat16))


@pytest.mark.parametrize("n", [64, 50], ids=["full_tile", "partial_tile"])
def test_bfloat16_arrays_load_exactly_and_store_rounded(n):
    """ml_dtypes' NumPy bfloat16 arrays as kernel arguments: loads widen the stored values
    exactly, stores take the bfloat16 the tile holds, rounded once from float32 (as ml_dtypes
    rounds: to nearest, ties to even)."""
    import ml_dtypes
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(ml_dtypes.bfloat16)
    y = np.full(n, np.nan, dtype=ml_dtypes.bfloat16)
    launch((1,), _bf16_array_kernel, (x, y, 64))
    expected = (x.astype(np.float32) * np.float32(3) + np.float32(1)).astype(ml_dtypes.bfloat16)
    np.testing.assert_array_equal(y.view(np.uint16), expected.view(np.uint16))


def test_astype_float64_to_tfloat32_rounds_once():
    """1 + 2^-11 + 2^-40 rounds up to 1 + 2^-10 in TF32; via float32 first it would be a tie
    (1 + 2^-11) and round down to 1: the conversion must not round twice."""
    x = np.array([1 + 2**-11 + 2**-40, -(1 + 2**-11 + 2**-40), 1 + 2**-11], dtype=np.float64)
    np.testing.assert_array_equal(_roundtrip(x, ct.tfloat32),
                                  np.array([1 + 2**-10, -(1 + 2**-10), 1.0], np.float32))


# ---------------------------------------------------------------------------------------------
# load / store: padding, partial tiles, order


PAD_EXPECTED = {
    ct.PaddingMode.ZERO: 0.0, ct.PaddingMode.NEG_ZERO: -0.0, ct.PaddingMode.NAN: np.nan,
    ct.PaddingMode.POS_INF: np.inf, ct.PaddingMode.NEG_INF: -np.inf,
    ct.PaddingMode.UNDETERMINED: np.nan,  # the interpreter's choice: a reliance on it shows
}


@pytest.mark.parametrize("mode", list(PAD_EXPECTED), ids=lambda m: m.name.lower())
def test_load_pads_the_out_of_bounds_part(mode):
    x = np.arange(1, 11, dtype=np.float32)  # 10 elements, tiles of 4: tile 2 holds 9, 10, pad, pad
    y = nan_like(np.zeros(4))
    launch((1,), _pad_kernel, (x, y, 4, 2, PADDINGS.index(mode)))
    expected = np.array([9.0, 10.0, PAD_EXPECTED[mode], PAD_EXPECTED[mode]], np.float32)
    np.testing.assert_array_equal(y, expected)
    np.testing.assert_array_equal(np.signbit(y), np.signbit(expected))


def test_load_of_an_inner_tile_is_not_padded():
    x = np.arange(1, 11, dtype=np.float32)
    y = nan_like(np.zeros(4))
    launch((1,), _pad_kernel, (x, y, 4, 1, PADDINGS.index(ct.PaddingMode.UNDETERMINED)))
    np.testing.assert_array_equal(y, x[4:8])


@pytest.mark.parametrize("shape, block", [((6, 10), (4, 4)), ((16, 8), (16, 8)), ((1, 3), (1, 4)),
                                          ((7, 5), (2, 8))],
                         ids=["ragged_both_axes", "exact_tiles", "single_row",
                              "tile_wider_than_array"])
def test_partial_tile_stores_write_only_inside(shape, block):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = nan_like(x)
    grid = (-(-shape[0] // block[0]), -(-shape[1] // block[1]))
    launch(grid, _copy_2d_kernel, (x, y, *block))
    np.testing.assert_array_equal(y, x)  # NaN padding stored outside would be dropped, not written


def test_store_leaves_neighbours_untouched():
    y = np.full(10, -1.0, np.float32)

    @ct.kernel
    def store_last(y):
        ct.store(y, (2,), ct.full((4,), 7.0, dtype=ct.float32))

    launch((1,), store_last, (y,))
    np.testing.assert_array_equal(y, [-1] * 8 + [7, 7])


@pytest.mark.parametrize("shape", [(6, 10), (16, 16), (3, 17)], ids=["ragged", "square", "thin"])
def test_order_f_load_is_a_transposed_load(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    y = nan_like(x.T)
    bm, bn = 4, 8
    launch((-(-shape[1] // bn), -(-shape[0] // bm)), _transposed_copy_kernel, (x, y, bm, bn))
    np.testing.assert_array_equal(y, x.T)


def test_load_with_axis_permutation_and_docstring_example():
    x = np.arange(8, dtype=np.int32).reshape(2, 2, 2)
    out = np.full((2, 1, 2, 2), -1, np.int32)

    @ct.kernel
    def permuted(x, out):
        for i in range(2):
            t = ct.load(x, (i, 0, 0), shape=(1, 2, 2), order=(0, 2, 1))
            ct.store(out, (i, 0, 0, 0), ct.reshape(t, (1, 1, 2, 2)))

    launch((1,), permuted, (x, out))
    np.testing.assert_array_equal(out[:, 0], [[[0, 2], [1, 3]], [[4, 6], [5, 7]]])


def test_store_with_order_f_writes_the_transpose():
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    y = nan_like(x.T)

    @ct.kernel
    def store_f(x, y):
        ct.store(y, (0, 0), ct.load(x, (0, 0), shape=(4, 8)), order="F")

    launch((1,), store_f, (x, y))
    np.testing.assert_array_equal(y, x.T)


def test_scalar_load_and_store():
    x = np.arange(10, dtype=np.float32)
    y = nan_like(x)

    @ct.kernel
    def scalars(x, y):
        for i in range(10):
            ct.store(y, (9 - i,), ct.load(x, (i,), shape=()) * 2.0)

    launch((1,), scalars, (x, y))
    np.testing.assert_array_equal(y, 2 * x[::-1])


@pytest.mark.parametrize("what", ["entirely_outside", "check_bounds_false_partial"])
def test_undefined_loads_raise(what):
    x = np.arange(10, dtype=np.float32)
    y = nan_like(np.zeros(4))

    @ct.kernel
    def outside(x, y):
        ct.store(y, (0,), ct.load(x, (3,), shape=(4,), padding_mode=ct.PaddingMode.ZERO))

    @ct.kernel
    def unchecked(x, y):
        ct.store(y, (0,), ct.load(x, (2,), shape=(4,), check_bounds=False))

    with pytest.raises(IndexError, match="undefined behaviour"):
        launch((1,), outside if what == "entirely_outside" else unchecked, (x, y))


def test_integer_padding_modes():
    x = np.arange(10, dtype=np.int32)
    y = np.zeros(4, np.int32)
    launch((1,), _pad_kernel, (x, y, 4, 2, PADDINGS.index(ct.PaddingMode.ZERO)))
    np.testing.assert_array_equal(y, [8, 9, 0, 0])
    launch((1,), _pad_kernel, (x, y, 4, 2, PADDINGS.index(ct.PaddingMode.UNDETERMINED)))
    np.testing.assert_array_equal(y, [8, 9, np.iinfo(np.int32).min, np.iinfo(np.int32).min])
    with pytest.raises(TypeError, match="needs a float array"):
        launch((1,), _pad_kernel, (x, y, 4, 2, PADDINGS.index(ct.PaddingMode.NAN)))


# ---------------------------------------------------------------------------------------------
# mma and matmul


def _mma(x, y, acc, dtype):
    out = nan_like(acc)
    m, k = x.shape
    n = y.shape[1]
    launch((1,), _mma_kernel, (x, y, acc, out, m, k, n, MMA_DTYPES.index(dtype)))
    return out


def _operands(m, k, n, seed=2):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32),
            rng.standard_normal((m, n)).astype(np.float32))


def _rounded(a, mantissa):
    a = a.astype(np.float64)
    e = np.floor(np.log2(np.abs(np.where(a == 0, 1.0, a))))
    q = 2.0 ** (e - mantissa)
    return np.round(a / q) * q


@pytest.mark.parametrize("dtype, mantissa", [(ct.tfloat32, 10), (ct.bfloat16, 7)],
                         ids=["tfloat32", "bfloat16"])
def test_mma_rounds_operands_and_accumulates_in_fp32(dtype, mantissa):
    """Against float64 of the rounded operands: within the fp32 accumulation bound
    gamma_(K+1) (|x| |y| + |acc|) (products of rounded operands are exact in fp32). Against the
    unrounded operands the rounding must show: well beyond that bound somewhere."""
    m, k, n = 32, 64, 16
    x, y, acc = _operands(m, k, n)
    got = _mma(x, y, acc, dtype).astype(np.float64)
    xr, yr = _rounded(x, mantissa), _rounded(y, mantissa)
    ref = xr @ yr + acc
    bound = gamma(k + 1) * (np.abs(xr) @ np.abs(yr) + np.abs(acc))
    assert np.all(np.abs(got - ref) <= bound)
    unrounded = x.astype(np.float64) @ y.astype(np.float64) + acc
    assert np.max(np.abs(got - unrounded) / bound) > 10  # without the rounding: <= 1


def test_mma_float32_operands_not_cast_run_in_true_fp32():
    m, k, n = 16, 64, 32
    x, y, acc = _operands(m, k, n, seed=3)
    got = _mma(x, y, acc, ct.float32).astype(np.float64)
    ref = x.astype(np.float64) @ y.astype(np.float64) + acc
    bound = gamma(k + 1) * (np.abs(x.astype(np.float64)) @ np.abs(y) + np.abs(acc))
    assert np.all(np.abs(got - ref) <= bound)


def test_mma_float16_operands():
    m, k, n = 16, 32, 16
    x, y, acc = _operands(m, k, n, seed=5)
    got = _mma(x, y, acc, ct.float16).astype(np.float64)
    xr, yr = x.astype(np.float16).astype(np.float64), y.astype(np.float16).astype(np.float64)
    ref = xr @ yr + acc
    assert np.all(np.abs(got - ref) <= gamma(k + 1) * (np.abs(xr) @ np.abs(yr) + np.abs(acc)))


def test_mma_batched_and_int8():
    rng = np.random.default_rng(6)
    a = rng.integers(-128, 128, (2, 4, 16)).astype(np.int8)
    b = rng.integers(-128, 128, (16, 8)).astype(np.int8)
    r = cti.mma(Tile(a, ct.int8), Tile(b, ct.int8), cti.full((2, 4, 8), 5, ct.int32))
    assert r.dtype == ct.int32
    np.testing.assert_array_equal(r.numpy(), a.astype(np.int32) @ b.astype(np.int32) + 5)


def test_mma_dtype_rules():
    f32 = cti.ones((16, 16), ct.float32)
    tf = f32.astype(ct.tfloat32)
    with pytest.raises(TypeError, match="same dtype"):
        cti.mma(tf, f32, f32)
    with pytest.raises(TypeError, match="acc"):
        cti.mma(tf, tf, cti.ones((16, 16), ct.float16))
    with pytest.raises(TypeError, match="acc must have shape"):
        cti.mma(tf, tf, cti.ones((16, 8), ct.float32))


def test_matmul_promotes_and_returns_the_input_dtype():
    x = cti.full((4, 8), 1.5, ct.float32)
    y = cti.arange(8, dtype=ct.int32)
    r = x @ y.astype(ct.float32).reshape((8, 1))
    assert r.dtype == ct.float32 and r.shape == (4, 1)
    np.testing.assert_array_equal(r.numpy(), np.full((4, 1), 1.5 * 28, np.float32))
    tf = x.astype(ct.tfloat32)
    assert cti.matmul(tf, cti.ones((8, 2), ct.float32).astype(ct.tfloat32)).dtype == ct.tfloat32


# ---------------------------------------------------------------------------------------------
# Scans, reductions, selection


@pytest.mark.parametrize("axis, reverse", [(0, False), (1, False), (1, True), (0, True)],
                         ids=["axis0", "axis1", "axis1_reverse", "axis0_reverse"])
def test_cumsum_of_representable_values_is_exact(axis, reverse):
    rng = np.random.default_rng(7)
    x = (rng.integers(-64, 64, (16, 32)) / 8).astype(np.float32)  # sums exact in fp32
    y = nan_like(x)
    launch((1,), _cumsum_kernel, (x, y, 16, 32, axis, reverse))
    ref = np.flip(np.cumsum(np.flip(x, axis), axis), axis) if reverse else np.cumsum(x, axis)
    np.testing.assert_array_equal(y, ref)


def test_cumsum_float32_regroups_like_a_parallel_scan():
    # x = [1, 2^-24, 2^-24, 0]. In parallel-scan (Kogge-Stone) order, prefix 2 is
    # 2^-24 + 2^-24 (= 2^-23, exact) added to 1: 1 + 2^-23, representable (the ulp of 1).
    # Prefix 3 is (0 + 2^-24) + (2^-24 + 1) = 2^-24 + 1 (1 + 2^-24 is a tie, to even: 1) = 1.
    # So adding a zero takes the prefix one ulp back, as the H200's scan did to dA_cumsum; a
    # sequential cumsum would give 1, 1, 1, 1 and hide kernels that assume monotone prefixes.
    x = cti.astile(np.array([1.0, 2.0**-24, 2.0**-24, 0.0], np.float32), dtype=ct.float32)
    np.testing.assert_array_equal(cti.cumsum(x).numpy(),
                                  np.array([1.0, 1.0, 1.0 + 2.0**-23, 1.0], np.float32))


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_scan_with_minimum_is_the_running_minimum(reverse):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    y = nan_like(x)
    launch((1,), _running_min_kernel, (x, y, 16, 8, reverse))
    ref = np.minimum.accumulate(x[::-1], axis=0)[::-1] if reverse else np.minimum.accumulate(x, 0)
    np.testing.assert_array_equal(y, ref)


def test_scan_of_a_tuple_is_not_supported():
    t = cti.full((4,), 1.0, ct.float32)
    with pytest.raises(NotImplementedError, match="scan of a tuple"):
        cti.scan((t, t), 0, lambda a, b, c, d: (a + c, b + d), (0.0, 0.0))


def test_cumsum_bfloat16_rounds_every_step():
    v = cti.full((8,), 1.0, ct.float32).astype(ct.bfloat16) * 1.0
    big = cti.full((8,), 256.0, ct.float32).astype(ct.bfloat16)
    r = cti.cumsum(cti.where(cti.arange(8, dtype=ct.int32) == 0, big, v))
    # 256 + 1 = 257 is not a bfloat16 (8 significant bits): each step rounds back to 256 (tie
    # to even), so the sum stays 256; a float32 accumulation would reach 263
    np.testing.assert_array_equal(r.numpy(), np.full(8, 256.0, np.float32))


def test_reductions():
    rng = np.random.default_rng(8)
    a = rng.standard_normal((4, 8)).astype(np.float32)
    t = Tile(a, ct.float32)
    np.testing.assert_allclose(cti.sum(t, 1).numpy(), a.sum(1), rtol=8 * U32)
    assert cti.sum(t).shape == () and cti.sum(t, 0, keepdims=True).shape == (1, 8)
    np.testing.assert_array_equal(cti.max(t, 0).numpy(), a.max(0))
    np.testing.assert_array_equal(cti.min(t, (0, 1)).numpy(), a.min())
    np.testing.assert_array_equal(cti.argmax(t, 1).numpy(), a.argmax(1))
    with_nan = a.copy()
    with_nan[0, 0] = np.nan
    tn = Tile(with_nan, ct.float32)
    assert cti.max(tn, 1).numpy()[0] == np.nanmax(with_nan[0])  # NaN ignored by default
    assert np.isnan(cti.max(tn, 1, propagate_nan=True).numpy()[0])
    ints = Tile(np.arange(8, dtype=np.int32).reshape(2, 4), ct.int32)
    r = cti.sum(ints, 1)
    assert r.dtype == ct.int32
    np.testing.assert_array_equal(r.numpy(), [6, 22])


def test_where_selects_before_use_no_nan_from_masked_overflow():
    """2^(a_t - a_s) overflows above the diagonal (a decreasing): the select must drop it."""
    a = -26.75 * np.arange(16, dtype=np.float32)  # differences exact in fp32, down to -401.25
    out = nan_like(np.zeros((16, 16)))
    launch((1,), _causal_decay_kernel, (a, out, 16))
    ref = np.where(np.tril(np.ones((16, 16), bool)),
                   np.exp2(a[:, None].astype(np.float64) - a[None, :]), 0.0)
    assert not np.any(np.isnan(out))
    # exp2 in fp32 (<= 1 ulp) of an exact difference; below 2^-126 the quantum is 2^-149
    assert np.all(np.abs(out - ref) <= 2 * U32 * ref + 2.0**-149)


def test_where_promotes_scalars_and_tiles():
    cond = cti.arange(4, dtype=ct.int32) >= 2
    r = cti.where(cond, cti.full((4,), 1, ct.int32), -1)
    assert r.dtype == ct.int32
    np.testing.assert_array_equal(r.numpy(), [-1, -1, 1, 1])
    f = cti.where(cond, 2.5, cti.zeros((4,), ct.float16))
    assert f.dtype == ct.float16


# ---------------------------------------------------------------------------------------------
# Elementwise arithmetic and promotion


def test_fp32_arithmetic_stays_fp32():
    a = np.float32([0.1, 1.0 / 3.0, 7.0, -2.5])
    t = Tile(a, ct.float32)
    r = t * 0.1 + 1.0 / 3.0
    assert r.dtype == ct.float32 and r.numpy().dtype == np.float32
    np.testing.assert_array_equal(r.numpy(), a * np.float32(0.1) + np.float32(1.0 / 3.0))
    assert (t / 3).dtype == ct.float32


def test_integer_promotion_rules():
    i = cti.arange(4, dtype=ct.int32)
    assert (i + 1).dtype == ct.int32
    assert (i * 2.5).dtype == ct.float32
    assert (i / 2).dtype == ct.float32
    np.testing.assert_array_equal((i / 2).numpy(), [0, 0.5, 1, 1.5])
    assert (i + Tile(np.zeros(4, np.int64), ct.int64)).dtype == ct.int64
    assert ((i > 1) + 1).dtype == ct.int32
    neg = i - 2
    np.testing.assert_array_equal((neg // 3).numpy(), [-1, -1, 0, 0])  # floor division
    np.testing.assert_array_equal((neg % 3).numpy(), [1, 2, 0, 1])  # sign of the divisor
    np.testing.assert_array_equal(cti.cdiv(i + 5, 4).numpy(), [2, 2, 2, 2])
    assert cti.cdiv(9, 4) == 3 and cti.cdiv(-9, 4) == -2
    with pytest.raises(ValueError, match="out of range"):
        Tile(np.zeros(4, np.int8), ct.int8) + 1000


def test_float16_and_bfloat16_arithmetic_round_in_their_dtype():
    a = np.float32([1.0, 1.0 / 3.0, 1000.5, -2.7])
    h = Tile(a.astype(np.float16), ct.float16)
    r = h * 1.1 + h
    assert r.dtype == ct.float16
    np.testing.assert_array_equal(r.numpy(), (a.astype(np.float16) * np.float16(1.1)
                                              + a.astype(np.float16)))
    b = Tile(a, ct.float32).astype(ct.bfloat16)
    s = b + b * 0.3
    assert s.dtype == ct.bfloat16
    assert np.all(bits(s.numpy()) & 0xFFFF == 0)  # every result is a bfloat16 value
    assert (b + Tile(a, ct.float32)).dtype == ct.float32


def test_tfloat32_takes_no_arithmetic_and_no_implicit_store():
    t = cti.ones((4,), ct.float32).astype(ct.tfloat32)
    with pytest.raises(TypeError, match="tfloat32"):
        t + 1.0
    with pytest.raises(TypeError, match="tfloat32"):
        t * cti.ones((4,), ct.float32)
    y = nan_like(np.zeros(4))

    @ct.kernel
    def store_tf32(y):
        ct.store(y, (0,), ct.ones((4,), dtype=ct.float32).astype(ct.tfloat32))

    with pytest.raises(TypeError, match="store"):
        launch((1,), store_tf32, (y,))


def test_store_does_not_narrow_implicitly():
    y = np.zeros(4, np.float16)

    @ct.kernel
    def store_f32(y):
        ct.store(y, (0,), ct.ones((4,), dtype=ct.float32))

    with pytest.raises(TypeError, match="store"):
        launch((1,), store_f32, (y,))


def test_comparisons_with_nan_and_minimum_maximum():
    t = Tile(np.float32([np.nan, 1.0, -1.0, 2.0]), ct.float32)
    np.testing.assert_array_equal((t != 1.0).numpy(), [True, False, True, True])  # unordered
    np.testing.assert_array_equal((t < 1.5).numpy(), [False, True, True, False])  # ordered
    np.testing.assert_array_equal(cti.minimum(t, 0.0).numpy(), [0.0, 0.0, -1.0, 0.0])  # NaN ignored
    assert np.isnan(cti.maximum(t, 0.0, propagate_nan=True).numpy()[0])
    np.testing.assert_array_equal(cti.isnan(t).numpy(), [True, False, False, False])
    np.testing.assert_array_equal(cti.abs(t - 1.0).numpy()[1:], [0.0, 2.0, 1.0])


def test_builtin_min_of_tiles_in_a_kernel_is_elementwise():
    x = np.float32([5, -1, 3, 9])
    y = nan_like(x)

    @ct.kernel
    def clamp(x, y):
        t = ct.load(x, (0,), shape=(4,))
        ct.store(y, (0,), max(min(t, 4.0), 0.0))

    launch((1,), clamp, (x, y))
    np.testing.assert_array_equal(y, [4, 0, 3, 4])


def test_exp2_exp_log_against_float64():
    a = np.float32([-20.5, -1.0, 0.0, 0.3, 10.25, 80.0])
    t = Tile(a, ct.float32)
    for op, ref in ((cti.exp2, np.exp2), (cti.exp, np.exp)):
        r = op(t).numpy()
        assert r.dtype == np.float32
        expect = ref(a.astype(np.float64))
        assert np.all(np.abs(r - expect) <= U32 * 2 * expect)  # <= 1 ulp (2 u relative)
    p = np.float32([0.1, 1.0, 3.0, 1e10])
    for op, ref in ((cti.log, np.log), (cti.log2, np.log2)):
        r = op(Tile(p, ct.float32)).numpy()
        expect = ref(p.astype(np.float64))
        assert np.all(np.abs(r - expect) <= 2 * U32 * np.maximum(np.abs(expect), 1e-30) + 1e-7)


def test_flush_to_zero_only_when_asked():
    t = Tile(np.float32([-140.0, -10.0]), ct.float32)
    kept = cti.exp2(t).numpy()
    assert kept[0] == np.float32(2.0**-140)  # subnormal result kept by default
    flushed = cti.exp2(t, flush_to_zero=True).numpy()
    assert flushed[0] == 0.0 and flushed[1] == np.float32(2.0**-10)
    tiny = Tile(np.float32([1e-39, -1e-39, 1.0]), ct.float32)  # two subnormals and a normal
    np.testing.assert_array_equal((tiny * 1.0).numpy(), tiny.numpy())
    r = cti.mul(tiny, 1.0, flush_to_zero=True).numpy()
    np.testing.assert_array_equal(r, [0.0, -0.0, 1.0])
    assert np.signbit(r[1])  # flushed to a signed zero


# ---------------------------------------------------------------------------------------------
# Creation and shapes


def test_creation():
    np.testing.assert_array_equal(cti.arange(8, dtype=ct.int32, start=7, step=-1).numpy(),
                                  np.arange(7, -1, -1))
    a = cti.arange(4, dtype=ct.float32)
    assert a.dtype == ct.float32 and a.numpy().dtype == np.float32
    f = cti.full((2, 4), 3, ct.float16)
    assert f.dtype == ct.float16 and f.numpy().dtype == np.float16 and np.all(f.numpy() == 3)
    assert np.all(cti.zeros((4,), ct.int32).numpy() == 0)
    assert np.all(cti.ones((2, 2), ct.bool_).numpy())
    with pytest.raises(ValueError, match="powers of two"):
        cti.full((3, 4), 0.0, ct.float32)
    with pytest.raises(ValueError, match="powers of two"):
        cti.arange(6, dtype=ct.int32)


def test_shape_operations():
    a = np.arange(16, dtype=np.int32)
    t = Tile(a, ct.int32)
    r = t.reshape((4, -1))
    np.testing.assert_array_equal(r.numpy(), a.reshape(4, 4))
    np.testing.assert_array_equal(cti.transpose(r).numpy(), a.reshape(4, 4).T)
    c = t.reshape((2, 2, 4))
    np.testing.assert_array_equal(cti.permute(c, (2, 0, 1)).numpy(),
                                  a.reshape(2, 2, 4).transpose(2, 0, 1))
    np.testing.assert_array_equal(c.transpose(0, 2).numpy(), a.reshape(2, 2, 4).swapaxes(0, 2))
    assert t[:, None].shape == (16, 1) and t[None, :].shape == (1, 16)
    assert cti.expand_dims(t, 0).shape == (1, 16)
    np.testing.assert_array_equal(cti.broadcast_to(t[None, :], (2, 16)).numpy(), np.tile(a, (2, 1)))
    np.testing.assert_array_equal(r.extract((0, 1), (2, 2)).numpy(), [[2, 3], [6, 7]])
    np.testing.assert_array_equal(
        cti.insert(r, (1, 0), cti.full((2, 2), 99, ct.int32)).numpy()[2:, :2], [[99, 99], [99, 99]])
    np.testing.assert_array_equal(cti.cat((r, r), 1).numpy(),
                                  np.concatenate([a.reshape(4, 4)] * 2, 1))
    assert cti.reshape(cti.full((1, 1), 2.0, ct.float32), ()).shape == ()
    with pytest.raises(TypeError, match="transpose"):
        cti.transpose(c)
    with pytest.raises(ValueError, match="cannot reshape"):
        t.reshape((4, 8))


# ---------------------------------------------------------------------------------------------
# Launch: grid, arguments, control flow, unsupported operations


def test_grid_bid_and_num_blocks():
    out = np.full((4, 3, 2), -1, np.int32)
    launch((2, 3, 4), _grid_kernel, (out,))
    z, y, x = np.meshgrid(range(4), range(3), range(2), indexing="ij")
    np.testing.assert_array_equal(out, x + 2 * (y + 3 * z) + 1000 * (2 + 30 + 400))


def test_runtime_scalar_trip_count():
    x = np.arange(32, dtype=np.float32)
    y = nan_like(np.zeros(8))
    launch((1,), _loop_kernel, (x, y, 3, 8))
    np.testing.assert_array_equal(y, x[:8] + x[8:16] + x[16:24])


def test_array_shape_is_a_runtime_value_not_a_tile_shape():
    x = np.zeros(8, np.float32)

    @ct.kernel
    def runtime_shape(x):
        ct.load(x, (0,), shape=(x.shape[0],))

    with pytest.raises(TypeError, match="constant"):
        launch((1,), runtime_shape, (x,))


def test_scalar_arguments_are_typed_like_cutile():
    y = np.zeros(4, np.float32)

    @ct.kernel
    def scale(y, s, n):
        ct.static_assert(s.dtype == ct.float32 and n.dtype == ct.int32)
        ct.store(y, (0,), ct.full((4,), 1.0, dtype=ct.float32) * s + n)

    launch((1,), scale, (y, 0.5, 2))
    np.testing.assert_array_equal(y, [2.5] * 4)

    @ct.kernel
    def wide(x: ct.IndexedWithInt64, y, n: ct.ScalarInt64):
        ct.static_assert(x.shape[0].dtype == ct.int64 and y.shape[0].dtype == ct.int32)
        ct.static_assert(n.dtype == ct.int64)
        ct.store(y, (0,), ct.full((4,), 1.0, dtype=ct.float32) * (n - 2**40 + x.shape[0]))

    launch((1,), wide, (np.zeros(8, np.float32), y, 2**40))
    np.testing.assert_array_equal(y, [8.0] * 4)
    with pytest.raises(ValueError, match="out of range of int32"):
        launch((1,), scale, (y, 0.5, 2**40))


@pytest.mark.parametrize("op", ["atomic_add", "printf"])
def test_unsupported_operations_raise_naming_them(op):
    y = np.zeros(4, np.float32)

    @ct.kernel
    def uses(y, OP: ct.Constant[str]):
        getattr(ct, OP)(y, (0,))

    with pytest.raises(NotImplementedError, match=f"ct.{op}"):
        launch((1,), uses, (y, op))


def test_helper_functions_of_the_kernel_module_are_rebound():
    y = nan_like(np.zeros(4))
    launch((1,), _helper_kernel, (y,))
    np.testing.assert_array_equal(y, [1.0, 2.0, 4.0, 8.0])


def _doubling(n):
    return ct.exp2(ct.arange(n, dtype=ct.float32))


@ct.kernel
def _helper_kernel(y):
    """One program: y = 2^[0, 1, 2, 3], computed by a helper of this module."""
    ct.store(y, (0,), _doubling(4))


@ct.kernel
def _overlapping_store_kernel(y, SAME: ct.Constant[bool]):
    """Every program stores to tile 0 of y: the same values (SAME) or its own block id."""
    v = ct.full((4,), 1.0, dtype=ct.float32)
    ct.store(y, (0,), v if SAME else v * ct.bid(0))


@ct.kernel
def _read_neighbour_kernel(y):
    """Program i stores tile i, then reads tile i + 1 (stored by another program)."""
    i = ct.bid(0)
    ct.store(y, (i,), ct.full((4,), 1.0, dtype=ct.float32))
    ct.load(y, (i + 1,), shape=(4,), padding_mode=ct.PaddingMode.ZERO)


def test_races_between_programs_raise():
    y = nan_like(np.zeros(8))
    launch((3,), _overlapping_store_kernel, (y, True))  # identical values: a benign overlap
    np.testing.assert_array_equal(y[:4], 1.0)
    with pytest.raises(RuntimeError, match="store different values"):
        launch((3,), _overlapping_store_kernel, (y, False))
    with pytest.raises(RuntimeError, match="reads elements that program"):
        launch((2,), _read_neighbour_kernel, (nan_like(np.zeros(12)),))


@ct.kernel
def _handoff_kernel(y, ready):
    """Program i waits for program i - 1's flag (consuming it), adds 1 to the value it stored,
    stores its own and sets its flag: a chain ordered by acquire and release."""
    i = ct.bid(0)
    got = ct.zeros((4,), dtype=ct.float32)
    for _ in range(ct.where(i > 0, 1, 0)):
        flag = ct.atomic_cas(ready, i - 1, 1, 0, memory_order=ct.MemoryOrder.ACQUIRE)
        while flag != 1:
            flag = ct.atomic_cas(ready, i - 1, 1, 0, memory_order=ct.MemoryOrder.ACQUIRE)
        got = ct.load(y, (i - 1,), shape=(4,), allow_tma=False)
    ct.store(y, (i,), got + 1.0, allow_tma=False)
    ct.atomic_xchg(ready, i, 1, memory_order=ct.MemoryOrder.RELEASE)


@ct.kernel
def _flag_read_kernel(y, ready, MODE: ct.Constant[int]):
    """Program 1 stores tile 1 and releases its flag (MODE 2: releases it first, then stores);
    program 0 takes the flag (acquiring it; MODE 1: relaxed, so nothing orders the store before
    its read) and reads tile 1."""
    i = ct.bid(0)
    for _ in range(ct.where(i == 1, 1, 0)):
        if MODE == 2:
            ct.atomic_xchg(ready, 1, 1, memory_order=ct.MemoryOrder.RELEASE)
        ct.store(y, (1,), ct.full((4,), 1.0, dtype=ct.float32), allow_tma=False)
        if MODE != 2:
            ct.atomic_xchg(ready, 1, 1, memory_order=ct.MemoryOrder.RELEASE)
    for _ in range(ct.where(i == 0, 1, 0)):
        order = ct.MemoryOrder.RELAXED if MODE == 1 else ct.MemoryOrder.ACQUIRE
        ct.atomic_cas(ready, 1, 1, 0, memory_order=order)
        ct.store(y, (0,), ct.load(y, (1,), shape=(4,), allow_tma=False) + 1.0)


@ct.kernel
def _relaxed_spin_kernel(ready):
    """Program 0 spins on a flag with relaxed compare-and-swaps."""
    flag = ct.atomic_cas(ready, 1, 1, 0, memory_order=ct.MemoryOrder.RELAXED)
    while flag != 1:
        flag = ct.atomic_cas(ready, 1, 1, 0, memory_order=ct.MemoryOrder.RELAXED)


@ct.kernel
def _wait_forever_kernel(ready):
    """Program 0 waits for a flag no program sets."""
    flag = ct.atomic_cas(ready, 1, 1, 0, memory_order=ct.MemoryOrder.ACQUIRE)
    while flag != 1:
        flag = ct.atomic_cas(ready, 1, 1, 0, memory_order=ct.MemoryOrder.ACQUIRE)


@ct.kernel
def _store_then_wait_kernel(y, ready):
    """Each program stores, then program 1 waits for program 0's flag."""
    i = ct.bid(0)
    ct.store(y, (i,), ct.full((4,), 1.0, dtype=ct.float32))
    for _ in range(ct.where(i > 0, 1, 0)):
        flag = ct.atomic_cas(ready, 0, 1, 0, memory_order=ct.MemoryOrder.ACQUIRE)
        while flag != 1:
            flag = ct.atomic_cas(ready, 0, 1, 0, memory_order=ct.MemoryOrder.ACQUIRE)
    ct.atomic_xchg(ready, i, 1, memory_order=ct.MemoryOrder.RELEASE)


def test_acquire_release_handoff_runs_waiting_programs_after_their_flag():
    # programs run in reverse order: each waits, and runs again once its predecessor has set
    # its flag; every flag a successor consumed is back to 0, the last one stays set
    y, ready = nan_like(np.zeros(20)), np.zeros(5, np.int32)
    launch((5,), _handoff_kernel, (y, ready))
    np.testing.assert_array_equal(y.reshape(5, 4), np.arange(1, 6, dtype=np.float32)[:, None]
                                  * np.ones((1, 4), np.float32))
    np.testing.assert_array_equal(ready, [0, 0, 0, 0, 1])


def test_only_an_acquire_orders_another_programs_store_before_a_read():
    y = nan_like(np.zeros(8))
    launch((2,), _flag_read_kernel, (y, np.zeros(2, np.int32), 0))
    np.testing.assert_array_equal(y, [2.0] * 4 + [1.0] * 4)
    # a relaxed read orders nothing; a release orders only the stores before it
    for mode in (1, 2):
        with pytest.raises(RuntimeError, match="reads elements that program 1"):
            launch((2,), _flag_read_kernel, (nan_like(np.zeros(8)), np.zeros(2, np.int32), mode))


def test_a_wait_no_program_ends_raises_instead_of_hanging():
    with pytest.raises(RuntimeError, match=r"waits for ready\[1\] == 1, which no program"):
        launch((1,), _wait_forever_kernel, (np.zeros(2, np.int32),))
    with pytest.raises(RuntimeError, match="without an acquiring order"):
        launch((1,), _relaxed_spin_kernel, (np.zeros(2, np.int32),))
    with pytest.raises(RuntimeError, match="waits on an element after storing"):
        launch((2,), _store_then_wait_kernel, (nan_like(np.zeros(8)), np.zeros(2, np.int32)))


def test_reads_of_unwritten_allocations_raise():
    """An array the launchers allocate (Backend.empty, under track_writes: on in every test)
    may be read only where a program stored: a load of an unwritten element names the kernel,
    the array, the index and the program; after a kernel wrote it the load passes, and a tile
    past the shape (a padding mode) stays legal. A host write (the NaN fill) is no store."""
    backend = Backend.of("numpy")
    x = backend.empty((6,))
    x[...] = math.nan
    y = backend.empty((2, 4))
    with pytest.raises(RuntimeError, match=r"_copy_2d_kernel \(program \d+\) reads x\[0, 0\], "
                                           r"an element of an allocated array that no program"):
        launch((1, 1), _copy_2d_kernel, (x.reshape(2, 3), y, 2, 4))
    launch((1,), _fill_kernel, (x, 8))
    launch((1, 1), _copy_2d_kernel, (x.reshape(2, 3), y, 2, 4))  # a tile past x's 3 columns
    np.testing.assert_array_equal(y[:, :3], 2.0)
    z = backend.empty((4, 4))
    launch((1, 1), _copy_2d_kernel, (y, z[:2], 2, 4))  # rows 0 and 1 of z, through a view
    out = np.zeros((2, 4), np.float32)
    with pytest.raises(RuntimeError, match=r"reads x\[1, 0\]"):  # z's row 2: the view's row 1
        launch((1, 1), _copy_2d_kernel, (z[1:3], out, 2, 4))


@ct.kernel
def _fill_kernel(x, N: ct.Constant[int]):
    """One program: x[:] = 2 (a tile of N, stored masked to x's shape)."""
    ct.store(x, (0,), ct.full((N,), 2.0, dtype=ct.float32))


def test_array_slice():
    x = np.arange(16, dtype=np.float32)
    y = nan_like(np.zeros(4))

    @ct.kernel
    def sliced(x, y):
        ct.store(y, (0,), ct.load(x.slice(0, 5, 9), (0,), shape=(4,)))

    launch((1,), sliced, (x, y))
    np.testing.assert_array_equal(y, x[5:9])


def test_rounding_modes():
    t = Tile(np.float32([0.5, 2.0]), ct.float32)
    np.testing.assert_array_equal(cti.exp(t, rounding_mode=ct.RoundingMode.APPROX).numpy(),
                                  cti.exp(t).numpy())  # computed as accurately as NumPy can
    np.testing.assert_array_equal(cti.truediv(t, 3.0, rounding_mode=ct.RoundingMode.FULL).numpy(),
                                  t.numpy() / np.float32(3.0))
    with pytest.raises(NotImplementedError, match="rounding_mode"):
        cti.add(t, 1.0, rounding_mode=ct.RoundingMode.RZ)


def test_bad_launches():
    with pytest.raises(TypeError, match="kernel"):
        launch((1,), lambda: None, ())
    with pytest.raises(ValueError, match="grid"):
        launch((0,), _grid_kernel, (np.zeros((1, 1, 1), np.int32),))
    with pytest.raises(TypeError, match="argument out"):
        launch((1,), _grid_kernel, (object(),))


# ---------------------------------------------------------------------------------------------
# The test kernels are valid cuTile: compiled for sm_90 (tileiras on the CPU)


def _array(dtype, ndim):
    return ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                           alias_groups=(), may_alias_internally=False)


COMPILED = {
    "roundtrip_tf32": (_roundtrip_kernel, [_array(ct.float32, 1), _array(ct.float32, 1), 32,
                                           CAST_DTYPES.index(ct.tfloat32)]),
    "pad_neg_inf": (_pad_kernel, [_array(ct.float32, 1), _array(ct.float32, 1), 4, 2,
                                  PADDINGS.index(ct.PaddingMode.NEG_INF)]),
    "transposed_copy": (_transposed_copy_kernel, [_array(ct.float32, 2), _array(ct.float32, 2),
                                                  16, 32]),
    "mma_tf32": (_mma_kernel, [_array(ct.float32, 2)] * 4
                 + [32, 64, 16, MMA_DTYPES.index(ct.tfloat32)]),
    "causal_decay": (_causal_decay_kernel, [_array(ct.float32, 1), _array(ct.float32, 2), 16]),
    "loop": (_loop_kernel, [_array(ct.float32, 1), _array(ct.float32, 1),
                            ScalarConstraint(ct.int32), 8]),
    "handoff": (_handoff_kernel, [_array(ct.float32, 1), _array(ct.int32, 1)]),
}


@pytest.mark.compile
@pytest.mark.parametrize("name", list(COMPILED))
def test_test_kernels_compile_for_sm90(name):
    kernel, params = COMPILED[name]
    out = io.BytesIO()
    export_kernel(kernel, [KernelSignature(params, CallingConvention.cutile_python_v1())], out,
                  gpu_code="sm_90", output_format="cubin")
    assert out.getvalue()[:4] == b"\x7fELF"


# ---------------------------------------------------------------------------------------------
# Speed: the whole forward on the interpreter (item 3 of issue 4: <= 1 s on 2 cores)


SPEED_DIMS = dict(batch=1, seqlen=512, nheads=4, headdim=64, dstate=64, chunk_size=64)
SPEED_TARGET_S = 1.0


def test_ssd_forward_interpreter_speed(benchmark):
    d = SPEED_DIMS
    rng = np.random.default_rng(9)
    x = rng.standard_normal((d["batch"], d["seqlen"], d["nheads"], d["headdim"])).astype(np.float32)
    dt = rng.uniform(0.01, 0.1, (d["batch"], d["seqlen"], d["nheads"])).astype(np.float32)
    A = -rng.uniform(0.5, 2.0, d["nheads"]).astype(np.float32)
    B = rng.standard_normal((d["batch"], d["seqlen"], 1, d["dstate"])).astype(np.float32)
    C = rng.standard_normal((d["batch"], d["seqlen"], 1, d["dstate"])).astype(np.float32)
    y = benchmark.pedantic(ssd_forward, args=(x, dt, A, B, C, d["chunk_size"]), rounds=5,
                           iterations=1, warmup_rounds=1)
    assert y.shape == x.shape and np.all(np.isfinite(y))
    assert benchmark.stats.stats.median <= SPEED_TARGET_S


@ct.kernel
def _or_bits(words, out):
    """Program i ORs bit i into words[0]; an index of 1 (out of bounds) does nothing."""
    i = ct.bid(0)
    bit = ct.astile(1, dtype=ct.int32) << i
    old = ct.atomic_or(words, ct.where(i == 2, 1, 0), bit)
    ct.store(out, (i,), ct.reshape(old, (1,)))


def test_atomic_or_sets_every_programs_bit_and_skips_out_of_bounds_indices():
    words = np.zeros(1, np.int32)
    old = np.full(4, -1, np.int32)
    launch((4, 1, 1), _or_bits, (words, old))
    assert words[0] == 0b1011  # program 2's index is out of bounds: skipped
    # each in-bounds program saw the bits of those run before it (never its own), 2 saw nothing
    assert old[2] == 0
    assert all(old[i] & ~0b1011 == 0 and not old[i] & (1 << i) for i in (0, 1, 3))
    assert sorted(bin(old[i]).count("1") for i in (0, 1, 3)) == [0, 1, 2]


def test_gather_pads_and_scatter_stores_under_the_mask():
    """gather: elements at tile indices, the padding value where masked off or out of bounds
    (negative included); scatter: stores only where the mask holds and the index is inside."""
    x = np.arange(10, dtype=np.float32)
    y = nan_like(np.zeros(8, np.float32))

    @ct.kernel
    def shifted(x, y, START: ct.Constant[int]):
        i = START + ct.arange(8, dtype=ct.int32)  # [8]: indices -2 ... 5 past START -2
        v = ct.gather(x, i, mask=i != 3, padding_value=-1.0)
        # stored at 1 + k where i < 5: k = 7 (i = 5) is masked off; k = 6 goes to 7
        ct.scatter(y, ct.arange(8, dtype=ct.int32) + 1, v, mask=i < 5)
        # stored at 2 + k where i >= 4: k = 6 and 7 fall past the array's end (skipped)
        ct.scatter(y, ct.arange(8, dtype=ct.int32) + 2, v * 10.0, mask=i >= 4)

    launch((1,), shifted, (x, y, -2))
    # i = -2 -1 0 1 2 3 4 5: gathered -1 -1 0 1 2 -1 4 5
    np.testing.assert_array_equal(y[1:8], [-1, -1, 0, 1, 2, -1, 4])
    assert np.isnan(y[0])


def test_gather_refuses_a_padding_that_widens_the_result():
    x = np.arange(10, dtype=np.float32)
    y = nan_like(np.zeros(4, np.float32))

    @ct.kernel
    def widening(x, y):
        v = ct.gather(x, ct.arange(2, dtype=ct.int32), padding_value=ct.zeros((4,),
                                                                              dtype=ct.float32))
        ct.store(y, (0,), v)

    with pytest.raises(ValueError, match="does not broadcast to the indices' shape"):
        launch((1,), widening, (x, y))


def test_scatter_of_two_programs_to_one_element_is_refused():
    y = nan_like(np.zeros(4, np.float32))

    @ct.kernel
    def racing(y):
        ct.scatter(y, ct.arange(2, dtype=ct.int32), ct.full((2,), 1.0, dtype=ct.float32)
                   * (ct.bid(0) + 1))

    with pytest.raises(RuntimeError, match="store different values to the same element"):
        launch((2,), racing, (y,))
