"""ssd_forward on torch tensors as the custom op cutile_ssd::ssd_forward (kernels/torch_op.py):
its fake implementation, torch.compile(fullgraph=True) bit-identical to eager, forward only.
On the GPU machine, where torch is installed; skipped without torch or a GPU."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kernels import raise_pending_errors, ssd_forward  # noqa: E402 - after the skip: needs torch
from shapes import Case, make_inputs  # noqa: E402 - after the skip

pytestmark = pytest.mark.gpu

CASE = Case("torch_op", 2, 100, 4, 16, 2, 16, 32, D="head", z=True, dt="softplus",
            initial_states=True)


def inputs(dtype=torch.float32):
    kw = make_inputs(CASE)
    out = {k: torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v
           for k, v in kw.items()}
    for name in ("x", "B", "C", "z"):
        out[name] = out[name].to(dtype)
    return out


def test_the_op_passes_torch_opcheck():
    """torch.library.opcheck: the schema, the fake implementation's shapes and dtypes against
    the real one, and the autograd registration."""
    from kernels import torch_op
    kw = inputs()
    lo, hi = kw["dt_limit"]
    args = (kw["x"], kw["dt"], kw["A"], kw["B"], kw["C"], CASE.chunk_size, kw["D"], kw["z"],
            kw["dt_bias"], kw["initial_states"], None, True, float(lo), float(hi),
            torch_op.CHECK_CODE[None], 0, "", "")
    torch.library.opcheck(torch.ops.cutile_ssd.ssd_forward.default, args)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_torch_compile_fullgraph_gives_the_eager_result(dtype):
    kw = inputs(dtype)
    eager = ssd_forward(**kw, return_final_states=True)

    def layer(x, dt, A, B, C, D, z, dt_bias, initial_states):
        y, final = ssd_forward(x, dt, A, B, C, CASE.chunk_size, D=D, z=z, dt_bias=dt_bias,
                               initial_states=initial_states, dt_softplus=True,
                               dt_limit=kw["dt_limit"], return_final_states=True)
        return y * 2.0, final

    compiled = torch.compile(layer, fullgraph=True)
    args = [kw[n] for n in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states")]
    y, final = compiled(*args)
    assert torch.equal(y, eager[0] * 2.0) and torch.equal(final, eager[1])
    raise_pending_errors()


def test_backward_raises_forward_only():
    kw = inputs()
    kw["x"] = kw["x"].requires_grad_()
    y = ssd_forward(**kw)
    with pytest.raises(RuntimeError, match="forward only"):
        y.sum().backward()


def test_refusals_still_name_the_argument():
    kw = inputs()
    with pytest.raises(TypeError, match="C: a torch CPU tensor is not supported"):
        ssd_forward(**dict(kw, C=kw["C"].cpu()))
    with pytest.raises(ValueError, match="A must have shape"):
        ssd_forward(**dict(kw, A=kw["A"][:-1]))
