"""compute_out against its float64 reference on the table of shapes, on both backends."""

import numpy as np
import pytest

import reference as R
from kernels import compute_out
from properties.bounds import KAPPA
from shapes import BACKENDS, CASES, check_within, make_inputs, on_backend, step_options

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_compute_out_matches_reference(case, backend, request):
    kw = make_inputs(case)
    dt_out, dA_cumsum = (a.astype(np.float32) for a in
                         R.chunk_cumsum_ref(kw["dt"], kw["A"], case.chunk_size, **step_options(kw)))
    chunk_states, _ = R.fwd_pass_state_ref(kw["x"], kw["B"], dt_out, dA_cumsum,
                                           kw.get("initial_states"), kw.get("seq_idx"))
    inputs = dict(x=kw["x"], B=kw["B"], C=kw["C"], dt_out=dt_out, dA_cumsum=dA_cumsum,
                  chunk_states=chunk_states.astype(np.float32), D=kw.get("D"), z=kw.get("z"),
                  seq_idx=kw.get("seq_idx"))
    y_ref = R.compute_out_ref(**inputs)
    M = R.compute_out_magnitude(**inputs)
    y = compute_out(**on_backend(backend, inputs))
    assert y.shape == y_ref.shape
    check_within("y", y, y_ref, M, KAPPA, request.node.name)
