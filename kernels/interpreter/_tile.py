"""Tiles and arrays of the interpreter: cuTile dtypes on NumPy storage, conversions, promotion.

A tile is a NumPy array plus its cuTile dtype. Storage: every dtype is held in the NumPy type
of the same name, except bfloat16 and tfloat32, which NumPy lacks: they are float32 storage
holding values already rounded to the narrower format (8-bit exponent, 7- resp. 10-bit
mantissa, round to nearest even, subnormals kept), so a tfloat32 tile is a float32 array of
TF32 values with a tfloat32 tag.

Promotion follows cuTile's own rules (the functions of `cuda.tile` 1.7 are called, not copied):
a Python int/float/bool is loosely typed (same category as the tile: the tile's dtype wins;
otherwise the stronger category wins, float constants as float32), two typed operands promote
by cuTile's table, and tfloat32 takes part in no arithmetic.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

import cuda.tile as ct
from cuda.tile._datatype import is_arithmetic, is_boolean, is_float, is_integral
from cuda.tile._exception import TileError, TileValueError
from cuda.tile._ir.ops_utils import promote_dtypes as _ct_promote_dtypes
from cuda.tile._ir.type import LooselyTypedScalar
from cuda.tile._ir.typing_support import dtype_of_constant_scalar

STORAGE = {
    ct.bool_: np.dtype(np.bool_),
    ct.int8: np.dtype(np.int8), ct.int16: np.dtype(np.int16),
    ct.int32: np.dtype(np.int32), ct.int64: np.dtype(np.int64),
    ct.uint8: np.dtype(np.uint8), ct.uint16: np.dtype(np.uint16),
    ct.uint32: np.dtype(np.uint32), ct.uint64: np.dtype(np.uint64),
    ct.float16: np.dtype(np.float16), ct.bfloat16: np.dtype(np.float32),
    ct.tfloat32: np.dtype(np.float32), ct.float32: np.dtype(np.float32),
    ct.float64: np.dtype(np.float64),
}

# NumPy dtype of an array argument -> cuTile dtype: bfloat16 arrays are ml_dtypes' (NumPy has no
# bfloat16; their tiles are float32 storage, loaded exactly), tfloat32 arrays do not exist.
FROM_NUMPY = {v: k for k, v in STORAGE.items() if k not in (ct.bfloat16, ct.tfloat32)}
FROM_NUMPY[np.dtype(ml_dtypes.bfloat16)] = ct.bfloat16

# Explicit mantissa bits of the formats held in float32 storage.
_NARROW_MANTISSA = {ct.bfloat16: 7, ct.tfloat32: 10}


def ct_dtype_of_numpy(dtype) -> ct.DType:
    try:
        return FROM_NUMPY[np.dtype(dtype)]
    except KeyError:
        raise TypeError("the interpreter has no cuTile dtype for NumPy dtype "
                        f"{np.dtype(dtype)}") from None


def round_fp32_mantissa(a: np.ndarray, bits: int) -> np.ndarray:
    """Round float32 values to `bits` explicit mantissa bits, to nearest, ties to even.

    The exponent range stays that of float32 (as in bfloat16 and TF32): subnormals are rounded
    at their fixed quantum, values past the largest finite number of the narrow format become
    inf, inf and NaN pass through. Works on the bit pattern: add half an ulp of the narrow
    format minus one, plus the lowest kept bit (the tie-to-even correction), then truncate; a
    carry out of the mantissa moves into the exponent, which is the correct rounding.
    """
    a = np.asarray(a, dtype=np.float32)
    u = np.ascontiguousarray(a).view(np.uint32).reshape(a.shape)
    drop = 23 - bits
    lsb = (u >> np.uint32(drop)) & np.uint32(1)
    kept = np.uint32((0xFFFFFFFF << drop) & 0xFFFFFFFF)  # the bits the rounded value keeps
    r = (u + (np.uint32((1 << (drop - 1)) - 1) + lsb)) & kept
    return np.where(np.isnan(a), a, r.view(np.float32))


def _fp64_to_fp32_round_to_odd(a: np.ndarray) -> np.ndarray:
    """float64 -> float32 rounding toward zero, with the lowest bit set when inexact (round to odd).

    Rounding to odd first and to nearest even on fewer bits afterwards equals one rounding to
    nearest even (float32 keeps >= 2 more bits than bfloat16/TF32), so float64 sources avoid the
    double-rounding error of float64 -> float32 -> narrow.
    """
    r = a.astype(np.float32)
    finite = np.isfinite(a)
    too_far = finite & (np.abs(r.astype(np.float64)) > np.abs(a))
    r = np.where(too_far, np.nextafter(r, np.float32(0)), r)
    inexact = finite & (r.astype(np.float64) != a)
    bits = r.view(np.uint32) | np.where(inexact, np.uint32(1), np.uint32(0))
    return bits.view(np.float32)


def convert(a: np.ndarray, src: ct.DType, dst: ct.DType) -> np.ndarray:
    """Values of dtype `src` (in its storage) converted to `dst` (in its storage): cuTile's astype.

    Floats round to nearest even; float -> int truncates toward zero (NaN or out-of-range values
    raise: the GPU result is not specified); to bool means != 0.
    """
    a = np.asarray(a)
    if src == dst:
        return a.astype(STORAGE[dst], copy=False)
    if is_boolean(dst):
        return a != 0
    if is_integral(dst):
        if is_float(src):
            if not np.all(np.isfinite(a)):
                raise ValueError(f"astype({src} -> {dst}) of NaN or inf is not specified on the "
                                 "GPU")
            t = np.trunc(a.astype(np.float64))
            info = np.iinfo(STORAGE[dst])
            if t.size and (t.min() < info.min or t.max() > info.max):
                raise ValueError(f"astype({src} -> {dst}): a value is out of range of {dst}")
            return t.astype(STORAGE[dst])
        return a.astype(STORAGE[dst])
    if not is_float(dst):
        raise NotImplementedError(f"astype to {dst}")
    bits = _NARROW_MANTISSA.get(dst)
    if bits is None:
        return a.astype(STORAGE[dst])
    if src in (ct.float32, ct.bfloat16, ct.tfloat32, ct.float16):
        return round_fp32_mantissa(a.astype(np.float32), bits)
    # float64, integers, bool: via float64 (exact for every integer below 2**53), rounded to odd.
    return round_fp32_mantissa(_fp64_to_fp32_round_to_odd(a.astype(np.float64)), bits)


def finish(a: np.ndarray, dtype: ct.DType) -> Tile:
    """Wrap the result of a NumPy computation done in `dtype`'s storage as a tile of `dtype`."""
    a = np.asarray(a)
    if a.dtype != STORAGE[dtype]:
        a = a.astype(STORAGE[dtype])
    if dtype == ct.bfloat16:
        a = round_fp32_mantissa(a, 7)
    return Tile(a, dtype)


