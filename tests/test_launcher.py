"""The launchers' one protocol: every kernel module declares its Choice, its CHOICES and
rules_choice(dims, sm_count), one signature, whose pick is one of its CHOICES; the standalone
functions share kernels.launcher.run_alone (checks, layout, outputs, error word, launch)."""

import importlib
import inspect

import numpy as np
import pytest

from contract import Dims
from kernels import chunk_cumsum, compute_out, ssd_scan
from kernels.arrays import LaunchDims

STAGES = ("chunk_cumsum", "fwd_pass_state", "compute_out", "ssd_scan", "ssd_varlen")
# launches the rules see: the 2.7B layout in both dtypes, a small odd one, one with seq_idx in
# int64 indices, each on a one-SM device (the interpreter) and on the H200's 132 SMs
DIMS = [LaunchDims(Dims(4, 4096, 80, 64, 1, 128, 256)),
        LaunchDims(Dims(4, 4096, 80, 64, 1, 128, 256), "bfloat16"),
        LaunchDims(Dims(1, 100, 4, 3, 1, 5, 16), "float16"),
        LaunchDims(Dims(1, 2**24, 128, 64, 1, 128, 64), segments=True, int64=True)]


@pytest.mark.parametrize("stage", STAGES)
def test_every_kernel_module_declares_the_same_protocol(stage):
    module = importlib.import_module(f"kernels.{stage}")
    assert issubclass(module.Choice, tuple) and module.Choice._fields, stage
    assert module.CHOICES and all(isinstance(c, module.Choice) for c in module.CHOICES), stage
    assert list(inspect.signature(module.rules_choice).parameters) == ["dims", "sm_count"]
    for dims in DIMS:
        for sm_count in (1, 132):
            assert module.rules_choice(dims, sm_count) in module.CHOICES, (stage, dims)


def test_a_standalone_call_checks_before_it_allocates_or_launches(monkeypatch):
    """run_alone's order: a bad argument is refused by name before any output exists or any
    error word is taken; check_values=True refuses a bad value on the host before the launch."""
    from kernels import arrays, launcher
    taken, allocated = [], []
    monkeypatch.setattr(launcher, "open_word", lambda *a, **k: taken.append(a))
    monkeypatch.setattr(arrays.Backend, "empty",
                        lambda self, shape, like=None: allocated.append(shape))
    dt = np.ones((1, 32, 4), np.float32)
    with pytest.raises(ValueError, match="A"):
        chunk_cumsum(dt, -np.ones(3, np.float32), 16)  # A of 3 heads, dt of 4
    assert taken == [] and allocated == []
    x = np.ones((1, 32, 4, 8), np.float32)
    B = np.ones((1, 32, 1, 8), np.float32)
    dt_out = np.ones((1, 4, 2, 16), np.float32)
    with pytest.raises(TypeError, match="D"):
        compute_out(x, B, B, dt_out, dt_out, np.ones((1, 2, 4, 8, 8), np.float32),
                    D=np.ones(4, np.int32))
    with pytest.raises(ValueError, match="D must be finite"):
        ssd_scan(x, B, B, dt_out, dt_out, D=np.full(4, np.nan, np.float32), check_values=True)
    assert taken == []
