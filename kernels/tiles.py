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
    """A tile as a ct.mma operand, for kernels whose inputs have `dtype`: bfloat16 for bfloat16
    inputs (their values as they are, computed values rounded to nearest), else TF32 (float32
    and float16 inputs, rounded to nearest; float16 values are TF32 values). A tile that
    already is a TF32 operand stays as it is.

    float16 inputs do not take float16 operands: a computed value past float16's range (65504)
    would round to inf where float32 holds it, and a guard that sends such a product to TF32
    operands costs more than it saves (benchmarks/DECISIONS.md "float16 products")."""
    if dtype == ct.bfloat16:
        return t.astype(dtype)
    if t.dtype == ct.tfloat32:
        return t
    return t.astype(ct.float32).astype(ct.tfloat32)


def mma_product(a, b, acc, dtype):
    """acc + a @ b on the fp32 accumulator acc, in a kernel whose inputs have `dtype`: each of a
    and b is an input's tile (as mma_operand made it) or a tile the kernel computed in float32,
    rounded here, both as mma_operand says."""
    return ct.mma(mma_operand(a, dtype), mma_operand(b, dtype), acc)


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
