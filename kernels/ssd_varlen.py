"""ssd_varlen: y and each sequence's final state of a packed row (cu_seqlens), a program per
(sequence, head, headdim block) carrying its state through its own sequence's tokens in
registers, from the sequence's initial state: the sequences go in parallel, none reads another's
tokens, and no chunk state goes through memory.

A sequence starts anywhere in the row, so its token blocks are gathered (ct.gather) from its
first token on, not loaded as tiles of the row's grid, and y is scattered back under the mask
of the sequence's tokens; each block's decay cumsum is taken here, from dt_out and A, so that
no decay crosses a sequence's start.

Good offsets cover every token once, so y needs no fill before the kernel. chunk_cumsum, launched
before it, checks every offset (ERROR_CU_SEQLENS in the call's error word where they do not start
at 0, decrease or do not end at seqlen); where the word holds it, no program steps through its
sequence (bad offsets may overlap: two programs would store to the same tokens) and the second
kernel, _ssd_varlen_refused_kernel, writes NaN to all of y and every state; it writes nothing
at all when the word shows no refusal.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import cuda.tile as ct

from kernels.arrays import LaunchDims, int32_indexed, launch_dims, needs_int64, pow2_tile
from kernels.constants import ERROR_CU_SEQLENS, LOG2E
from kernels.tiles import MMA_MIN, checked_D, gate, mma_operand, mma_product

# tokens per step, at most the chunk: each block's decay cumsum then adds no more terms than
# chunk_cumsum's, which the bound's cumsum term counts (properties.bounds.cumsum_gamma)
BLOCK_T = 64
# programs per SM, by x's dtype: a sequence's steps are latency-bound, more programs hide it;
# bfloat16's smaller tiles fit three, float32's run slower at three (DECISIONS.md "ssd_varlen:
# a program per sequence")
OCCUPANCIES = {"bfloat16": 3}
OCCUPANCY_OTHERS = 2
REFUSED_BLOCK_T = 64  # token rows per NaN tile of _ssd_varlen_refused_kernel


class Choice(NamedTuple):
    """One launch configuration of ssd_varlen beyond its shapes."""
    occupancy: int  # programs per SM (the kernel object's hint)


# the declared search space: the occupancy hints of its kernel objects
CHOICES = (Choice(OCCUPANCY_OTHERS), Choice(OCCUPANCIES["bfloat16"]))


def _ssd_varlen_kernel(x: ct.IndexedWithInt64, B: ct.IndexedWithInt64, C: ct.IndexedWithInt64,
                       dt_out: ct.IndexedWithInt64, A, cu_seqlens,
                       initial_states: ct.IndexedWithInt64, D, z: ct.IndexedWithInt64,
                       y: ct.IndexedWithInt64, varlen_states: ct.IndexedWithInt64, errors,
                       CHUNK: ct.Constant[int], BLOCK_T: ct.Constant[int],
                       BLOCK_P: ct.Constant[int], DSTATE: ct.Constant[int],
                       HAS_D: ct.Constant[bool], D_PER_HEADDIM: ct.Constant[bool],
                       HAS_Z: ct.Constant[bool], HAS_INITIAL_STATES: ct.Constant[bool]):
    """One program: y and the final state of sequence bid(2), head bid(1), headdim block bid(0),
    token block by token block from the sequence's first token."""
    i_p = ct.bid(0)
    i_h = ct.bid(1)
    i_s = ct.bid(2)
    i_g = i_h // (x.shape[2] // B.shape[2])  # the group the head reads
    start = ct.gather(cu_seqlens, i_s)  # the sequence's tokens: start ... end - 1
    end = ct.gather(cu_seqlens, i_s + 1)
    # offsets chunk_cumsum refused (any of them, not only this sequence's): no step
    # (_ssd_varlen_refused_kernel then NaNs all of y and every state)
    bad = (ct.gather(errors, 0) & ERROR_CU_SEQLENS) != 0
    if HAS_INITIAL_STATES:
        S = ct.load(initial_states, (i_s, i_h, i_p, 0), shape=(1, 1, BLOCK_P, DSTATE),
                    padding_mode=ct.PaddingMode.ZERO)
        S = ct.reshape(S, (BLOCK_P, DSTATE)).astype(ct.float32)  # [BLOCK_P, DSTATE], widened
    else:
        S = ct.zeros((BLOCK_P, DSTATE), dtype=ct.float32)
    if HAS_D:  # a D that is not finite makes its y NaN; chunk_cumsum reports it
        skip = checked_D(D, i_h, i_p, BLOCK_P, D_PER_HEADDIM)
    a_h = ct.reshape(ct.load(A, (i_h,), shape=(1,)), (1, 1)).astype(ct.float32) * LOG2E  # log2
    p_col = ct.reshape(i_p * BLOCK_P + ct.arange(BLOCK_P, dtype=ct.int32), (1, BLOCK_P))
    n_col = ct.reshape(ct.arange(DSTATE, dtype=ct.int32), (1, DSTATE))
    rows = ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (BLOCK_T, 1))  # s
    causal = rows <= ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (1, BLOCK_T))  # s <= t

    # S: the state after the token before the block (the initial state before the first). A
    # block's tokens see the earlier ones through S alone, as in ssd_scan: with a_t the block's
    # own cumsum of dt A up to t (so 2^a_t is the decay from the state before the block),
    # y_t = 2^a_t S . C_t + (C_t . B_s o L)(dt_s x_s), L[t, s] = 2^(a_t - a_s) for s <= t;
    # then S <- 2^a_last S + (w o x)^T B, w_s = dt_s 2^(a_last - a_s). y is accumulated
    # transposed, y^T [BLOCK_P, BLOCK_T] (x^T the product's first operand, as in ssd_scan).
    # a refused sequence runs no step (garbage offsets would make the loop as long as they say)
    for i_t in range(ct.cdiv(ct.where(bad, 0, end - start), BLOCK_T)):
        t = start + i_t * BLOCK_T + rows  # [BLOCK_T, 1]: the block's tokens
        inside = t < end  # padding past the sequence's end: zero x, B, C and dt
        xs = ct.gather(x, (0, t, i_h, p_col), mask=inside)  # [s, P], x's dtype
        Bt = mma_operand(ct.gather(B, (0, t, i_g, n_col), mask=inside), B.dtype)  # [s, n]
        Ct = ct.gather(C, (0, t, i_g, n_col), mask=inside)
        CtT = mma_operand(ct.transpose(Ct), C.dtype)  # [n, t]
        dt_s = ct.gather(dt_out, (0, i_h, t // CHUNK, t % CHUNK), mask=inside)  # [s, 1]
        # the decay from the state before the block through each token, in fp32 (<= 0: dt >= 0,
        # A < 0); the running minimum keeps it non-increasing wherever the GPU's scan groups the
        # additions unevenly (as chunk_cumsum), so a_last is its last entry and its minimum
        a_s = ct.scan(ct.cumsum(dt_s * a_h, axis=0), 0, ct.minimum, math.inf)  # [s, 1]
        a_t = ct.reshape(a_s, (1, BLOCK_T))  # [1, t]
        a_last = ct.reshape(ct.min(a_s), (1, 1))
        cbT = ct.mma(Bt, CtT, ct.zeros((BLOCK_T, BLOCK_T), dtype=ct.float32))  # [s, t]
        # the state's term, [BLOCK_P, BLOCK_T]: 2^a_t S . C_t^T (a_t <= 0: no clamp needed)
        acc = mma_product(S, CtT, ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.float32), x.dtype)
        acc = acc * ct.exp2(a_t)
        # the block's own term: a select on a clamped exponent, so 2^(positive) is never formed
        # above the diagonal and no inf * 0 can appear
        LT = ct.where(causal, ct.exp2(ct.minimum(a_t - a_s, 0.0)), 0.0)  # [s, t]
        acc = mma_product(mma_operand(ct.transpose(xs), x.dtype), cbT * LT * dt_s, acc, x.dtype)
        if HAS_D:
            acc = acc + skip * ct.transpose(xs.astype(ct.float32))
        if HAS_Z:
            zt = ct.gather(z, (0, t, i_h, p_col), mask=inside).astype(ct.float32)  # [s, P]
            acc = acc * gate(ct.transpose(zt))  # [P, t]
        # y[token, head, channel] <- y^T[channel, token] where the token is the sequence's
        # (columns past headdim are out of bounds: not stored); y has x's dtype
        ct.scatter(y, (0, ct.transpose(t), i_h, ct.transpose(p_col)), acc.astype(y.dtype),
                   mask=ct.transpose(inside))
        w = dt_s * ct.exp2(ct.minimum(a_last - a_s, 0.0))  # [s, 1], scales x's rows
        xw = ct.transpose(xs.astype(ct.float32) * w)  # [P, s]
        S = mma_product(xw, Bt, S * ct.exp2(a_last), x.dtype)

    ct.store(varlen_states, (i_s, i_h, i_p, 0), ct.reshape(S, (1, 1, BLOCK_P, DSTATE)))


def _ssd_varlen_refused_kernel(y: ct.IndexedWithInt64, varlen_states: ct.IndexedWithInt64,
                               errors, BLOCK_T: ct.Constant[int], BLOCK_P: ct.Constant[int],
                               DSTATE: ct.Constant[int]):
    """A program per head, after _ssd_varlen_kernel: NaN to all of head bid(0)'s y and states
    where chunk_cumsum refused the call's cu_seqlens (which tokens no sequence covers is not
    known here); where the offsets are good it loads the error word and stores nothing."""
    i_h = ct.bid(0)
    refused = (ct.gather(errors, 0) & ERROR_CU_SEQLENS) != 0
    p_blocks = ct.cdiv(y.shape[3], BLOCK_P)
    y_nan = ct.full((1, BLOCK_T, 1, BLOCK_P), math.nan, dtype=y.dtype)
    for i in range(ct.where(refused, ct.cdiv(y.shape[1], BLOCK_T) * p_blocks, 0)):
        ct.store(y, (0, i // p_blocks, i_h, i % p_blocks), y_nan)
    state_nan = ct.full((1, 1, BLOCK_P, DSTATE), math.nan, dtype=ct.float32)
    for i in range(ct.where(refused, varlen_states.shape[0] * p_blocks, 0)):
        ct.store(varlen_states, (i // p_blocks, i_h, i % p_blocks, 0), state_nan)


# The kernel objects, int32 indices only (ssd_varlen runs where every array has fewer than 2^31
# elements: kernels.arrays.int32_indexed of the function): by occupancy hint, then the refusal's
_ssd_varlen = ct.kernel(int32_indexed(_ssd_varlen_kernel), occupancy=OCCUPANCY_OTHERS)
_ssd_varlen_three_per_sm = _ssd_varlen.replace_hints(occupancy=OCCUPANCIES["bfloat16"])
_KERNELS = {OCCUPANCY_OTHERS: _ssd_varlen, OCCUPANCIES["bfloat16"]: _ssd_varlen_three_per_sm}
_ssd_varlen_refused = ct.kernel(int32_indexed(_ssd_varlen_refused_kernel))


def _tiles(headdim: int, dstate: int, chunk_size: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_P, DSTATE tile): a headdim block of at most 64 channels (a state tile
    of [64, 128] fp32 is the largest the scan keeps in registers)."""
    return (min(chunk_size, BLOCK_T), pow2_tile(headdim, lo=MMA_MIN, hi=64),
            pow2_tile(dstate, lo=MMA_MIN))


def rules_choice(dims: LaunchDims, sm_count) -> Choice:
    """The rules' Choice (OCCUPANCIES by the activations' dtype), whatever the device."""
    return Choice(OCCUPANCIES.get(dims.dtype, OCCUPANCY_OTHERS))


def ssd_varlen_launches(x, B, C, dt_out, A, cu_seqlens, initial_states, D, z, y, varlen_states,
                        *, errors=None) -> list[tuple]:
    """[(kernel, grid, kernel args)] of ssd_varlen, then of its refusal's NaN (y need not be
    filled before them): the one place their tiles and hints are chosen. Reads only shapes and
    dtypes. `cu_seqlens`: int32 offsets; `errors`: the call's error word (None only in a launch
    that is planned, never run)."""
    _, _, nheads, headdim = (int(s) for s in x.shape)
    num_seqs = int(cu_seqlens.shape[0]) - 1
    block_t, block_p, dstate_tile = _tiles(headdim, int(B.shape[3]), int(dt_out.shape[3]))
    args = (x, B, C, dt_out, A, cu_seqlens, x if initial_states is None else initial_states,
            x if D is None else D, x if z is None else z, y, varlen_states, errors,
            int(dt_out.shape[3]), block_t, block_p, dstate_tile, D is not None,
            D is not None and len(D.shape) == 2, z is not None, initial_states is not None)
    if needs_int64(*args):
        raise ValueError("cu_seqlens: a packed row with an array of 2^31 elements or more is "
                         "not supported (int32 indices only)")
    kernel = _KERNELS[rules_choice(launch_dims(x, B, dt_out), sm_count=None).occupancy]
    refused = (y, varlen_states, errors, REFUSED_BLOCK_T, block_p, dstate_tile)
    return [(kernel, (-(-headdim // block_p), nheads, num_seqs), args),
            (_ssd_varlen_refused, (nheads,), refused)]
