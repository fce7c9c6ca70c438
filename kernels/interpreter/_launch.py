"""Running a `@ct.kernel` on the CPU: the kernel's own Python function, rebound to the emulation.

The kernel's function is rebuilt unchanged (same code object, defaults, closure) with globals in
which every reference to the `cuda.tile` module, or to a function imported from it, is replaced by
the interpreter's namespace, and every helper function of a module that uses cuTile is rebuilt the
same way, recursively. Builtin `min`/`max` of two tiles mean `ct.minimum`/`ct.maximum`, as in
cuTile. Then the function runs once per grid point.
"""

from __future__ import annotations

import builtins
import inspect
import itertools
import types
import typing

import numpy as np

import cuda.tile as ct
from cuda.tile._execution import is_function_wrapper

from kernels.interpreter import _ops, _state
from kernels.interpreter._tile import Array, Tile, Writers, ct_dtype_of_numpy, scalar_tile

_OP_NAMES = (
    "bid", "num_blocks", "num_tiles", "load", "store", "mma", "matmul", "astype", "bitcast",
    "add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "minimum", "maximum", "cdiv",
    "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_lshift", "bitwise_rshift", "bitwise_not",
    "greater", "greater_equal", "less", "less_equal", "equal", "not_equal",
    "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh",
    "floor", "ceil", "abs", "negative", "isnan", "where", "arange", "full", "zeros", "ones",
    "astile", "reshape", "permute", "transpose", "expand_dims", "broadcast_to", "extract",
    "insert", "cat", "sum", "prod", "max", "min", "argmax", "argmin", "cumsum", "cumprod", "scan",
    "static_assert", "assert_", "static_eval", "static_iter", "ensure_constant",
    "assume_divisible_by", "atomic_or", "atomic_xchg", "atomic_cas", "gather", "scatter",
)

# Names of cuda.tile that are not operations: dtypes, enums, annotations, decorators, errors.
_PASS_THROUGH = (
    "DType", "PaddingMode", "RoundingMode", "MemoryOrder", "MemoryScope", "Constant",
    "ConstantAnnotation", "ArrayAnnotation", "ListAnnotation", "Scalar", "ScalarInt64",
    "IndexedWithInt64", "ByTarget", "kernel", "function",
)


def _build_namespace() -> types.ModuleType:
    ns = types.ModuleType("cuda.tile[interpreter]", "cuda.tile operations emulated with NumPy")
    for name, value in vars(ct).items():
        if (isinstance(value, ct.DType) or name in _PASS_THROUGH
                or name.endswith(("Error", "Exception"))):
            setattr(ns, name, value)
    for name in _OP_NAMES:
        setattr(ns, name, getattr(_ops, name))
    ns.Tile = Tile
    ns.Array = Array

    def __getattr__(name):
        if name.startswith("_"):
            raise AttributeError(name)
        raise NotImplementedError(f"ct.{name} is not supported by the CPU interpreter")

    ns.__getattr__ = __getattr__
    return ns


NAMESPACE = _build_namespace()

# Functions and objects exported by cuda.tile, by identity -> their cuda.tile name.
_CT_OBJECTS = {id(v): k for k, v in vars(ct).items()
               if not k.startswith("_") and callable(v) and not isinstance(v, (type, ct.DType))}


# Modules whose functions are never rebound: cuTile itself and the interpreter.
_NOT_REBOUND = ("cuda.", "kernels.interpreter")


def _unsupported(name):
    def call(*args, **kwargs):
        raise NotImplementedError(f"ct.{name} is not supported by the CPU interpreter")
    return call


def _builtin_min(*args, **kwargs):
    if len(args) == 2 and not kwargs and any(isinstance(a, Tile) for a in args):
        return _ops.minimum(*args)
    return builtins.min(*args, **kwargs)


