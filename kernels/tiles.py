"""Helpers the kernels call inside their programs (cuTile device code, traced into each kernel
that calls them): tensor-core operands and products, the skip weights D, the z gate, the error
word's atomic. The host side of the launchers lives in kernels/arrays.py."""

from __future__ import annotations

import math

import cuda.tile as ct

from kernels.constants import ERROR_D
from kernels.constants import LOG2E  # the z gate's sigmoid is taken with exp2 too

# Smallest tile extent the launchers feed to ct.mma; smaller dimensions are zero padded up to it.
MMA_MIN = 16


def mma_operand(t, dtype):
    """A tile as a ct.mma operand, for kernels whose inputs have `dtype`: bfloat16 or float16 for
    16-bit inputs (their values as they are, computed values rounded to nearest: a float16 one
    past 65504 is inf, which ssd_scan's guard catches; the other kernels' mma_product scales it
    into range first), else TF32 (float32 inputs, and any tile where `dtype` is float32; rounded
    to nearest). A tile that already is a TF32 operand stays as it is."""
    if dtype == ct.bfloat16 or dtype == ct.float16:
        return t.astype(dtype)
    if t.dtype == ct.tfloat32:
        return t
    return t.astype(ct.float32).astype(ct.tfloat32)


def mma_product(a, b, acc, dtype):
    """acc + a @ b on the fp32 accumulator acc, in a kernel whose inputs have `dtype`: each of a
    and b is an input's tile (as mma_operand made it) or a tile the kernel computed in float32,
    rounded here as mma_operand says; in a float16 kernel the computed one (at most one of the
    two: a's rows or b's columns) is scaled into float16's range by powers of two
    (float16_scaled), its product taken on a zero accumulator and scaled back (exact), then
    added to acc."""
    if dtype != ct.float16 or (a.dtype == ct.float16 and b.dtype == ct.float16):
        return ct.mma(mma_operand(a, dtype), mma_operand(b, dtype), acc)
    zero = ct.zeros(acc.shape, dtype=ct.float32)
    if a.dtype == ct.float16:
        b16, back = float16_scaled(b, 0)  # back: [1, N]
        return acc + ct.mma(a, b16, zero) * back
    a16, back = float16_scaled(a, 1)  # back: [M, 1]
    return acc + ct.mma(a16, b, zero) * back


# float16_scaled's target: each row's (column's) largest magnitude scaled into [2^13, 2^14), two
# binades below float16's largest finite value (65504 < 2^16), so that rounding cannot reach inf
FLOAT16_TOP_EXPONENT = 13
# a largest magnitude below 2^(FLOAT16_MIN_BIASED - 127) is scaled as if it were that: the
# factors 2^(140 - e) and 2^(e - 140) then stay normal float32 numbers
FLOAT16_MIN_BIASED = 14


def float16_scaled(t, axis):
    """(t as a float16 operand, the factors that scale a product of it back): t, a float32 tile
    [M, N], scaled by 2^(140 - e) per row (axis 1; factors [M, 1]) or column (axis 0; [1, N]),
    e the biased float32 exponent of the row's (column's) largest magnitude: that magnitude
    lands in [2^13, 2^14), so nothing rounds to inf, and every value rounds as TF32 rounds it
    (a 10-bit mantissa) down to 2^-27 of it (float16's smallest normal, 2^-14, scaled back);
    below, float16's subnormals keep an absolute error <= 2^-38 of the row's (column's)
    largest magnitude (properties/bounds.py, "Scaled float16 operands"). Powers of two, built
    from their exponent bits: the scaling and the scaling back are exact, their product is 1.
    inf and NaN stay inf and NaN."""
    top = ct.max(ct.abs(t), axis=axis, keepdims=True)
    e = ct.maximum((ct.bitcast(top, ct.int32) >> 23) & 255, FLOAT16_MIN_BIASED)
    up = ct.bitcast((254 + FLOAT16_TOP_EXPONENT - e) << 23, ct.float32)  # 2^(140 - e)
    back = ct.bitcast((e - FLOAT16_TOP_EXPONENT) << 23, ct.float32)  # 2^(e - 140)
    return (t * up).astype(ct.float16), back


def head_D(D, i_h, i_p, BLOCK_P, D_PER_HEADDIM):
    """Head i_h's skip weights for headdim block i_p: [BLOCK_P, 1] per channel, else [1, 1],
    in float32 (a 16-bit D widened, exact)."""
    if D_PER_HEADDIM:
        skip = ct.load(D, (i_h, i_p), shape=(1, BLOCK_P), padding_mode=ct.PaddingMode.ZERO)
        skip = ct.reshape(skip, (BLOCK_P, 1))
    else:
        skip = ct.reshape(ct.load(D, (i_h,), shape=(1,)), (1, 1))
    return skip.astype(ct.float32)


def checked_D(D, i_h, i_p, BLOCK_P, D_PER_HEADDIM):
    """head_D's skip weights, NaN where one is not finite (NaN fails the comparison too), so
    that every y it feeds is NaN (NaN x 0 is NaN, where inf x 0 would be NaN and inf x 1 inf)."""
    skip = head_D(D, i_h, i_p, BLOCK_P, D_PER_HEADDIM)
    return ct.where(ct.abs(skip) < math.inf, skip, math.nan)


def report_D(errors, skip, CHECK_D):
    """With CHECK_D, ERROR_D OR-ed into errors[0] where a skip weight checked_D gave is NaN: its
    D is not finite (only by a program that has one: index 1 is out of bounds). A program calls
    it after its loop, so that the check holds no registers through it (at its start it made
    the program per chunk spill). Without CHECK_D the call checks D elsewhere (ssd_forward: in
    chunk_cumsum, where the atomic costs no time)."""
    if CHECK_D:
        or_error(errors, ct.max(ct.where(skip == skip, 0, ERROR_D)))


def or_error(errors, flags):
    """ORs the error bits `flags` (an int32 scalar tile, 0 where there are none) into the call's
    error word errors[0], by a program that has some only (the index 1 is out of bounds: no
    atomic). Relaxed: the word is read after the launch ends (the host's copy, a later kernel),
    so nothing orders it with the program's other accesses; the default acquire-release atomic
    costs every program a GPU-wide barrier and an L1 invalidation (MEMBAR.ALL.GPU and
    CCTL.IVALL in its SASS), whether it fires or not."""
    ct.atomic_or(errors, ct.where(flags != 0, 0, 1), flags, memory_order=ct.MemoryOrder.RELAXED)


def z_gated(acc, z, i_b, i_t, i_h, i_p, BLOCK_T, BLOCK_P):
    """y^T [BLOCK_P, BLOCK_T] of head i_h's token block i_t times its gate z * sigmoid(z)."""
    zt = ct.load(z, (i_b, i_t, i_h, i_p), shape=(1, BLOCK_T, 1, BLOCK_P),
                 padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)  # narrow z: widened, exact
    zt = ct.transpose(ct.reshape(zt, (BLOCK_T, BLOCK_P)))  # [BLOCK_P, BLOCK_T]
    return acc * gate(zt)


def gate(zt):
    """z * sigmoid(z) of a float32 tile, as z / (1 + 2^(-z log2 e)): for very negative z the
    denominator is inf and the gate is -0, its limit."""
    return zt / (1.0 + ct.exp2(-zt * LOG2E))
