"""compute_out against its float64 reference on the table of shapes, on both backends."""

import numpy as np
import pytest

import reference as R
from contract import Dims
from kernels import compute_out
from properties.bounds import KAPPA
from shapes import (BACKENDS, CASES, check_within, launch_arg, make_inputs, on_backend,
                    step_options)

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


@pytest.mark.parametrize("dims, dtype, heads", [
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "float32", 2, id="mamba2_2p7b_two_heads"),
    pytest.param(Dims(4, 4096, 64, 64, 8, 64, 128), "float32", 2, id="groups_8_two_heads"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "bfloat16", 1, id="bfloat16_one_head"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "float16", 1, id="float16_one_head"),
    # dstate 256: token blocks of 32, so a chunk of 64 holds two of them
    pytest.param(Dims(1, 512, 4, 64, 1, 256, 64), "float32", 2,
                 id="chunk_of_two_token_blocks_two_heads"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 64), "float32", 1,
                 id="chunk_of_one_token_block_one_head"),
    pytest.param(Dims(1, 512, 6, 64, 2, 64, 256), "float32", 1,
                 id="three_heads_per_group_one_head"),
    pytest.param(Dims(1, 512, 8, 64, 8, 64, 256), "float32", 1, id="one_head_per_group"),
])
def test_a_program_takes_heads_of_one_group(dims, dtype, heads):
    """compute_out's programs each take `heads` heads: with float32 inputs a power of two
    dividing the heads of a group (they share C B^T), one when the chunk is a single token
    block; one with narrow inputs."""
    from types import SimpleNamespace
    from kernels.compute_out import compute_out_launch
    a = lambda name: SimpleNamespace(shape=dims.shape(name), dtype=dtype)
    kernel, grid, args = compute_out_launch(a("x"), a("B"), a("C"), a("dt_out"), a("dA_cumsum"),
                                            a("chunk_states"), None, None, None, a("y"))
    assert launch_arg(kernel, args, "HEADS") == heads
    assert grid[1] * heads == dims.nheads