def _ct_error(e: TileError, what: str):
    """cuTile's compile-time error as the Python error the interpreter raises at run time."""
    msg = str(e).split("\n")[0]
    return (ValueError if isinstance(e, TileValueError) else TypeError)(f"{what}: {msg}")


def dtype_of(v):
    """The cuTile view of an operand's type: a DType, or a LooselyTypedScalar for Python scalars."""
    if isinstance(v, Tile):
        return v.dtype
    if isinstance(v, (bool, int, float)):
        return LooselyTypedScalar(v)
    raise TypeError(f"expected a tile or a Python scalar, got {type(v).__name__}")


def promote(x, y, what: str, force_float: bool = False) -> ct.DType:
    try:
        return _ct_promote_dtypes(dtype_of(x), dtype_of(y), force_float)
    except TileError as e:
        raise _ct_error(e, what) from None


def _loose_source_dtype(v) -> ct.DType:
    if isinstance(v, bool):
        return ct.bool_
    if isinstance(v, int):
        return ct.int64
    return ct.float64


def as_storage(v, dtype: ct.DType) -> np.ndarray:
    """An operand (tile or Python scalar) converted to `dtype`, as a NumPy array or 0-d array."""
    if isinstance(v, Tile):
        return convert(v._a, v.dtype, dtype)
    if is_integral(dtype) and not isinstance(v, bool):
        info = np.iinfo(STORAGE[dtype])
        if not info.min <= v <= info.max:
            raise ValueError(f"integer constant {v} is out of range of {dtype}")
    return convert(np.asarray(v), _loose_source_dtype(v), dtype)


def as_tile(v, what: str) -> Tile:
    """A tile from a tile or a Python scalar (its loosely typed default dtype)."""
    if isinstance(v, Tile):
        return v
    if isinstance(v, (bool, int, float)):
        dtype = dtype_of_constant_scalar(v)
        return Tile(as_storage(v, dtype), dtype)
    raise TypeError(f"{what}: expected a tile, got {type(v).__name__}")


def check_shape(shape, what: str) -> tuple[int, ...]:
    """A constant tile shape: a tuple of Python ints, each a power of two (cuTile's rule)."""
    if isinstance(shape, (int, np.integer)) and not isinstance(shape, bool):
        shape = (shape,)
    if not isinstance(shape, (tuple, list)):
        raise TypeError(f"{what}: shape must be a tuple of constant ints, got {shape!r}")
    out = []
    for s in shape:
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)):
            raise TypeError(f"{what}: shape entries must be constant ints (not runtime values), "
                            f"got {s!r}")
        s = int(s)
        if s <= 0 or s & (s - 1):
            raise ValueError(f"{what}: tile dimensions must be powers of two, got shape "
                             f"{tuple(shape)}")
        out.append(s)
    return tuple(out)


