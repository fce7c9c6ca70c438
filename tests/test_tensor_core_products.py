"""Every matrix product of the kernels is a tensor-core product (TF32, bf16 or fp16 operands).

An fp32 `ct.mma` whose operands were not cast to `ct.tfloat32` is correct to the last bit, so no
error bound can catch it, but it runs in true fp32 on the GPU, 28x slower (spec, "cuTile facts").
The CPU cannot time it; the interpreter can see it: it records every product's operand dtypes.
Part of the property suite, so the review gate and the mutant catalogue (tf32_cast_dropped) use it.
"""

import pytest

import cuda.tile as ct

from kernels import chunk_cumsum, compute_out, fwd_pass_state, ssd_forward, ssd_scan
from kernels.arrays import launch_dims
from kernels.compute_out import LAYOUTS, compute_out_choices, rules_choice
from kernels.interpreter import record_mma_operands
from kernels.ssd_scan import FLOAT16_CB_MIN_DSTATE
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
@pytest.mark.parametrize("dtype, operand", [("bfloat16", "bfloat16"), ("float16", "tfloat32")])
@pytest.mark.parametrize("case", [c.param() for c in CASES
                                  if c.id in ("all_options_chunk16", "chunk256_ragged")])
def test_16_bit_inputs_take_the_products_of_their_dtype(case, dtype, operand):
    """x, B, C, z in `dtype`: every product of the forward, of fwd_pass_state and compute_out,
    and of a packed row takes `operand` operands (kernels.tiles.mma_operand): bfloat16 ones for
    bfloat16 (TF32 runs at half their rate), TF32 ones for float16 (a float16 operand may
    overflow where float32 does not)."""
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
    want = getattr(ct, operand)
    assert (want, want) in products, f"no product on {operand} operands: {sorted(products)}"
    # C . B^T takes the 16-bit inputs as they are (their products exact in float32)
    other = sorted({f"{x} x {y}" for x, y in products
                    if (x, y) not in ((want, want), (getattr(ct, dtype),) * 2)})
    assert not other, f"{len(other)} kind(s) of product without {operand} operands: {other}"


@pytest.mark.properties
@pytest.mark.parametrize("dstate, float16_operands", [
    pytest.param(FLOAT16_CB_MIN_DSTATE, True, id="dstate_tile_at_the_rule"),
    pytest.param(FLOAT16_CB_MIN_DSTATE // 2, False, id="dstate_tile_below_the_rule")])
def test_float16_scan_c_b_operands_follow_the_dstate_rule(dstate, float16_operands):
    """float16 inputs: the scan's C . B^T takes float16 operands from a dstate tile of
    FLOAT16_CB_MIN_DSTATE (there TF32 ones spill and slow the scan down), TF32 ones below
    (benchmarks/DECISIONS.md "float16 products"). No bound can tell them apart: the products are
    exact either way."""
    import numpy as np
    kw = make_inputs(Case("scan_float16", 1, 70, 2, 16, 1, dstate, 64))
    x, B, C = (kw[k].astype(np.float16) for k in ("x", "B", "C"))
    dt_out, dA_cumsum = chunk_cumsum(kw["dt"], kw["A"], kw["chunk_size"])
    with record_mma_operands() as products:
        ssd_scan(x, B, C, dt_out, dA_cumsum)
    assert ((ct.float16, ct.float16) in products) == float16_operands, sorted(set(products))
