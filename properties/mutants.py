"""Harness strength: seeded kernel bugs (mutants of the real kernel source, and of the launch
plan's cache key) and which property kills each.

Every mutant is one textual replacement in one kernel file that must match exactly once, so a
kernel change that moves the text makes the catalogue fail loudly (tests/test_properties_harness.py)
instead of silently testing nothing. `python -m properties.mutants` copies the working tree,
applies one mutant at a time, runs `pytest -m properties` there on the interpreter with the ci
profile's examples (shrinking off: the first failing example is enough to kill), and writes the
report (default properties/mutant_report.txt).

    python -m properties.mutants [--only NAME ...] [--jobs 2] [--report PATH] [--first]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
REPORT = REPO / "properties" / "mutant_report.txt"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str  # kernel file, relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    bug: str  # what a developer would have done wrong


CATALOGUE = [
    Mutant("scan_causal_mask_off_by_one", "kernels/ssd_scan.py",
           "causal = rows <= cols  # causal: s <= t", "causal = rows <= cols + 1  # causal: s <= t",
           "the scan: the causal mask lets token t see token t+1"),
    Mutant("scan_chunk_restart_missing", "kernels/ssd_scan.py",
           "new_a_befores += (ct.where(i_tc == T_PER_CHUNK - 1, 0.0, a_last),)",
           "new_a_befores += (a_last,)",
           "the scan: the state's reference point kept across a chunk boundary, where dA_cumsum "
           "restarts from 0"),
    Mutant("scan_carry_missing", "kernels/ssd_scan.py",
           "new_states += (ct.mma(mma_operand(xw, products), Bt, states[i_k] * carry),)",
           "new_states += (ct.mma(mma_operand(xw, products), Bt, states[i_k]),)",
           "the scan: the state is carried to the next token block without its decay"),
    Mutant("scan_block_end_by_max", "kernels/ssd_scan.py",
           "\n                a_last = ct.min(a_t, axis=1, keepdims=True)  # [1, 1]",
           "\n                a_last = ct.max(a_t, axis=1, keepdims=True)  # [1, 1]",
           "the scan: a token block's last dA_cumsum taken as its tile's maximum (its first "
           "token's) instead of its minimum"),
    Mutant("scan_segment_entering_not_decayed", "kernels/ssd_scan.py",
           "leaving = states[i_k] * (ct.exp2(logs[i_k]) * live) + owns[i_k]",
           "leaving = states[i_k] + owns[i_k]",
           "the segmented scan: a segment hands on the state entering it without the decay "
           "through its tokens"),
    Mutant("scan_segment_own_part_not_carried", "kernels/ssd_scan.py",
           "new_owns += (ct.mma(mma_operand(xw, products), Bt, owns[i_k] * carry),)",
           "new_owns += (ct.mma(mma_operand(xw, products), Bt, owns[i_k]),)",
           "the segmented scan: a segment's own part of its leaving state skips the decay "
           "between its token blocks"),
    Mutant("scan_segment_reads_its_own_slot", "kernels/ssd_scan.py",
           "ct.load(passed, (i_b, i_hb * HEADS + i_k, i_s - 1, i_p, 0),",
           "ct.load(passed, (i_b, i_hb * HEADS + i_k, i_s, i_p, 0),",
           "the segmented scan: a segment reads its own slot of the handed-on states (not yet "
           "written) instead of its predecessor's"),
    Mutant("varlen_state_one_token_early", "kernels/ssd_varlen.py",
           "inside = t < end  # padding",
           "inside = t < end - 1  # padding",
           "a packed row: each sequence stops one token early (its state taken before its last "
           "token)"),
    Mutant("varlen_initial_state_of_wrong_sequence", "kernels/ssd_varlen.py",
           "S = ct.load(initial_states, (i_s, i_h, i_p, 0)",
           "S = ct.load(initial_states, (ct.maximum(i_s - 1, 0), i_h, i_p, 0)",
           "a packed row: a sequence starts from the previous sequence's initial state"),
    Mutant("varlen_carry_missing", "kernels/ssd_varlen.py",
           "S = mma_product(xw, Bt, S * ct.exp2(a_last), x.dtype)",
           "S = mma_product(xw, Bt, S, x.dtype)",
           "a packed row: the state goes to the sequence's next token block without its decay"),
    Mutant("scan_weights_in_8_bits", "kernels/ssd_scan.py",
           "mma_operand(cbT * LT * dt_s, products), acc)",
           "mma_operand(ct.bitcast(ct.bitcast(cbT * LT * dt_s, ct.int32) & -1048576, "
           "ct.float32), products), acc)",
           "the scan: the decayed weights keep 3 mantissa bits, an 8-bit float's, before their "
           "product"),
    Mutant("scan_reset_missing", "kernels/ssd_scan.py",
           "\n                carry = ct.where(seg_last == seg_before, carry, 0.0)",
           "\n                carry = carry",
           "the scan: the state crosses a seq_idx boundary between token blocks"),
    Mutant("causal_mask_off_by_one", "kernels/compute_out.py",
           "keep = rows <= cols  # causal: s <= t", "keep = rows <= cols + 1  # causal: s <= t",
           "the causal mask lets token t see token t+1"),
    Mutant("exponent_clamp_removed", "kernels/compute_out.py",
           "LT = ct.where(keep, ct.exp2(ct.minimum(a_ts[i_k] - a_s, 0.0)), 0.0)",
           "LT = ct.where(keep, 1.0, 0.0) * ct.exp2(a_ts[i_k] - a_s)",
           "exponent not clamped and the mask applied by a multiply: inf * 0 above the diagonal"),
    Mutant("exp_instead_of_exp2", "kernels/compute_out.py",
           "LT = ct.where(keep, ct.exp2(ct.minimum(a_ts[i_k] - a_s, 0.0)), 0.0)",
           "LT = ct.where(keep, ct.exp(ct.minimum(a_ts[i_k] - a_s, 0.0)), 0.0)",
           "natural exp on a cumsum kept in log2 units"),
    Mutant("heads_share_first_decay", "kernels/compute_out.py",
           "ct.exp2(ct.minimum(a_ts[i_k] - a_s, 0.0))",
           "ct.exp2(ct.minimum(a_ts[0] - a_s, 0.0))",
           "a program's heads all take the first head's in-chunk decay (heads per program)"),
    Mutant("log2e_scale_missing", "kernels/chunk_cumsum.py",
           "v * ct.reshape(a_h * LOG2E, (1, BLOCK_H))", "v * ct.reshape(a_h, (1, BLOCK_H))",
           "dA_cumsum left in natural-log units while every consumer uses exp2"),
    Mutant("chunk_boundary_off_by_one", "kernels/fwd_pass_state.py",
           "ct.load(dA_cumsum, (i_b, i_h, i_c, CHUNK - 1), shape=(1, 1, 1, 1))",
           "ct.load(dA_cumsum, (i_b, i_h, i_c, CHUNK - 2), shape=(1, 1, 1, 1))",
           "the chunk's total decay read one token before the chunk's end"),
    Mutant("wrong_head_group_mapping", "kernels/compute_out.py",
           "position in its chunk\n    i_g = i_hb * HEADS // (x.shape[2] // B.shape[2])",
           "position in its chunk\n    i_g = i_hb * HEADS % B.shape[2]",
           "heads assigned to groups round-robin instead of in contiguous blocks"),
    Mutant("weights_in_bf16", "kernels/compute_out.py",
           "W = cbT * LT * dt_s  # [s, t]\n            new_accs",
           "W = (cbT * LT * dt_s).astype(ct.bfloat16).astype(ct.float32)  # [s, t]"
           "\n            new_accs",
           "the decayed C B^T weights pass through bfloat16 (a precision regression)"),
    Mutant("state_in_bf16", "kernels/fwd_pass_state.py",
           "        S = acc\n", "        S = acc.astype(ct.bfloat16).astype(ct.float32)\n",
           "the carried state is kept in bfloat16 between chunks (a precision regression)"),
    Mutant("D_term_dropped", "kernels/tiles.py",
           "        skip = ct.reshape(ct.load(D, (i_h,), shape=(1,)), (1, 1))\n"
           "    return skip.astype(ct.float32)\n",
           "        skip = ct.reshape(ct.load(D, (i_h,), shape=(1,)), (1, 1))\n"
           "    return skip.astype(ct.float32) * 0.0\n",
           "the skip connection D x is lost (compute_out's layouts and the scan)"),
    Mutant("initial_state_ignored", "kernels/fwd_pass_state.py",
           "S = ct.transpose(ct.reshape(S, (BLOCK_P, BLOCK_N)).astype(ct.float32))",
           "S = ct.transpose(ct.reshape(S, (BLOCK_P, BLOCK_N)).astype(ct.float32)) * 0.0",
           "initial_states read but not used"),
    Mutant("ragged_partial_block_dropped", "kernels/fwd_pass_state.py",
           "ct.cdiv(seqlen - i_c * CHUNK, BLOCK_K)", "(seqlen - i_c * CHUNK) // BLOCK_K",
           "the last, partial token block of a ragged last chunk is skipped in the state"),
    Mutant("ragged_padding_dt_not_zeroed", "kernels/chunk_cumsum.py",
           "v = ct.where(t < seqlen, v, 0.0)", "v = ct.where(t < seqlen + 1, v, 0.0)",
           "the padding token right after seqlen gets a step size (bias, softplus, limit)"),
    Mutant("seq_idx_reset_missing_in_state", "kernels/fwd_pass_state.py",
           "carry = ct.where(seg_last == seg_before, carry, 0.0)\n"
           "            seg_before = seg_last\n        acc = S * carry",
           "carry = carry\n            seg_before = seg_last\n        acc = S * carry",
           "the state is carried across a seq_idx change at a chunk boundary"),
    Mutant("seq_idx_reset_missing_in_chunk", "kernels/compute_out.py",
           "keep = keep & (ct.reshape(seg_s, (BLOCK_T, 1)) == seg_t)", "keep = keep",
           "tokens of the previous sequence in the same chunk still contribute"),
    Mutant("seq_idx_segment_before_off_by_one", "kernels/compute_out.py",
           "ct.load(seg, (i_b, ct.maximum(i_c * CHUNK - 1, 0)), shape=(1, 1))",
           "ct.load(seg, (i_b, i_c * CHUNK), shape=(1, 1))",
           "the carried state's segment taken from the chunk's first token, not the one before"),
    Mutant("carried_state_not_decayed", "kernels/compute_out.py",
           "accs += (acc * decay_in,)", "accs += (acc,)",
           "the carried-state term misses its in-chunk decay 2^(a_t)"),
    Mutant("block_causal_mask_off_by_one", "kernels/compute_out.py",
           "causal = rows <= cols  # causal: s <= t", "causal = rows <= cols + 1  # causal: s <= t",
           "a program per chunk: the causal mask lets token t see token t+1"),
    Mutant("block_weights_in_bf16", "kernels/compute_out.py",
           "W = (cbT * LT * dt_s).astype(ct.tfloat32)  # [s, t]\n            acc = ct.mma(",
           "W = (cbT * LT * dt_s).astype(ct.bfloat16).astype(ct.float32).astype(ct.tfloat32)"
           "\n            acc = ct.mma(",
           "a program per chunk: the decayed C B^T weights pass through bfloat16"),
    Mutant("block_state_not_carried_decayed", "kernels/compute_out.py",
           "                                      states[i_k] * carry),)",
           "                                      states[i_k]),)",
           "a program per chunk: the state carried to the next token block misses the block's"
           " decay"),
    Mutant("block_decay_from_chunk_start", "kernels/compute_out.py",
           "acc = acc * ct.exp2(ct.minimum(a_t - a_befores[i_k], 0.0))",
           "acc = acc * ct.exp2(ct.minimum(a_t, 0.0))",
           "a program per chunk: a later token block decays the carried state from the chunk's"
           " start, not from the token before the block"),
    Mutant("softplus_naive", "kernels/chunk_cumsum.py",
           "log1p_e = ct.where(grown, ct.log(s) * e / ct.where(grown, s - 1.0, 1.0), e)",
           "log1p_e = ct.log(s)",
           "softplus as log(1 + e^v): all precision lost for v << 0"),
    Mutant("cumsum_running_min_removed", "kernels/chunk_cumsum.py",
           "    dA = ct.scan(dA, 0, ct.minimum, math.inf)\n", "",
           "the parallel scan's cumsum stored as it comes: a prefix one ulp above the one before"
           " (the bug the property suite found on the H200)"),
    Mutant("tf32_cast_dropped", "kernels/fwd_pass_state.py",
           "mma_product(mma_operand(ct.transpose(Bk), B.dtype), xk * w, acc, B.dtype)",
           "ct.mma(ct.transpose(Bk).astype(ct.float32), xk * w, acc)",
           "the state product's operands not cast to tfloat32: exact, but true fp32 on the GPU,"
           " 28x slower"),
    Mutant("state_pass_segment_reset_missing", "kernels/fwd_pass_state.py",
           "carry = ct.where(seg_last == seg_before, carry, 0.0)\n"
           "            seg_before = seg_last\n        S = S * carry",
           "carry = carry\n            seg_before = seg_last\n        S = S * carry",
           "with the chunks in parallel, the pass carries the state across a seq_idx change"),
    Mutant("state_pass_chunk_end_off_by_one", "kernels/fwd_pass_state.py",
           "END = CHUNK - 1  # a chunk's last position",
           "END = CHUNK - 2  # a chunk's last position",
           "with the chunks in parallel, the pass decays by the chunk's cumsum one token early"),
    Mutant("state_pass_initial_state_ignored", "kernels/fwd_pass_state.py",
           "        S = ct.reshape(S, (BLOCK_P, BLOCK_N)).astype(ct.float32)  #",
           "        S = ct.reshape(S, (BLOCK_P, BLOCK_N)).astype(ct.float32) * 0.0  #",
           "with the chunks in parallel, the pass starts from zero instead of initial_states"),
    Mutant("dt_limit_upper_ignored", "kernels/chunk_cumsum.py",
           "v = ct.minimum(ct.maximum(v, DT_MIN), DT_MAX)", "v = ct.maximum(v, DT_MIN)",
           "dt_limit's upper end not applied"),
    # the tile indices and block counts of the reach model (properties/reach.py): each killed
    # only where a launch has two blocks or more of its dimension (or a partial last one)
    Mutant("headdim_blocks_not_counted", "kernels/compute_out.py",
           "    p_blocks = ct.cdiv(x.shape[3], BLOCK_P)\n    i_t = i_tp // p_blocks",
           "    p_blocks = 1\n    i_t = i_tp // p_blocks",
           "a program per token block ignores its headdim block: every program writes block 0"),
    Mutant("chunk_headdim_blocks_not_counted", "kernels/compute_out.py",
           "    p_blocks = ct.cdiv(x.shape[3], BLOCK_P)\n    i_c = i_cp // p_blocks",
           "    p_blocks = 1\n    i_c = i_cp // p_blocks",
           "a program per chunk ignores its headdim block: every program writes block 0"),
    Mutant("state_headdim_block_from_dstate_index", "kernels/fwd_pass_state.py",
           "i_p = i_pn % pn_blocks // n_blocks", "i_p = i_pn % n_blocks",
           "fwd_pass_state's headdim block taken from the dstate block's index"),
    Mutant("state_dstate_block_ignored", "kernels/fwd_pass_state.py",
           "    i_n = i_pn % n_blocks\n    i_g", "    i_n = 0\n    i_g",
           "fwd_pass_state's programs all take dstate block 0 (a second block never written)"),
    Mutant("state_pass_dstate_block_ignored", "kernels/fwd_pass_state.py",
           "    i_n = i_pn % n_blocks\n    END", "    i_n = 0\n    END",
           "the pass's programs all take dstate block 0"),
    Mutant("cumsum_head_block_ignored", "kernels/chunk_cumsum.py",
           "a_h = ct.load(A, (i_hb,), shape=(BLOCK_H,)", "a_h = ct.load(A, (0,), shape=(BLOCK_H,)",
           "every head block of chunk_cumsum reads the first block's A"),
    Mutant("head_block_offset_dropped", "kernels/compute_out.py",
           "        i_h = i_hb * HEADS + i_k\n        a_t = ",
           "        i_h = i_hb + i_k\n        a_t = ",
           "a multi-head program's carried-state term takes heads i_hb + k, not i_hb * HEADS + k"),
    Mutant("chunk_head_block_offset_dropped", "kernels/compute_out.py",
           "S = ct.load(chunk_states, (i_b, i_c, i_hb * HEADS + i_k, i_p, 0),",
           "S = ct.load(chunk_states, (i_b, i_c, i_hb + i_k, i_p, 0),",
           "a program per chunk over several heads loads the wrong heads' entering states"),
    Mutant("chunk_partial_token_block_dropped", "kernels/compute_out.py",
           "ct.cdiv(seqlen - i_c * CHUNK, BLOCK_T)", "(seqlen - i_c * CHUNK) // BLOCK_T",
           "a program per chunk skips the last chunk's partial token block"),
    Mutant("s_block_offset_dropped", "kernels/compute_out.py",
           "rows = ct.reshape(i_sc * BLOCK_T + ct.arange(BLOCK_T, dtype=ct.int32), (BLOCK_T, 1))",
           "rows = ct.reshape(ct.arange(BLOCK_T, dtype=ct.int32), (BLOCK_T, 1))",
           "the causal mask takes an s-block's rows without its offset in the chunk"),
    # the 16-bit path (bfloat16 inputs: bfloat16 operands, fp32 decays and accumulators)
    Mutant("weights_in_8_bits", "kernels/compute_out.py",
           "W = cbT * LT * dt_s  # [s, t]",
           "W = ct.bitcast(ct.bitcast(cbT * LT * dt_s, ct.int32) & -1048576, "
           "ct.float32)  # [s, t]",
           "the decayed weights keep 3 mantissa bits, an 8-bit float's, before their product"),
    Mutant("state_accumulator_in_16_bits", "kernels/fwd_pass_state.py",
           "xk * w, acc, B.dtype)",
           "xk * w, acc, B.dtype).astype(ct.bfloat16)"
           ".astype(ct.float32)",
           "the state's accumulator is rounded to bfloat16 after every product (a 16-bit "
           "accumulator)"),
    # float16 inputs: the computed operands scaled into float16's range (kernels.tiles)
    Mutant("float16_operand_unscaled", "kernels/tiles.py",
           "    return (t * up).astype(ct.float16), back\n",
           "    return t.astype(ct.float16), back / back\n",
           "a float16 kernel's computed operand is rounded to float16 unscaled: past 65504 it "
           "is inf"),
    Mutant("float16_scan_unguarded", "kernels/ssd_scan.py",
           "            or_error(errors, flags)\n",
           "            or_error(errors, flags * 0)\n",
           "the float16 scan never asks for its redo: a computed operand past 65504 is inf in y "
           "and the states"),
    Mutant("float16_operand_8_bit", "kernels/tiles.py",
           "    return (t * up).astype(ct.float16), back\n",
           "    return ct.bitcast(ct.bitcast(t * up, ct.int32) & -1048576, ct.float32).astype("
           "ct.float16), back\n",
           "a float16 kernel's scaled operand keeps 3 mantissa bits, an 8-bit float's"),
    Mutant("chunk_state_stored_in_8_bits", "kernels/fwd_pass_state.py",
           "ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)).astype(\n"
           "                         chunk_states.dtype))",
           "ct.bitcast(ct.bitcast(ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)), "
           "ct.int32) & -1048576, ct.float32).astype(chunk_states.dtype))",
           "the chunk states are stored narrower than state_dtype (3 mantissa bits, an 8-bit "
           "float's)"),
    Mutant("chunk_increment_stored_in_8_bits", "kernels/fwd_pass_state.py",
           "ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)).astype(\n"
           "                     chunk_states.dtype))",
           "ct.bitcast(ct.bitcast(ct.reshape(ct.transpose(S), (1, 1, 1, BLOCK_P, BLOCK_N)), "
           "ct.int32) & -1048576, ct.float32).astype(chunk_states.dtype))",
           "with the chunks in parallel, each chunk's increment is stored narrower than "
           "state_dtype"),
    Mutant("state_pass_stored_in_8_bits", "kernels/fwd_pass_state.py",
           "ct.reshape(S, (1, 1, 1, BLOCK_P, BLOCK_N)).astype(chunk_states.dtype))",
           "ct.bitcast(ct.bitcast(ct.reshape(S, (1, 1, 1, BLOCK_P, BLOCK_N)), ct.int32) "
           "& -1048576, ct.float32).astype(chunk_states.dtype))",
           "the pass stores the chunk states narrower than state_dtype (chunks in parallel)"),
    Mutant("decay_exponent_in_16_bits", "kernels/compute_out.py",
           "LT = ct.where(keep, ct.exp2(ct.minimum(a_ts[i_k] - a_s, 0.0)), 0.0)",
           "LT = ct.where(keep, ct.exp2(ct.minimum((a_ts[i_k] - a_s).astype(ct.bfloat16)"
           ".astype(ct.float32), 0.0)), 0.0)",
           "the in-chunk decay's exponent is taken in bfloat16"),
    # the arrays as callers lay them out (properties.strategies.LAYOUTS) and the weights in
    # the activations' 16-bit dtype (contract.weight_dtypes)
    Mutant("strides_lost", "kernels/plan.py",
           "        arrays = {name: getattr(call, name) for name in INPUTS}\n",
           "        arrays = {name: (lambda a: a if a is None or min(a.strides) < 0 else\n"
           "            __import__(\"numpy\").lib.stride_tricks.as_strided(a, strides=tuple(\n"
           "                a.itemsize * __import__(\"math\").prod(a.shape[k + 1:])\n"
           "                for k in range(a.ndim))))(getattr(call, name)) for name in INPUTS}\n",
           "a strided view passed on as if C-contiguous: the kernels read the elements that follow "
           "its first in memory (a projection's next columns, a slice's next row, the next token "
           "of a token-major view)"),
    Mutant("narrow_dt_unwidened", "kernels/chunk_cumsum.py",
           "v = ct.minimum(ct.maximum(v, DT_MIN), DT_MAX)",
           "v = ct.minimum(ct.maximum(v, DT_MIN), DT_MAX).astype(dt.dtype).astype(ct.float32)",
           "chunk_cumsum keeps the processed dt (bias, softplus, clamp) in dt's own dtype: a "
           "16-bit dt's step sizes, and so every decay, rounded to 16 bits"),
    # memory a kernel reads that no program wrote (kernels.interpreter.track_writes names it)
    Mutant("cumsum_padding_unwritten", "kernels/chunk_cumsum.py",
           "ct.store(dA_cumsum, (i_b, i_hb, i_c, 0), ct.reshape(ct.transpose(dA), (1, BLOCK_H, 1, "
           "CHUNK)))",
           "ct.scatter(dA_cumsum, (i_b, ct.reshape(i_hb * BLOCK_H + ct.arange(BLOCK_H, "
           "dtype=ct.int32), (1, BLOCK_H)), i_c, t - i_c * CHUNK), dA, mask=t < seqlen)",
           "chunk_cumsum writes dA_cumsum at the real tokens only: a short last chunk's padding, "
           "whose last position the state pass and the scan read as the chunk's decay, holds "
           "whatever the allocation held"),
    Mutant("scan_reads_y_before_writing", "kernels/ssd_scan.py",
           "            # rows past seqlen and columns past headdim are masked by the store; "
           "y has x's",
           "            acc = acc + ct.transpose(ct.reshape(ct.load(\n"
           "                y, (i_b, i_t, i_h, i_p), shape=(1, BLOCK_T, 1, BLOCK_P),\n"
           "                padding_mode=ct.PaddingMode.ZERO), (BLOCK_T, BLOCK_P))"
           ".astype(ct.float32))\n"
           "            # rows past seqlen and columns past headdim are masked by the store; "
           "y has x's",
           "the scan adds y's previous contents to the block's output (as if y held a partial "
           "sum): it reads y before any program wrote it"),
    # the values the kernels check on the device (kernels/errors.py): a check that sees part of
    # the data, an error bit naming the wrong argument, an output a bad value feeds left finite
    Mutant("D_check_first_block_only", "kernels/chunk_cumsum.py",
           "for i_p in range(ct.where(first, ct.cdiv(D.shape[1], BLOCK_DP), 0)):",
           "for i_p in range(ct.where(first, 1, 0)):",
           "chunk_cumsum checks a per-channel D's first 64 channels only: a bad channel past "
           "them makes its y NaN with no error"),
    Mutant("dt_bias_error_named_A", "kernels/chunk_cumsum.py",
           "bad = bad | ct.where(ct.abs(bias) < math.inf, 0, ERROR_DT_BIAS)",
           "bad = bad | ct.where(ct.abs(bias) < math.inf, 0, ERROR_A)",
           "a dt_bias that is not finite is reported as a bad A"),
    Mutant("A_zero_accepted", "kernels/chunk_cumsum.py",
           "bad = ct.where((a_h < 0.0) & (a_h > -math.inf)",
           "bad = ct.where((a_h <= 0.0) & (a_h > -math.inf)",
           "A = 0 passes the device's check: no decay, finite outputs, no error"),
    # the same checks through the launchers alone (chunk_cumsum, ssd_scan, compute_out)
    Mutant("scan_alone_D_unreported", "kernels/ssd_scan.py",
           "(*head, D is not None and check_D, *options, guarded, False)",
           "(*head, False, *options, guarded, False)",
           "ssd_scan alone makes a bad D's y NaN but reports nothing: no error names D"),
    Mutant("compute_out_alone_D_unreported", "kernels/compute_out.py",
           "               D is not None and check_D)", "               False)",
           "compute_out alone makes a bad D's y NaN but reports nothing: no error names D"),
    Mutant("chunk_cumsum_alone_host_check_skips_dt_bias", "kernels/chunk_cumsum.py",
           'values=("A", "dt_bias")', 'values=("A",)',
           "chunk_cumsum alone checks A on the host but not dt_bias: a bad dt_bias is found on "
           "the device only, where the caller asked for an error at once"),
    Mutant("compute_out_alone_host_check_dropped", "kernels/compute_out.py",
           'check_values=check_values, values=("D",))', "check_values=check_values)",
           "compute_out alone never checks D on the host: check_values=True raises nothing"),
    Mutant("varlen_start_check_dropped", "kernels/chunk_cumsum.py",
           "wrong = (end < start) | ((k == 0) & (start != 0)) | ",
           "wrong = (end < start) | ",
           "packed offsets that do not start at 0 pass: the tokens before the first offset keep "
           "whatever y held, and no error names cu_seqlens"),
    Mutant("varlen_end_check_dropped", "kernels/chunk_cumsum.py",
           " | ((k == pairs - 1) & (end != seqlen))", "",
           "packed offsets that end short of seqlen pass: the tokens after the last offset "
           "keep whatever y held, and no error names cu_seqlens"),
    Mutant("varlen_decrease_unchecked", "kernels/chunk_cumsum.py",
           "wrong = (end < start) | ", "wrong = ",
           "packed offsets that decrease pass: two sequences overlap, and their programs store "
           "to the same tokens of y"),
    Mutant("varlen_offsets_checked_by_the_first_block_only", "kernels/chunk_cumsum.py",
           "for i in range(ct.where(first, ct.cdiv(pairs, BLOCK_CU), 0)):",
           "for i in range(ct.where(first, 1, 0)):",
           "chunk_cumsum checks the first 256 packed offsets only: a bad offset past them "
           "passes"),
    Mutant("varlen_steps_through_refused_offsets", "kernels/ssd_varlen.py",
           "bad = (ct.gather(errors, 0) & ERROR_CU_SEQLENS) != 0\n    if HAS_INITIAL_STATES",
           "bad = (ct.gather(errors, 0) & ERROR_CU_SEQLENS) < 0\n    if HAS_INITIAL_STATES",
           "ssd_varlen steps through every sequence whatever chunk_cumsum found: overlapping "
           "sequences store to the same tokens of y"),
    Mutant("D_inf_kept", "kernels/tiles.py",
           "return ct.where(ct.abs(skip) < math.inf, skip, math.nan)",
           "return skip",
           "an infinite D stays infinite in compute_out and the scan: its y is +-inf (NaN only "
           "where x is 0), not NaN"),
    # the plan cache's key (kernels.plan.key): a key blind to something a plan reads hands one
    # signature's plan to another
    Mutant("plan_key_blind_to_strides", "kernels/plan.py",
           "return lambda a: (a.shape, a.strides, a.dtype)",
           "return lambda a: (a.shape, a.dtype)",
           "a call takes the plan of another stride pattern: a layout the kernels cannot read "
           "in place (a reversed view) goes to them uncopied"),
    Mutant("plan_key_blind_to_equal_itemsize", "kernels/plan.py",
           "return lambda a: (a.shape, a.strides, a.dtype)",
           "return lambda a: (a.shape, a.strides, a.dtype.itemsize)",
           "a NumPy array is keyed by its item size, not its dtype: a bfloat16 call takes the "
           "plan of a float16 call of the same layout (past the scan's dstate, float32 chunk "
           "states where bfloat16's are bfloat16)"),
    Mutant("bfloat16_states_by_default_wide", "kernels/call.py",
           'STATE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}',
           'STATE_DTYPES = {"float32": "float32", "bfloat16": "float32", "float16": "float32"}',
           "bfloat16 inputs store float32 chunk states by default: twice the state traffic the "
           "documented default saves"),
    Mutant("float16_states_by_default_narrow", "kernels/call.py",
           'STATE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float32"}',
           'STATE_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "bfloat16"}',
           "float16 inputs store their chunk states in x's dtype by default (float16: past 65504 "
           "they overflow), and a bound read from this default would have loosened with it"),
    Mutant("plan_key_blind_to_options", "kernels/plan.py",
           "            type(c.dt_softplus), c.dt_softplus,\n", "",
           "dt_softplus on takes the plan of dt_softplus off"),
    Mutant("plan_key_blind_to_state_dtype", "kernels/plan.py",
           "            type(c.state_dtype), c.state_dtype,\n", "",
           "a call takes the plan, and so the chunk states' dtype, of another state_dtype"),
    Mutant("plan_key_blind_to_route", "kernels/plan.py",
           "            type(c.route), c.route,\n", "",
           "a call takes the plan, and so the route, of a call that asked for another route"),
    # the forward's routes (kernels.launches.forward_launches): a route asked for and not
    # taken, and what only the chunk states' routes or the batch slices pass between kernels
    Mutant("route_ignored_where_scan_runs", "kernels/launches.py",
           "if route is None and scan_runs(", "if scan_runs(",
           "the scan runs wherever the rules would take it, whatever route the call asked for"),
    Mutant("parallel_route_runs_in_order", "kernels/launches.py",
           'ROUTE_MODES = {"chunks_in_order": "in_order", "chunks_parallel": "parallel_chunks"}',
           'ROUTE_MODES = {"chunks_in_order": "in_order", "chunks_parallel": "in_order"}',
           "the chunks-in-parallel route runs fwd_pass_state's chunks in order: the state pass "
           "and its kernel never run through ssd_forward"),
    Mutant("chunk_route_drops_initial_states", "kernels/launches.py",
           "*fwd_pass_state_launches(a.x, a.B, a.dt_out, a.dA_cumsum, a.initial_states, a.seg,",
           "*fwd_pass_state_launches(a.x, a.B, a.dt_out, a.dA_cumsum, None, a.seg,",
           "the chunk states' routes start every sequence from zero: the initial state reaches "
           "the scan only"),
    Mutant("chunk_route_drops_seq_idx", "kernels/launches.py",
           "return (self.x, self.B, self.C, self.dt_out, self.dA_cumsum, self.chunk_states, "
           "self.D,\n                self.z, self.seg, self.y)",
           "return (self.x, self.B, self.C, self.dt_out, self.dA_cumsum, self.chunk_states, "
           "self.D,\n                self.z, None, self.y)",
           "compute_out runs without seq_idx on the chunk states' routes: a token sees the "
           "earlier segments of its chunk"),
    Mutant("batch_slice_keeps_whole_seg", "kernels/launches.py",
           'BATCH_FIRST = ("x", "dt", "B", "C", "z", "initial_states", "seg", "dt_out",',
           'BATCH_FIRST = ("x", "dt", "B", "C", "z", "initial_states", "dt_out",',
           "a batch slice reads the whole batch's segment ids: the second slice takes the first "
           "rows' seq_idx"),
    Mutant("plan_key_blind_to_dt_limit", "kernels/plan.py",
           "            type(c.dt_limit), dt_limit,\n", "",
           "a call takes the plan, and so the clamp, of another dt_limit"),
    Mutant("plan_key_blind_to_check_values", "kernels/plan.py",
           "            type(c.check_values), c.check_values,\n", "",
           "a call takes the plan of another check_values: check_values=True skips the host's "
           "check where a call of False planned first, or the default on NumPy defers it"),
]

BY_NAME = {m.name: m for m in CATALOGUE}


def check_applies(mutant: Mutant, root: Path = REPO) -> str:
    """The source of the mutant's file under `root`; ValueError unless its text occurs there
    exactly once (a drifted kernel source must fail loudly, not test nothing)."""
    source = (root / mutant.path).read_text()
    count = source.count(mutant.old)
    if count != 1:
        raise ValueError(f"mutant {mutant.name}: its text occurs {count} times in {mutant.path} "
                         f"(must be exactly once): {mutant.old!r}")
    return source


def apply(mutant: Mutant, root: Path):
    """Apply `mutant` to the tree at `root`."""
    source = check_applies(mutant, root)
    (root / mutant.path).write_text(source.replace(mutant.old, mutant.new))


def copy_tree(dest: Path):
    """Copy the working tree's files (tracked and untracked, not ignored) to `dest`."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, check=True, capture_output=True, text=True).stdout.split()
    for rel in files:
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def mutated_tree(mutant: Mutant) -> Path:
    """A temporary copy of the working tree with `mutant` applied (the caller removes it)."""
    root = Path(tempfile.mkdtemp(prefix=f"mutant-{mutant.name}-"))
    copy_tree(root)
    apply(mutant, root)
    return root