def _builtin_max(*args, **kwargs):
    if len(args) == 2 and not kwargs and any(isinstance(a, Tile) for a in args):
        return _ops.maximum(*args)
    return builtins.max(*args, **kwargs)


def _uses_cuda_tile(g: dict) -> bool:
    return any(v is ct or id(v) in _CT_OBJECTS for v in g.values())


class _Rebinder:
    """Rebuilds functions with emulated globals; one instance per launch (globals may change)."""

    def __init__(self):
        self._globals: dict[int, dict] = {}
        self._functions: dict[int, types.FunctionType] = {}

    def value(self, v):
        if v is ct:
            return NAMESPACE
        if isinstance(v, types.ModuleType):
            return v
        name = _CT_OBJECTS.get(id(v))
        if name is not None:
            return getattr(NAMESPACE, name) if name in vars(NAMESPACE) else _unsupported(name)
        while is_function_wrapper(v):
            v = v.__wrapped__
        if isinstance(v, types.FunctionType) and not v.__module__.startswith(_NOT_REBOUND) \
                and _uses_cuda_tile(v.__globals__):
            return self.function(v)
        return v

    def function(self, f: types.FunctionType) -> types.FunctionType:
        done = self._functions.get(id(f))
        if done is not None:
            return done
        closure = None
        if f.__closure__ is not None:
            closure = tuple(types.CellType(self.value(c.cell_contents)) if _cell_full(c) else c
                            for c in f.__closure__)
        new = types.FunctionType(f.__code__, self.globals(f.__globals__), f.__name__,
                                 f.__defaults__, closure)
        new.__kwdefaults__ = f.__kwdefaults__
        new.__qualname__ = f.__qualname__
        self._functions[id(f)] = new
        return new

    def globals(self, g: dict) -> dict:
        done = self._globals.get(id(g))
        if done is not None:
            return done
        new: dict = {}
        self._globals[id(g)] = new
        new.update((k, self.value(v)) for k, v in g.items())
        new.setdefault("min", _builtin_min)
        new.setdefault("max", _builtin_max)
        return new


def _cell_full(cell) -> bool:
    try:
        _ = cell.cell_contents  # an empty cell raises
    except ValueError:
        return False
    return True


def _param_annotations(func) -> dict[str, tuple]:
    """The typing.Annotated metadata of each parameter (ct.Constant, ct.IndexedWithInt64, ...)."""
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception:
        hints = func.__annotations__
    return {name: h.__metadata__ for name, h in hints.items()
            if typing.get_origin(h) is typing.Annotated}


def _wrap_arg(name, v, metadata, writers):
    """A kernel argument as cuTile types it: Constants stay Python values, arrays become Arrays
    (int32 shapes, int64 with ct.IndexedWithInt64), ints int32 scalars (int64 with
    ct.ScalarInt64), floats float32 scalars, bools bool scalars."""
    if any(isinstance(m, ct.ConstantAnnotation) for m in metadata):
        if isinstance(v, np.ndarray):
            raise TypeError(f"argument {name} is a ct.Constant parameter; got an array")
        return v
    wide = any(getattr(m, "index_dtype", None) == ct.int64 or getattr(m, "dtype", None) == ct.int64
               for m in metadata)
    if isinstance(v, np.ndarray):
        # one Writers per NumPy array: an array passed twice (a dummy for an absent option) is one
        w = writers.setdefault(id(v), Writers(v.shape))
        return Array(v, ct.int64 if wide else ct.int32, w, name=name)
    if v is None:
        return None
    if isinstance(v, bool):
        return scalar_tile(v, ct.bool_)
    if isinstance(v, int):
        dtype = ct.int64 if wide else ct.int32
        info = np.iinfo(np.int64 if wide else np.int32)
        if not info.min <= v <= info.max:
            raise ValueError(f"argument {name}: {v} is out of range of {dtype} "
                             "(annotate the parameter ct.ScalarInt64 for int64)")
        return scalar_tile(v, dtype)
    if isinstance(v, float):
        return scalar_tile(v, ct.float32)
    if isinstance(v, np.generic):
        return Tile(np.asarray(v), ct_dtype_of_numpy(v.dtype))
    if isinstance(v, (tuple, list)):
        return tuple(_wrap_arg(name, e, (), writers) for e in v)
    raise TypeError(f"argument {name}: the CPU interpreter takes NumPy arrays and Python/NumPy "
                    f"scalars, got {type(v).__module__}.{type(v).__name__}")


