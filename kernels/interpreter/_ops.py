"""The cuTile operations on the CPU: what `ct.<name>` means inside a kernel run by the interpreter.

Every function works on whole tiles with NumPy (never per element). Semantics decisions:

- Arithmetic is done in the promoted dtype: float32 in float32, float16 in float16 (NumPy
  computes each half operation in float32 and rounds once, which is the correctly rounded
  result), bfloat16 in float32 then rounded to bfloat16 after every operation (also correctly
  rounded: float32 has more than 2·8+2 bits). tfloat32 tiles take part in no arithmetic (as in
  cuTile): they feed `mma`, `astype`, `where` and the shape operations only.
- Flush to zero: none by default; subnormals are kept (the GPU may flush them: anything under
  2**-126 may become 0, which the error bounds already allow). `flush_to_zero=True` flushes
  subnormal inputs and results to signed zero.
- exp, exp2, log, log2, ...: NumPy's float32 functions (<= 1 ulp); the GPU's ex2.approx is within
  2 ulp. Neither is bit-exact with the other: tests compare them within bounds.
- mma: operands rounded to their dtype already (an `astype(ct.tfloat32)` rounds to nearest even on
  a 10-bit mantissa); the products of TF32, bfloat16 and float16 values are exact in float32, so a
  float32 matrix product (BLAS sgemm: float32 products and float32 accumulation) of the rounded
  operands is the tensor core's computation up to the order of the fp32 additions; the
  accumulator is added after the product, in float32. float32 operands not cast to tfloat32 are
  multiplied in true float32 (sgemm), float64 in float64, int8/uint8 in int32.
- Reductions and scans: float32 and float64 sums in NumPy's order (pairwise); float32 and float64
  cumsum in the order of a parallel (Kogge-Stone) scan, because the GPU's scan groups the
  additions differently for each prefix too: on the H200 a prefix of non-positive terms came out
  one ulp above the prefix before it, and a sequential cumsum (always monotone for terms of one
  sign) would hide such a kernel bug on the CPU. float16/bfloat16 sequentially with a rounding to
  the dtype after every addition. `scan` with a custom function: sequential, the function applied
  to whole slices along the other axes (it must be elementwise, as cuTile's 0-d combiners are).
- load padding: ZERO, NEG_ZERO, NAN, POS_INF, NEG_INF as named; UNDETERMINED fills NaN (integer
  tiles: the dtype's minimum) so that a kernel that relies on undetermined padding fails loudly.
  A tile entirely outside the array, or outside with check_bounds=False, raises IndexError
  (undefined behaviour on the GPU). Stores ignore the out-of-bounds part of a partial tile.
"""

from __future__ import annotations

import builtins
import math

import numpy as np

import cuda.tile as ct
from cuda.tile._datatype import (_resolve_mma_supported_dtype, is_boolean, is_float,
                                 is_integral)
from cuda.tile._datatype import promote_dtypes as _ct_promote_dtypes
from cuda.tile._exception import TileError
from cuda.tile._ir.cast_ops import check_implicit_cast

from kernels.interpreter import _state
from kernels.interpreter._tile import (
    STORAGE, Array, Tile, _OPS, _ct_error, as_storage, as_tile, check_shape, convert, dtype_of,
    finish, index_int, int_scalar, is_numeric_arith, promote, scalar_tile,
)


# ---------------------------------------------------------------------------------------------
# Grid


def bid(axis) -> Tile:
    return scalar_tile(_state.block_id(axis), ct.int32)


def num_blocks(axis) -> Tile:
    return scalar_tile(_state.grid_dim(axis), ct.int32)


# ---------------------------------------------------------------------------------------------
# Elementwise binary operations


def _both_loose(x, y) -> bool:
    return not isinstance(x, Tile) and not isinstance(y, Tile)


def _arith_dtype(name, x, y, force_float=False):
    dtype = promote(x, y, name, force_float)
    if not is_numeric_arith(dtype):
        raise TypeError(f"{name}: arithmetic on {dtype} tiles is not supported by cuTile"
                        + (" (cast with astype first)" if dtype == ct.tfloat32 else ""))
    return dtype


def _arith(name, fn, x, y, force_float=False):
    """fn on the operands promoted to their common dtype, in that dtype; None for two constants."""
    if _both_loose(x, y):
        return None
    dtype = _arith_dtype(name, x, y, force_float)
    xa, ya = as_storage(x, dtype), as_storage(y, dtype)
    with np.errstate(all="ignore"):
        return finish(fn(xa, ya), dtype)


def _ftz(a: np.ndarray) -> np.ndarray:
    tiny = np.finfo(a.dtype).tiny
    return np.where(np.abs(a) < tiny, np.copysign(np.zeros_like(a), a), a)


_APPROX = (ct.RoundingMode.FULL, ct.RoundingMode.APPROX)


def _check_rounding(name, rounding_mode, approx_ok=False):
    """Round to nearest is what NumPy does. FULL/APPROX (the GPU's faster approximations of
    exp, tanh, division, sqrt) are computed the same way: more accurate than the GPU, within the
    approximation's documented error of it. Directed roundings are not emulated."""
    if rounding_mode in (None, ct.RoundingMode.RN) or (approx_ok and rounding_mode in _APPROX):
        return
    raise NotImplementedError(f"{name}(rounding_mode={rounding_mode})")


def _float_binary(name, fn):
    def op(x, y, /, *, rounding_mode=None, flush_to_zero=False):
        _check_rounding(name, rounding_mode, approx_ok=(name == "truediv"))
        if _both_loose(x, y):
            return _PY_BINARY[name](x, y)
        if not flush_to_zero:
            return _arith(name, fn, x, y, force_float=(name == "truediv"))
        dtype = _arith_dtype(name, x, y, force_float=(name == "truediv"))
        if not is_float(dtype):
            raise TypeError(f"{name}: flush_to_zero needs float operands")
        return finish(_ftz_operands(fn, x, y, dtype), dtype)
    op.__name__ = name
    return op


def _ftz_operands(fn, x, y, dtype):
    with np.errstate(all="ignore"):
        r = fn(_ftz(as_storage(x, dtype)), _ftz(as_storage(y, dtype)))
        return _ftz(r).astype(STORAGE[dtype])


def _floordiv_fn(a, b):
    if a.dtype.kind == "f":
        return np.floor(a / b)
    return np.floor_divide(a, b)


