"""The SSD forward in cuTile: four kernels, their launchers, and `ssd_forward` composing them.

NumPy arrays in: the kernels run on the CPU tile interpreter; CuPy arrays or torch CUDA tensors
in: on the GPU. Either way through the same launch code (grid, tile sizes, specializations).
`tune_forward` searches compute_out's choices for a shape on the GPU (kernels.tuning).
`raise_pending_errors` waits for the GPU and raises what bad values its kernels found
(kernels.errors).
"""

from kernels.chunk_cumsum import chunk_cumsum
from kernels.compute_out import compute_out
from kernels.errors import raise_pending_errors
from kernels.fwd_pass_state import fwd_pass_state
from kernels.ssd_forward import ssd_forward
from kernels.ssd_scan import ssd_scan
from kernels.tuning import tune_forward

__all__ = ["ssd_forward", "tune_forward", "chunk_cumsum", "fwd_pass_state", "compute_out",
           "ssd_scan", "raise_pending_errors"]
