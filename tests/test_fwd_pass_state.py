"""fwd_pass_state against its float64 reference on the table of shapes, on both backends."""

import numpy as np
import pytest

import reference as R
from kernels import fwd_pass_state
from kernels.arrays import launch_dims
from kernels.fwd_pass_state import MODES, fwd_pass_state_launches, rules_choice
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


# every case in order and with its chunks in parallel (the rules take that mode from 128-token
# chunks; a given choice at any chunk size)
CASE_MODES = [pytest.param(c, mode, id=f"{c.id}-{mode}", marks=c.marks)
              for c in CASES for mode in MODES]
MODE_KERNELS = {"in_order": ["_fwd_pass_state_kernel"],
                "parallel_chunks": ["_fwd_pass_state_kernel", "_state_pass_kernel"]}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, mode", CASE_MODES)
def test_fwd_pass_state_matches_reference(case, mode, backend, request):
    """Each mode, whatever device runs it (the rules' choice with the mode replaced)."""
    kw, dt_out, dA_cumsum = stage_inputs(case)
    inputs = dict(x=kw["x"], B=kw["B"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                  initial_states=kw.get("initial_states"), seq_idx=kw.get("seq_idx"))
    states_ref, final_ref = R.fwd_pass_state_ref(**inputs)
    states_M, final_M = R.fwd_pass_state_magnitude(**inputs)
    choice = rules_choice(launch_dims(kw["x"], kw["B"], dt_out), 1)._replace(mode=mode)
    with recorded_launches() as launches:
        states, final = fwd_pass_state(**on_backend(backend, inputs), choice=choice)
    assert [name for name, _, _ in launches] == MODE_KERNELS[mode]
    assert states.shape == states_ref.shape and final.shape == final_ref.shape
    check_within("chunk_states", states, states_ref, states_M, KAPPA, request.node.name)
    check_within("final_states", final, final_ref, final_M, KAPPA, request.node.name)


@pytest.mark.parametrize("case_id, programs_vs_sms, parallel, block_k", [
    pytest.param("all_options_chunk256", 0, False, 128, id="as_many_programs_as_sms_in_order"),
    pytest.param("all_options_chunk256", 1, True, 128, id="fewer_programs_than_sms_parallel"),
    pytest.param("base_chunk64", 1, False, 64, id="fewer_programs_than_sms_chunk64_in_order"),
])
def test_grid_size_picks_the_mode(case_id, programs_vs_sms, parallel, block_k):
    """The launcher runs the chunks in parallel when the sequential grid has fewer programs than
    the device has SMs and the chunks hold 128 tokens or more, else in order: fwd_pass_state's
    launches on a device of one SM more than its programs (or as many), and those of
    ssd_forward's plan (the batch whole) where its forward runs the three kernels: on twice as
    many SMs (float32 takes the scan from 0.7 of a wave, kernels.ssd_scan.scan_runs)."""
    from contract import Dims
    from kernels.launches import ForwardArrays, part_launches
    from tests.test_compile import ArraySpec
    case = next(c for c in CASES if c.id == case_id)
    dims = Dims(case.batch, case.seqlen, case.nheads, case.headdim, case.ngroups, case.dstate,
                case.chunk_size)
    a = lambda name: ArraySpec(dims.shape(name))
    programs = case.batch * case.nheads  # headdim, dstate: one slice
    alone = fwd_pass_state_launches(a("x"), a("B"), a("dt_out"), a("dA_cumsum"), None, None,
                                    a("chunk_states"), a("final_states"),
                                    programs + programs_vs_sms)
    arrays = ForwardArrays(a("x"), a("dt"), a("A"), a("B"), a("C"), None, None, None, None, None,
                           False, (0.0, float("inf")), a("dt_out"), a("dA_cumsum"),
                           a("chunk_states"), a("final_states"), a("y"))
    (forward,) = part_launches(arrays, programs * (1 + programs_vs_sms), 1)
    kernels = MODE_KERNELS["parallel_chunks" if parallel else "in_order"]
    name = lambda launch: launch[0]._pyfunc.__name__
    assert [name(launch) for launch in alone] == kernels
    if programs_vs_sms == 0:  # a wave of scan programs: the forward is the scan
        assert [name(launch) for launch in forward] == ["_chunk_cumsum_kernel",
                                                        "_ssd_scan_kernel"]
        forward = []
    else:
        assert [name(launch) for launch in forward] == (
            ["_chunk_cumsum_kernel"] + kernels + ["_compute_out_kernel"])
    for kernel, _, args in alone + forward[1:-1]:
        if kernel._pyfunc.__name__ == "_fwd_pass_state_kernel":
            assert launch_arg(kernel, args, "BLOCK_K") == block_k
            assert launch_arg(kernel, args, "PARALLEL_CHUNKS") == parallel


@pytest.mark.parametrize("choice", [
    pytest.param(dict(mode="in_parallel"), id="mode_not_declared"),
    pytest.param(dict(block_k=96), id="block_k_not_declared"),
    pytest.param(dict(occupancy=3), id="occupancy_not_declared"),
])
def test_a_choice_that_cannot_run_is_refused(choice):
    case = next(c for c in CASES if c.id == "base_chunk64")
    kw, dt_out, dA_cumsum = stage_inputs(case)
    rules = rules_choice(launch_dims(kw["x"], kw["B"], dt_out), 1)
    with recorded_launches() as launches, pytest.raises(ValueError, match="^choice: "):
        fwd_pass_state(kw["x"], kw["B"], dt_out, dA_cumsum, choice=rules._replace(**choice))
    assert not launches
