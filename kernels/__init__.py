"""The SSD forward in cuTile: three kernels, their launchers, and `ssd_forward` composing them.

NumPy arrays in: the kernels run on the CPU tile interpreter; CuPy arrays or torch CUDA tensors
in: on the GPU. Either way through the same launch code (grid, tile sizes, specializations).
"""

from kernels.chunk_cumsum import chunk_cumsum
from kernels.compute_out import compute_out
from kernels.fwd_pass_state import fwd_pass_state
from kernels.ssd_forward import ssd_forward

__all__ = ["ssd_forward", "chunk_cumsum", "fwd_pass_state", "compute_out"]
