"""The program being interpreted: its kernel, block id and the grid (what ct.bid /
ct.num_blocks read), the optional record of matrix-product operand dtypes, and the optional
written-masks of the arrays the launchers allocate."""

import contextlib

import numpy as np
from numpy.lib.stride_tricks import as_strided

_grid = (1, 1, 1)
_bid = None
_kernel = ""


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


def kernel_name() -> str:
    """The name of the kernel function being interpreted."""
    return _kernel


def enter(grid, bid, kernel: str = ""):
    global _grid, _bid, _kernel, _stored, _seen, _spins
    _grid, _bid, _kernel = grid, bid, kernel
    _stored, _seen, _spins = False, {}, {}


class Blocked(Exception):
    """Raised by an acquiring compare-and-swap that finds its element unlike `expected`: on the
    GPU the program spins until another program sets it; the interpreter runs the program again
    once one has (kernels.interpreter._launch.launch). `array` is the cuTile Array, `at` the
    element's index in it."""

    def __init__(self, array, at: tuple, expected):
        super().__init__(f"waits for {array.name}{list(at)} == {expected}")
        self.array, self.at, self.expected = array, at, expected

    def holds(self) -> bool:
        return bool(self.array._a[self.at] == self.expected)


# Within one program: whether it has stored anything (a program that waits after a store cannot
# be run again from its start); the stores it may read, {program: the number of its last store
# it may read}: those made before a release its acquire read, and those the releaser could
# read in turn; and its failed compare-and-swaps by element (a spin that no schedule can end).
_stored = False
_seen = {}
_spins = {}
# Within one launch: the number of the last store (stores are numbered in order), and what a
# release at an element's address publishes ({program: store number}).
_stores = 0
_released = {}


def new_launch():
    global _stores
    _stores = 0
    _released.clear()


def note_store() -> int:
    """A store of the current program: its number in the launch."""
    global _stored, _stores
    _stored = True
    _stores += 1
    return _stores


def stored() -> bool:
    return _stored


def seen() -> dict:
    return _seen


def release(address: int):
    """The current program's stores so far, and those it may read, become readable by an
    acquire that reads what it wrote at `address`."""
    _released[address] = {**_seen, program_id(): _stores}


def acquire(address: int):
    """The current program read a value released at `address`."""
    for program, last in _released.get(address, {}).items():
        _seen[program] = max(_seen.get(program, -1), last)


def spin(address: int) -> int:
    """A failed compare-and-swap of the current program at `address`: how many in a row."""
    _spins[address] = _spins.get(address, 0) + 1
    return _spins[address]


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


# A dict while track_writes() is active: id of each NumPy array the launchers allocated
# (kernels.arrays.Backend.empty) -> (the array, its written-mask: True where a program stored).
_written = None


@contextlib.contextmanager
def track_writes():
    """Within the block, every NumPy array the launchers allocate carries a written-mask, and a
    load or gather of one of its elements that no program has stored (in this launch or an
    earlier one) raises RuntimeError naming the kernel, the array, the index and the program.

    On the GPU such an element holds whatever the allocation held (compute-sanitizer's
    initcheck reports it); a host write (a NaN fill) is not a program's store, so it does not
    count. A load past the array's shape (a padding mode) reads no element: still legal."""
    global _written
    outer, _written = _written, {}
    try:
        yield
    finally:
        _written = outer


def allocated(a: np.ndarray):
    """Give a new array a written-mask (all unwritten) where track_writes() is active."""
    if _written is not None:
        _written[id(a)] = (a, np.zeros(a.shape, dtype=bool))


def written_mask(a: np.ndarray):
    """The written-mask of `a`, a tracked allocation or a view of one, as a view of the same
    shape and strides (in elements); None for any other array."""
    if not _written:
        return None
    owner = a if a.base is None else a.base
    entry = _written.get(id(owner))
    if entry is None or entry[0] is not owner:
        return None
    mask = entry[1].reshape(-1)
    offset = (a.__array_interface__["data"][0] - owner.__array_interface__["data"][0]) \
        // owner.itemsize
    return as_strided(mask[offset:], shape=a.shape,
                      strides=tuple(s // a.itemsize for s in a.strides))
