"""A CPU interpreter of cuTile kernels: the kernels' own source, run on NumPy arrays.

    from kernels.interpreter import launch
    launch(grid, kernel, args)   # same meaning as ct.launch(stream, grid, kernel, args)

One program per grid point, tiles as NumPy arrays, cuTile's semantics for every supported
operation (see `_ops` for the numerical decisions: mma accumulation, flush to zero, padding);
an operation it does not support raises NotImplementedError naming it.
"""

from kernels.interpreter._launch import NAMESPACE, launch
from kernels.interpreter._state import allocated, record_mma_operands, track_writes
from kernels.interpreter._tile import Array, Tile, round_fp32_mantissa

__all__ = ["launch", "record_mma_operands", "track_writes", "allocated", "NAMESPACE", "Tile",
           "Array", "round_fp32_mantissa"]
