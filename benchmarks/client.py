"""mamba_ssm's own Mamba2 layer with each scan, where users call the forward (GPU; torch, and
mamba_ssm's source importable, e.g. from the ignored folder .ext/):

    python -m benchmarks.client [--configs 2p7b_rmsnorm,130m_z] [--dtypes bfloat16] [--reps 40]

For each layer config and dtype: `Mamba2` (use_mem_eff_path=False, random weights, eval, no
grad) on one input, with its `mamba_chunk_scan_combined` mamba_ssm's and with ours
(kernels.ssd_combined, patched into mamba_ssm.modules.mamba2), each layer timed whole, and both
scans alone on the layer's real call (its arguments as the layer passed them, captured: views
of one projection, the parameters' dtypes); the four calls take turns in each round
(benchmarks.peers.rounds_ms). Printed: each call's argument layouts and our plan's copies, the
times (median ms of the rounds, L2 flushed, host hidden), the saving the layer keeps of the
scans' own (`kept`: the median of each round's paired savings, kept_saving), and our outputs on
the real call checked against the float64 reference within their bounds (properties.bounds): y
of the call's first CHECK_TOKENS tokens of batch element 0 (y is causal: the same as the
prefix's) and the final state of that prefix called alone (the same views, sliced). Exit 1 if a
check fails or a target misses: the layer faster with our scan on every row, keeping >=
KEEP_MIN of the saving.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import inspect
import math
import statistics

import numpy as np

from benchmarks.peers import rounds_ms

# the layers: (Mamba2 keyword arguments, batch, seqlen); they differ in the gate (RMSNorm-gated
# or z into the scan), D (per head, per channel), dt_limit and groups
CONFIGS = {
    "2p7b_rmsnorm": (dict(d_model=2560, d_state=128, headdim=64, ngroups=1, chunk_size=256,
                          rmsnorm=True), 4, 4096),
    "130m_z": (dict(d_model=768, d_state=128, headdim=64, ngroups=1, chunk_size=256,
                    rmsnorm=False), 8, 2048),
    "groups_8_channel_D": (dict(d_model=2048, d_state=64, headdim=64, ngroups=8, chunk_size=128,
                                D_has_hdim=True, dt_limit=(1e-3, 0.1)), 2, 4000),
}
DTYPES = ("float32", "bfloat16")
KEEP_MIN = 0.8  # of the scans' own saving, the layer keeps at least this
CHECK_TOKENS = 512  # tokens of the checked prefix (two chunks at least: a state handed on)


def kept_saving(rounds: dict) -> float:
    """The share of the scans' own saving the layer keeps: the median over rounds of the layer's
    saving (mamba_ssm's scan minus ours, the same round) over that of the scans alone."""
    saving = lambda what: statistics.median(
        t - o for t, o in zip(rounds[f"{what} mamba_ssm"], rounds[f"{what} cutile"]))
    scans = saving("scan")
    return saving("layer") / scans if scans > 0 else -math.inf


def _capture(layer, u, module) -> dict:
    """The arguments by name of the layer's call of `module.mamba_chunk_scan_combined` on u."""
    calls = []
    scan = module.mamba_chunk_scan_combined

    def spy(*args, **kwargs):
        calls.append(inspect.signature(scan).bind(*args, **kwargs).arguments)
        return scan(*args, **kwargs)
    module.mamba_chunk_scan_combined = spy
    try:
        layer(u)
    finally:
        module.mamba_chunk_scan_combined = scan
    return calls[0]


def _layout(name, t) -> str:
    if t is None or not hasattr(t, "stride"):
        return ""
    return f"{name} {str(t.dtype).removeprefix('torch.')} {tuple(t.shape)} {tuple(t.stride())}"


def _prefix(call: dict, tokens: int) -> dict:
    """The call's arguments restricted to batch element 0 and its first `tokens` tokens (the
    same views, sliced: the layouts stay), its final states returned."""
    prefix = dict(call, return_final_states=True)
    for name in ("x", "dt", "B", "C", "z", "seq_idx"):
        if call.get(name) is not None:
            prefix[name] = call[name][:1, :tokens]
    if call.get("initial_states") is not None:
        prefix["initial_states"] = call["initial_states"][:1]
    return prefix


def _host(t):
    """A torch tensor as a float64 NumPy array (16-bit values widen exactly)."""
    return None if t is None else t.detach().double().cpu().numpy()


def _check(args: dict, y, final, operands: str, stored_states: bool) -> dict:
    """err/bound of y and final_states against the float64 recurrence (ProcessPool worker)."""
    import reference as R
    from properties.bounds import narrow_output_bound
    from properties.compare import check_close, forward_bounds
    from properties.strategies import Problem
    p = Problem(**args)
    y_ref, final_ref = R.ssd_recurrent(p.x, p.dt, p.A, p.B, p.C, **p.options())
    b = forward_bounds(p, operands=operands, stored_states=stored_states)
    dtype = "float32" if operands == "tfloat32" else operands
    metrics = check_close("y", y, y_ref, narrow_output_bound(y_ref, b.y, dtype), b.M, p,
                          floor=b.floor)
    metrics.update(check_close("final_states", final, final_ref, b.final, b.final_M, p,
                               floor=b.floor))
    return {k: v for k, v in metrics.items() if k.endswith("err/bound")}


def run_row(name: str, dtype: str, reps: int) -> dict:
    """One config in one dtype: the layouts, the times, the check's inputs."""
    import torch
    import mamba_ssm.modules.mamba2 as module
    from kernels.ssd_combined import mamba_chunk_scan_combined as ours
    from kernels.call import Call
    from kernels.plan import plan_of
    theirs = module.mamba_chunk_scan_combined
    options, batch, seqlen = CONFIGS[name]
    torch.manual_seed(0)
    narrow = getattr(torch, dtype)
    layer = module.Mamba2(**options, use_mem_eff_path=False, device="cuda",
                          dtype=narrow).eval()
    u = torch.randn(batch, seqlen, options["d_model"], device="cuda", dtype=narrow)
    with torch.no_grad():
        call = _capture(layer, u, module)
        plan = plan_of(Call(**{k: v for k, v in call.items() if k in Call._fields}))
        def layer_with(scan):
            module.mamba_chunk_scan_combined = scan
            try:
                return layer(u)
            finally:
                module.mamba_chunk_scan_combined = theirs
        reference_out, out = layer_with(theirs), layer_with(ours)
        rounds = rounds_ms({"layer mamba_ssm": lambda: layer_with(theirs),
                            "layer cutile": lambda: layer_with(ours),
                            "scan mamba_ssm": lambda: theirs(**call),
                            "scan cutile": lambda: ours(**call)}, reps)
        layer_diff = float((out.float() - reference_out.float()).abs().max()
                           / reference_out.float().abs().max())
        y = ours(**call)
        y = y[0] if isinstance(y, tuple) else y
        tokens = min(seqlen, CHECK_TOKENS)
        prefix = _prefix(call, tokens)
        _, final = ours(**prefix)
        torch.cuda.synchronize()
    check = {k: _host(prefix.get(k)) for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias",
                                                "initial_states", "seq_idx")}
    check.update(chunk_size=int(prefix["chunk_size"]),
                 dt_softplus=bool(prefix.get("dt_softplus")),
                 dt_limit=tuple(prefix.get("dt_limit", (0.0, math.inf))))
    if check["seq_idx"] is not None:
        check["seq_idx"] = check["seq_idx"].astype(np.int32)
    stored = any(n == "chunk_states" for n, _, _ in plan.outputs) and dtype == "bfloat16"
    return dict(layouts=[_layout(k, v) for k, v in call.items()], copies=plan.copies,
                times={name: statistics.median(ms) for name, ms in rounds.items()},
                kept=kept_saving(rounds), layer_diff=layer_diff,
                check=(check, _host(y[:1, :tokens]), _host(final),
                       "bfloat16" if dtype == "bfloat16" else "tfloat32", stored))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.client",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--dtypes", default=",".join(DTYPES))
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args(argv)
    rows = [(c, d) for c in args.configs.split(",") for d in args.dtypes.split(",")]
    unknown = [c for c, _ in rows if c not in CONFIGS] + [d for _, d in rows if d not in DTYPES]
    if unknown:
        parser.error(f"unknown configs or dtypes {sorted(set(unknown))}")
    results = {}
    for row in rows:
        r = results[row] = run_row(*row, args.reps)
        t = r["times"]
        print(f"{row[0]} {row[1]}: our plan copies {list(r['copies']) or 'nothing'}; "
              f"layer outputs differ by {r['layer_diff']:.1e} (relative, max); ms: "
              + ", ".join(f"{k} {v:.3f}" for k, v in t.items()), flush=True)
        for line in filter(None, r["layouts"]):
            print("   ", line)
    with concurrent.futures.ProcessPoolExecutor() as pool:
        checks = {row: pool.submit(_check, *r["check"]) for row, r in results.items()}
        print("\n| layer | dtype | layer mamba_ssm | layer cuTile | scan mamba_ssm | scan cuTile "
              "| layer speedup | kept of the scans' saving | y err/bound | final err/bound |\n"
              "|---|---|---|---|---|---|---|---|---|---|")
        failed = False
        for row, r in results.items():
            t, kept = r["times"], r["kept"]
            try:
                metrics = checks[row].result()
                ratios = [f"{metrics['y err/bound']:.2f}",
                          f"{metrics['final_states err/bound']:.2f}"]
            except AssertionError as e:
                ratios, failed = ["FAILED", str(e).splitlines()[0]], True
            failed |= t["layer cutile"] >= t["layer mamba_ssm"] or kept < KEEP_MIN
            print(f"| {row[0]} | {row[1]} | {t['layer mamba_ssm']:.3f} | {t['layer cutile']:.3f} "
                  f"| {t['scan mamba_ssm']:.3f} | {t['scan cutile']:.3f} "
                  f"| {t['layer mamba_ssm'] / t['layer cutile']:.2f}x | {kept:.0%} | "
                  + " | ".join(ratios) + " |", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
