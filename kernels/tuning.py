"""Per-shape tuning of compute_out (the forward's largest kernel) on the GPU: a search with
`cuda.tile.tune.exhaustive_search` over the declared choices it can run on the shape (program
layout, heads per program, occupancy hint, token block; kernels.compute_out.CHOICES), recorded
per shape and device in kernels.tuning_table.

    y = ssd_forward(...)                        # the launchers' rules (measured on the H200)
    tune_forward(x, dt, A, B, C, chunk_size, ...)  # once per shape: search, remember the best
    y = ssd_forward(...)                        # the tuned choice for that shape on this device

Choices are per launch signature: where ssd_forward runs the batch as slices, per slice. Only an
explicit tune_forward call searches; ssd_forward and compute_out only look choices up, and a
stored choice compute_out cannot run on its shape is refused at launch (compute_out_launch).
The interpreter (NumPy arrays) never uses a tuned choice. Latency hints are not searched
(benchmarks/DECISIONS.md, "tune_forward: search space").
"""

from __future__ import annotations

import dataclasses
import math

from contract import check_vector_values
from kernels.arrays import backend_of
from kernels.compute_out import (KERNEL_OBJECTS, Choice, compute_out_choices,
                                 compute_out_launch, compute_out_signature)
from kernels.errors import scratch_word
from kernels.call import Call
from kernels.launches import ForwardPart, forward_launches
from kernels.plan import plan_of
from kernels.tuning_table import device_key, record


def search(stream, launch_of, choices: list[Choice]):
    """cuda.tile.tune's exhaustive search: `launch_of(choice)` -> (kernel, grid, args), each
    timed on `stream` with L2 flushed; its TuningResult (best, successes, failures)."""
    from cuda.tile.tune import exhaustive_search
    launches = {c: launch_of(c) for c in choices}
    return exhaustive_search(choices, stream, lambda c: launches[c][1],
                             lambda c: launches[c][0], lambda c: launches[c][2], quiet=True)


def tune_forward(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                 seq_idx=None, dt_softplus=False, dt_limit=(0.0, math.inf)) -> dict:
    """Search compute_out's choices for the launches ssd_forward makes with these arguments (GPU
    arrays: CuPy or torch CUDA), remember the fastest per launch signature for this device, and
    return {signature: cuda.tile.tune.TuningResult}. Arguments are checked as ssd_forward checks
    them; the search runs the forward's first two kernels to give compute_out real inputs, then
    times each choice (compiling it first: seconds per choice on a first run). Where the forward
    runs the scan (kernels.ssd_scan) it launches no compute_out: nothing is searched, {}."""
    if backend_of(x=x, dt=dt, A=A, B=B, C=C, D=D, z=z, dt_bias=dt_bias,
                  initial_states=initial_states, seq_idx=seq_idx).kind == "numpy":
        raise TypeError("x: tune_forward times kernels on the GPU: pass CuPy arrays or torch "
                        "CUDA tensors, got NumPy arrays")
    call = Call(x, dt, A, B, C, chunk_size, D, z, dt_bias, initial_states, seq_idx,
                dt_softplus=dt_softplus, dt_limit=dt_limit)
    plan = plan_of(call)  # the forward's own plan: its checks, batch slices and choices
    backend = plan.backend
    with backend.on_device():
        parts = plan.forward_parts(plan.arrays(call))
    check_vector_values(A, D=D, dt_bias=dt_bias)
    return tune_parts(backend, device_key(backend.kind, backend.device, backend.sm_count), parts,
                      search)


def tune_parts(backend, key: str, parts: list[ForwardPart], search_fn) -> dict:
    """tune_forward's search over a forward's parts (ssd_forward.forward_parts): each part that
    runs the three kernels (not the scan, which launches no compute_out) runs its chunk_cumsum
    and fwd_pass_state, then its compute_out signature, where this call has not searched it
    yet, is searched with `search_fn(stream, launch_of, choices)` (search's
    signature) on the arrays' device and current stream, and its best choice recorded for
    device `key`."""
    results = {}
    with backend.on_device():
        stream = backend.current_stream()
        word = scratch_word(backend)  # the values were checked on the host
        for part in parts:
            part = part._replace(arrays=dataclasses.replace(part.arrays, errors=word))
            launches = forward_launches(*part)
            if launches[-1][0] not in KERNEL_OBJECTS:  # the scan: no compute_out to tune
                continue
            for kernel, grid, args in launches[:-1]:
                backend.launch(kernel, grid, args)
            arrays = part.arrays.compute_out_arrays()
            signature = compute_out_signature(*arrays)
            if signature in results:
                continue
            # each choice as ssd_forward launches it (D checked by chunk_cumsum, not here)
            result = search_fn(stream, lambda c, arrays=arrays, part=part: compute_out_launch(
                *arrays, part.sm_count, choice=c, errors=word, check_D=False),
                compute_out_choices(*arrays))
            record(key, signature, result.best.config)
            results[signature] = result
    return results
