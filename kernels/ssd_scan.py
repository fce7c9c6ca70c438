"""ssd_scan: y and the final state from dt_out and dA_cumsum in one pass, a program per (batch,
head, headdim block) carrying its state through every token block of the sequence in registers:
x, B and C are read once and no chunk state goes through memory (fwd_pass_state and compute_out
in one kernel). It pays where those programs fill the GPU; elsewhere ssd_forward runs the two
kernels, whose chunks go in parallel.

The declared choices (CHOICES) are what the launcher may run: its rules pick one (rules_choice),
benchmarks.sweep times the others. The measured reason of each rule: benchmarks/DECISIONS.md,
under the titles named below.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import cuda.tile as ct

from contract import ACTIVATION_DTYPES, check_ssd_scan_args, dtype_name, weight_dtypes
from kernels.arrays import LaunchDims, int32_indexed, launch_dims, needs_int64, pow2_tile
from kernels.launcher import run_alone
from kernels.constants import FLOAT16_RANGE
from kernels.tiles import MMA_MIN, checked_D, mma_operand, or_error, report_D, z_gated

HEADS = (1, 2)  # heads of one group per program: C B^T, which they share, is formed once
OCCUPANCIES = (2, 1)  # programs per SM (the compiler's occupancy hint)
BLOCK_PS = (64, 32)  # headdim columns per program
WORKER_WARPS = (None, 8)  # the compiler's num_worker_warps hint; None: its own count
# segments of each sequence in parallel programs (the segmented kernel, SEGMENTED); 0: the
# kernel without segments, one program through the whole sequence
SEGMENTS = (0, 1, 4)


class Choice(NamedTuple):
    """One launch configuration of ssd_scan beyond its shapes."""
    heads: int  # HEADS
    occupancy: int  # OCCUPANCIES
    block_p: int  # BLOCK_PS
    warps: int | None  # WORKER_WARPS
    segments: int = 0  # SEGMENTS


# two heads per program with eight worker warps only: at the compiler's own count, with the
# options on (seq_idx, z, initial_states, D), tileiras 13.4 fails to compile them (SIGFPE, or
# "Invalid use-def chain in LoopSchedule") for sm_90. The segmented kernel: one head and the
# whole headdim block per program, at the compiler's warp count
CHOICES = tuple(Choice(h, o, p, w) for h in HEADS for o in OCCUPANCIES for p in BLOCK_PS
                for w in WORKER_WARPS if h == 1 or w is not None) + tuple(
    Choice(1, o, 64, None, s) for o in OCCUPANCIES for s in SEGMENTS if s)

# The rules' pick (rules_choice): one head and Mamba-2's whole headdim per program; two programs
# per SM (RULES_CHOICE), but where the grid has at most one program per SM, for the dtypes of
# FEW_PROGRAMS_DTYPES, one program per SM of eight worker warps (FEW_PROGRAMS_CHOICE), whose
# token-block step is shorter (measured for 16-bit inputs; float32's state tile spills with
# eight). The segmented kernel in one segment is faster there still, but tileiras 13.4 crashes
# compiling it now and then (SIGSEGV): not ruled; DECISIONS.md "ssd_scan: program"
RULES_CHOICE = Choice(1, 2, 64, None)
FEW_PROGRAMS_CHOICE = Choice(1, 1, 64, 8)
FEW_PROGRAMS_DTYPES = ("bfloat16", "float16")
# a token block's last dA_cumsum is the minimum of its tile (a reduction, no load) in programs
# of these worker warps (the compiler's count) on these inputs, loaded in the others (eight
# warps, or float32 operands: there the reduction slows the step); DECISIONS.md "ssd_scan:
# program"
LAST_BY_MIN_WARPS = (None,)
LAST_BY_MIN_DTYPES = ("bfloat16", "float16")
BLOCK_T = 64  # tokens per step (a shorter chunk is one step)
# the scan runs (ssd_forward) where its grid has SCAN_MIN_WAVES programs per SM or more (each
# runs through the whole sequence: a smaller grid leaves SMs idle, where fwd_pass_state takes
# the chunks in parallel), by the inputs' dtype (16-bit products: 0.4 of a wave pays; float32:
# 0.7), and the state tile, [BLOCK_P, DSTATE tile], has a dstate tile of at most
# SCAN_MAX_DSTATE (measured there only); DECISIONS.md "ssd_forward: one pass or two kernels"
SCAN_MIN_WAVES = {"bfloat16": 0.4, "float16": 0.4}
SCAN_MIN_WAVES_OTHERS = 0.7
SCAN_MAX_DSTATE = 128


def _ssd_scan_kernel(x: ct.IndexedWithInt64, B: ct.IndexedWithInt64, C: ct.IndexedWithInt64,
                     dt_out: ct.IndexedWithInt64, dA_cumsum: ct.IndexedWithInt64,
                     initial_states: ct.IndexedWithInt64, D, z: ct.IndexedWithInt64,
                     seg: ct.IndexedWithInt64, y: ct.IndexedWithInt64,
                     final_states: ct.IndexedWithInt64, passed: ct.IndexedWithInt64,
                     ready: ct.IndexedWithInt64, errors,
                     CHUNK: ct.Constant[int], BLOCK_T: ct.Constant[int],
                     BLOCK_P: ct.Constant[int], DSTATE: ct.Constant[int],
                     HEADS: ct.Constant[int], HAS_D: ct.Constant[bool],
                     D_PER_HEADDIM: ct.Constant[bool], HAS_Z: ct.Constant[bool],
                     CHECK_D: ct.Constant[bool], HAS_INITIAL_STATES: ct.Constant[bool],
                     HAS_SEQ_IDX: ct.Constant[bool], LAST_BY_MIN: ct.Constant[bool],
                     SEGMENTED: ct.Constant[bool], GUARD: ct.Constant[bool],
                     REDO: ct.Constant[bool]):
    """One program: y and the final state of BLOCK_P headdim columns of HEADS heads of one group
    and batch, token block by token block; grid (headdim blocks, nheads / HEADS, batch).
    SEGMENTED: the grid's first axis is (segments x headdim blocks), each program one segment of
    whole chunks of the sequence, the state entering it handed on through `passed` and `ready`
    (kernels.ssd_scan.scan_scratch); else they are not read. GUARD (float16 inputs):
    FLOAT16_RANGE into the error word where a product's result is not finite. REDO: the float16
    launch's second, with TF32 operands, which runs where the first set FLOAT16_RANGE and else
    stores nothing."""
    i_p = ct.bid(0)
    i_s = 0  # the program's segment of the sequence, of `segments` (segment-major grid)
    segments = 1
    if SEGMENTED:
        i_p = ct.bid(0) % ct.cdiv(x.shape[3], BLOCK_P)
        i_s = ct.bid(0) // ct.cdiv(x.shape[3], BLOCK_P)
        segments = ct.num_blocks(0) // ct.cdiv(x.shape[3], BLOCK_P)
    i_hb = ct.bid(1)  # head block: heads i_hb * HEADS ... i_hb * HEADS + HEADS - 1, one group
    i_b = ct.bid(2)
    seqlen = x.shape[1]
    T_PER_CHUNK = CHUNK // BLOCK_T
    i_g = i_hb * HEADS // (x.shape[2] // B.shape[2])  # the group the heads read

    # Each head carries its state S, [BLOCK_P, DSTATE] in fp32: before token block i_t it is the
    # state after the block's previous token, and a_before is dA_cumsum there (0 at a chunk's
    # start: dA_cumsum restarts each chunk). A block's tokens see the earlier ones through S
    # alone: y_t = 2^(a_t - a_before) S . C_t^T + the block's causal term (C_t . B_s^T o L)
    # (dt_s x_s); then S <- 2^(a_last - a_before) S + (w o x)^T B, w_s = dt_s 2^(a_last - a_s).
    # y is accumulated transposed, y^T [BLOCK_P, BLOCK_T], so that x^T is a product's first
    # operand (DECISIONS.md "compute_out: transposed accumulator"). The heads' tiles are tuples
    # unrolled at compile time, so every product stays two-dimensional.
    # Products take TF32 operands for float32 inputs, 16-bit ones for 16-bit inputs
    # (mma_operand: inputs as they are; the state, the decayed weights and w o x rounded to
    # 16 bits), fp32 accumulators always; C . B^T of 16-bit inputs is exact in fp32. A float16
    # operand the kernel computes rounds to inf past 65504, where float32 is finite: GUARD
    # marks each product's non-finite results in `poison` (a select per element, no
    # reduction in the loop) and the final state; one non-finite sets FLOAT16_RANGE, and the
    # REDO launch recomputes everything with TF32 operands, float32's own results.
    products = x.dtype  # the products' operand format
    if REDO:
        products = ct.float32
    blocks = ct.cdiv(seqlen, BLOCK_T)
    t_first = 0  # the segment's token blocks: t_first ... blocks - 1
    if SEGMENTED:
        per = ct.cdiv(ct.cdiv(seqlen, CHUNK), segments) * T_PER_CHUNK  # whole chunks
        t_first = ct.minimum(i_s * per, blocks)
        blocks = ct.minimum(t_first + per, blocks)
    stores = 1  # the final states' stores: none where a REDO launch has nothing to redo
    last = 1  # whether the program's segment is the sequence's last (it stores the state)
    if SEGMENTED:
        last = ct.where(i_s == segments - 1, 1, 0)
    if REDO:
        redo = (ct.gather(errors, 0) & FLOAT16_RANGE) != 0
        blocks = ct.where(redo, blocks, t_first)
        stores = ct.where(redo, 1, 0)
    poison = ct.zeros((1, 1), dtype=ct.int32)
    if GUARD:
        poison = ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.int32)  # FLOAT16_RANGE where not finite
    states = ()
    a_befores = ()
    skips = ()  # each head's skip weights (NaN where not finite)
    for i_k in ct.static_iter(range(HEADS)):
        i_h = i_hb * HEADS + i_k
        if HAS_INITIAL_STATES:
            S = ct.load(initial_states, (i_b, i_h, i_p, 0), shape=(1, 1, BLOCK_P, DSTATE),
                        padding_mode=ct.PaddingMode.ZERO)
            S = ct.reshape(S, (BLOCK_P, DSTATE)).astype(ct.float32)  # 16-bit: widened, exact
        else:
            S = ct.zeros((BLOCK_P, DSTATE), dtype=ct.float32)
        states += (S,)
        a_befores += (ct.zeros((1, 1), dtype=ct.float32),)  # [1, 1]
        if HAS_D:
            skips += (checked_D(D, i_h, i_p, BLOCK_P, D_PER_HEADDIM),)
    seg_before = ct.zeros((1, 1), dtype=ct.int32)  # the initial state's segment: 0
    rows = ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (BLOCK_T, 1))  # s
    cols = ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (1, BLOCK_T))  # t
    causal = rows <= cols  # causal: s <= t

    if SEGMENTED:
        # Segments run in parallel. Each but the last first steps the state through its blocks
        # from zero (its own part L, no y), then waits for the state entering it (the previous
        # segment's `ready` flag), hands on the state leaving it, 2^(sum of its decays) times
        # the entering one plus L, and sets its own flag; then it runs the scan's loop from the
        # entering state. The flags are consumed (1 -> 0), so a launch leaves them as it found
        # them: zero. A segment waits only for lower block ids of its own head (the grid is
        # segment-major on its first axis): it cannot hang where every program is resident or
        # programs start in block-id order.
        # 0 where a REDO launch has nothing to redo (no flag set, none awaited); every program
        # of the launch must read the same word, so more than one segment needs an error word
        # no other launch writes meanwhile (ssd_scan's own)
        chain = stores
        own_end = ct.where(i_s < segments - 1, blocks, t_first)
        owns = ()  # each head's L, [BLOCK_P, DSTATE]
        logs = ()  # each head's sum of decay exponents, [1, 1]
        a_owns = ()
        for _ in ct.static_iter(range(HEADS)):
            owns += (ct.zeros((BLOCK_P, DSTATE), dtype=ct.float32),)
            logs += (ct.zeros((1, 1), dtype=ct.float32),)
            a_owns += (ct.zeros((1, 1), dtype=ct.float32),)
        # 0 where a block of the segment ends in another sequence than the entering state's
        live = ct.ones((1, 1), dtype=ct.float32)
        seg_own = ct.zeros((1, 1), dtype=ct.int32)
        if HAS_SEQ_IDX:  # the entering state's: that of the token before the segment
            seg_own = ct.load(seg, (i_b, ct.minimum(ct.maximum(t_first * BLOCK_T - 1, 0),
                                                    seqlen - 1)), shape=(1, 1))
            seg_own = ct.where(i_s > 0, seg_own, 0)
            seg_before = seg_own
        for i_t in range(t_first, own_end):
            i_c = i_t // T_PER_CHUNK
            i_tc = i_t % T_PER_CHUNK
            Bt = mma_operand(ct.reshape(ct.load(B, (i_b, i_t, i_g, 0),
                                                shape=(1, BLOCK_T, 1, DSTATE),
                                                padding_mode=ct.PaddingMode.ZERO),
                                        (BLOCK_T, DSTATE)), products)  # [s, n]
            if HAS_SEQ_IDX:
                seg_t = ct.load(seg, (i_b, i_t), shape=(1, BLOCK_T),
                                padding_mode=ct.PaddingMode.ZERO)
                seg_last = ct.load(seg, (i_b, ct.minimum(i_t * BLOCK_T + BLOCK_T - 1,
                                                         seqlen - 1)), shape=(1, 1))
                live = ct.where(seg_last == seg_own, live, 0.0)
            new_owns = ()
            new_logs = ()
            new_a_owns = ()
            for i_k in ct.static_iter(range(HEADS)):
                i_h = i_hb * HEADS + i_k
                a_t = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc),
                                         shape=(1, 1, 1, BLOCK_T)), (1, BLOCK_T))  # [1, t]
                a_s = ct.reshape(a_t, (BLOCK_T, 1))  # [s, 1]
                dt_s = ct.reshape(ct.load(dt_out, (i_b, i_h, i_c, i_tc),
                                          shape=(1, 1, 1, BLOCK_T)), (BLOCK_T, 1))  # [s, 1]
                xs = ct.reshape(ct.load(x, (i_b, i_t, i_h, i_p), shape=(1, BLOCK_T, 1, BLOCK_P),
                                        padding_mode=ct.PaddingMode.ZERO), (BLOCK_T, BLOCK_P))
                if LAST_BY_MIN:
                    a_last = ct.min(a_t, axis=1, keepdims=True)  # [1, 1]
                else:
                    a_last = ct.reshape(
                        ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc * BLOCK_T + BLOCK_T - 1),
                                shape=(1, 1, 1, 1)), (1, 1))  # [1, 1]
                step = ct.minimum(a_last - a_owns[i_k], 0.0)
                carry = ct.exp2(step)
                w = dt_s * ct.exp2(ct.minimum(a_last - a_s, 0.0))  # [s, 1]
                if HAS_SEQ_IDX:
                    carry = ct.where(seg_last == seg_before, carry, 0.0)
                    w = ct.where(ct.reshape(seg_t, (BLOCK_T, 1)) == seg_last, w, 0.0)
                xw = ct.transpose(xs.astype(ct.float32) * w)  # [P, s]
                new_owns += (ct.mma(mma_operand(xw, products), Bt, owns[i_k] * carry),)
                new_logs += (logs[i_k] + step,)
                new_a_owns += (ct.where(i_tc == T_PER_CHUNK - 1, 0.0, a_last),)
            owns = new_owns
            logs = new_logs
            a_owns = new_a_owns
            if HAS_SEQ_IDX:
                seg_before = seg_last
        # the wait: an acquiring compare-and-swap that takes the flag (1 -> 0) once it is set;
        # the handed-on state is read after it, and stored before the release below, without
        # TMA (the bulk copies go through the async proxy, which acquire and release do not
        # order)
        for _ in range(ct.where(i_s > 0, chain, 0)):
            got = ct.atomic_cas(ready, (i_b, i_hb, i_p, i_s - 1), 1, 0,
                                memory_order=ct.MemoryOrder.ACQUIRE)
            while got != 1:
                got = ct.atomic_cas(ready, (i_b, i_hb, i_p, i_s - 1), 1, 0,
                                    memory_order=ct.MemoryOrder.ACQUIRE)
            entering = ()
            for i_k in ct.static_iter(range(HEADS)):
                entering += (ct.reshape(
                    ct.load(passed, (i_b, i_hb * HEADS + i_k, i_s - 1, i_p, 0),
                            shape=(1, 1, 1, BLOCK_P, DSTATE), allow_tma=False),
                    (BLOCK_P, DSTATE)),)
            states = entering
        for _ in range(ct.where(i_s < segments - 1, chain, 0)):
            for i_k in ct.static_iter(range(HEADS)):
                leaving = states[i_k] * (ct.exp2(logs[i_k]) * live) + owns[i_k]
                ct.store(passed, (i_b, i_hb * HEADS + i_k, i_s, i_p, 0),
                         ct.reshape(leaving, (1, 1, 1, BLOCK_P, DSTATE)), allow_tma=False)
            ct.atomic_xchg(ready, (i_b, i_hb, i_p, i_s), 1, memory_order=ct.MemoryOrder.RELEASE)
        seg_before = seg_own

    for i_t in range(t_first, blocks):
        i_c = i_t // T_PER_CHUNK
        i_tc = i_t % T_PER_CHUNK  # the block's position in its chunk
        Bt_in = ct.reshape(ct.load(B, (i_b, i_t, i_g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                                   padding_mode=ct.PaddingMode.ZERO), (BLOCK_T, DSTATE))  # [s, n]
        Ct = ct.load(C, (i_b, i_t, i_g, 0), shape=(1, BLOCK_T, 1, DSTATE),
                     padding_mode=ct.PaddingMode.ZERO)
        CtT_in = ct.transpose(ct.reshape(Ct, (BLOCK_T, DSTATE)))  # [n, t], C's dtype
        Bt, CtT = mma_operand(Bt_in, products), mma_operand(CtT_in, products)
        cbT = ct.mma(Bt, CtT, ct.zeros((BLOCK_T, BLOCK_T), dtype=ct.float32))  # [s, t]
        keep = causal
        if HAS_SEQ_IDX:
            seg_t = ct.load(seg, (i_b, i_t), shape=(1, BLOCK_T), padding_mode=ct.PaddingMode.ZERO)
            keep = keep & (ct.reshape(seg_t, (BLOCK_T, 1)) == seg_t)
            # the state handed on belongs to the segment of the block's last real token
            seg_last = ct.load(seg, (i_b, ct.minimum(i_t * BLOCK_T + BLOCK_T - 1, seqlen - 1)),
                               shape=(1, 1))
        new_states = ()
        new_a_befores = ()
        for i_k in ct.static_iter(range(HEADS)):
            i_h = i_hb * HEADS + i_k
            a_t = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc), shape=(1, 1, 1, BLOCK_T)),
                             (1, BLOCK_T))  # [1, t]
            a_s = ct.reshape(a_t, (BLOCK_T, 1))  # [s, 1]
            dt_s = ct.reshape(ct.load(dt_out, (i_b, i_h, i_c, i_tc), shape=(1, 1, 1, BLOCK_T)),
                              (BLOCK_T, 1))  # [s, 1]
            xs = ct.load(x, (i_b, i_t, i_h, i_p), shape=(1, BLOCK_T, 1, BLOCK_P),
                         padding_mode=ct.PaddingMode.ZERO)
            xs = ct.reshape(xs, (BLOCK_T, BLOCK_P))  # [s, P], x's dtype
            # the state's term, [BLOCK_P, BLOCK_T]: 2^(a_t - a_before) S . C_t^T; clamp:
            # rounding must not make the decay > 1
            acc = ct.mma(mma_operand(states[i_k], products), CtT,
                         ct.zeros((BLOCK_P, BLOCK_T), dtype=ct.float32))
            decay_in = ct.exp2(ct.minimum(a_t - a_befores[i_k], 0.0))  # [1, t]
            if HAS_SEQ_IDX:
                decay_in = ct.where(seg_t == seg_before, decay_in, 0.0)
            acc = acc * decay_in
            # the block's own term: (dt_s x_s)^T (C_t . B_s^T o L)^T. L^T[s, t] =
            # 2^(a_t - a_s): a select on a clamped exponent, so 2^(positive) is never formed
            # above the diagonal and no inf * 0 can appear
            LT = ct.where(keep, ct.exp2(ct.minimum(a_t - a_s, 0.0)), 0.0)  # [s, t]
            acc = ct.mma(mma_operand(ct.transpose(xs), products),
                         mma_operand(cbT * LT * dt_s, products), acc)
            if GUARD:
                poison = ct.where(ct.abs(acc) < math.inf, poison, FLOAT16_RANGE)
            if HAS_D:  # the block's x is x_t: the skip term reads no more
                acc = acc + skips[i_k] * ct.transpose(xs.astype(ct.float32))
            if HAS_Z:
                acc = z_gated(acc, z, i_b, i_t, i_h, i_p, BLOCK_T, BLOCK_P)
            # rows past seqlen and columns past headdim are masked by the store; y has x's
            # dtype (one rounding of the float32 result for narrow inputs)
            ct.store(y, (i_b, i_t, i_h, i_p),
                     ct.reshape(ct.transpose(acc), (1, BLOCK_T, 1, BLOCK_P)).astype(y.dtype))
            # the state after the block: a_last is dA_cumsum at its last token (flat over a
            # short chunk's padding, whose x and B are zero). LAST_BY_MIN: the minimum of a_t,
            # the same value (dA_cumsum never rises within a chunk: dt_out >= 0, A < 0),
            # without a load; else loaded
            if LAST_BY_MIN:
                a_last = ct.min(a_t, axis=1, keepdims=True)  # [1, 1]
            else:
                a_last = ct.reshape(
                    ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc * BLOCK_T + BLOCK_T - 1),
                            shape=(1, 1, 1, 1)), (1, 1))  # [1, 1]
            carry = ct.exp2(ct.minimum(a_last - a_befores[i_k], 0.0))
            w = dt_s * ct.exp2(ct.minimum(a_last - a_s, 0.0))  # [s, 1], scales x's rows
            if HAS_SEQ_IDX:
                carry = ct.where(seg_last == seg_before, carry, 0.0)
                w = ct.where(ct.reshape(seg_t, (BLOCK_T, 1)) == seg_last, w, 0.0)
            xw = ct.transpose(xs.astype(ct.float32) * w)  # [P, s]
            new_states += (ct.mma(mma_operand(xw, products), Bt, states[i_k] * carry),)
            # the next block starts a chunk: dA_cumsum restarts from 0 there
            new_a_befores += (ct.where(i_tc == T_PER_CHUNK - 1, 0.0, a_last),)
        states = new_states
        a_befores = new_a_befores
        if HAS_SEQ_IDX:
            seg_before = seg_last

    for _ in range(stores):
        if GUARD:
            flags = ct.max(poison)
        for i_k in ct.static_iter(range(HEADS)):
            for _ in range(last):
                ct.store(final_states, (i_b, i_hb * HEADS + i_k, i_p, 0),
                         ct.reshape(states[i_k], (1, 1, BLOCK_P, DSTATE)))
            if HAS_D:
                report_D(errors, skips[i_k], CHECK_D)
            if GUARD:
                flags = ct.maximum(flags, ct.max(ct.where(ct.abs(states[i_k]) < math.inf, 0,
                                                          FLOAT16_RANGE)))
        if GUARD:
            or_error(errors, flags)


def _hints(occupancy: int, warps: int | None) -> dict:
    return {"occupancy": occupancy} | ({} if warps is None else {"num_worker_warps": warps})


# The kernel objects, int32 indices only (the scan runs where every array has fewer than 2^31
# elements: kernels.arrays.int32_indexed of the function, whose ct.IndexedWithInt64 arrays mark
# what an int64 object would index in int64): the rules' two, then by (occupancy, worker warps)
# hints, each made once here (an object made per call would be dispatched anew)
_ssd_scan = ct.kernel(int32_indexed(_ssd_scan_kernel),
                      **_hints(RULES_CHOICE.occupancy, RULES_CHOICE.warps))
_ssd_scan_few_programs = _ssd_scan.replace_hints(
    **_hints(FEW_PROGRAMS_CHOICE.occupancy, FEW_PROGRAMS_CHOICE.warps))
_KERNELS = {(RULES_CHOICE.occupancy, RULES_CHOICE.warps): _ssd_scan,
            (FEW_PROGRAMS_CHOICE.occupancy, FEW_PROGRAMS_CHOICE.warps): _ssd_scan_few_programs}
_KERNELS.update({(o, w): _ssd_scan.replace_hints(**_hints(o, w))
                 for o in OCCUPANCIES for w in WORKER_WARPS if (o, w) not in _KERNELS})


def _tiles(headdim: int, dstate: int, chunk_size: int, block_p: int) -> tuple[int, int, int]:
    """(BLOCK_T, BLOCK_P, DSTATE tile) of a launch whose choice has `block_p`."""
    return (min(chunk_size, BLOCK_T), pow2_tile(headdim, lo=MMA_MIN, hi=block_p),
            pow2_tile(dstate, lo=MMA_MIN))


def _rules_programs(batch: int, nheads: int, headdim: int) -> int:
    """The programs of a launch of the rules' heads and headdim block (every rules' choice has
    RULES_CHOICE's)."""
    block_p = pow2_tile(headdim, lo=MMA_MIN, hi=RULES_CHOICE.block_p)
    return -(-headdim // block_p) * nheads // RULES_CHOICE.heads * batch


def rules_choice(dims: LaunchDims, sm_count) -> Choice:
    """The rules' Choice on a GPU of `sm_count` SMs (see RULES_CHOICE)."""
    d = dims.dims
    few = (dims.dtype in FEW_PROGRAMS_DTYPES
           and _rules_programs(d.batch, d.nheads, d.headdim) <= sm_count)
    return FEW_PROGRAMS_CHOICE if few else RULES_CHOICE


def scan_fits(dstate: int, arrays: tuple = ()) -> bool:
    """Whether the scan can run a call of this dstate whose launch passes `arrays`: a dstate
    tile of at most SCAN_MAX_DSTATE and int32 indices."""
    return pow2_tile(dstate, lo=MMA_MIN) <= SCAN_MAX_DSTATE and not needs_int64(*arrays)


def scan_runs(x, B, dt_out, arrays: tuple, sm_count) -> bool:
    """Whether ssd_forward's rules take the scan for these arrays (x, B, dt_out, and every array
    the launch would pass): where it fits (scan_fits) and the rules' grid has SCAN_MIN_WAVES
    programs per SM or more for x's dtype."""
    waves = SCAN_MIN_WAVES.get(dtype_name(x), SCAN_MIN_WAVES_OTHERS)
    batch, _, nheads, headdim = (int(s) for s in x.shape)
    return (scan_fits(int(B.shape[3]), arrays)
            and _rules_programs(batch, nheads, headdim) >= waves * sm_count)


def ssd_scan_choices(x, B) -> list[Choice]:
    """The CHOICES a launch of these arrays can run, each distinct launch once: heads that
    divide a group's; a headdim block that clamps to the extent of an earlier one's (headdim
    <= 32) is left out."""
    per_group, headdim = int(x.shape[2]) // int(B.shape[2]), int(x.shape[3])
    found, launches = [], set()
    for c in CHOICES:
        launch = (c.heads, c.occupancy, c.warps, pow2_tile(headdim, lo=MMA_MIN, hi=c.block_p),
                  c.segments)
        if per_group % c.heads == 0 and launch not in launches:
            launches.add(launch)
            found.append(c)
    return found


def scan_scratch(x, B, choice: Choice) -> dict:
    """{name: shape} of the arrays a launch of the segmented kernel hands its states on
    through ({} for the kernel without segments): `passed`, float32, the state leaving each
    segment, (batch, nheads, segments, headdim blocks x BLOCK_P, dstate tile: whole tiles, so
    no load of it is partial), and `ready`, int32, each segment's flag, (batch, nheads, headdim
    blocks, segments), zero before the launch (a launch leaves it zero: every flag set is
    consumed) where there is more than one segment."""
    if not choice.segments:
        return {}
    batch, _, nheads, headdim = (int(s) for s in x.shape)
    block_p = pow2_tile(headdim, lo=MMA_MIN, hi=choice.block_p)
    blocks = -(-headdim // block_p)
    return {"passed": (batch, nheads, choice.segments, blocks * block_p,
                       pow2_tile(int(B.shape[3]), lo=MMA_MIN)),
            "ready": (batch, nheads, blocks, choice.segments)}


def ssd_scan_launches(x, B, C, dt_out, dA_cumsum, initial_states, D, z, seg, y, final_states,
                      sm_count, choice: Choice | None = None, *, errors=None,
                      check_D: bool = True, passed=None, ready=None) -> list[tuple]:
    """[(kernel, grid, kernel args)] of ssd_scan: the one place its tiles and kernel objects are
    chosen; `choice` where given (one of ssd_scan_choices, else a ValueError), else the rules'
    for a GPU of `sm_count` SMs. float16 inputs launch twice: the guarded products, then the
    redo with TF32 operands, which stores only where the first found a result out of float16's
    range (kernels.constants.FLOAT16_RANGE in the error word).

    Reads only shapes and dtypes, so the compile gate derives its signatures from here too. `seg`
    is the (batch, seqlen) int32 segment ids, or None. `errors`: the call's error word
    (kernels.errors), None only in a launch that is planned, never run. `check_D`: whether a D
    that is not finite is reported here (its y is NaN either way); ssd_forward checks D in
    chunk_cumsum instead. `passed`, `ready`: the segmented kernel's arrays (scan_scratch), given
    where the choice has segments (a ValueError where they are missing).
    """
    batch, _, nheads, headdim = (int(s) for s in x.shape)
    given = choice is not None
    choice = rules_choice(launch_dims(x, B, dt_out), sm_count) if choice is None else choice
    if choice not in ssd_scan_choices(x, B):
        raise ValueError(f"{'choice' if given else 'rules choice'}: {choice} is not one that "
                         f"ssd_scan can run on this shape ({ssd_scan_choices.__name__})")
    segments = choice.segments or 1
    for name, shape in scan_scratch(x, B, choice).items():
        array = {"passed": passed, "ready": ready}[name]
        dtype = "int32" if name == "ready" else "float32"
        if (array is None or tuple(int(n) for n in array.shape) != shape
                or dtype_name(array) != dtype):
            got = None if array is None else (tuple(array.shape), dtype_name(array))
            raise ValueError(f"{name}: {choice} runs the segmented kernel, which takes {name} "
                             f"of shape {shape}, {dtype} ({scan_scratch.__name__}), got {got}")
    block_t, block_p, dstate_tile = _tiles(headdim, int(B.shape[3]), int(dt_out.shape[3]),
                                           choice.block_p)
    guarded = dtype_name(x) == "float16"
    # the kernel's arguments before CHECK_D, and between it and GUARD, REDO; the kernel without
    # segments reads neither passed nor ready (stand-ins)
    scratch = (passed, ready) if choice.segments else (final_states, errors)
    head = (x, B, C, dt_out, dA_cumsum, x if initial_states is None else initial_states,
            x if D is None else D, x if z is None else z, dt_out if seg is None else seg, y,
            final_states, *scratch, errors, int(dt_out.shape[3]), block_t, block_p,
            dstate_tile, choice.heads, D is not None, D is not None and len(D.shape) == 2,
            z is not None)
    last_by_min = choice.warps in LAST_BY_MIN_WARPS and dtype_name(x) in LAST_BY_MIN_DTYPES
    options = (initial_states is not None, seg is not None, last_by_min,
               choice.segments > 0)
    args = (*head, D is not None and check_D, *options, guarded, False)
    if needs_int64(*args):
        raise ValueError("ssd_scan: an array of 2^31 elements or more (int32 indices only)")
    grid = (-(-headdim // block_p) * segments, nheads // choice.heads, batch)
    kernel = _KERNELS[choice.occupancy, choice.warps]
    if not guarded:
        return [(kernel, grid, args)]
    # the redo: no D check (the first launch made it), no guard
    return [(kernel, grid, args), (kernel, grid, (*head, False, *options, False, True))]


def ssd_scan(x, B, C, dt_out, dA_cumsum, D=None, z=None, initial_states=None, seq_idx=None, *,
             check_values=None, choice: Choice | None = None):
    """(y, final_states) of the caller's array type: y (batch, seqlen, nheads, headdim) in x's
    dtype, final_states (batch, nheads, headdim, dstate) float32. x, B, C, z: float32, bfloat16
    or float16, all alike; the rest float32. `check_values`: as in ssd_forward (a channel with a
    D that is not finite gets NaN). `choice`: the Choice to launch (one of ssd_scan_choices, else
    a ValueError before any launch) instead of the rules'."""
    def check(x, B, C, dt_out, dA_cumsum, D, z, initial_states, seq_idx):
        dims = check_ssd_scan_args(x, B, C, dt_out, dA_cumsum, D=D, z=z,
                                   initial_states=initial_states, seq_idx=seq_idx,
                                   float_dtypes=weight_dtypes(x),
                                   activation_dtypes=ACTIVATION_DTYPES, check_values=False)
        if choice is not None and choice not in ssd_scan_choices(x, B):
            raise ValueError(f"choice: {choice} is not one that ssd_scan can run on this shape "
                             f"({ssd_scan_choices.__name__})")
        return dims

    def launches(a, backend, errors):
        launched = choice or rules_choice(launch_dims(a["x"], a["B"], a["dt_out"]),
                                          backend.sm_count)
        # the flags zeroed where a segment waits (one segment reads neither array)
        scratch = scan_scratch(a["x"], a["B"], launched)
        passed = backend.empty(scratch["passed"]) if scratch else None
        ready = None
        if scratch:
            ready = (backend.zeros(scratch["ready"], "int32") if launched.segments > 1 else
                     backend.empty(scratch["ready"], dtype="int32"))
        return ssd_scan_launches(
            a["x"], a["B"], a["C"], a["dt_out"], a["dA_cumsum"], a["initial_states"], a["D"],
            a["z"], a["seg"], a["y"], a["final_states"], backend.sm_count, launched,
            errors=errors, passed=passed, ready=ready)

    a = run_alone(
        "ssd_scan", dict(x=x, B=B, C=C, dt_out=dt_out, dA_cumsum=dA_cumsum, D=D, z=z,
                         initial_states=initial_states, seq_idx=seq_idx),
        check=check,
        outputs=lambda dims: {"y": (dims.shape("y"), "x"),
                              "final_states": (dims.shape("final_states"), None)},
        launches=launches, check_values=check_values, values=("D",))
    return a["y"], a["final_states"]
