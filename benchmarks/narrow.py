"""16-bit inputs on the GPU, in one process: the chunk states' dtype, and float16's products.

    python -m benchmarks.narrow states [--reps 15]
    python -m benchmarks.narrow products [--products shipped|tf32|unscaled] [--reps 15]

`states`: ssd_forward on bfloat16 inputs with state_dtype float32 and bfloat16, alternating, three
rounds each, on benchmarks.configs.THREE_KERNEL_ROWS (shapes whose forward runs the three
kernels), and how far y and final_states move between the two.
`products`: ssd_forward on float16 inputs over the anchor rows and two three-kernel shapes.
`--products` chooses how float16 inputs multiply: `shipped` (as the kernels do: float16
operands, the scan's guarded by its redo, the other kernels' scaled), `tf32` (every operand TF32)
or `unscaled` (the other kernels' float16 operands unscaled: wrong past 65504, timed as the floor
of the scaling's cost). A kernel compiles once per process, so a process times one variant: run
it once per variant, in turn, twice.
Timing: benchmarks.peers.gpu_ms (L2 flushed, median of --reps rounds, ms).
"""

from __future__ import annotations

import argparse

import cuda.tile as ct

from benchmarks.configs import ANCHORS, THREE_KERNEL_ROWS
from kernels.tiles import mma_operand


def _forward(config, dtype: str, **kw):
    """A call of ssd_forward on a row's inputs (x, B, C in `dtype`, D per head, final states)."""
    import kernels
    from benchmarks.peers import row_tensors
    a = row_tensors(config, dtype)
    args = (a["x"], a["dt"], a["A"], a["B"], a["C"], config[-1])
    return lambda: kernels.ssd_forward(*args, D=a["D"], return_final_states=True, **kw)


def states(reps: int):
    import torch

    from benchmarks.peers import gpu_ms
    for name, config in THREE_KERNEL_ROWS.items():
        wide = _forward(config, "bfloat16", state_dtype="float32")
        narrow = _forward(config, "bfloat16", state_dtype="bfloat16")
        y0, s0 = (t.clone() for t in wide())
        y1, s1 = narrow()
        torch.cuda.synchronize()
        dy = ((y1.float() - y0.float()).abs().max() / y0.float().abs().max()).item()
        ds = ((s1 - s0).abs().max() / s0.abs().max()).item()
        times = {"float32": [], "bfloat16": []}
        for _ in range(3):
            times["float32"].append(gpu_ms(wide, reps))
            times["bfloat16"].append(gpu_ms(narrow, reps))
        print(f"{name} {config}: float32 states " + " ".join(f"{t:.3f}" for t in times["float32"])
              + ", bfloat16 states " + " ".join(f"{t:.3f}" for t in times["bfloat16"])
              + f" ms; max |dy| / max |y| {dy:.2e}, final_states {ds:.2e}", flush=True)


# the variants the kernels do not take: every operand TF32 (float16 inputs widened, exact), or
# the scaling kernels' products (mma_product) on unscaled float16 operands
def _tf32_operand(t, dtype):
    return mma_operand(t, ct.float32 if dtype == ct.float16 else dtype)


def _tf32_product(a, b, acc, dtype):
    return ct.mma(_tf32_operand(a, dtype), _tf32_operand(b, dtype), acc)


def _unscaled_product(a, b, acc, dtype):
    return ct.mma(mma_operand(a, dtype), mma_operand(b, dtype), acc)


def _products(variant: str):
    """Bind the kernel modules' product helpers to `variant` (a kernel reads its module's
    names when it compiles, at its first launch: before any, in this process)."""
    import sys

    import kernels  # noqa: F401  (imports every kernel module)
    helpers = {"tf32": (_tf32_operand, _tf32_product),
               "unscaled": (mma_operand, _unscaled_product)}.get(variant)
    if helpers is None:
        return
    for name in ("arrays", "compute_out", "fwd_pass_state", "ssd_scan", "ssd_varlen"):
        module = sys.modules[f"kernels.{name}"]
        for attr, helper in zip(("mma_operand", "mma_product"), helpers):
            if hasattr(module, attr):
                setattr(module, attr, helper)


def products(variant: str, reps: int):
    _products(variant)
    import torch

    from benchmarks.peers import gpu_ms
    out = []
    for name, config in {**ANCHORS, **dict(list(THREE_KERNEL_ROWS.items())[:2])}.items():
        call = _forward(config, "float16")
        y, _ = call()
        torch.cuda.synchronize()
        if not bool(torch.isfinite(y).all()):
            raise RuntimeError(f"{name}: float16 y not finite ({variant} products)")
        out.append(f"{name} {gpu_ms(call, reps):.3f}")
    print(f"float16, {variant} products, ms: " + ", ".join(out), flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("states", "products"))
    parser.add_argument("--products", default="shipped", choices=("shipped", "tf32", "unscaled"))
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    if args.what == "states":
        states(args.reps)
    else:
        products(args.products, args.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
