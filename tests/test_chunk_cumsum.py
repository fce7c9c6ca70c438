"""chunk_cumsum against its float64 reference on the table of shapes, on both backends."""

import numpy as np
import pytest

import reference as R
from kernels import chunk_cumsum
from properties.bounds import chunk_cumsum_bound
from properties.runner import to_host
from shapes import BACKENDS, CASES, make_inputs, on_backend, step_options

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [c.param() for c in CASES])
def test_chunk_cumsum_matches_reference(case, backend):
    kw = make_inputs(case)
    steps = step_options(kw)
    dt_ref, dA_ref = R.chunk_cumsum_ref(kw["dt"], kw["A"], case.chunk_size, **steps)
    args = on_backend(backend, dict(dt=kw["dt"], A=kw["A"], **steps))
    dt_out, dA_cumsum = chunk_cumsum(chunk_size=case.chunk_size, **args)
    dt_out, dA_cumsum = to_host(dt_out), to_host(dA_cumsum)
    assert dt_out.shape == dt_ref.shape and dA_cumsum.shape == dA_ref.shape
    dt_bound, dA_bound = chunk_cumsum_bound(dt_ref, dA_ref, case.chunk_size)
    assert np.all(np.abs(dt_out - dt_ref) <= dt_bound), np.max(np.abs(dt_out - dt_ref) / dt_ref)
    assert np.all(np.abs(dA_cumsum - dA_ref) <= dA_bound)
    # the padding of a short last chunk: dt_out exactly 0. dA_cumsum is flat there in the
    # reference and within the cumsum bound of it above; not bitwise flat on the GPU, whose
    # parallel scan groups the (zero) additions differently from position to position.
    pad = case.seqlen % case.chunk_size
    if pad:
        assert np.all(dt_out[:, :, -1, pad:] == 0.0)