# Two Python constants fold with Python's arithmetic, as cuTile folds them.
_PY_BINARY = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y,
              "mul": lambda x, y: x * y, "truediv": lambda x, y: x / y}

add = _float_binary("add", np.add)
sub = _float_binary("sub", np.subtract)
mul = _float_binary("mul", np.multiply)
truediv = _float_binary("truediv", np.true_divide)


def floordiv(x, y, /):
    r = _arith("floordiv", _floordiv_fn, x, y)
    return x // y if r is None else r


def mod(x, y, /):
    r = _arith("mod", np.mod, x, y)
    return x % y if r is None else r


def pow(x, y, /):  # noqa: A001 - cuTile's name
    r = _arith("pow", np.power, x, y)
    return x ** y if r is None else r


def _minmax(name, nan_ignoring, nan_propagating):
    def op(x, y, /, *, flush_to_zero=False, propagate_nan=False):
        if _both_loose(x, y):
            return getattr(builtins, name[:3])(x, y)
        fn = nan_propagating if propagate_nan else nan_ignoring
        if flush_to_zero:
            dtype = _arith_dtype(name, x, y)
            return finish(_ftz_operands(fn, x, y, dtype), dtype)
        return _arith(name, fn, x, y)
    op.__name__ = name
    return op


minimum = _minmax("minimum", np.fmin, np.minimum)
maximum = _minmax("maximum", np.fmax, np.maximum)


