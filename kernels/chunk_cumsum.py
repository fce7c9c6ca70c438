"""chunk_cumsum: the processed step size and the in-chunk decay cumsum, in log2 units.

The declared choices (CHOICES) are what the launcher may run: its rule picks one
(rules_choice), benchmarks.sweep times the others.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import cuda.tile as ct

from contract import Dims, check_chunk_cumsum_args, check_dt_limit, weight_dtypes
from kernels.arrays import LaunchDims, int32_indexed, needs_int64, pow2_tile
from kernels.constants import ERROR_A, ERROR_CU_SEQLENS, ERROR_D, ERROR_DT_BIAS, LOG2E
from kernels.launcher import run_alone
from kernels.tiles import or_error

SOFTPLUS_THRESHOLD = 20.0  # softplus(v) = v above it (as mamba_ssm and the reference)


class Choice(NamedTuple):
    """One launch configuration of chunk_cumsum beyond its shapes."""
    block_h: int  # heads per program: a [CHUNK, BLOCK_H] tile


# the declared search space; the rules' pick: 16 heads x 256 tokens, 16 KiB of fp32
# (benchmarks/DECISIONS.md "chunk_cumsum: heads per program")
CHOICES = (Choice(16), Choice(8), Choice(32))
RULES_BLOCK_H = 16
BLOCK_DP = 64  # channels of a per-channel D a program checks at a time: a [BLOCK_H, 64] tile
BLOCK_CU = 256  # packed offsets a program checks at a time


def _chunk_cumsum_kernel(dt: ct.IndexedWithInt64, A, dt_bias, D, cu_seqlens,
                         dt_out: ct.IndexedWithInt64, dA_cumsum: ct.IndexedWithInt64, errors,
                         CHUNK: ct.Constant[int], BLOCK_H: ct.Constant[int],
                         HAS_DT_BIAS: ct.Constant[bool], DT_SOFTPLUS: ct.Constant[bool],
                         DT_MIN: ct.Constant[float], DT_MAX: ct.Constant[float],
                         HAS_D: ct.Constant[bool], D_PER_HEADDIM: ct.Constant[bool],
                         HAS_CU_SEQLENS: ct.Constant[bool]):
    """One program: dt_out and dA_cumsum of chunk bid(0) for heads block bid(1) of batch bid(2).
    A head whose A is not finite and < 0, or whose dt_bias is not finite, gets NaN in both, and
    its bit (ERROR_A, ERROR_DT_BIAS) is OR-ed into errors[0]. With HAS_D, a D that is not finite
    sets ERROR_D there too (D feeds y alone: compute_out makes that y NaN); with HAS_CU_SEQLENS,
    packed offsets that do not start at 0, decrease or do not end at seqlen set
    ERROR_CU_SEQLENS (ssd_varlen, launched next, then steps through no sequence)."""
    i_c = ct.bid(0)
    i_hb = ct.bid(1)
    i_b = ct.bid(2)
    seqlen = dt.shape[1]
    real = i_hb * BLOCK_H + ct.arange(BLOCK_H, dtype=ct.int32) < A.shape[0]  # [BLOCK_H]
    # A, dt and dt_bias may be float32 or 16-bit arrays: each widened to float32 at its load
    a_h = ct.load(A, (i_hb,), shape=(BLOCK_H,), padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
    # NaN and -inf fail one of the two comparisons; heads past nheads (zero padding) are fine
    bad = ct.where((a_h < 0.0) & (a_h > -math.inf), 0, ct.where(real, ERROR_A, 0))  # [BLOCK_H]
    v = ct.load(dt, (i_b, i_c, i_hb), shape=(1, CHUNK, BLOCK_H), padding_mode=ct.PaddingMode.ZERO)
    v = ct.reshape(v, (CHUNK, BLOCK_H)).astype(ct.float32)  # [CHUNK, BLOCK_H]
    if HAS_DT_BIAS:
        bias = ct.load(dt_bias, (i_hb,), shape=(BLOCK_H,),
                       padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        bad = bad | ct.where(ct.abs(bias) < math.inf, 0, ERROR_DT_BIAS)  # NaN fails it too
        v = v + ct.reshape(bias, (1, BLOCK_H))
    if DT_SOFTPLUS:
        # log1p(e) as log(1 + e) * e / ((1 + e) - 1) (Goldberg): accurate also where 1 + e
        # rounds to 1 (v very negative), where it is e itself. The selects keep the unused
        # branches finite: e is formed only for v <= threshold, the quotient only where 1 + e > 1.
        e = ct.exp(ct.minimum(v, SOFTPLUS_THRESHOLD))
        s = 1.0 + e
        grown = s > 1.0
        log1p_e = ct.where(grown, ct.log(s) * e / ct.where(grown, s - 1.0, 1.0), e)
        v = ct.where(v > SOFTPLUS_THRESHOLD, v, log1p_e)
    v = ct.minimum(ct.maximum(v, DT_MIN), DT_MAX)
    # the padding of a short last chunk: dt_out = 0 there, so dA_cumsum stays flat
    t = ct.reshape(i_c * CHUNK + ct.arange(CHUNK, dtype=ct.int32), (CHUNK, 1))
    v = ct.where(t < seqlen, v, 0.0)
    dA = ct.cumsum(v * ct.reshape(a_h * LOG2E, (1, BLOCK_H)), axis=0)  # [CHUNK, BLOCK_H]: <= 0
    # The GPU's parallel scan groups the additions differently for each prefix, so a term that
    # is tiny next to the running sum (or a zero of the padding) can leave a prefix one ulp above
    # the one before it (seen on the H200). The running minimum makes dA_cumsum non-increasing,
    # as the math is, and moves no entry outside the cumsum bound: it replaces a prefix by an
    # earlier, larger-in-magnitude computed prefix whose true value lies above the true one.
    dA = ct.scan(dA, 0, ct.minimum, math.inf)
    # a bad head's values are NaN (never plausible numbers), and so is all they feed downstream
    bad_head = ct.reshape(bad != 0, (1, BLOCK_H))
    v = ct.where(bad_head, math.nan, v)
    dA = ct.where(bad_head, math.nan, dA)
    # the OR of the bits of the block's bad heads, into errors[0] only where there is one
    flags = ct.max(bad & ERROR_A) | ct.max(bad & ERROR_DT_BIAS)
    if HAS_D:  # checked here, where an atomic is cheap (in compute_out's loops it is not)
        flags = flags | _bad_D(D, i_hb, (i_c == 0) & (i_b == 0), BLOCK_H, D_PER_HEADDIM)
    if HAS_CU_SEQLENS:  # every offset at once, before any sequence runs (ssd_varlen)
        flags = flags | _bad_offsets(cu_seqlens, seqlen, (i_c == 0) & (i_hb == 0) & (i_b == 0))
    or_error(errors, flags)
    # stored as (batch, nheads, nchunks, chunk_size); heads past nheads are masked by the store
    ct.store(dt_out, (i_b, i_hb, i_c, 0), ct.reshape(ct.transpose(v), (1, BLOCK_H, 1, CHUNK)))
    ct.store(dA_cumsum, (i_b, i_hb, i_c, 0), ct.reshape(ct.transpose(dA), (1, BLOCK_H, 1, CHUNK)))


def _bad_D(D, i_hb, first, BLOCK_H, D_PER_HEADDIM):
    """ERROR_D where a skip weight of heads block i_hb is not finite (NaN fails the comparison
    too), else 0. D per channel, (nheads, headdim), is read in [BLOCK_H, BLOCK_DP] blocks by the
    programs of the first chunk and batch element only (`first`; a zero trip count elsewhere)."""
    if D_PER_HEADDIM:
        bad = ct.zeros((BLOCK_H, BLOCK_DP), dtype=ct.int32)
        for i_p in range(ct.where(first, ct.cdiv(D.shape[1], BLOCK_DP), 0)):
            d = ct.load(D, (i_hb, i_p), shape=(BLOCK_H, BLOCK_DP),
                        padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
            bad = bad | ct.where(ct.abs(d) < math.inf, 0, ERROR_D)
    else:
        d = ct.load(D, (i_hb,), shape=(BLOCK_H,),
                    padding_mode=ct.PaddingMode.ZERO).astype(ct.float32)
        bad = ct.where(ct.abs(d) < math.inf, 0, ERROR_D)
    return ct.max(bad)


def _bad_offsets(cu_seqlens, seqlen, first):
    """ERROR_CU_SEQLENS where the packed offsets do not start at 0, decrease anywhere, or do not
    end at seqlen (so every offset lies in [0, seqlen] and no two sequences overlap), else 0:
    read in blocks of BLOCK_CU pairs (cu[k], cu[k + 1]) by the first program only (`first`; a
    zero trip count elsewhere)."""
    pairs = cu_seqlens.shape[0] - 1
    bad = ct.zeros((BLOCK_CU,), dtype=ct.int32)
    for i in range(ct.where(first, ct.cdiv(pairs, BLOCK_CU), 0)):
        k = i * BLOCK_CU + ct.arange(BLOCK_CU, dtype=ct.int32)  # [BLOCK_CU]
        inside = k < pairs
        start = ct.gather(cu_seqlens, k, mask=inside)
        end = ct.gather(cu_seqlens, k + 1, mask=inside)
        wrong = (end < start) | ((k == 0) & (start != 0)) | ((k == pairs - 1) & (end != seqlen))
        bad = bad | ct.where(inside & wrong, ERROR_CU_SEQLENS, 0)
    return ct.max(bad)


# the kernel objects: int32 or int64 indices (kernels.arrays.needs_int64)
_chunk_cumsum = ct.kernel(int32_indexed(_chunk_cumsum_kernel))
_chunk_cumsum_int64 = ct.kernel(_chunk_cumsum_kernel)


def rules_choice(dims: LaunchDims | None, sm_count) -> Choice:
    """The choice of the launcher's rule (RULES_BLOCK_H), whatever the launch and device."""
    return Choice(RULES_BLOCK_H)