def python_in(root: Path, module_args: list[str], *, capture: bool = True,
              **kwargs) -> subprocess.CompletedProcess:
    """`python <module_args>` with `root`'s packages first on the path (before the installed
    ones and the caller's PYTHONPATH, which stays after them: packages installed there, e.g. a
    cuda-tile unpacked to a folder, are still found)."""
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *inherited]),
               **kwargs.pop("env", {}))
    return subprocess.run([sys.executable, *module_args], cwd=root, env=env,
                          capture_output=capture, text=True, **kwargs)


def run_planted(name: str, module_args: list[str]) -> int:
    """Run `python <module_args>` in a copy of the tree with mutant `name` planted (the fuzzer
    and the replayer demonstrate themselves on a known bug this way); its exit status."""
    root = mutated_tree(BY_NAME[name])
    try:
        return python_in(root, module_args, capture=False).returncode
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Result:
    mutant: Mutant
    killed_by: list[tuple[str, str]]  # (test, first line of its failure)
    passed: int
    seconds: float
    error: str = ""


def run_mutant(mutant: Mutant, timeout: float = 1200, first: bool = False) -> Result:
    """Run the property suite on the interpreter against `mutant`; which tests fail (with
    `first`, the suite stops at the first)."""
    start = time.time()
    root = mutated_tree(mutant)
    try:
        report = root / "junit.xml"
        proc = python_in(root, ["-m", "pytest", "-m", "properties", "--backend", "interpreter",
                                "-p", "no:cacheprovider", "-q", f"--junitxml={report}",
                                *(["-x"] if first else [])],
                         env={"HYPOTHESIS_PROFILE": "mutants"}, timeout=timeout)
        if not report.exists():
            return Result(mutant, [], 0, time.time() - start,
                          error=(proc.stdout + proc.stderr)[-2000:])
        killed, passed = [], 0
        for case in ET.parse(report).iter("testcase"):
            failure = case.find("failure")
            if failure is None:
                failure = case.find("error")
            if failure is None:
                passed += case.find("skipped") is None
                continue
            message = (failure.get("message") or "").strip().splitlines()
            killed.append((case.get("name"), message[0][:160] if message else ""))
        return Result(mutant, killed, passed, time.time() - start)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def format_report(results: list[Result], header: str) -> str:
    lines = [header, ""]
    for r in results:
        status = "KILLED" if r.killed_by else "SURVIVED"
        lines.append(f"{r.mutant.name}: {status} ({len(r.killed_by)} tests fail, {r.passed} pass, "
                     f"{r.seconds:.0f} s)")
        lines.append(f"    {r.mutant.path}: {r.mutant.bug}")
        for test, message in r.killed_by:
            lines.append(f"    killed by {test}: {message}")
        if r.error:
            lines.append(f"    pytest produced no report: {r.error}")
    killed = sum(bool(r.killed_by) for r in results)
    lines += ["", f"{killed} of {len(results)} mutants killed"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=sorted(BY_NAME), help="mutants to run")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run in parallel")
    parser.add_argument("--report", type=Path, default=REPORT)
    parser.add_argument("--first", action="store_true",
                        help="stop each mutant's suite at its first failing test (faster; the "
                             "report then names one killer per mutant)")
    args = parser.parse_args(argv)
    mutants = [BY_NAME[n] for n in args.only] if args.only else CATALOGUE
    for m in mutants:
        check_applies(m)
    start = time.time()
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda m: run_mutant(m, first=args.first), mutants))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    header = (f"Mutant report: the property suite (pytest -m properties, HYPOTHESIS_PROFILE=mutants"
              f" = the ci profile's examples without shrinking) on the CPU interpreter against "
              f"{len(mutants)} seeded kernel bugs; kernel source at commit {commit} "
              f"(+ working tree); {time.time() - start:.0f} s with {args.jobs} jobs"
              + ("; each suite stopped at its first failing test (--first)." if args.first
                 else "."))
    text = format_report(results, header)
    args.report.write_text(text)
    print(text)
    return 0 if all(r.killed_by for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
