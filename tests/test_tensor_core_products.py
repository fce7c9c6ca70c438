"""Every matrix product of the kernels is a tensor-core product (TF32, bf16 or fp16 operands).

An fp32 `ct.mma` whose operands were not cast to `ct.tfloat32` is correct to the last bit, so no
error bound can catch it, but it runs in true fp32 on the GPU, 28x slower (spec, "cuTile facts").
The CPU cannot time it; the interpreter can see it: it records every product's operand dtypes.
Part of the property suite, so the review gate and the mutant catalogue (tf32_cast_dropped) use it.
"""

import pytest

import cuda.tile as ct

from kernels import ssd_forward
from kernels.compute_out import LAYOUTS, layout_as
from kernels.interpreter import record_mma_operands
from shapes import CASES, make_inputs

TENSOR_CORE_OPERANDS = (ct.tfloat32, ct.bfloat16, ct.float16)


@pytest.mark.properties
@pytest.mark.parametrize("layout", LAYOUTS)  # compute_out's two kernels
# chunk256_ragged: several token blocks per chunk and no seq_idx, so the program per chunk
# updates its state (a product the other cases' chunks of one block or seq_idx never reach)
@pytest.mark.parametrize("case", [c.param() for c in CASES
                                  if c.id in ("all_options_chunk16", "headdim_3_dstate_5",
                                              "all_options_chunk256", "chunk256_ragged")])
def test_every_product_has_tensor_core_operands(case, layout):
    with layout_as(layout), record_mma_operands() as products:
        ssd_forward(**make_inputs(case), return_final_states=True)
    assert products, "ssd_forward ran no matrix product on the interpreter"
    slow = sorted({f"{x} x {y}" for x, y in products
                   if x not in TENSOR_CORE_OPERANDS or y not in TENSOR_CORE_OPERANDS})
    assert not slow, (f"{len(slow)} kind(s) of product with operands not cast for the tensor "
                      f"cores (fp32 operands run in true fp32, 28x slower): {slow}")