def chunk_cumsum_launch(dt, A, dt_bias, dt_out, dA_cumsum, dt_softplus, dt_limit,
                        choice: Choice | None = None, *, errors=None, D=None, cu_seqlens=None):
    """(kernel, grid, kernel args) of _chunk_cumsum_kernel: the one place its tiles and its kernel
    object (index width) are chosen: `choice` where given (one of CHOICES, else a ValueError),
    else the rules'.

    Reads only shapes, so the compile gate derives its signatures from here too. `errors`: the
    call's error word (kernels.errors), a (1,) int32 array; None only in a launch that is
    planned, never run. `D`: ssd_forward's skip weights, (nheads,) or (nheads, headdim), checked
    here for the forward (compute_out then only makes a bad D's y NaN), or None. `cu_seqlens`:
    a packed row's int32 offsets, checked here (ssd_varlen reads the verdict), or None.
    """
    if choice is None:
        choice = rules_choice(None, None)  # the rule reads neither
    elif choice not in CHOICES:
        raise ValueError(f"choice: {choice} is not one of chunk_cumsum's CHOICES {CHOICES}")
    batch, _, nheads = (int(s) for s in dt.shape)
    chunk_size, nchunks = int(dt_out.shape[3]), int(dt_out.shape[2])
    block_h = pow2_tile(nheads, hi=choice.block_h)
    lo, hi = dt_limit
    grid = (nchunks, -(-nheads // block_h), batch)
    args = (dt, A, A if dt_bias is None else dt_bias, A if D is None else D,
            A if cu_seqlens is None else cu_seqlens, dt_out, dA_cumsum, errors, chunk_size,
            block_h, dt_bias is not None, bool(dt_softplus), float(lo), float(hi), D is not None,
            D is not None and len(D.shape) == 2, cu_seqlens is not None)
    kernel = _chunk_cumsum_int64 if needs_int64(*args) else _chunk_cumsum
    return kernel, grid, args


def chunk_cumsum(dt, A, chunk_size, dt_bias=None, dt_softplus=False, dt_limit=(0.0, math.inf),
                 *, check_values=None, choice: Choice | None = None):
    """(dt_out, dA_cumsum), both (batch, nheads, nchunks, chunk_size) float32, of the caller's
    array type: dt <- clamp(softplus?(dt + dt_bias), dt_limit), zero beyond seqlen, and its
    in-chunk cumulative decay dt * A in log2 units. `check_values`: as in ssd_forward (a head
    with a bad A or dt_bias gets NaN). `choice`: the Choice to launch (one of CHOICES) instead of
    the rules'."""
    def check(dt, A, dt_bias):
        batch, seqlen, nheads, chunk = check_chunk_cumsum_args(
            dt, A, chunk_size, dt_bias=dt_bias, dt_limit=dt_limit,
            float_dtypes=weight_dtypes(dt), check_values=False)
        return Dims(batch, seqlen, nheads, 1, 1, 1, chunk)

    a = run_alone(
        "chunk_cumsum", dict(dt=dt, A=A, dt_bias=dt_bias), check=check,
        outputs=lambda dims: {"dt_out": (dims.shape("dt_out"), None),
                              "dA_cumsum": (dims.shape("dA_cumsum"), None)},
        launches=lambda a, backend, errors: [chunk_cumsum_launch(
            a["dt"], a["A"], a["dt_bias"], a["dt_out"], a["dA_cumsum"], dt_softplus,
            check_dt_limit(dt_limit), choice, errors=errors)],
        check_values=check_values, values=("A", "dt_bias"))
    return a["dt_out"], a["dA_cumsum"]
