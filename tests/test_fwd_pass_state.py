"""fwd_pass_state against its float64 reference on the table of shapes, on both backends."""

import numpy as np
import pytest

import reference as R
from kernels import fwd_pass_state
from kernels.arrays import sm_count_as
from kernels.fwd_pass_state import MODE_SM_COUNTS, modes
from kernels.ssd_forward import batch_parts_as
from properties.bounds import KAPPA
from shapes import (BACKENDS, CASES, check_within, launch_arg, make_inputs, on_backend,
                    recorded_launches, step_options)

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")


def stage_inputs(case):
    """x, B (fp32 random) and the reference's dt_out, dA_cumsum rounded to fp32: the kernel and
    the reference then read identical inputs."""
    kw = make_inputs(case)
    dt_out, dA_cumsum = R.chunk_cumsum_ref(kw["dt"], kw["A"], case.chunk_size, **step_options(kw))
    return kw, dt_out.astype(np.float32), dA_cumsum.astype(np.float32)


# every case in order, and with its chunks in parallel where its chunk size allows that mode
CASE_MODES = [pytest.param(c, mode, id=f"{c.id}-{mode}", marks=c.marks)
              for c in CASES for mode in modes(c.chunk_size)]
MODE_KERNELS = {"in_order": ["_fwd_pass_state_kernel"],
                "parallel_chunks": ["_fwd_pass_state_kernel", "_state_pass_kernel"]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, mode", CASE_MODES)
def test_fwd_pass_state_matches_reference(case, mode, backend, request):
    """Each mode the launcher may choose at the case's chunk size, whatever device runs it."""
    kw, dt_out, dA_cumsum = stage_inputs(case)
    inputs = dict(x=kw["x"], B=kw["B"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                  initial_states=kw.get("initial_states"), seq_idx=kw.get("seq_idx"))
    states_ref, final_ref = R.fwd_pass_state_ref(**inputs)
    states_M, final_M = R.fwd_pass_state_magnitude(**inputs)
    with sm_count_as(MODE_SM_COUNTS[mode]), recorded_launches() as launches:
        states, final = fwd_pass_state(**on_backend(backend, inputs))
    assert [name for name, _, _ in launches] == MODE_KERNELS[mode]
    assert states.shape == states_ref.shape and final.shape == final_ref.shape
    check_within("chunk_states", states, states_ref, states_M, KAPPA, request.node.name)
    check_within("final_states", final, final_ref, final_M, KAPPA, request.node.name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case_id, programs_vs_sms, parallel, block_k", [
    pytest.param("all_options_chunk256", 0, False, 128, id="as_many_programs_as_sms_in_order"),
    pytest.param("all_options_chunk256", 1, True, 128, id="fewer_programs_than_sms_parallel"),
    pytest.param("base_chunk64", 1, False, 64, id="fewer_programs_than_sms_chunk64_in_order"),
])
def test_grid_size_picks_the_mode(case_id, programs_vs_sms, parallel, block_k, backend, request):
    """The launcher runs the chunks in parallel when the sequential grid has fewer programs than
    the device has SMs and the chunks hold 128 tokens or more (fwd_pass_state and ssd_forward
    pass the device's count), else in order: the launches recorded, and the results against the
    reference."""
    from kernels import ssd_forward
    case = next(c for c in CASES if c.id == case_id)
    kw, dt_out, dA_cumsum = stage_inputs(case)
    inputs = dict(x=kw["x"], B=kw["B"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                  initial_states=kw.get("initial_states"), seq_idx=kw.get("seq_idx"))
    programs = case.batch * case.nheads  # headdim and dstate fit one program's slice
    # the batch whole: its slices choose alike (test_ssd_forward.py) but launch twice
    with sm_count_as(programs + programs_vs_sms), recorded_launches() as launches, \
            batch_parts_as(1):
        states, final = fwd_pass_state(**on_backend(backend, inputs))
        ssd_forward(**on_backend(backend, kw), return_final_states=True)
    kernels = MODE_KERNELS["parallel_chunks" if parallel else "in_order"]
    names = [name for name, _, _ in launches]
    assert names == kernels + ["_chunk_cumsum_kernel"] + kernels + ["_compute_out_kernel"]
    for name, kernel, args in launches:
        if name == "_fwd_pass_state_kernel":
            assert launch_arg(kernel, args, "BLOCK_K") == block_k
            assert launch_arg(kernel, args, "PARALLEL_CHUNKS") == parallel
    states_ref, final_ref = R.fwd_pass_state_ref(**inputs)
    states_M, final_M = R.fwd_pass_state_magnitude(**inputs)
    check_within("chunk_states", states, states_ref, states_M, KAPPA, request.node.name)
    check_within("final_states", final, final_ref, final_M, KAPPA, request.node.name)