def index_int(v, what: str) -> int:
    """A runtime integer (Python int or integer 0-d tile) as a Python int."""
    if isinstance(v, Tile):
        if v.ndim != 0 or not (is_integral(v.dtype) or is_boolean(v.dtype)):
            raise TypeError(f"{what}: expected an integer scalar, got a {v.dtype} tile of shape "
                            f"{v.shape}")
        return int(v._a)
    if isinstance(v, (int, np.integer)) and not isinstance(v, bool):
        return int(v)
    raise TypeError(f"{what}: expected an integer, got {type(v).__name__}")


def scalar_tile(value, dtype: ct.DType) -> Tile:
    return Tile(np.asarray(value, dtype=STORAGE[dtype]), dtype)


def int_scalar(value: int) -> Tile:
    """A runtime integer as cuTile types it: int32, or int64 when it does not fit."""
    return scalar_tile(value, ct.int32 if -2**31 <= value < 2**31 else ct.int64)


class Tile:
    """A cuTile tile on the CPU: an immutable NumPy array (`_a`) and its cuTile dtype."""

    __slots__ = ("_a", "_dtype")
    __array_ufunc__ = None  # NumPy scalars defer to the tile's reflected operators
    __hash__ = None

    def __init__(self, a: np.ndarray, dtype: ct.DType):
        self._a = a
        self._dtype = dtype

    @property
    def dtype(self) -> ct.DType:
        return self._dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return self._a.shape

    @property
    def ndim(self) -> int:
        return self._a.ndim

    def numpy(self) -> np.ndarray:
        """The values as a NumPy array in the storage dtype (for tests and debugging)."""
        return self._a

    def __repr__(self):
        return f"Tile({self._a!r}, dtype={self._dtype.name})"

    # Methods of cuTile's Tile (implemented in _ops, bound there to avoid an import cycle).
    def astype(self, dtype, *, rounding_mode=None):
        return _OPS.astype(self, dtype, rounding_mode=rounding_mode)

    def reshape(self, shape):
        return _OPS.reshape(self, shape)

    def permute(self, axes):
        return _OPS.permute(self, axes)

    def transpose(self, axis0=None, axis1=None):
        return _OPS.transpose(self, axis0, axis1)

    def extract(self, index, shape):
        return _OPS.extract(self, index, shape)

    def insert(self, index, value):
        return _OPS.insert(self, index, value)

    def item(self):
        return _OPS.reshape(self, ())

    def __getitem__(self, key):
        """x[:, None] / x[None, :]: insert axes of size 1 (cuTile's expand_dims sugar)."""
        key = key if isinstance(key, tuple) else (key,)
        for k in key:
            if not (k is None or k is Ellipsis or (isinstance(k, slice) and k == slice(None))):
                raise NotImplementedError(f"tile indexing with {k!r} (only ':' and None are cuTile "
                                          "syntax)")
        return Tile(self._a[key], self._dtype)

    # Scalars in Python control flow.
    def _scalar(self, what):
        if self.ndim != 0:
            raise TypeError(f"{what} of a tile of shape {self.shape}: only 0-d tiles are scalars")
        return self._a[()]

    def __index__(self):
        if not (is_integral(self._dtype) or is_boolean(self._dtype)):
            raise TypeError(f"a {self._dtype} tile cannot be used as an index")
        return int(self._scalar("index"))

    def __int__(self):
        return int(self._scalar("int()"))

    def __float__(self):
        return float(self._scalar("float()"))

    def __bool__(self):
        return bool(self._scalar("truth value"))

    # Arithmetic, comparisons, bitwise.
    def __add__(self, o): return _OPS.add(self, o)
    def __radd__(self, o): return _OPS.add(o, self)
    def __sub__(self, o): return _OPS.sub(self, o)
    def __rsub__(self, o): return _OPS.sub(o, self)
    def __mul__(self, o): return _OPS.mul(self, o)
    def __rmul__(self, o): return _OPS.mul(o, self)
    def __truediv__(self, o): return _OPS.truediv(self, o)
    def __rtruediv__(self, o): return _OPS.truediv(o, self)
    def __floordiv__(self, o): return _OPS.floordiv(self, o)
    def __rfloordiv__(self, o): return _OPS.floordiv(o, self)
    def __mod__(self, o): return _OPS.mod(self, o)
    def __rmod__(self, o): return _OPS.mod(o, self)
    def __pow__(self, o): return _OPS.pow(self, o)
    def __rpow__(self, o): return _OPS.pow(o, self)
    def __and__(self, o): return _OPS.bitwise_and(self, o)
    def __rand__(self, o): return _OPS.bitwise_and(o, self)
    def __or__(self, o): return _OPS.bitwise_or(self, o)
    def __ror__(self, o): return _OPS.bitwise_or(o, self)
    def __xor__(self, o): return _OPS.bitwise_xor(self, o)
    def __rxor__(self, o): return _OPS.bitwise_xor(o, self)
    def __lshift__(self, o): return _OPS.bitwise_lshift(self, o)
    def __rlshift__(self, o): return _OPS.bitwise_lshift(o, self)
    def __rshift__(self, o): return _OPS.bitwise_rshift(self, o)
    def __rrshift__(self, o): return _OPS.bitwise_rshift(o, self)
    def __matmul__(self, o): return _OPS.matmul(self, o)
    def __rmatmul__(self, o): return _OPS.matmul(o, self)
    def __neg__(self): return _OPS.negative(self)
    def __pos__(self): return self
    def __abs__(self): return _OPS.abs(self)
    def __invert__(self): return _OPS.bitwise_not(self)
    def __lt__(self, o): return _OPS.less(self, o)
    def __le__(self, o): return _OPS.less_equal(self, o)
    def __gt__(self, o): return _OPS.greater(self, o)
    def __ge__(self, o): return _OPS.greater_equal(self, o)
    def __eq__(self, o): return _OPS.equal(self, o)
    def __ne__(self, o): return _OPS.not_equal(self, o)


