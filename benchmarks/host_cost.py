"""The host cost of an ssd_forward call, its floor, and the GPU time of the default call against
check_values=False, in one process on the GPU (issue: the default call at GPU speed).

    python -m benchmarks.host_cost

Host: microseconds per call, 200 calls back to back (the median of 5 such runs, after 20 warm-up
calls) at (1, 256, 8, 64, 64, 1, 64) fp32 with D: the default call (CuPy, then torch tensors),
check_values=True, check_values=False, mamba_ssm's mamba_chunk_scan_combined on the same torch
tensors (where it imports: its source on PYTHONPATH), and the floor: ct.launch of the same
call's launches, built once. GPU: median ms of the default call and of check_values=False on
the five anchor rows (fp32; bf16 x, B, C as torch tensors), ROUNDS rounds interleaved, each of
REPS calls behind L2 flushes (benchmarks.sweep.fed_gpu_time), the median of the rounds' medians.
"""

from __future__ import annotations

import dataclasses
import statistics
import time

SMALL = (1, 256, 8, 64, 64, 1, 64)
ROUNDS, REPS = 7, 21


def host_us(call, n: int = 200, runs: int = 5) -> float:
    import cupy
    for _ in range(20):
        call()
    per_call = []
    for _ in range(runs):
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            call()
        per_call.append((time.perf_counter() - t0) / n * 1e6)
        cupy.cuda.runtime.deviceSynchronize()
    return statistics.median(per_call)


def _torch(a: dict, narrow=None) -> dict:
    import torch
    t = {k: torch.as_tensor(v, device="cuda") for k, v in a.items()}
    for name in ("x", "B", "C") if narrow else ():
        t[name] = t[name].to(narrow)
    return t


def main():
    import cupy
    import torch

    import cuda.tile as ct
    from benchmarks.configs import ANCHORS, row_inputs
    from benchmarks.sweep import fed_gpu_time
    from benchmarks.timing import cupy_flush
    from kernels import errors, ssd_forward
    from kernels.call import Call
    from kernels.launches import forward_launches
    from kernels.plan import plan_of

    a, chunk = row_inputs(SMALL), SMALL[-1]
    t = _torch(a)

    def call(arr, **kw):
        return lambda: ssd_forward(arr["x"], arr["dt"], arr["A"], arr["B"], arr["C"], chunk,
                                   D=arr["D"], **kw)
    rows = {"default": call(a), "default, torch tensors": call(t),
            "check_values=True": call(a, check_values=True),
            "check_values=False": call(a, check_values=False)}
    call_of = Call(a["x"], a["dt"], a["A"], a["B"], a["C"], chunk, a["D"])
    forward = plan_of(call_of)
    backend = forward.backend
    parts = forward.forward_parts(forward.arrays(call_of))
    word = errors.scratch_word(backend)
    plan = [launch for arrays, sm_count in parts for launch in forward_launches(
        dataclasses.replace(arrays, errors=word), sm_count)]
    stream = cupy.cuda.get_current_stream()

    def bare():
        for kernel, grid, args in plan:
            ct.launch(stream, grid, kernel, args)
    rows[f"floor: ct.launch of its {len(plan)} launches"] = bare
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
        rows["mamba_ssm, torch tensors"] = lambda: mamba_chunk_scan_combined(
            t["x"], t["dt"], t["A"], t["B"], t["C"], chunk, D=t["D"])
    except ImportError as e:
        print(f"mamba_ssm not timed: {e}")
    for label, fn in rows.items():
        print(f"host {label:40s} {host_us(fn):8.1f} us/call", flush=True)

    flush = cupy_flush()
    for name, config in ANCHORS.items():
        a, chunk = row_inputs(config), config[-1]
        for dtype, arr in (("fp32", a), ("bf16", _torch(a, torch.bfloat16))):
            calls = {cv: call(arr, return_final_states=True, check_values=cv)
                     for cv in (None, False)}
            for fn in calls.values():
                fn()
            cupy.cuda.runtime.deviceSynchronize()
            ms = {cv: [] for cv in calls}
            for _ in range(ROUNDS):
                for cv, fn in calls.items():
                    ms[cv].append(fed_gpu_time(fn, REPS, flush, 4)[0])
            default, nocheck = (statistics.median(ms[cv]) for cv in (None, False))
            print(f"gpu  {name:12s} {dtype} default {default:.3f} ms, check_values=False "
                  f"{nocheck:.3f} ms, ratio {default / nocheck:.3f}", flush=True)


if __name__ == "__main__":
    main()