def _grid(grid) -> tuple[int, int, int]:
    g = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    if not 1 <= len(g) <= 3 or any(isinstance(d, bool) or not isinstance(d, (int, np.integer))
                                   or d < 1 for d in g):
        raise ValueError(f"grid must be 1 to 3 positive ints, got {grid!r}")
    return tuple(int(d) for d in g) + (1,) * (3 - len(g))


def launch(grid, kernel, args) -> None:
    """Run `kernel` (a `@ct.kernel`) on NumPy arrays: `ct.launch(stream, grid, kernel, args)` on
    the CPU.

    `args` is a tuple of NumPy arrays (written in place by stores), Python/NumPy scalars and the
    values of `ct.Constant` parameters. Programs run one after the other, in reverse order of
    their linear block id. The GPU promises no order: a program that loads what another program
    of the same launch stored, or two programs storing different values to one element, raise
    RuntimeError here (see `Writers`), unless an acquire of the loading program read what a
    release of the storing one wrote. A program whose acquiring compare-and-swap waits
    (_state.Blocked) runs again from its start once another program has set the element; one
    still waiting when every other program has ended raises RuntimeError (a hang on the GPU).
    """
    pyfunc = getattr(kernel, "_pyfunc", None)
    if pyfunc is None:
        raise TypeError(f"kernel must be a @ct.kernel, got {type(kernel).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}")
    params = list(inspect.signature(pyfunc).parameters)
    if len(params) != len(args):
        raise TypeError(f"{pyfunc.__name__} takes {len(params)} arguments, got {len(args)}")
    metadata, writers = _param_annotations(pyfunc), {}
    wrapped = tuple(_wrap_arg(p, a, metadata.get(p, ()), writers) for p, a in zip(params, args))
    func = _Rebinder().function(pyfunc)
    g = _grid(grid)
    programs = list(itertools.product(range(g[2]), range(g[1]), range(g[0])))
    _state.new_launch()
    waiting = []  # (program, _state.Blocked): those whose acquire found its flag unset
    with np.errstate(all="ignore"):
        for program in reversed(programs):
            blocked = _run_program(func, wrapped, g, program, pyfunc.__name__)
            if blocked is not None:
                waiting.append((program, blocked))
                continue
            # a program ran to its end: run again, from their start, those it let through
            while ready := [w for w in waiting if w[1].holds()]:
                for w in ready:
                    waiting.remove(w)
                    again = _run_program(func, wrapped, g, w[0], pyfunc.__name__)
                    if again is not None:
                        waiting.append((w[0], again))
    if waiting:
        (z, y, x), blocked = waiting[0]
        raise RuntimeError(f"{pyfunc.__name__}: program bid=({x}, {y}, {z}) {blocked}, which no "
                           "program of the launch sets: on the GPU it would spin forever")


def _run_program(func, wrapped, g, program, name) -> _state.Blocked | None:
    """Run one program from its start; the Blocked wait that stopped it, or None."""
    z, y, x = program
    _state.enter(g, (x, y, z), name)
    try:
        if func(*wrapped) is not None:
            raise TypeError(f"kernel {name} returned a value")
    except _state.Blocked as blocked:
        return blocked
    except Exception as e:
        e.add_note(f"(in program bid=({x}, {y}, {z}) of grid {g}, run by the CPU interpreter)")
        raise
    finally:
        _state.leave()
    return None
