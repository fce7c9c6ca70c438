"""The one skeleton of a kernel run on its own (each kernel module's public function:
chunk_cumsum, fwd_pass_state, compute_out, ssd_scan): check, lay out, allocate, check values
where asked, launch inside the call's error word. Each module declares the same protocol beside
it: its Choice, CHOICES, rules_choice(dims, sm_count) and its launcher (the one place its tiles
and kernel objects are chosen)."""

from __future__ import annotations

from collections.abc import Callable

from contract import check_grid, check_vector_values
from kernels.arrays import backend_of
from kernels.errors import check_on_host, open_word


def run_alone(name: str, arrays: dict, *, check: Callable, outputs: Callable,
              launches: Callable, check_values=None, values: tuple[str, ...] = (),
              word: bool = True) -> dict:
    """Kernel `name` on `arrays` (its arguments by name, None where absent), its arrays by name
    returned, outputs included. In order: where the arrays lie (one kind, one device:
    kernels.arrays.backend_of), `check(**arrays)` (the contract's checks of their shapes and
    dtypes, returning the launch's contract.Dims), the grid's limits; then the inputs as the
    kernels take them (Backend.laid_out) and seq_idx as its segment ids ("seg"), the outputs
    allocated (`outputs(dims)`: {name: (shape, like)}, `like` an input's name whose dtype the
    output takes, or None for float32), the arguments named in `values` checked on the host
    where check_values asks (kernels.errors.check_on_host: last before the launch, it waits);
    then `launches(arrays, backend, errors)`, a list of (kernel, grid, args), launched on the
    current stream inside a new error word of the call (`word`: whether the kernel reports bad
    values; a kernel that reports none takes no word)."""
    backend = backend_of(**arrays)
    dims = check(**arrays)
    check_grid(dims.batch, dims.nheads)
    laid = {n: backend.laid_out(a) for n, a in arrays.items() if n != "seq_idx"}
    laid["seg"] = backend.segment_ids(arrays.get("seq_idx"))
    for output, (shape, like) in outputs(dims).items():
        laid[output] = backend.empty(shape, like=None if like is None else laid[like])
    if check_on_host(check_values, backend):
        given = {n: laid[n] for n in values if laid.get(n) is not None}
        if given:
            check_vector_values(**given)
    if not word:
        for launch in launches(laid, backend, None):
            backend.launch(*launch)
        return laid
    with open_word(backend, name) as error_word:  # a word left unused by a bad choice stays clear
        for launch in launches(laid, backend, error_word.array):
            backend.launch(*launch)
    return laid
