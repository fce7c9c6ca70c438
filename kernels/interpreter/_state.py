"""The program being interpreted: its block id and the grid (what ct.bid / ct.num_blocks read),
and the optional record of matrix-product operand dtypes."""

import contextlib

_grid = (1, 1, 1)
_bid = None


def block_id(axis) -> int:
    if _bid is None:
        raise RuntimeError("ct.bid() called outside a kernel launched by the interpreter")
    return _bid[_grid_axis(axis)]


def grid_dim(axis) -> int:
    if _bid is None:
        raise RuntimeError("ct.num_blocks() called outside a kernel launched by the interpreter")
    return _grid[_grid_axis(axis)]


def _grid_axis(axis) -> int:
    if isinstance(axis, bool) or axis not in (0, 1, 2):
        raise ValueError(f"grid axis must be the constant 0, 1 or 2, got {axis!r}")
    return axis


def program_id() -> int:
    """The current program's linear id (x fastest), for the race checks of load/store."""
    x, y, z = _bid
    return x + _grid[0] * (y + _grid[1] * z)


def enter(grid, bid):
    global _grid, _bid
    _grid, _bid = grid, bid


def leave():
    global _bid
    _bid = None


# A list while record_mma_operands() is active: the (x, y) operand dtypes of every ct.mma/matmul.
_mma_operands = None


@contextlib.contextmanager
def record_mma_operands():
    """Collect the operand dtypes of every ct.mma and ct.matmul run inside the block.

    What the CPU cannot time, it can still see: an fp32 product whose operands were not cast to
    tfloat32 is right to the last bit but runs in true fp32 on the GPU, 28x slower (spec).
    """
    global _mma_operands
    outer, _mma_operands = _mma_operands, []
    try:
        yield _mma_operands
    finally:
        _mma_operands = outer


def note_mma(x_dtype, y_dtype):
    if _mma_operands is not None:
        _mma_operands.append((x_dtype, y_dtype))
