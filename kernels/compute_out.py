"""compute_out: every chunk's output from the state entering it (carried-state term, causal
interaction, D skip and z gate fused): a program per token block, or, where that pays, a program
per chunk that carries the state through the chunk's token blocks.

The declared choices (CHOICES) are what the launcher may run: its rules pick one per shape
(rules_choice), kernels.tuning searches those the shape allows, benchmarks.sweep times them. The
measured reason of each rule: benchmarks/DECISIONS.md, under the titles named below.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import cuda.tile as ct

from contract import ACTIVATION_DTYPES, check_compute_out_args, dtype_name, weight_dtypes
from kernels import tuning_table
from kernels.arrays import LaunchDims, int32_indexed, launch_dims, needs_int64, pow2_tile
from kernels.launcher import run_alone
from kernels.tiles import MMA_MIN, checked_D, mma_operand, mma_product, report_D, z_gated

# Program layouts. "token_blocks" (_compute_out_kernel): a program per token block, looping over
# the chunk's earlier token blocks (flash-attention-like), so a chunk x chunk matrix never
# exists, not even in registers. "whole_chunks" (_compute_out_chunk_kernel): a program per
# chunk, its token blocks in order, each block's tokens seeing the earlier blocks through a
# state carried in registers (a jump of fwd_pass_state's kind per block), so x, B, C and the
# state are read once.
LAYOUTS = ("token_blocks", "whole_chunks")
HEADS = (1, 2)  # heads of one group per program: C B^T, which they share, is formed once
OCCUPANCIES = (1, 2)  # programs per SM (the compiler's occupancy hint)
# a token block's largest extent; the C and B tiles, [BLOCK_T, DSTATE], hold at most
# block_t x TILE_DSTATE elements (block_t shrinks as dstate grows past TILE_DSTATE)
BLOCK_TS = (64, 32, 128)
TILE_DSTATE = 128
MAX_BLOCK_P = 64  # headdim columns per program: Mamba-2's whole headdim


class Choice(NamedTuple):
    """One launch configuration of compute_out beyond its shapes."""
    layout: str  # LAYOUTS
    heads: int  # HEADS
    occupancy: int  # OCCUPANCIES
    block_t: int = BLOCK_TS[0]  # BLOCK_TS; the first is the rules' (RULES_BLOCK_T)


# the declared search space: every choice the launcher can take (the shape allows a subset,
# compute_out_choices); the program per chunk at the rules' token block only: tileiras 13.4 fails
# to compile it at 128 tokens with two heads and z for sm_90 (DECISIONS.md "compute_out: program
# layout")
CHOICES = tuple(Choice(layout, heads, occupancy, block_t) for layout in LAYOUTS
                for heads in HEADS for occupancy in OCCUPANCIES for block_t in BLOCK_TS
                if layout == "token_blocks" or block_t == BLOCK_TS[0])

# The rules' pick (rules_choice):
RULES_BLOCK_T = BLOCK_TS[0]  # DECISIONS.md "compute_out: token block"
# two heads for float32 inputs where a chunk holds several token blocks, one for narrow inputs
# (their C B^T runs at twice the TF32 rate) and for a chunk of one token block (the compiler
# fails several there); "compute_out: heads per program"
RULES_HEADS = 2
RULES_OCCUPANCY = 2  # "compute_out: occupancy"
# the program per chunk where its state tile fits and its grid fills the GPU: two heads, chunks
# of WHOLE_CHUNK_MIN_BLOCKS token blocks or more, a state tile of WHOLE_CHUNK_DSTATE, at least
# WHOLE_CHUNK_MIN_WAVES programs per SM (they run one per SM); "compute_out: program layout"
WHOLE_CHUNK_MIN_BLOCKS = 4
WHOLE_CHUNK_DSTATE = 128
WHOLE_CHUNK_MIN_WAVES = 2


def _compute_out_kernel(x: ct.IndexedWithInt64, B: ct.IndexedWithInt64, C: ct.IndexedWithInt64,
                        dt_out: ct.IndexedWithInt64, dA_cumsum: ct.IndexedWithInt64,
                        chunk_states: ct.IndexedWithInt64, D, z: ct.IndexedWithInt64,
                        seg: ct.IndexedWithInt64, y: ct.IndexedWithInt64, errors,
                        CHUNK: ct.Constant[int], BLOCK_T: ct.Constant[int],
                        BLOCK_P: ct.Constant[int], DSTATE: ct.Constant[int],
                        HEADS: ct.Constant[int], HAS_D: ct.Constant[bool],
                        D_PER_HEADDIM: ct.Constant[bool], HAS_Z: ct.Constant[bool],
                        CHECK_D: ct.Constant[bool],
                        HAS_SEQ_IDX: ct.Constant[bool]):
    """One program: y for BLOCK_T tokens x BLOCK_P headdim columns of HEADS heads of one group
    and batch; grid (token blocks x headdim blocks, nheads / HEADS, batch)."""
    i_tp = ct.bid(0)
    i_hb = ct.bid(1)  # head block: heads i_hb * HEADS ... i_hb * HEADS + HEADS - 1, one group
    i_b = ct.bid(2)
    p_blocks = ct.cdiv(x.shape[3], BLOCK_P)
    i_t = i_tp // p_blocks  # token block, in units of BLOCK_T tokens
    i_p = i_tp % p_blocks
    T_PER_CHUNK = CHUNK // BLOCK_T
    i_c = i_t // T_PER_CHUNK
    i_tc = i_t % T_PER_CHUNK  # the token block's position in its chunk
    i_g = i_hb * HEADS // (x.shape[2] // B.shape[2])  # the group the heads read
    # each head's skip weights (NaN where not finite), read once; reported after the loop
    # (report_D)
    skips = ()
    for i_k in ct.static_iter(range(HEADS)):
        if HAS_D:
            skips += (checked_D(D, i_hb * HEADS + i_k, i_p, BLOCK_P, D_PER_HEADDIM),)

    # Each head accumulates y^T, [BLOCK_P, BLOCK_T]: its products take the state, B_s or x
    # (transposed) as their first operand and C^T, or the computed (C B^T o L)^T, as second
    # (faster than y with x second: DECISIONS.md "compute_out: transposed accumulator"). The
    # heads' tiles are tuples unrolled at compile time, so every product stays two-dimensional.
    # x, B, C, z are float32, bfloat16 or float16 arrays. Products take TF32 operands for
    # float32 inputs, 16-bit ones for 16-bit inputs (mma_product: the inputs as they are, the
    # state and the decayed weights rounded to bfloat16, or to float16 scaled by powers of two
    # into its range), always with fp32 accumulators; C . B^T of 16-bit inputs is exact in
    # float32, at twice the TF32 rate. Every other use of a load widens it to float32 (exact).
    Ct = ct.load(C, (i_b, i_t, i_g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                 padding_mode=ct.PaddingMode.ZERO)
    CtT_in = ct.transpose(ct.reshape(Ct, (BLOCK_T, DSTATE)))  # [DSTATE, BLOCK_T], C's dtype
    CtT = mma_operand(CtT_in, C.dtype)
    CtT_cb = CtT if C.dtype == ct.float32 else CtT_in
    if HAS_SEQ_IDX:
        seg_t = ct.load(seg, (i_b, i_t), shape=(1, BLOCK_T), padding_mode=ct.PaddingMode.ZERO)
        # the carried state belongs to the segment of the token before the chunk (chunk 0: 0)
        seg_before = ct.load(seg, (i_b, ct.maximum(i_c * CHUNK - 1, 0)), shape=(1, 1))

    # carried-state term: 2^(a_t) * S_c . C_t^T
    a_ts = ()
    accs = ()
    for i_k in ct.static_iter(range(HEADS)):
        i_h = i_hb * HEADS + i_k
        a_t = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc), shape=(1, 1, 1, BLOCK_T)),
                         (1, BLOCK_T))
        # chunk_states' dtype: float32, or bfloat16 for bfloat16 inputs (then the operand as
        # it is)
        S = ct.load(chunk_states, (i_b, i_c, i_h, i_p, 0), shape=(1, 1, 1, BLOCK_P, DSTATE),
                    padding_mode=ct.PaddingMode.ZERO)
        # [BLOCK_P, BLOCK_T]
        acc = mma_product(ct.reshape(S, (BLOCK_P, DSTATE)), CtT,
                          ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.float32), x.dtype)
        # [1, BLOCK_T]; clamp: rounding must not make it > 1
        decay_in = ct.exp2(ct.minimum(a_t, 0.0))
        if HAS_SEQ_IDX:
            decay_in = ct.where(seg_t == seg_before, decay_in, 0.0)
        a_ts += (a_t,)
        accs += (acc * decay_in,)

    # intra-chunk term: sum over s-blocks i_sc <= i_tc of (dt_s x_s)^T (C_t . B_s^T o L)^T;
    # C_t . B_s^T is the group's, one product for the program's heads
    cols = ct.reshape(i_tc * BLOCK_T + ct.arange(BLOCK_T, dtype=ct.int32), (1, BLOCK_T))  # t
    for i_sc in range(i_tc + 1):
        i_s = i_c * T_PER_CHUNK + i_sc
        Bs = ct.load(B, (i_b, i_s, i_g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                     padding_mode=ct.PaddingMode.ZERO)
        Bs = ct.reshape(Bs, (BLOCK_T, DSTATE))
        if B.dtype == ct.float32:
            Bs = Bs.astype(ct.tfloat32)
        cbT = ct.mma(Bs, CtT_cb, ct.zeros((BLOCK_T, BLOCK_T), dtype=ct.float32))  # [s, t]
        rows = ct.reshape(i_sc * BLOCK_T + ct.arange(BLOCK_T, dtype=ct.int32), (BLOCK_T, 1))  # s
        keep = rows <= cols  # causal: s <= t
        if HAS_SEQ_IDX:
            seg_s = ct.load(seg, (i_b, i_s), shape=(1, BLOCK_T), padding_mode=ct.PaddingMode.ZERO)
            keep = keep & (ct.reshape(seg_s, (BLOCK_T, 1)) == seg_t)
        new_accs = ()
        for i_k in ct.static_iter(range(HEADS)):
            i_h = i_hb * HEADS + i_k
            a_s = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, i_sc), shape=(1, 1, 1, BLOCK_T)),
                             (BLOCK_T, 1))
            dt_s = ct.reshape(ct.load(dt_out, (i_b, i_h, i_c, i_sc), shape=(1, 1, 1, BLOCK_T)),
                              (BLOCK_T, 1))
            # L^T[s, t] = 2^(a_t - a_s): a select on a clamped exponent, so 2^(positive) is
            # never formed above the diagonal and no inf * 0 can appear
            LT = ct.where(keep, ct.exp2(ct.minimum(a_ts[i_k] - a_s, 0.0)), 0.0)  # [s, t]
            xs = ct.load(x, (i_b, i_s, i_h, i_p), shape=(1, BLOCK_T, 1, BLOCK_P),
                         padding_mode=ct.PaddingMode.ZERO)
            # [P, s]
            xsT = mma_operand(ct.transpose(ct.reshape(xs, (BLOCK_T, BLOCK_P))), x.dtype)
            W = cbT * LT * dt_s  # [s, t]
            new_accs += (mma_product(xsT, W, accs[i_k], x.dtype),)
        accs = new_accs

    for i_k in ct.static_iter(range(HEADS)):
        i_h = i_hb * HEADS + i_k
        acc = accs[i_k]
        if HAS_D:
            xt = ct.load(x, (i_b, i_t, i_h, i_p), shape=(1, BLOCK_T, 1, BLOCK_P),
                         padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
            acc = acc + skips[i_k] * ct.transpose(ct.reshape(xt, (BLOCK_T, BLOCK_P)))
        if HAS_Z:
            acc = z_gated(acc, z, i_b, i_t, i_h, i_p, BLOCK_T, BLOCK_P)
        # rows past seqlen and columns past headdim are masked by the store; y has x's dtype
        # (one rounding of the float32 result for narrow inputs)
        yt = ct.transpose(acc)  # [BLOCK_T, BLOCK_P]
        ct.store(y, (i_b, i_t, i_h, i_p), ct.reshape(yt, (1, BLOCK_T, 1, BLOCK_P)).astype(y.dtype))
        if HAS_D:
            report_D(errors, skips[i_k], CHECK_D)


def _compute_out_chunk_kernel(x: ct.IndexedWithInt64, B: ct.IndexedWithInt64,
                              C: ct.IndexedWithInt64, dt_out: ct.IndexedWithInt64,
                              dA_cumsum: ct.IndexedWithInt64, chunk_states: ct.IndexedWithInt64,
                              D, z: ct.IndexedWithInt64, y: ct.IndexedWithInt64, errors,
                              CHUNK: ct.Constant[int], BLOCK_T: ct.Constant[int],
                              BLOCK_P: ct.Constant[int], DSTATE: ct.Constant[int],
                              HEADS: ct.Constant[int], HAS_D: ct.Constant[bool],
                              D_PER_HEADDIM: ct.Constant[bool], HAS_Z: ct.Constant[bool],
                              CHECK_D: ct.Constant[bool]):
    """One program: y of one chunk, BLOCK_P headdim columns of HEADS heads of one group, token
    block by token block (float32, no seq_idx); grid (chunks x headdim blocks, nheads / HEADS,
    batch)."""
    i_cp = ct.bid(0)
    i_hb = ct.bid(1)  # head block: heads i_hb * HEADS ... i_hb * HEADS + HEADS - 1, one group
    i_b = ct.bid(2)
    seqlen = x.shape[1]
    p_blocks = ct.cdiv(x.shape[3], BLOCK_P)
    i_c = i_cp // p_blocks
    i_p = i_cp % p_blocks
    T_PER_CHUNK = CHUNK // BLOCK_T
    i_g = i_hb * HEADS // (x.shape[2] // B.shape[2])  # the group the heads read
    # token blocks that hold real tokens (a block wholly past seqlen is neither loaded nor stored)
    t_blocks = ct.minimum(T_PER_CHUNK, ct.cdiv(seqlen - i_c * CHUNK, BLOCK_T))

    # Each head carries its state S, [BLOCK_P, DSTATE], through the chunk: before token block
    # i_tc it is the state after the block's previous token (the chunk's entering state for the
    # first block), and a_before is dA_cumsum at that token (0 at the chunk's start). A block's
    # tokens see the earlier blocks through S alone, so x, B and C are read once per chunk: y_t =
    # 2^(a_t - a_before) S . C_t^T + the block's own causal term (C_t . B_s^T o L) (dt_s x_s).
    # y is accumulated transposed, y^T [BLOCK_P, BLOCK_T], so that x^T is a product's first
    # operand (DECISIONS.md "compute_out: transposed accumulator"). The heads' tiles are tuples
    # unrolled at compile time, so every product stays two-dimensional.
    states = ()
    a_befores = ()
    for i_k in ct.static_iter(range(HEADS)):
        S = ct.load(chunk_states, (i_b, i_c, i_hb * HEADS + i_k, i_p, 0),
                    shape=(1, 1, 1, BLOCK_P, DSTATE), padding_mode=ct.PaddingMode.ZERO)
        states += (ct.reshape(S, (BLOCK_P, DSTATE)),)
        a_befores += (ct.zeros((1, 1), dtype=ct.float32),)  # [1, 1]
    skips = ()  # each head's skip weights (NaN where not finite), read once per program
    for i_k in ct.static_iter(range(HEADS)):
        if HAS_D:
            skips += (checked_D(D, i_hb * HEADS + i_k, i_p, BLOCK_P, D_PER_HEADDIM),)
    rows = ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (BLOCK_T, 1))  # s
    cols = ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (1, BLOCK_T))  # t
    causal = rows <= cols  # causal: s <= t

    for i_tc in range(t_blocks):
        i_t = i_c * T_PER_CHUNK + i_tc
        Ct = ct.load(C, (i_b, i_t, i_g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                     padding_mode=ct.PaddingMode.ZERO)
        CtT = ct.transpose(ct.reshape(Ct, (BLOCK_T, DSTATE))).astype(ct.tfloat32)  # [n, t]
        Bt = ct.reshape(ct.load(B, (i_b, i_t, i_g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                                padding_mode=ct.PaddingMode.ZERO), (BLOCK_T, DSTATE))  # [s, n]
        Bt_tf32 = Bt.astype(ct.tfloat32)
        cbT = ct.mma(Bt_tf32, CtT, ct.zeros((BLOCK_T, BLOCK_T), dtype=ct.float32))  # [s, t]
        new_states = ()
        new_a_befores = ()
        for i_k in ct.static_iter(range(HEADS)):
            i_h = i_hb * HEADS + i_k
            a_t = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc), shape=(1, 1, 1, BLOCK_T)),
                             (1, BLOCK_T))  # [1, t]
            a_s = ct.reshape(a_t, (BLOCK_T, 1))  # [s, 1]
            dt_s = ct.reshape(ct.load(dt_out, (i_b, i_h, i_c, i_tc), shape=(1, 1, 1, BLOCK_T)),
                              (BLOCK_T, 1))  # [s, 1]
            # the state's term, [BLOCK_P, BLOCK_T]: 2^(a_t - a_before) S . C_t^T; clamp:
            # rounding must not make the decay > 1
            acc = ct.mma(states[i_k].astype(ct.tfloat32), CtT,
                         ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.float32))
            acc = acc * ct.exp2(ct.minimum(a_t - a_befores[i_k], 0.0))
            # the block's own term: (dt_s x_s)^T (C_t . B_s^T o L)^T. L^T[s, t] = 2^(a_t - a_s):
            # a select on a clamped exponent, so 2^(positive) is never formed above the diagonal
            # and no inf * 0 can appear
            LT = ct.where(causal, ct.exp2(ct.minimum(a_t - a_s, 0.0)), 0.0)  # [s, t]
            xs = ct.load(x, (i_b, i_t, i_h, i_p), shape=(1, BLOCK_T, 1, BLOCK_P),
                         padding_mode=ct.PaddingMode.ZERO)
            xs = ct.reshape(xs, (BLOCK_T, BLOCK_P))
            xsT = ct.transpose(xs)  # [BLOCK_P, s]
            W = (cbT * LT * dt_s).astype(ct.tfloat32)  # [s, t]
            acc = ct.mma(xsT.astype(ct.tfloat32), W, acc)
            if HAS_D:  # the block's x is x_t: the skip term reads no more
                acc = acc + skips[i_k] * xsT
            if HAS_Z:
                acc = z_gated(acc, z, i_b, i_t, i_h, i_p, BLOCK_T, BLOCK_P)
            # rows past seqlen and columns past headdim are masked by the store
            ct.store(y, (i_b, i_t, i_h, i_p),
                     ct.reshape(ct.transpose(acc), (1, BLOCK_T, 1, BLOCK_P)))
            if T_PER_CHUNK > 1:  # a chunk of one token block needs no state after it
                # the state after the block, [BLOCK_P, DSTATE]: S 2^(a_last - a_before) +
                # (w o x)^T B, w_s = dt_s 2^(a_last - a_s) (a_last: dA_cumsum at the block's last
                # token, flat over a short chunk's padding)
                a_last = ct.reshape(
                    ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc * BLOCK_T + BLOCK_T - 1),
                            shape=(1, 1, 1, 1)), (1, 1))  # [1, 1]
                carry = ct.exp2(ct.minimum(a_last - a_befores[i_k], 0.0))
                w = dt_s * ct.exp2(ct.minimum(a_last - a_s, 0.0))  # [s, 1], scales x's rows
                new_states += (ct.mma(ct.transpose(xs * w).astype(ct.tfloat32), Bt_tf32,
                                      states[i_k] * carry),)
                new_a_befores += (a_last,)
        if T_PER_CHUNK > 1:
            states = new_states
            a_befores = new_a_befores
    for i_k in ct.static_iter(range(HEADS)):
        if HAS_D:
            report_D(errors, skips[i_k], CHECK_D)


# The kernel objects: int32 or int64 indices (kernels.arrays.needs_int64; DECISIONS.md "Index
# width"). The program per chunk exists for float32 inputs, int32 indices and no seq_idx only:
# tileiras 13.4 crashed (SIGFPE) compiling its int64 object with every option on, and, with
# seq_idx, failed its loop schedule for sm_80 or crashed for sm_90.
_compute_out = ct.kernel(int32_indexed(_compute_out_kernel), occupancy=RULES_OCCUPANCY)
_compute_out_int64 = ct.kernel(_compute_out_kernel, occupancy=RULES_OCCUPANCY)
_compute_out_chunk = ct.kernel(int32_indexed(_compute_out_chunk_kernel),
                               occupancy=RULES_OCCUPANCY)
# by (layout, int64 indices, occupancy hint), each made once here (an object made per call
# would be dispatched anew)
_KERNELS = {(lay, int64, RULES_OCCUPANCY): k for lay, int64, k in (
    ("token_blocks", False, _compute_out), ("token_blocks", True, _compute_out_int64),
    ("whole_chunks", False, _compute_out_chunk))}
_KERNELS.update({(lay, int64, occ): k.replace_hints(occupancy=occ)
                 for (lay, int64, _), k in list(_KERNELS.items())
                 for occ in OCCUPANCIES if occ != RULES_OCCUPANCY})
KERNEL_OBJECTS = tuple(_KERNELS.values())  # every compute_out launch runs one of these


def heads_per_program(heads_per_group: int, max_heads: int) -> int:
    """The most heads of one group a program can take: a power of two (a tile extent) that
    divides the group's heads, at most max_heads."""
    heads = 1
    while heads * 2 <= max_heads and heads_per_group % (heads * 2) == 0:
        heads *= 2
    return heads


