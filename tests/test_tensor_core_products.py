"""Every matrix product of the kernels is a tensor-core product (TF32, bf16 or fp16 operands).

An fp32 `ct.mma` whose operands were not cast to `ct.tfloat32` is correct to the last bit, so no
error bound can catch it, but it runs in true fp32 on the GPU, 28x slower (spec, "cuTile facts").
The CPU cannot time it; the interpreter can see it: it records every product's operand dtypes.
Part of the property suite, so the review gate and the mutant catalogue (tf32_cast_dropped) use it.
"""

import pytest

import cuda.tile as ct

from kernels import chunk_cumsum, compute_out, fwd_pass_state, ssd_forward
from kernels.arrays import launch_dims
from kernels.compute_out import LAYOUTS, compute_out_choices, rules_choice
from kernels.interpreter import record_mma_operands
from shapes import CASES, Case, make_inputs

TENSOR_CORE_OPERANDS = (ct.tfloat32, ct.bfloat16, ct.float16)


def _forward_and_stages(kw: dict):
    """ssd_forward on the inputs `kw`, then chunk_cumsum and fwd_pass_state by their rules:
    (dt_out, dA_cumsum, chunk_states)."""
    ssd_forward(**kw, return_final_states=True)
    dt_out, dA_cumsum = chunk_cumsum(kw["dt"], kw["A"], kw["chunk_size"], kw.get("dt_bias"),
                                     kw.get("dt_softplus", False),
                                     kw.get("dt_limit", (0.0, float("inf"))))
    states, _ = fwd_pass_state(kw["x"], kw["B"], dt_out, dA_cumsum, kw.get("initial_states"),
                               kw.get("seq_idx"))
    return dt_out, dA_cumsum, states


@pytest.mark.properties
@pytest.mark.parametrize("layout", LAYOUTS)  # compute_out's two kernels
# chunk256_ragged: several token blocks per chunk and no seq_idx, so the program per chunk
# updates its state (a product the other cases' chunks of one block or seq_idx never reach)
@pytest.mark.parametrize("case", [c.param() for c in CASES
                                  if c.id in ("all_options_chunk16", "headdim_3_dstate_5",
                                              "all_options_chunk256", "chunk256_ragged")])
def test_every_product_has_tensor_core_operands(case, layout):
    """ssd_forward by its rules, then compute_out in `layout` (the rules' choice with the layout
    replaced) where the case can run it (the program per chunk: float32, no seq_idx)."""
    kw = make_inputs(case)
    with record_mma_operands() as products:
        dt_out, dA_cumsum, states = _forward_and_stages(kw)
        arrays = (kw["x"], kw["B"], kw["C"], dt_out, dA_cumsum, states, kw.get("D"), kw.get("z"))
        seg = kw.get("seq_idx")  # stands in for its segment ids: the choices read its shape
        dims = launch_dims(kw["x"], kw["B"], dt_out, seg=seg)
        choice = rules_choice(dims, 1)._replace(layout=layout)
        if choice in compute_out_choices(*arrays, seg, kw["x"]):
            compute_out(*arrays, seg, choice=choice)
    assert products, "ssd_forward ran no matrix product on the interpreter"
    slow = sorted({f"{x} x {y}" for x, y in products
                   if x not in TENSOR_CORE_OPERANDS or y not in TENSOR_CORE_OPERANDS})
    assert not slow, (f"{len(slow)} kind(s) of product with operands not cast for the tensor "
                      f"cores (fp32 operands run in true fp32, 28x slower): {slow}")


@pytest.mark.properties
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", [c.param() for c in CASES
                                  if c.id in ("all_options_chunk16", "chunk256_ragged")])
def test_16_bit_inputs_take_the_products_of_their_dtype(case, dtype):
    """x, B, C, z in `dtype`: every product of the forward, of fwd_pass_state and compute_out,
    and of a packed row takes operands of that dtype (kernels.tiles.mma_product; TF32 runs at
    half their rate): bfloat16 ones rounded, float16 ones rounded in the scan (guarded) and
    scaled into its range first in the other kernels."""
    import ml_dtypes
    import numpy as np
    narrow = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float16)
    kw = {k: v.astype(narrow) if k in ("x", "B", "C", "z") else v
          for k, v in make_inputs(case).items()}
    with record_mma_operands() as products:
        dt_out, dA_cumsum, states = _forward_and_stages(kw)
        compute_out(kw["x"], kw["B"], kw["C"], dt_out, dA_cumsum, states, kw.get("D"),
                    kw.get("z"), kw.get("seq_idx"))
        row = {k: v[:1] if k in ("x", "dt", "B", "C", "z") else v for k, v in kw.items()
               if k not in ("initial_states", "seq_idx")}
        ssd_forward(**row, cu_seqlens=np.array([0, 1, kw["x"].shape[1]], np.int32))
    want = getattr(ct, dtype)
    other = sorted({f"{x} x {y}" for x, y in products if (x, y) != (want, want)})
    assert products and not other, (f"{len(other)} kind(s) of product without {dtype} "
                                     f"operands: {other}")


def _float16_exact(kw: dict, x: int, B: int, C: int, dt: float) -> dict:
    """kw with x, B, C scaled by 2^x, 2^B, 2^C and z, all four float16 values held in float32;
    dt times `dt` (large steps: the weights and the states grow)."""
    import numpy as np
    kw = dict(kw)
    for name, e in (("x", x), ("B", B), ("C", C), ("z", 0)):
        kw[name] = (kw[name] * 2.0 ** e).astype(np.float16).astype(np.float32)
    kw["dt"] = kw["dt"] * dt
    return kw


