"""fwd_pass_state against its float64 reference on the table of shapes, on both backends."""

import numpy as np
import pytest

import reference as R
from kernels import fwd_pass_state
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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_fwd_pass_state_matches_reference(case, backend, request):
    kw, dt_out, dA_cumsum = stage_inputs(case)
    inputs = dict(x=kw["x"], B=kw["B"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                  initial_states=kw.get("initial_states"), seq_idx=kw.get("seq_idx"))
    states_ref, final_ref = R.fwd_pass_state_ref(**inputs)
    states_M, final_M = R.fwd_pass_state_magnitude(**inputs)
    states, final = fwd_pass_state(**on_backend(backend, inputs))
    assert states.shape == states_ref.shape and final.shape == final_ref.shape
    check_within("chunk_states", states, states_ref, states_M, KAPPA, request.node.name)
    check_within("final_states", final, final_ref, final_M, KAPPA, request.node.name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("sm_count, block_k", [
    pytest.param(1, 128, id="grid_over_sm_count_products_of_128"),
    pytest.param(10**6, 64, id="grid_under_sm_count_products_of_64"),
])
def test_chunk256_products_follow_the_grid_size(sm_count, block_k, backend, request, monkeypatch):
    """At chunk 256 the launcher takes products of 128 tokens when the grid outnumbers the
    device's SMs, else of 64 (fwd_pass_state and ssd_forward pass the device's count): both
    paths against the reference, whatever the SM count of the device the tests run on."""
    from kernels import ssd_forward
    from kernels.arrays import Backend
    case = next(c for c in CASES if c.id == "all_options_chunk256")
    kw, dt_out, dA_cumsum = stage_inputs(case)
    inputs = dict(x=kw["x"], B=kw["B"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                  initial_states=kw.get("initial_states"), seq_idx=kw.get("seq_idx"))
    monkeypatch.setattr(Backend, "sm_count", property(lambda self: sm_count))
    with recorded_launches() as launches:
        states, final = fwd_pass_state(**on_backend(backend, inputs))
        ssd_forward(**on_backend(backend, kw), return_final_states=True)
    block_ks = [launch_arg(kernel, args, "BLOCK_K") for name, kernel, args in launches
                if name == "_fwd_pass_state_kernel"]
    assert block_ks == [block_k, block_k]  # fwd_pass_state's, then ssd_forward's
    states_ref, final_ref = R.fwd_pass_state_ref(**inputs)
    states_M, final_M = R.fwd_pass_state_magnitude(**inputs)
    check_within("chunk_states", states, states_ref, states_M, KAPPA, request.node.name)
    check_within("final_states", final, final_ref, final_M, KAPPA, request.node.name)
