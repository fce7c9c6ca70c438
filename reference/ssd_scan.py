"""Reference of the ssd_scan stage: y and the final state from dt_out and dA_cumsum, the states
entering the chunks and the outputs from them (the kernel carries the same state token block by
token block; only its rounding differs)."""

from __future__ import annotations

from contract import check_ssd_scan_args
from reference.compute_out import compute_out_ref
from reference.fwd_pass_state import fwd_pass_state_ref


def ssd_scan_ref(x, B, C, dt_out, dA_cumsum, D=None, z=None, initial_states=None, seq_idx=None):
    """(y (batch, seqlen, nheads, headdim), final_states (batch, nheads, headdim, dstate)),
    float64: fwd_pass_state_ref's chunk states fed to compute_out_ref."""
    check_ssd_scan_args(x, B, C, dt_out, dA_cumsum, D=D, z=z, initial_states=initial_states,
                        seq_idx=seq_idx)
    chunk_states, final_states = fwd_pass_state_ref(x, B, dt_out, dA_cumsum, initial_states,
                                                    seq_idx)
    return compute_out_ref(x, B, C, dt_out, dA_cumsum, chunk_states, D, z, seq_idx), final_states
