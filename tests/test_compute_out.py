"""compute_out against its float64 reference on the table of shapes, on both backends."""

import numpy as np
import pytest

import reference as R
from contract import Dims
from kernels.arrays import launch_dims
from kernels import compute_out
from kernels.compute_out import LAYOUTS, compute_out_choices, rules_choice
from properties.bounds import KAPPA
from shapes import (BACKENDS, CASES, check_within, launch_arg, make_inputs, on_backend,
                    recorded_launches, step_options)

pytestmark = pytest.mark.usefixtures("nan_filled_outputs")

LAYOUT_KERNELS = {"token_blocks": "_compute_out_kernel",
                  "whole_chunks": "_compute_out_chunk_kernel"}
H200_SMS = 132


def stand_in_launch(dims: Dims, dtype: str, seq_idx: bool = False, choice=None):
    """compute_out_launch's (kernel, grid, args) for stand-in arrays (a shape and a dtype, no
    data) of these dimensions, D and z off, on an H200's SM count."""
    from types import SimpleNamespace
    from kernels.compute_out import compute_out_launch
    a = lambda name: SimpleNamespace(shape=dims.shape(name), dtype=dtype)
    seg = SimpleNamespace(shape=dims.shape("seq_idx"), dtype="int32") if seq_idx else None
    return compute_out_launch(a("x"), a("B"), a("C"), a("dt_out"), a("dA_cumsum"),
                              a("chunk_states"), None, None, seg, a("y"), H200_SMS, choice=choice)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case, layout", [
    pytest.param(c, layout, id=f"{c.id}-{layout}", marks=c.marks)
    for c in CASES for layout in LAYOUTS])
def test_compute_out_matches_reference(case, layout, backend, request):
    """Both program layouts on every case (the launcher picks one by shape, `choice` forces
    each: the rules' choice with the layout replaced), where the case can run it; where it
    cannot (narrow inputs, seq_idx: no program per chunk), the choice is refused before any
    launch."""
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
    seg = inputs["seq_idx"]  # stands in for its segment ids: the choices read its shape
    choice = rules_choice(launch_dims(inputs["x"], inputs["B"], dt_out, seg=seg),
                          H200_SMS)._replace(layout=layout)
    runnable = compute_out_choices(*(inputs[n] for n in (
        "x", "B", "C", "dt_out", "dA_cumsum", "chunk_states", "D", "z")), seg, inputs["x"])
    with recorded_launches() as launches:
        if choice not in runnable:
            with pytest.raises(ValueError, match="^choice: "):
                compute_out(**on_backend(backend, inputs), choice=choice)
            assert not launches and layout == "whole_chunks"
            return
        y = compute_out(**on_backend(backend, inputs), choice=choice)
    assert [name for name, _, _ in launches] == [LAYOUT_KERNELS[layout]]
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
    kernel, grid, args = stand_in_launch(dims, dtype)
    assert launch_arg(kernel, args, "HEADS") == heads
    assert grid[1] * heads == dims.nheads


@pytest.mark.parametrize("dims, dtype, layout, seq_idx", [
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "float32", "whole_chunks", False,
                 id="mamba2_2p7b"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "float32", "token_blocks", True,
                 id="mamba2_2p7b_seq_idx"),
    pytest.param(Dims(1, 2**24, 128, 64, 1, 128, 256), "float32", "token_blocks", False,
                 id="int64_indices"),
    pytest.param(Dims(1, 16384, 80, 64, 1, 128, 256), "float32", "whole_chunks", False,
                 id="long_seq"),
    pytest.param(Dims(8, 2048, 24, 64, 1, 100, 256), "float32", "whole_chunks", False,
                 id="dstate_100_in_a_tile_of_128"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 256), "bfloat16", "token_blocks", False,
                 id="bfloat16_one_head"),
    pytest.param(Dims(4, 4096, 81, 64, 1, 128, 256), "float32", "token_blocks", False,
                 id="odd_heads_per_group_one_head"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 128, 128), "float32", "token_blocks", False,
                 id="chunk128_two_token_blocks"),
    pytest.param(Dims(4, 4096, 64, 64, 8, 64, 128), "float32", "token_blocks", False,
                 id="groups_8"),
    pytest.param(Dims(4, 4096, 80, 64, 1, 64, 256), "float32", "token_blocks", False,
                 id="dstate_64_not_measured"),
    pytest.param(Dims(1, 4096, 8, 64, 1, 256, 256), "float32", "token_blocks", False,
                 id="dstate_256"),
    # the batch-1 sweep's shapes on the H200's 132 SMs: 160 programs per chunk at 1024 tokens
    # (under two per SM), 320 at 2048
    pytest.param(Dims(1, 1024, 80, 64, 1, 128, 256), "float32", "token_blocks", False,
                 id="under_two_programs_per_sm"),
    pytest.param(Dims(1, 2048, 80, 64, 1, 128, 256), "float32", "whole_chunks", False,
                 id="two_programs_per_sm_or_more"),
])
def test_shape_picks_the_layout(dims, dtype, layout, seq_idx):
    """A program per chunk where it was measured faster (two heads per program, four token
    blocks or more per chunk, a dstate tile of 128, two programs per SM or more; int32 indices,
    no seq_idx), else a program per token block (an H200's 132 SMs)."""
    kernel, grid, args = stand_in_launch(dims, dtype, seq_idx)
    assert kernel._pyfunc.__name__ == LAYOUT_KERNELS[layout]
    tokens = dims.chunk_size if layout == "whole_chunks" else launch_arg(kernel, args, "BLOCK_T")
    assert grid[0] == -(-dims.seqlen // tokens)  # headdim 64: one headdim block


@pytest.mark.parametrize("dtype, seq_idx", [
    pytest.param("float16", False, id="float16"),
    pytest.param("bfloat16", False, id="bfloat16"),
    pytest.param("float32", True, id="seq_idx"),
])
def test_whole_chunks_is_refused_where_it_has_no_kernel(dtype, seq_idx):
    """The program per chunk exists for float32 without seq_idx only: asked for elsewhere, the
    launch is refused (never a silent fallback), and the rules take token blocks."""
    from kernels.compute_out import Choice
    dims = Dims(4, 4096, 80, 64, 1, 128, 256)
    with pytest.raises(ValueError, match="^choice: "):
        stand_in_launch(dims, dtype, seq_idx, choice=Choice("whole_chunks", 1, 2))
    kernel, _, _ = stand_in_launch(dims, dtype, seq_idx)
    assert kernel._pyfunc.__name__ == LAYOUT_KERNELS["token_blocks"]