def layout(chunk_size: int, block_t: int, dstate_tile: int, heads: int, programs: int,
           sm_count) -> str:
    """The program layout the rules take where both can run (see WHOLE_CHUNK_*); `programs`:
    the grid of a program per chunk."""
    pays = (heads > 1 and chunk_size >= WHOLE_CHUNK_MIN_BLOCKS * block_t
            and dstate_tile == WHOLE_CHUNK_DSTATE and programs >= WHOLE_CHUNK_MIN_WAVES * sm_count)
    return "whole_chunks" if pays else "token_blocks"


def _tiles(x, B, dt_out, block_t: int) -> tuple[int, int, int, int]:
    """(chunk_size, BLOCK_T, BLOCK_P, DSTATE tile) of a launch whose choice has `block_t`."""
    return _tile_sizes(int(x.shape[3]), int(B.shape[3]), int(dt_out.shape[3]), block_t)


@functools.cache
def _tile_sizes(headdim: int, dstate: int, chunk_size: int, block_t: int):
    dstate_tile = pow2_tile(dstate, lo=MMA_MIN)
    block_t = max(MMA_MIN, min(chunk_size, block_t, block_t * TILE_DSTATE // dstate_tile))
    return chunk_size, block_t, pow2_tile(headdim, lo=MMA_MIN, hi=MAX_BLOCK_P), dstate_tile


def _arrays(x, B, C, dt_out, dA_cumsum, chunk_states, D, z):
    """The kernels' array arguments (x stands in for D and z when they are absent)."""
    return (x, B, C, dt_out, dA_cumsum, chunk_states, x if D is None else D,
            x if z is None else z)


def _whole_chunks_run(dims: LaunchDims) -> bool:
    """The program per chunk exists for float32 inputs, int32 indices and no seq_idx only."""
    return dims.dtype == "float32" and not dims.segments and not dims.int64


def _int64(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y) -> bool:
    """The launch's index width (kernels.arrays.needs_int64 of every array it passes)."""
    return needs_int64(*_arrays(x, B, C, dt_out, dA_cumsum, chunk_states, D, z), y, seg)


def compute_out_signature(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y) -> tuple:
    """What a launch's choice may depend on: the inputs' and the chunk states' dtypes, the
    dimensions, the options and the index width (the key of a tuned choice,
    kernels.tuning_table)."""
    return _signature(x, B, dt_out, chunk_states, D, z, seg,
                      _int64(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y))


def _signature(x, B, dt_out, chunk_states, D, z, seg, int64: bool) -> tuple:
    batch, seqlen, nheads, headdim = (int(s) for s in x.shape)
    return (dtype_name(x), dtype_name(chunk_states), batch, seqlen, nheads, headdim,
            int(B.shape[2]), int(B.shape[3]), int(dt_out.shape[3]), D is not None,
            D is not None and len(D.shape) == 2, z is not None, seg is not None, int64)


def compute_out_choices(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y) -> list[Choice]:
    """The CHOICES a launch of these arrays can run (what kernels.tuning searches), each distinct
    launch once: the program per chunk where it exists (float32, int32 indices, no seq_idx) with
    a state tile of at most WHOLE_CHUNK_DSTATE; heads that divide a group's, one where a chunk
    is a single token block; a token block that clamps to the same extent as an earlier one of
    BLOCK_TS is left out."""
    return _choices(x, B, dt_out, seg,
                    _int64(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y))


def _choices(x, B, dt_out, seg, int64: bool) -> list[Choice]:
    return list(_choices_of(int(x.shape[2]) // int(B.shape[2]), int(x.shape[3]),
                            int(B.shape[3]), int(dt_out.shape[3]),
                            _whole_chunks_run(launch_dims(x, B, dt_out, seg=seg, int64=int64))))


@functools.cache
def _choices_of(per_group: int, headdim: int, dstate: int, chunk: int,
                whole_chunks: bool) -> tuple[Choice, ...]:
    found, launches = [], set()
    for choice in CHOICES:
        chunk_size, block_t, _, dstate_tile = _tile_sizes(headdim, dstate, chunk, choice.block_t)
        if choice.layout == "whole_chunks" and not (whole_chunks
                                                    and dstate_tile <= WHOLE_CHUNK_DSTATE):
            continue
        max_heads = heads_per_program(per_group, max(HEADS) if chunk_size > block_t else 1)
        if choice.heads > max_heads or max_heads % choice.heads:
            continue
        launch = (choice.layout, choice.heads, choice.occupancy, block_t)
        if launch not in launches:
            launches.add(launch)
            found.append(choice)
    return tuple(found)


def rules_choice(dims: LaunchDims, sm_count) -> Choice:
    """The choice of the launcher's rules (RULES_*, layout()) on a device of `sm_count` SMs."""
    d = dims.dims
    chunk_size, block_t, block_p, dstate_tile = _tile_sizes(d.headdim, d.dstate, d.chunk_size,
                                                            RULES_BLOCK_T)
    max_heads = RULES_HEADS if chunk_size > block_t and dims.dtype == "float32" else 1
    heads = heads_per_program(d.nheads // d.ngroups, max_heads)
    chunk_programs = (-(-d.seqlen // chunk_size) * -(-d.headdim // block_p) * (d.nheads // heads)
                      * d.batch)
    runs = (_whole_chunks_run(dims)
            and layout(chunk_size, block_t, dstate_tile, heads, chunk_programs,
                       sm_count) == "whole_chunks")
    return Choice("whole_chunks" if runs else "token_blocks", heads, RULES_OCCUPANCY,
                  RULES_BLOCK_T)


def compute_out_launch(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seg, y, sm_count,
                       tuned=None, choice: Choice | None = None, *, errors=None,
                       check_D: bool = True):
    """(kernel, grid, kernel args) of compute_out: the one place its program layout, its tiles,
    its heads per program and its kernel object (index width, occupancy hint) are chosen.

    Reads only shapes and x's dtype, so the compile gate derives its signatures from here too
    (the rules' choices; a tuned choice compiles where it is searched). `seg` is the (batch,
    seqlen) int32 segment ids, or None; `sm_count`: the device's SMs. The choice is `choice`
    where given, else the device's tuned choice for this signature where `tuned` (a mapping,
    kernels.tuning_table.table) has one, else the rules' (rules_choice); a given or tuned choice
    must be one of compute_out_choices. `errors`: the call's error word (kernels.errors), a (1,)
    int32 array; None only in a launch that is planned, never run. `check_D`: whether a D that
    is not finite is reported here (its y is NaN either way); ssd_forward checks D in
    chunk_cumsum instead, where the error word's atomic costs no time.
    """
    batch, seqlen, nheads, headdim = (int(s) for s in x.shape)
    options = (D is not None, D is not None and len(D.shape) == 2, z is not None,
               D is not None and check_D)
    arrays = _arrays(x, B, C, dt_out, dA_cumsum, chunk_states, D, z)
    int64 = needs_int64(*arrays, y, seg)
    given = choice is not None
    if not given and tuned:
        entry = tuned.get(_signature(x, B, dt_out, chunk_states, D, z, seg, int64))
        choice = None if entry is None else Choice(*entry)
    if choice is not None and choice not in _choices(x, B, dt_out, seg, int64):
        raise ValueError(f"{'choice' if given else 'tuned choice'}: {choice} is not one that "
                         f"compute_out can run on this shape ({compute_out_choices.__name__}); "
                         f"a tuning file of another version? (kernels.tuning_table)")
    if choice is None:
        choice = rules_choice(launch_dims(x, B, dt_out, seg=seg, int64=int64), sm_count)
    chunk_size, block_t, block_p, dstate_tile = _tiles(x, B, dt_out, choice.block_t)
    kernel = _KERNELS[choice.layout, int64, choice.occupancy]
    tiles = (chunk_size, block_t, block_p, dstate_tile, choice.heads)
    if choice.layout == "whole_chunks":
        args, tokens = (*arrays, y, errors, *tiles, *options), chunk_size
    else:
        args = (*arrays, dt_out if seg is None else seg, y, errors, *tiles, *options,
                seg is not None)
        tokens = block_t
    grid = (-(-seqlen // tokens) * -(-headdim // block_p), nheads // choice.heads, batch)
    return kernel, grid, args


def compute_out(x, B, C, dt_out, dA_cumsum, chunk_states, D=None, z=None, seq_idx=None, *,
                check_values=None, choice: Choice | None = None):
    """y, (batch, seqlen, nheads, headdim) in x's dtype, of the caller's array type:
    carried-state term + (C B^T o L)(dt x) + D x, then the z gate. x, B, C, z: float32, bfloat16
    or float16, all alike; chunk_states float32, or bfloat16 for bfloat16 inputs (read as it
    is); the rest float32. `check_values`: as in ssd_forward (a channel with a D that is not
    finite gets NaN).
    `choice`: the Choice to launch (one of compute_out_choices for these arrays, else a
    ValueError before any launch) instead of the device's tuned one or the rules'."""
    a = run_alone(
        "compute_out", dict(x=x, B=B, C=C, dt_out=dt_out, dA_cumsum=dA_cumsum,
                            chunk_states=chunk_states, D=D, z=z, seq_idx=seq_idx),
        check=lambda x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seq_idx:
            check_compute_out_args(x, B, C, dt_out, dA_cumsum, chunk_states, D=D, z=z,
                                   seq_idx=seq_idx, float_dtypes=weight_dtypes(x),
                                   activation_dtypes=ACTIVATION_DTYPES, check_values=False),
        outputs=lambda dims: {"y": (dims.shape("y"), "x")},
        launches=lambda a, backend, errors: [compute_out_launch(
            a["x"], a["B"], a["C"], a["dt_out"], a["dA_cumsum"], a["chunk_states"], a["D"],
            a["z"], a["seg"], a["y"], backend.sm_count, tuning_table.table(backend), choice,
            errors=errors)],
        check_values=check_values, values=("D",))
    return a["y"]