class Writers:
    """Which program last stored each element of one array argument, during one launch.

    Created lazily at the first store, so read-only inputs cost nothing. The GPU runs programs in
    no fixed order: two programs storing different values to one element, or a program loading an
    element another program stored in the same launch, make the result order-dependent there.
    The interpreter raises on both (RuntimeError) instead of silently picking its own order.
    """

    __slots__ = ("shape", "ids", "serials")

    def __init__(self, shape: tuple[int, ...]):
        self.shape = shape
        self.ids = None
        self.serials = None  # each element's last store's number in the launch (_state)

    def view(self, offset: tuple[int, ...], shape: tuple[int, ...], create: bool,
             serials: bool = False):
        if self.ids is None:
            if not create:
                return None
            self.ids = np.full(self.shape, -1, dtype=np.int64)
            self.serials = np.full(self.shape, -1, dtype=np.int64)
        whole = self.serials if serials else self.ids
        return whole[tuple(slice(o, o + n) for o, n in zip(offset, shape))]


class Array:
    """A cuTile global array on the CPU: a NumPy array (a view: stores write through) and its
    dtype."""

    __slots__ = ("_a", "_dtype", "_index_dtype", "_writers", "_offset", "name")

    def __init__(self, a: np.ndarray, index_dtype: ct.DType = ct.int32,
                 writers: Writers | None = None, offset: tuple[int, ...] | None = None,
                 name: str = "array"):
        self._a = a
        self.name = name  # the kernel parameter it was passed as, for error messages
        self._dtype = ct_dtype_of_numpy(a.dtype)
        self._index_dtype = index_dtype  # int64 for ct.IndexedWithInt64 parameters
        self._writers = Writers(a.shape) if writers is None else writers
        self._offset = (0,) * a.ndim if offset is None else offset  # of a slice in the argument

    def writers(self, create: bool, serials: bool = False):
        """The last-writer program ids of this array's elements, or with `serials` the numbers
        of their stores in the launch (None before any store)."""
        return self._writers.view(self._offset, self._a.shape, create, serials)

    @property
    def dtype(self) -> ct.DType:
        return self._dtype

    @property
    def shape(self) -> tuple:
        """Runtime values of the index dtype, as in cuTile (not constants: never tile shapes)."""
        return tuple(scalar_tile(s, self._index_dtype) for s in self._a.shape)

    @property
    def strides(self) -> tuple:
        return tuple(scalar_tile(s // self._a.itemsize, self._index_dtype) for s in self._a.strides)

    @property
    def ndim(self) -> int:
        return self._a.ndim

    def slice(self, axis, start, stop) -> Array:
        axis = int(axis)
        if axis < 0:
            axis += self.ndim
        start, stop = index_int(start, "Array.slice start"), index_int(stop, "Array.slice stop")
        n = self._a.shape[axis]
        if not (0 <= start < n and start <= stop <= n):
            raise IndexError(f"Array.slice({start}, {stop}) out of range for axis {axis} of size "
                             f"{n}")
        key = (slice(None),) * axis + (slice(start, stop),)
        offset = tuple(o + (start if d == axis else 0) for d, o in enumerate(self._offset))
        return Array(self._a[key], self._index_dtype, self._writers, offset, self.name)

    def __getattr__(self, name):
        raise NotImplementedError(f"the interpreter does not support Array.{name}")


class _OpsHolder:
    """Set by _ops at import: the operations the Tile methods dispatch to."""


_OPS = _OpsHolder()


def is_numeric_arith(dtype) -> bool:
    return is_arithmetic(dtype) and not is_boolean(dtype)