def cdiv(x, y, /):
    return -((-x) // y)


def _bitwise(name, fn):
    def op(x, y, /):
        if _both_loose(x, y):
            return fn(x, y)
        dtype = promote(x, y, name)
        if not (is_integral(dtype) or is_boolean(dtype)):
            raise TypeError(f"{name} requires integer or boolean operands, got {dtype}")
        return finish(fn(as_storage(x, dtype), as_storage(y, dtype)), dtype)
    op.__name__ = name
    return op


bitwise_and = _bitwise("bitwise_and", np.bitwise_and)
bitwise_or = _bitwise("bitwise_or", np.bitwise_or)
bitwise_xor = _bitwise("bitwise_xor", np.bitwise_xor)
bitwise_lshift = _bitwise("bitwise_lshift", np.left_shift)
bitwise_rshift = _bitwise("bitwise_rshift", np.right_shift)


def bitwise_not(x, /):
    x = as_tile(x, "bitwise_not")
    if not (is_integral(x.dtype) or is_boolean(x.dtype)):
        raise TypeError(f"bitwise_not requires an integer or boolean tile, got {x.dtype}")
    return Tile(np.invert(x._a), x.dtype)


def _compare(name, fn):
    def op(x, y, /):
        if _both_loose(x, y):
            return fn(x, y)
        dtype = promote(x, y, name)
        return Tile(np.asarray(fn(as_storage(x, dtype), as_storage(y, dtype))), ct.bool_)
    op.__name__ = name
    return op


# Ordered comparisons (False with a NaN operand), != unordered (True with a NaN), as in cuTile.
greater = _compare("greater", np.greater)
greater_equal = _compare("greater_equal", np.greater_equal)
less = _compare("less", np.less)
less_equal = _compare("less_equal", np.less_equal)
equal = _compare("equal", np.equal)
not_equal = _compare("not_equal", np.not_equal)


# ---------------------------------------------------------------------------------------------
# Unary operations


def _float_tile(x, name) -> Tile:
    x = as_tile(x, name)
    if not is_float(x.dtype) or x.dtype == ct.tfloat32:
        raise TypeError(f"{name} requires a float tile, got {x.dtype}")
    return x


def _unary_float(name, fn, has_rounding=False, has_ftz=False):
    def op(x, /, **kw):
        allowed = (({"rounding_mode"} if has_rounding else set())
                   | ({"flush_to_zero"} if has_ftz else set()))
        unknown = set(kw) - allowed
        if unknown:
            raise TypeError(f"{name}() got unexpected keyword arguments {sorted(unknown)}")
        _check_rounding(name, kw.get("rounding_mode"), approx_ok=True)
        x = _float_tile(x, name)
        a = x._a
        ftz = kw.get("flush_to_zero", False)
        with np.errstate(all="ignore"):
            r = fn(_ftz(a) if ftz else a)
        r = finish(r, x.dtype)
        return Tile(_ftz(r._a), r.dtype) if ftz else r
    op.__name__ = name
    return op


exp = _unary_float("exp", np.exp, has_rounding=True)
exp2 = _unary_float("exp2", np.exp2, has_ftz=True)
log = _unary_float("log", np.log)
log2 = _unary_float("log2", np.log2)
sqrt = _unary_float("sqrt", np.sqrt, has_rounding=True, has_ftz=True)
rsqrt = _unary_float("rsqrt", lambda a: np.reciprocal(np.sqrt(a)), has_ftz=True)
sin = _unary_float("sin", np.sin)
cos = _unary_float("cos", np.cos)
tan = _unary_float("tan", np.tan)
sinh = _unary_float("sinh", np.sinh)
cosh = _unary_float("cosh", np.cosh)
tanh = _unary_float("tanh", np.tanh, has_rounding=True)
floor = _unary_float("floor", np.floor)
ceil = _unary_float("ceil", np.ceil)


def abs(x, /):  # noqa: A001 - cuTile's name
    if not isinstance(x, Tile):
        return builtins.abs(x)
    if not is_numeric_arith(x.dtype):
        raise TypeError(f"abs of a {x.dtype} tile")
    return Tile(np.abs(x._a), x.dtype)


def negative(x, /):
    if not isinstance(x, Tile):
        return -x
    if not is_numeric_arith(x.dtype):
        raise TypeError(f"negation of a {x.dtype} tile")
    return Tile(np.negative(x._a), x.dtype)


def isnan(x, /):
    x = _float_tile(x, "isnan")
    return Tile(np.isnan(x._a), ct.bool_)


# ---------------------------------------------------------------------------------------------
# Selection, creation, conversion


def where(cond, x, y, /):
    if _both_loose(x, y):
        x_t = as_tile(x, "where")
        dtype = promote(x_t, y, "where")
    else:
        dtype = promote(x, y, "where")
    c = as_storage(cond, ct.bool_) if isinstance(cond, Tile) else np.asarray(bool(cond))
    return Tile(np.where(c, as_storage(x, dtype), as_storage(y, dtype)), dtype)


def _require_dtype(dtype, what):
    if not isinstance(dtype, ct.DType) or dtype not in STORAGE:
        raise NotImplementedError(f"{what}: dtype {dtype!r}")
    return dtype


def arange(size, /, *, dtype, start=0, step=1):
    (n,) = check_shape((size,), "arange")
    dtype = _require_dtype(dtype, "arange")
    idx = np.arange(n, dtype=STORAGE[dtype])
    with np.errstate(all="ignore"):
        return finish(as_storage(start, dtype) + idx * as_storage(step, dtype), dtype)


def full(shape, fill_value, dtype):
    shape = check_shape(shape, "full") if shape != () else ()
    dtype = _require_dtype(dtype, "full")
    return Tile(np.full(shape, as_storage(fill_value, dtype), dtype=STORAGE[dtype]), dtype)


def zeros(shape, dtype):
    return full(shape, 0, dtype)


def ones(shape, dtype):
    return full(shape, 1, dtype)


def astile(value, /, *, dtype):
    dtype = _require_dtype(dtype, "astile")
    a = np.asarray(value, dtype=np.float64 if is_float(dtype) else None)
    if a.ndim:
        check_shape(a.shape, "astile")
    src = ct.float64 if a.dtype.kind == "f" else (ct.bool_ if a.dtype.kind == "b" else ct.int64)
    return Tile(convert(a, src, dtype), dtype)


def astype(x, dtype, /, *, rounding_mode=None):
    _check_rounding("astype", rounding_mode)
    dtype = _require_dtype(dtype, "astype")
    x = as_tile(x, "astype")
    if x.dtype == dtype:
        return x
    return Tile(convert(x._a, x.dtype, dtype), dtype)


def bitcast(x, /, dtype):
    x = as_tile(x, "bitcast")
    dtype = _require_dtype(dtype, "bitcast")
    if dtype.bitwidth != x.dtype.bitwidth:
        raise TypeError(f"bitcast: {x.dtype} and {dtype} differ in width")
    if ct.bfloat16 in (dtype, x.dtype):
        raise NotImplementedError(f"bitcast {x.dtype} -> {dtype}")
    return Tile(x._a.view(STORAGE[dtype]), dtype)


# ---------------------------------------------------------------------------------------------
# Shapes


def _tile(x, what) -> Tile:
    if not isinstance(x, Tile):
        raise TypeError(f"{what}: expected a tile, got {type(x).__name__}")
    return x


def _axis(axis, ndim, what) -> int:
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{what}: axis must be a constant int, got {axis!r}")
    a = int(axis) + (ndim if axis < 0 else 0)
    if not 0 <= a < ndim:
        raise ValueError(f"{what}: axis {axis} out of range for a {ndim}-d tile")
    return a


def reshape(x, /, shape):
    x = as_tile(x, "reshape")
    if isinstance(shape, int):
        shape = (shape,)
    shape = tuple(shape)
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        shape = tuple(x._a.size // known if s == -1 else s for s in shape)
    if shape:
        check_shape(shape, "reshape")
    if math.prod(shape) != x._a.size:
        raise ValueError(f"reshape: cannot reshape a tile of shape {x.shape} to {shape}")
    return Tile(x._a.reshape(shape), x.dtype)


def permute(x, /, axes):
    x = _tile(x, "permute")
    axes = tuple(_axis(a, x.ndim, "permute") for a in axes)
    if sorted(axes) != list(range(x.ndim)):
        raise ValueError(f"permute: {axes} is not a permutation of the axes of a {x.ndim}-d tile")
    return Tile(np.transpose(x._a, axes), x.dtype)


def transpose(x, /, axis0=None, axis1=None):
    x = _tile(x, "transpose")
    if axis0 is None and axis1 is None:
        if x.ndim != 2:
            raise TypeError(f"transpose of a {x.ndim}-d tile needs axis0 and axis1")
        return Tile(x._a.T, x.dtype)
    a0, a1 = _axis(axis0, x.ndim, "transpose"), _axis(axis1, x.ndim, "transpose")
    return Tile(np.swapaxes(x._a, a0, a1), x.dtype)


def expand_dims(x, /, axis):
    x = _tile(x, "expand_dims")
    return Tile(np.expand_dims(x._a, _axis(axis, x.ndim + 1, "expand_dims")), x.dtype)


def broadcast_to(x, /, shape):
    x = as_tile(x, "broadcast_to")
    shape = check_shape(shape, "broadcast_to")
    return Tile(np.broadcast_to(x._a, shape), x.dtype)


def _subtile_slices(x: Tile, index, shape, what):
    index = index if isinstance(index, (tuple, list)) else (index,)
    shape = check_shape(shape, what)
    if len(index) != x.ndim or len(shape) != x.ndim:
        raise ValueError(f"{what}: index {tuple(index)} and shape {shape} must have the tile's "
                         f"rank {x.ndim}")
    slices = []
    for d, (i, s, n) in enumerate(zip(index, shape, x.shape)):
        if n % s:
            raise ValueError(f"{what}: sub-tile shape {shape} does not divide the tile shape "
                             f"{x.shape}")
        i = index_int(i, what)
        if not 0 <= i < n // s:
            raise IndexError(f"{what}: index {i} out of range [0, {n // s}) on axis {d}")
        slices.append(slice(i * s, (i + 1) * s))
    return tuple(slices)


def extract(x, /, index, shape):
    x = _tile(x, "extract")
    return Tile(x._a[_subtile_slices(x, index, shape, "extract")].copy(), x.dtype)


def insert(x, /, index, value):
    x = _tile(x, "insert")
    value = as_tile(value, "insert") if isinstance(value, Tile) else value
    vshape = value.shape if isinstance(value, Tile) and value.ndim else (1,) * x.ndim
    sl = _subtile_slices(x, index, vshape, "insert")
    out = x._a.copy()
    out[sl] = np.reshape(as_storage(value, x.dtype), vshape)
    return Tile(out, x.dtype)


def cat(tiles, /, axis):
    a, b = (_tile(t, "cat") for t in tiles)
    if a.dtype != b.dtype:
        raise TypeError(f"cat: tiles must have the same dtype, got {a.dtype} and {b.dtype}")
    ax = _axis(axis, a.ndim, "cat")
    out = np.concatenate([a._a, b._a], axis=ax)
    check_shape(out.shape, "cat")
    return Tile(out, a.dtype)


# ---------------------------------------------------------------------------------------------
# Reductions and scans


def _axes(axis, ndim, what):
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, (tuple, list)):
        return tuple(sorted(_axis(a, ndim, what) for a in axis))
    return (_axis(axis, ndim, what),)


def _sequential(a: np.ndarray, axis: int, dtype, reverse: bool, scan: bool) -> np.ndarray:
    """Sum along `axis` one element at a time, rounding to `dtype` after every addition."""
    a = np.moveaxis(a, axis, 0)
    if reverse:
        a = a[::-1]
    acc = a[0].copy()
    out = [acc]
    for k in range(1, a.shape[0]):
        acc = finish(acc + a[k], dtype)._a
        out.append(acc)
    r = np.stack(out) if scan else acc
    if scan:
        if reverse:
            r = r[::-1]
        return np.moveaxis(r, 0, axis)
    return r


def sum(x, /, axis=None, *, keepdims=False, rounding_mode=None, flush_to_zero=False):  # noqa: A001 - cuTile's name
    _check_rounding("sum", rounding_mode)
    if flush_to_zero:
        raise NotImplementedError("sum(flush_to_zero=True)")
    x = _tile(x, "sum")
    if not is_numeric_arith(x.dtype):
        raise TypeError(f"sum of a {x.dtype} tile")
    axes = _axes(axis, x.ndim, "sum")
    if x.dtype in (ct.float16, ct.bfloat16):
        r = x._a
        for ax in reversed(axes):
            r = _sequential(r, ax, x.dtype, False, False)
        if keepdims:
            r = np.expand_dims(r, axes)
    else:
        r = np.sum(x._a, axis=axes, keepdims=keepdims, dtype=STORAGE[x.dtype])
    return finish(r, x.dtype)


def prod(x, /, axis=None, *, keepdims=False, rounding_mode=None, flush_to_zero=False):
    _check_rounding("prod", rounding_mode)
    if flush_to_zero:
        raise NotImplementedError("prod(flush_to_zero=True)")
    x = _tile(x, "prod")
    if x.dtype in (ct.float16, ct.bfloat16) or not is_numeric_arith(x.dtype):
        raise NotImplementedError(f"prod of a {x.dtype} tile")
    with np.errstate(all="ignore"):
        r = np.prod(x._a, axis=_axes(axis, x.ndim, "prod"), keepdims=keepdims,
                    dtype=STORAGE[x.dtype])
    return finish(r, x.dtype)


def _reduce_minmax(name, nan_ignoring, nan_propagating):
    def op(x, /, axis=None, *, keepdims=False, flush_to_zero=False, propagate_nan=False):
        x = _tile(x, name)
        if not is_numeric_arith(x.dtype):
            raise TypeError(f"{name} of a {x.dtype} tile")
        a = _ftz(x._a) if flush_to_zero else x._a
        fn = nan_propagating if propagate_nan else nan_ignoring
        r = fn.reduce(a, axis=_axes(axis, x.ndim, name), keepdims=keepdims)
        return finish(r, x.dtype)
    op.__name__ = name
    return op


max = _reduce_minmax("max", np.fmax, np.maximum)  # noqa: A001 - cuTile's name
min = _reduce_minmax("min", np.fmin, np.minimum)  # noqa: A001 - cuTile's name


def _arg_reduce(name, fn, nan_fill):
    def op(x, /, axis=None, *, keepdims=False, propagate_nan=False):
        x = _tile(x, name)
        a = x._a
        if propagate_nan:
            raise NotImplementedError(f"{name}(propagate_nan=True)")
        if is_float(x.dtype):
            a = np.where(np.isnan(a), nan_fill, a)
        if axis is None:
            r = fn(a.reshape(-1))
            r = np.reshape(r, (1,) * x.ndim) if keepdims else r
        else:
            r = fn(a, axis=_axis(axis, x.ndim, name), keepdims=keepdims)
        return finish(r, ct.int32)
    op.__name__ = name
    return op


argmax = _arg_reduce("argmax", np.argmax, -np.inf)
argmin = _arg_reduce("argmin", np.argmin, np.inf)


def cumsum(x, /, axis=0, *, reverse=False, rounding_mode=None, flush_to_zero=False):
    _check_rounding("cumsum", rounding_mode)
    if flush_to_zero:
        raise NotImplementedError("cumsum(flush_to_zero=True)")
    x = _tile(x, "cumsum")
    if not is_numeric_arith(x.dtype):
        raise TypeError(f"cumsum of a {x.dtype} tile")
    ax = _axis(axis, x.ndim, "cumsum")
    if x.dtype in (ct.float16, ct.bfloat16):
        return finish(_sequential(x._a, ax, x.dtype, reverse, True), x.dtype)
    a = np.flip(x._a, ax) if reverse else x._a
    r = _kogge_stone_cumsum(a.astype(STORAGE[x.dtype]), ax)
    return finish(np.flip(r, ax) if reverse else r, x.dtype)


def _kogge_stone_cumsum(a: np.ndarray, axis: int) -> np.ndarray:
    """Inclusive prefix sums in log2(n) rounds: r[i] += r[i - d] for d = 1, 2, 4, ..., each
    round in the array's dtype (prefix i is a tree sum whose shape depends on i)."""
    r = np.moveaxis(a, axis, 0).copy()
    d = 1
    while d < r.shape[0]:
        r[d:] = r[d:] + r[:-d]  # the right-hand side is evaluated before the assignment
        d *= 2
    return np.moveaxis(r, 0, axis)


def scan(x, /, axis, func, identity, *, reverse=False):
    if isinstance(x, tuple):
        raise NotImplementedError("scan of a tuple of tiles")
    x = _tile(x, "scan")
    ax = _axis(axis, x.ndim, "scan")
    a = np.moveaxis(x._a, ax, 0)
    steps = range(a.shape[0] - 1, -1, -1) if reverse else range(a.shape[0])
    out = np.empty_like(a)
    acc = None
    for k in steps:
        item = Tile(a[k], x.dtype)
        acc = item if acc is None else func(acc, item)
        if not isinstance(acc, Tile) or acc.dtype != x.dtype or acc.shape != item.shape:
            raise TypeError(f"scan: the function must return a {x.dtype} tile like its arguments")
        out[k] = acc._a
    return Tile(np.moveaxis(out, 0, ax), x.dtype)


def cumprod(x, /, axis=0, *, reverse=False, rounding_mode=None, flush_to_zero=False):
    _check_rounding("cumprod", rounding_mode)
    x = _tile(x, "cumprod")
    if flush_to_zero or x.dtype in (ct.float16, ct.bfloat16) or not is_numeric_arith(x.dtype):
        raise NotImplementedError(f"cumprod of a {x.dtype} tile (flush_to_zero={flush_to_zero})")
    ax = _axis(axis, x.ndim, "cumprod")
    a = np.flip(x._a, ax) if reverse else x._a
    with np.errstate(all="ignore"):
        r = np.cumprod(a, axis=ax, dtype=STORAGE[x.dtype])
    return finish(np.flip(r, ax) if reverse else r, x.dtype)


# ---------------------------------------------------------------------------------------------
# Matrix products


def _broadcast_mm_shapes(xs, ys):
    """cuTile's matmul shape rule: 1-d operands promoted to 2-d, batch axes broadcast."""
    x2 = (1,) + xs if len(xs) == 1 else xs
    y2 = ys + (1,) if len(ys) == 1 else ys
    if x2[-1] != y2[-2]:
        raise TypeError(f"incompatible shapes for a matrix product: {xs}, {ys}")
    batch = np.broadcast_shapes(x2[:-2], y2[:-2])
    out = batch + (x2[-2], y2[-1])
    if len(xs) == 1:
        out = out[:-2] + out[-1:]
    if len(ys) == 1:
        out = out[:-1]
    return x2, y2, batch + (x2[-2], y2[-1]), out


def _product(xa: np.ndarray, ya: np.ndarray, in_dtype) -> np.ndarray:
    """x @ y as the tensor core computes it (see the module docstring)."""
    if in_dtype in (ct.tfloat32, ct.bfloat16, ct.float16, ct.float32):
        return np.matmul(xa.astype(np.float32, copy=False), ya.astype(np.float32, copy=False))
    if in_dtype == ct.float64:
        return np.matmul(xa, ya)
    if in_dtype in (ct.int8, ct.uint8):
        return np.matmul(xa.astype(np.int32), ya.astype(np.int32))
    raise NotImplementedError(f"mma on {in_dtype} operands")


def mma(x, y, /, acc, *, use_fast_acc=False):
    if use_fast_acc:
        raise NotImplementedError("mma(use_fast_acc=True)")
    x, y, acc = _tile(x, "mma x"), _tile(y, "mma y"), _tile(acc, "mma acc")
    if x.ndim < 2 or y.ndim < 2:
        raise TypeError(f"mma needs 2-d or 3-d operands, got shapes {x.shape} and {y.shape}")
    try:
        _resolve_mma_supported_dtype(x.dtype, y.dtype, acc.dtype)
    except TileError as e:
        raise _ct_error(e, "mma") from None
    x2, y2, _, out = _broadcast_mm_shapes(x.shape, y.shape)
    if acc.shape != out:
        raise TypeError(f"mma: acc must have shape {out}, got {acc.shape}")
    _state.note_mma(x.dtype, y.dtype)
    # a float16 accumulator: the sum in float32, rounded to float16 once
    work = np.float32 if acc.dtype == ct.float16 else STORAGE[acc.dtype]
    with np.errstate(all="ignore"):
        p = _product(x._a.reshape(x2), y._a.reshape(y2), x.dtype)
        r = p.astype(work, copy=False) + acc._a.astype(work, copy=False)
    return finish(r, acc.dtype)


def matmul(x, y, /):
    x, y = _tile(x, "matmul"), _tile(y, "matmul")
    dtype = promote(x, y, "matmul")
    try:
        acc_dtype = _resolve_mma_supported_dtype(dtype, dtype, None)
    except TileError as e:
        raise _ct_error(e, "matmul") from None
    x2, y2, acc_shape, out = _broadcast_mm_shapes(x.shape, y.shape)
    _state.note_mma(dtype, dtype)
    xa = convert(x._a, x.dtype, dtype).reshape(x2)
    ya = convert(y._a, y.dtype, dtype).reshape(y2)
    with np.errstate(all="ignore"):
        p = _product(xa, ya, dtype).astype(STORAGE[acc_dtype])
    return Tile(convert(p, acc_dtype, dtype).reshape(out), dtype)


# ---------------------------------------------------------------------------------------------
# Memory


def _order(order, ndim, what):
    if order == "C":
        return tuple(range(ndim))
    if order == "F":
        return tuple(reversed(range(ndim)))
    order = tuple(order)
    if sorted(order) != list(range(ndim)):
        raise ValueError(f"{what}: order {order} is not a permutation of {ndim} axes")
    return order


def _array(a, what) -> Array:
    if not isinstance(a, Array):
        raise TypeError(f"{what}: expected an array, got {type(a).__name__}")
    return a


def _tile_region(view_shape, index, shape, what, check_bounds):
    """Slices of the array view covered by the tile, and of the tile covered by the array."""
    index = index if isinstance(index, (tuple, list)) else (index,)
    if len(index) != len(view_shape):
        raise TypeError(f"{what}: index size {len(index)} does not match the array rank "
                        f"{len(view_shape)}")
    src, dst, partial = [], [], False
    for d, (i, s, n) in enumerate(zip(index, shape, view_shape)):
        start = index_int(i, what) * s
        if start < 0 or start >= n:
            raise IndexError(f"{what}: tile {tuple(index_int(j, what) for j in index)} of shape "
                             f"{shape} lies outside the array of shape {tuple(view_shape)} on "
                             f"axis {d} (undefined behaviour on the GPU)")
        stop = builtins.min(start + s, n)
        partial |= stop - start < s
        src.append(slice(start, stop))
        dst.append(slice(0, stop - start))
    if partial and not check_bounds:
        raise IndexError(f"{what}: check_bounds=False but the tile at {tuple(index)} of shape "
                         f"{shape} extends past the array of shape {tuple(view_shape)} "
                         "(undefined behaviour)")
    return tuple(src), tuple(dst), partial


def _padding_value(mode, dtype, what):
    P = ct.PaddingMode
    if is_float(dtype):
        return {P.UNDETERMINED: np.nan, P.ZERO: 0.0, P.NEG_ZERO: -0.0, P.NAN: np.nan,
                P.POS_INF: np.inf, P.NEG_INF: -np.inf}[mode]
    if mode in (P.ZERO, P.NEG_ZERO):
        return 0
    if mode == P.UNDETERMINED:
        return True if is_boolean(dtype) else np.iinfo(STORAGE[dtype]).min
    raise TypeError(f"{what}: padding_mode {mode} needs a float array, got {dtype}")


def _load_store_common(array, order, latency, allow_tma, memory_order, memory_scope, what):
    array = _array(array, what)
    if latency is not None and not (isinstance(latency, int) and 1 <= latency <= 10):
        raise ValueError(f"{what}: latency must be an int in [1, 10], got {latency!r}")
    if allow_tma is not None and not isinstance(allow_tma, bool):
        raise TypeError(f"{what}: allow_tma must be a bool, got {allow_tma!r}")
    if memory_order != ct.MemoryOrder.WEAK or memory_scope != ct.MemoryScope.NONE:
        raise NotImplementedError(f"{what}(memory_order={memory_order}, "
                                  f"memory_scope={memory_scope})")
    perm = _order(order, array.ndim, what)
    return array, perm, np.transpose(array._a, perm)


def load(array, /, index, shape, *, order="C", padding_mode=ct.PaddingMode.UNDETERMINED,
         check_bounds=True, latency=None, allow_tma=None,
         memory_order=ct.MemoryOrder.WEAK, memory_scope=ct.MemoryScope.NONE):
    array, perm, view = _load_store_common(array, order, latency, allow_tma, memory_order,
                                           memory_scope, "load")
    if not isinstance(padding_mode, ct.PaddingMode):
        raise TypeError(f"load: padding_mode must be a ct.PaddingMode, got {padding_mode!r}")
    scalar = shape == ()
    shape = (1,) * array.ndim if scalar else check_shape(shape, "load")
    if len(shape) != array.ndim:
        raise TypeError(f"load: tile shape {shape} does not match the array rank {array.ndim}")
    src, dst, partial = _tile_region(view.shape, index, shape, "load", check_bounds)
    _check_no_foreign_writes(array, perm, src)
    _check_written(array, perm, src)
    dtype = array.dtype
    if partial:
        out = np.full(shape, _padding_value(padding_mode, dtype, "load"), dtype=STORAGE[dtype])
        out[dst] = view[src]
    else:  # in the dtype's storage (a bfloat16 array's values widen to float32 exactly)
        out = view[src].astype(STORAGE[dtype])
    return Tile(out.reshape(()) if scalar else out, dtype)


def _check_no_foreign_writes(array: Array, perm, src, what="load"):
    """Refuse a read (`src`: slices of a tile, or index arrays of a gather, on the array's axes
    permuted by `perm`) of elements another program stored in the same launch."""
    ids = array.writers(create=False)
    if ids is None:
        return
    ids = np.transpose(ids, perm)[src]
    me = _state.program_id()
    foreign = (ids >= 0) & (ids != me)
    if foreign.any() and _state.seen():  # stores made before a release it acquired are fine
        serials = np.transpose(array.writers(create=False, serials=True), perm)[src]
        for program, last in _state.seen().items():
            foreign &= ~((ids == program) & (serials <= last))
    if foreign.any():
        raise RuntimeError(f"{what}: this program ({me}) reads elements that program "
                           f"{int(ids[foreign].flat[0])} stored in the same launch: the result "
                           "depends on the order of programs on the GPU")


def _check_written(array: Array, perm, src, what="load"):
    """Refuse a read (`src`: slices of a tile, or index arrays of a gather, on the array's axes
    permuted by `perm`) of an element of a tracked allocation no program has stored
    (_state.track_writes)."""
    mask = _state.written_mask(array._a)
    if mask is None:
        return
    unwritten = ~np.transpose(mask, perm)[src]
    if unwritten.any():
        first = np.argwhere(unwritten)[0]
        if isinstance(src[0], slice):
            permuted = [s.start + int(i) for s, i in zip(src, first)]
        else:  # a gather's index arrays, one per axis
            permuted = [int(s[tuple(first)]) for s in src]
        index = [0] * array.ndim
        for k, axis in enumerate(perm):
            index[axis] = permuted[k]
        raise RuntimeError(f"{what}: {_state.kernel_name()} (program {_state.program_id()}) "
                           f"reads {array.name}[{', '.join(map(str, index))}], an element of an "
                           f"allocated array that no program has written "
                           f"({int(unwritten.sum())} such elements in this {what})")


def _mark_written(array: Array, perm, src):
    mask = _state.written_mask(array._a)
    if mask is not None:
        np.transpose(mask, perm)[src] = True


def _record_store(array: Array, perm, src, view, values):
    serial = _state.note_store()
    ids = np.transpose(array.writers(create=True), perm)[src]
    me = _state.program_id()
    foreign = (ids >= 0) & (ids != me)
    if foreign.any():
        old = view[src]
        same = old == values
        if old.dtype.kind == "f":
            same |= np.isnan(old) & np.isnan(values)
        clash = foreign & ~same
        if clash.any():
            raise RuntimeError(f"store: programs {int(ids[clash].flat[0])} and {me} store "
                               "different values to the same element: the result depends on the "
                               "order of programs on the GPU")
    ids[...] = me
    np.transpose(array.writers(create=True, serials=True), perm)[src] = serial


def _check_store_cast(tile, dtype):
    """cuTile's implicit cast of a stored value to the array's dtype (no narrowing, no tfloat32)."""
    try:
        if isinstance(tile, Tile):
            if tile.dtype != dtype and _ct_promote_dtypes(tile.dtype, dtype) != dtype:
                raise TypeError(f"store: a {tile.dtype} tile cannot be stored into a {dtype} array "
                                "without an explicit astype")
        else:
            check_implicit_cast(dtype_of(tile), dtype)
    except TileError as e:
        raise _ct_error(e, "store") from None


def store(array, /, index, tile, *, order="C", check_bounds=True, latency=None, allow_tma=None,
          memory_order=ct.MemoryOrder.WEAK, memory_scope=ct.MemoryScope.NONE):
    array, perm, view = _load_store_common(array, order, latency, allow_tma, memory_order,
                                           memory_scope, "store")
    dtype = array.dtype
    _check_store_cast(tile, dtype)
    values = as_storage(tile, dtype)
    if values.ndim == 0:
        values = values.reshape((1,) * array.ndim)
    elif values.ndim != array.ndim:
        raise TypeError(f"store: tile rank {values.ndim} does not match the array rank "
                        f"{array.ndim}")
    src, dst, _ = _tile_region(view.shape, index, values.shape, "store", check_bounds)
    _record_store(array, perm, src, view, values[dst])
    _mark_written(array, perm, src)
    view[src] = values[dst]


def _element_indices(array: Array, indices, extra, what):
    """(the index arrays broadcast together, `extra` broadcast to their shape, the in-bounds
    mask) of an element-wise access: one integer tile or scalar per axis (a tile alone for a
    1-d array); `extra` (padding or values) must broadcast to the indices' shape."""
    if not isinstance(indices, tuple):
        indices = (indices,)
    if len(indices) != array.ndim:
        raise TypeError(f"{what}: {len(indices)} indices for an array of rank {array.ndim}")
    idx = []
    for i in indices:
        if isinstance(i, Tile) and not is_integral(i.dtype):
            raise TypeError(f"{what}: indices must be integer tiles or scalars, got {i.dtype}")
        if not isinstance(i, Tile) and (isinstance(i, bool)
                                        or not isinstance(i, (int, np.integer))):
            raise TypeError(f"{what}: indices must be integer tiles or scalars, got {i!r}")
        idx.append(np.asarray(i._a if isinstance(i, Tile) else i, dtype=np.int64))
    idx = np.broadcast_arrays(*idx)
    try:
        extra = np.broadcast_to(extra, idx[0].shape)
    except ValueError:
        raise ValueError(f"{what}: a value of shape {np.shape(extra)} does not broadcast to the "
                         f"indices' shape {idx[0].shape}") from None
    inside = np.ones(extra.shape, dtype=bool)
    for i, n in zip(idx, array._a.shape):
        inside &= (i >= 0) & (i < n)
    return idx, extra, inside


def _element_mask(mask, shape, what):
    if mask is None:
        return np.ones(shape, dtype=bool)
    m = as_storage(mask, ct.bool_) if isinstance(mask, Tile) else np.asarray(bool(mask))
    try:
        return np.broadcast_to(m, shape)
    except ValueError:
        raise ValueError(f"{what}: mask of shape {m.shape} does not broadcast to {shape}") from None


def _element_access(array: Array, indices, extra, mask, check_bounds, what):
    """(index arrays, extra, where the access happens) of a gather or scatter: indices and
    `extra` (its padding or values) broadcast together, the mask and the bounds applied."""
    idx, extra, inside = _element_indices(array, indices, extra, what)
    wanted = _element_mask(mask, extra.shape, what)
    if not check_bounds and not inside[wanted].all():
        raise IndexError(f"{what}: index out of bounds with check_bounds=False (undefined "
                         "behaviour)")
    return idx, extra, wanted & inside


def gather(array, indices, /, *, mask=None, padding_value=0, check_bounds=True, latency=None):
    """array[indices] element-wise (indices broadcast together): padding_value where the mask is
    False or, with check_bounds, where an index is out of bounds (a negative one included)."""
    array = _array(array, "gather")
    idx, pad, take = _element_access(array, indices, as_storage(padding_value, array.dtype),
                                     mask, check_bounds, "gather")
    out = np.array(pad, dtype=STORAGE[array.dtype])
    if take.any():
        at = tuple(i[take] for i in idx)
        _check_no_foreign_writes(array, tuple(range(array.ndim)), at, "gather")
        _check_written(array, tuple(range(array.ndim)), at, "gather")
        out[take] = array._a[at]
    return Tile(out, array.dtype)


def scatter(array, indices, value, /, *, mask=None, check_bounds=True, latency=None):
    """array[indices] = value element-wise, where the mask is True and (with check_bounds) the
    index is in bounds. Two elements of one scatter to the same place are refused here, even
    with equal values (stricter than cuTile, which leaves the winner unspecified)."""
    array = _array(array, "scatter")
    _check_store_cast(value, array.dtype)
    idx, values, put = _element_access(array, indices, as_storage(value, array.dtype), mask,
                                       check_bounds, "scatter")
    at = tuple(i[put] for i in idx)
    flat = np.ravel_multi_index(at, array._a.shape) if at[0].size else np.zeros(0, np.int64)
    if len(np.unique(flat)) != len(flat):
        raise RuntimeError("scatter: two elements go to the same place: the result depends on "
                           "the order of threads on the GPU")
    serial = _state.note_store()
    ids = array.writers(create=True)
    me = _state.program_id()
    old, new = array._a[at], values[put]
    same = old == new
    if old.dtype.kind == "f":
        same |= np.isnan(old) & np.isnan(new)
    clash = (ids[at] >= 0) & (ids[at] != me) & ~same
    if clash.any():
        raise RuntimeError(f"scatter: programs {int(ids[at][clash][0])} and {me} store different "
                           "values to the same element: the result depends on the order of "
                           "programs on the GPU")
    ids[at] = me
    array.writers(create=True, serials=True)[at] = serial
    _mark_written(array, tuple(range(array.ndim)), at)
    array._a[at] = new


def _atomic_elements(array, indices, values, check_bounds, what):
    """(the in-bounds elements' index tuples, their positions in the flattened result, the
    values flattened, the result's shape) of an element-wise atomic: indices a tuple of one
    integer tile or scalar per axis (or one for a 1-d array), broadcast together with `values`;
    out-of-bounds elements are skipped with check_bounds, an IndexError without."""
    if not isinstance(indices, tuple):
        indices = (indices,)
    if len(indices) != array.ndim:
        raise TypeError(f"{what}: {len(indices)} indices for an array of rank {array.ndim}")
    idx = [np.asarray(i._a if isinstance(i, Tile) else i, dtype=np.int64) for i in indices]
    *idx, values = np.broadcast_arrays(*idx, values)
    inside = np.ones(values.shape, dtype=bool)
    for i, n in zip(idx, array._a.shape):
        inside &= (i >= 0) & (i < n)
    if not check_bounds and not inside.all():
        raise IndexError(f"{what}: index out of bounds with check_bounds=False")
    flat_idx = [i.reshape(-1) for i in idx]
    keep = np.flatnonzero(inside.reshape(-1))
    ats = [tuple(int(i[k]) for i in flat_idx) for k in keep]
    return ats, keep, values.reshape(-1), values.shape


def _address(array, at: tuple) -> int:
    """An element's address in memory: its identity across views of one allocation."""
    a = array._a
    return a.__array_interface__["data"][0] + builtins.sum(i * st for i, st in zip(at, a.strides))


_ACQUIRING = (ct.MemoryOrder.ACQUIRE, ct.MemoryOrder.ACQ_REL)
_RELEASING = (ct.MemoryOrder.RELEASE, ct.MemoryOrder.ACQ_REL)
SPINS = 1000  # failed relaxed compare-and-swaps on one element before the spin is refused


def _read_modify_write(what, array, indices, update, check_bounds, memory_order, combine):
    """Element-wise atomic array[indices] = combine(old, update): the old values (0 for
    skipped out-of-bounds elements). A store of the program; a releasing order publishes its
    stores to an acquire that reads the new value."""
    ats, keep, values, shape = _atomic_elements(array, indices, as_storage(update, array.dtype),
                                                check_bounds, what)
    _state.note_store()
    old = np.zeros(values.shape, dtype=array._a.dtype)
    for k, at in zip(keep, ats):
        old[k] = array._a[at]
        array._a[at] = combine(old[k], values[k])
        if memory_order in _RELEASING:
            _state.release(_address(array, at))
    return Tile(old.reshape(shape), array.dtype)


def atomic_or(array, indices, update, /, *, check_bounds=True,
              memory_order=ct.MemoryOrder.ACQ_REL, memory_scope=ct.MemoryScope.DEVICE):
    """Element-wise atomic OR of integer `update` into array[indices] (indices: a tuple of one
    integer tile or scalar per axis, or one for a 1-d array, broadcast together with update);
    out-of-bounds indices are skipped with check_bounds (their old value is returned as 0). The
    programs run one at a time, so each OR is atomic; an OR's result is independent of the
    order of programs, so the element keeps no writer (loads after it in the launch are fine)."""
    array = _array(array, "atomic_or")
    if not is_integral(array.dtype):
        raise TypeError(f"atomic_or: needs an integer array, got {array.dtype}")
    return _read_modify_write("atomic_or", array, indices, update, check_bounds, memory_order,
                              lambda old, new: old | new)


def atomic_xchg(array, indices, update, /, *, check_bounds=True,
                memory_order=ct.MemoryOrder.ACQ_REL, memory_scope=ct.MemoryScope.DEVICE):
    """Element-wise atomic exchange: array[indices] = update, the old values returned (0 for
    skipped out-of-bounds elements). A releasing order publishes the program's stores to an
    acquire that reads the new value."""
    return _read_modify_write("atomic_xchg", _array(array, "atomic_xchg"), indices, update,
                              check_bounds, memory_order, lambda old, new: new)


def atomic_cas(array, indices, expected, desired, /, *, check_bounds=True,
               memory_order=ct.MemoryOrder.ACQ_REL, memory_scope=ct.MemoryScope.DEVICE):
    """Element-wise atomic compare-and-swap: where array[indices] == expected it becomes
    desired; the old values are returned (`expected` for skipped out-of-bounds elements).

    An acquiring CAS that finds an element unlike `expected` is a wait (on the GPU the program
    spins on it until another program sets it): before any element changes, it raises
    _state.Blocked, and the launch runs the program again from its start once another program
    has set the element (a program that has stored before cannot be run again: RuntimeError).
    An acquire that reads a released value may then read the releasing program's stores."""
    array = _array(array, "atomic_cas")
    want = as_storage(expected, array.dtype)
    ats, keep, values, shape = _atomic_elements(array, indices, as_storage(desired, array.dtype),
                                                check_bounds, "atomic_cas")
    want = np.broadcast_to(want, shape).reshape(-1)
    old = want.copy()
    for k, at in zip(keep, ats):
        old[k] = array._a[at]
    if memory_order in _ACQUIRING:
        for k, at in zip(keep, ats):
            if old[k] != want[k]:
                if _state.stored():
                    raise RuntimeError("atomic_cas: this program waits on an element after "
                                       "storing: the interpreter cannot run it again")
                raise _state.Blocked(array, at, want[k])
            _state.acquire(_address(array, at))
    else:  # no other program runs meanwhile: a failed relaxed one repeated is a spin
        for k, at in zip(keep, ats):
            if old[k] != want[k] and _state.spin(_address(array, at)) > SPINS:
                raise RuntimeError(f"atomic_cas: {array.name}{list(at)} stays unlike "
                                   f"{want[k]} through {SPINS} tries without an acquiring "
                                   "order: a wait for another program needs one")
    for k, at in zip(keep, ats):
        if old[k] == want[k]:
            _state.note_store()
            array._a[at] = values[k]
            if memory_order in _RELEASING:
                _state.release(_address(array, at))
    return Tile(old.reshape(shape), array.dtype)


def num_tiles(array, /, axis, shape, order="C"):
    array = _array(array, "num_tiles")
    shape = check_shape(shape, "num_tiles")
    perm = _order(order, array.ndim, "num_tiles")
    ax = _axis(axis, array.ndim, "num_tiles")
    n = array._a.shape[perm[ax]]
    return int_scalar(-(-n // shape[ax]))


# ---------------------------------------------------------------------------------------------
# Compile-time helpers


def static_assert(condition, message=None, /):
    if not condition:
        raise AssertionError(message or "static_assert failed")


def assert_(cond, /, message=None):
    c = as_storage(cond, ct.bool_) if isinstance(cond, Tile) else np.asarray(bool(cond))
    if not np.all(c):
        raise AssertionError(message or "ct.assert_ failed")


def static_eval(expr, /):
    return expr


def static_iter(iterable):
    return iterable


def ensure_constant(value, /):
    if isinstance(value, Tile):
        raise TypeError("ensure_constant: the value is a runtime tile, not a constant")
    return value


def assume_divisible_by(x, divisor):
    v = index_int(x, "assume_divisible_by")
    if v % divisor:
        raise ValueError(f"assume_divisible_by: {v} is not divisible by {divisor} (undefined "
                         "behaviour)")
    return x


# The names Tile's operators dispatch to.
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "bitwise_and",
              "bitwise_or", "bitwise_xor", "bitwise_lshift", "bitwise_rshift", "bitwise_not",
              "matmul", "negative", "abs", "less", "less_equal", "greater", "greater_equal",
              "equal", "not_equal", "astype", "reshape", "permute", "transpose", "extract",
              "insert"):
    setattr(_OPS, _name, globals()[_name])
