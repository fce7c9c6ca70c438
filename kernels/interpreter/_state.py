"""The program being interpreted: its block id and the grid (what ct.bid / ct.num_blocks read)."""

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