@pytest.mark.properties
@pytest.mark.parametrize("route", ["chunks_in_order", "chunks_parallel", "packed"])
def test_float16_operands_round_as_tf32(route):
    """float16 inputs in float16's normal range, on the routes whose kernels scale: every
    operand they compute is scaled by a power of two (kernels.tiles.float16_scaled) and rounds
    as TF32 rounds it, so y and the states are bit-identical to those of the same values in
    float32 (TF32 operands), here, where the interpreter accumulates both alike, including
    operands past 65504 (x scaled up: the decayed weights and states pass float16's range, y
    stays inside it)."""
    import numpy as np
    kw = _float16_exact(make_inputs(Case("float16_scaled", 1, 150, 2, 16, 1, 16, 64, D="head",
                                         z=True)), 6, 6, -7, 40.0)
    if route == "packed":
        options = dict(cu_seqlens=np.array([0, 70, 150], np.int32), return_varlen_states=True)
    else:
        options = dict(route=route, return_final_states=True)
    wide_y, wide_states = ssd_forward(**kw, **options)
    narrow = {k: v.astype(np.float16) if k in ("x", "B", "C", "z") else v for k, v in kw.items()}
    with record_mma_operands() as products:
        y, states = ssd_forward(**narrow, **options)
    assert set(products) == {(ct.float16, ct.float16)}, sorted(set(products))
    assert np.abs(wide_states).max() > 65504, "the states stay inside float16's range"
    assert np.isfinite(y).all() and np.isfinite(states).all()
    np.testing.assert_array_equal(states, wide_states)
    np.testing.assert_array_equal(y, wide_y.astype(np.float16))


@pytest.mark.properties
@pytest.mark.parametrize("past_range", [False, True])
def test_float16_segmented_scan_redoes_out_of_range_with_tf32(past_range):
    """The segmented scan in four segments of five chunks (one empty) on float16 inputs: inside
    float16's range all its products are float16; past it (a handed-on state past 65504) the
    second launch hands the states on again, from flags the first left zero, and its outputs
    are bit-identical to the same scan's on float32 inputs."""
    import numpy as np
    from kernels import raise_pending_errors
    from kernels.ssd_scan import Choice, ssd_scan
    kw = _float16_exact(make_inputs(Case("float16_guard", 1, 300, 2, 16, 1, 16, 64, D="head",
                                         z=True)), 8 if past_range else 0, 6, -9, 40.0)
    dt_out, dA_cumsum = chunk_cumsum(kw["dt"], kw["A"], 64)
    four = Choice(1, 1, 64, None, 4)
    run = lambda x, B, C, z, **options: ssd_scan(x, B, C, dt_out, dA_cumsum, D=kw["D"], z=z,
                                                 choice=four, **options)
    wide_y, wide_states = run(kw["x"], kw["B"], kw["C"], kw["z"])
    with record_mma_operands() as products:
        y, states = run(*(kw[k].astype(np.float16) for k in ("x", "B", "C", "z")),
                        check_values=False)
    raise_pending_errors()
    assert np.isfinite(y).all() and np.isfinite(states).all()
    if not past_range:
        assert set(products) == {(ct.float16, ct.float16)}, sorted(set(products))
        return
    assert np.abs(wide_states).max() > 65504, "the states stay inside float16's range"
    assert (ct.tfloat32, ct.tfloat32) in set(products)
    np.testing.assert_array_equal(states, wide_states)
    np.testing.assert_array_equal(y, wide_y.astype(np.float16))


@pytest.mark.properties
@pytest.mark.parametrize("past_range", [False, True])
def test_float16_scan_redoes_out_of_range_with_tf32(past_range):
    """The scan rounds its computed float16 operands unscaled and guards them: inside float16's
    range its products are all float16 and its second launch stores nothing (the outputs are
    the first's, within the fp16 bound: the properties); where a state passes 65504 before the
    last token block (x scaled up further, C down so y stays in range) the second launch
    recomputes y and the states with TF32 operands, bit-identical to float32's here, finite,
    and the note it reads (FLOAT16_RANGE) is raised as no error."""
    import numpy as np
    from kernels import raise_pending_errors
    kw = _float16_exact(make_inputs(Case("float16_guard", 1, 300, 2, 16, 1, 16, 64, D="head",
                                         z=True)), 8 if past_range else 0, 6, -9, 40.0)
    wide_y, wide_states = ssd_forward(**kw, route="scan", return_final_states=True)
    narrow = {k: v.astype(np.float16) if k in ("x", "B", "C", "z") else v for k, v in kw.items()}
    with record_mma_operands() as products:
        y, states = ssd_forward(**narrow, route="scan", return_final_states=True,
                                check_values=False)
    raise_pending_errors()
    assert np.isfinite(y).all() and np.isfinite(states).all()
    if not past_range:
        assert np.abs(wide_states).max() < 2048, "the states pass float16's range"
        assert set(products) == {(ct.float16, ct.float16)}, sorted(set(products))
        return
    assert np.abs(wide_states).max() > 65504, "the states stay inside float16's range"
    assert set(products) == {(ct.float16, ct.float16), (ct.tfloat32, ct.tfloat32)}, \
        sorted(set(products))
    np.testing.assert_array_equal(states, wide_states)
    np.testing.assert_array_equal(y, wide_y.astype(np.float16))
