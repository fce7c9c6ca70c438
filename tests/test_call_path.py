"""The path of a call through the product (kernels.ssd_forward's pipeline: the signature's key,
then on its first call validate and plan, then bind and launch), traced with sys.setprofile: a
first call of a signature validates and builds its plan once, each stage's own functions call
into each other module once (STAGES), and no module calls back into one that called it (the
stages nest: no bounce); a second call of it runs no check and builds nothing. `moves` counts
the steps from one project module into another, as a reader following `x` would take them;
`bounces` those into a module still waiting below on the stack."""

import sys
from collections import Counter
from pathlib import Path

import pytest

from kernels import interpreter, ssd_forward
from shapes import Case, make_inputs

REPO = Path(__file__).resolve().parent.parent
CASE = Case("call_path", 2, 40, 4, 8, 2, 8, 16, D="head", z=True, dt="softplus",
            initial_states=True, seq_idx="sorted")
# the functions that check arguments (contract's checkers, the call's validation) or build a plan
CHECKS = ("check_", "_check", "validate", "_flags", "_options", "options", "build")
# the pipeline's stages, in kernels.ssd_forward.run's order: each stage's own functions, by
# (module, function); what they call into another module does the stage's work there
STAGES = {
    "key": {("kernels.plan", "plan_of"), ("kernels.plan", "key")},
    "validate": {("kernels.call", "validate"), ("kernels.call", "_flags"),
                 ("kernels.call", "_options")},
    "plan": {("kernels.plan", "build")},
    "bind": {("kernels.plan", "arrays"), ("kernels.plan", "bind")},
    "launch": {("kernels.arrays", "launch_parts"), ("kernels.arrays", "_launch_parts"),
               ("kernels.arrays", "launch"), ("kernels.arrays", "_launch")},
}


def _module(code) -> str | None:
    """The project module of a code object ("kernels/plan.py" -> "kernels.plan"), or None."""
    path = Path(code.co_filename)
    if not path.is_relative_to(REPO):
        return None
    parts = path.relative_to(REPO).with_suffix("").parts
    # the interpreter, the tests, and a virtual environment inside the checkout (CI's .venv)
    if {"interpreter", "tests", "site-packages"} & set(parts) or parts[0].startswith("."):
        return None
    return ".".join(parts)


def trace(call) -> tuple[Counter, list[tuple[str, str]], list[tuple[str, str, str]], Counter]:
    """(calls by (module, function), moves from one project module into another, bounces: moves
    (caller, module, function) into a module already on the stack below the caller, entries:
    the moves by their caller's function, a Counter of ((caller module, caller function),
    module entered)) of call()."""
    calls, moves, bounces, entries, stack = Counter(), [], [], Counter(), []

    def profile(frame, event, arg):
        if event == "call":
            module = _module(frame.f_code)
            caller = stack[-1] if stack else (None, None)
            if module is not None:
                calls[module, frame.f_code.co_name] += 1
                if caller[0] is not None and module != caller[0]:
                    moves.append((caller[0], module))
                    entries[caller, module] += 1
                    if module in (m for m, _ in stack):
                        bounces.append((caller[0], module, frame.f_code.co_name))
            stack.append((module, frame.f_code.co_name) if module else caller)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return calls, moves, bounces, entries


@pytest.fixture
def fresh_plans(monkeypatch):
    import kernels.plan
    monkeypatch.setattr(kernels.plan, "_PLANS", {})
    # the kernels themselves are not the path's subject (the interpreter would trace them)
    monkeypatch.setattr(interpreter, "launch", lambda grid, kernel, args: None)


def test_a_second_call_runs_no_check(fresh_plans):
    kw = make_inputs(CASE)
    call = lambda: ssd_forward(**kw, check_values=False, return_final_states=True)
    first, first_moves, first_bounces, first_entries = trace(call)
    entered = stage_entries(first_entries)
    second, second_moves, _, _ = trace(call)
    checks = lambda calls: {f"{m}.{f}": n for (m, f), n in calls.items()
                            if f.startswith(CHECKS)}
    assert first["kernels.call", "validate"] == 1 and first["kernels.plan", "build"] == 1
    assert first_bounces == [], Counter(first_bounces)
    assert {stage for stage, _ in entered} == set(STAGES) - {"launch"}, entered
    assert max(entered.values()) == 1, entered
    assert checks(second) == {}, checks(second)
    # a second call: the public function, its plan (key, bind, arrays), the launches and the
    # error word; never the contract, the launchers' rules or the kernel modules
    assert {m for m, _ in second} <= {"kernels.ssd_forward", "kernels.plan", "kernels.arrays",
                                      "kernels.errors", "kernels.tuning_table"}, set(second)
    assert len(second_moves) < len(first_moves)


def stage_entries(entries: Counter) -> Counter:
    """Counter of (stage, module): the calls of each stage's own functions (STAGES) into each
    other project module."""
    entered = Counter()
    for (caller, module), n in entries.items():
        for stage, functions in STAGES.items():
            if caller in functions:
                entered[stage, module] += n
    return entered


def test_host_value_checks_run_per_call_where_asked(fresh_plans):
    """check_values=True (and the NumPy default) reads A, D and dt_bias on every call: values are
    not part of a signature."""
    kw = make_inputs(CASE)
    for _ in range(2):
        calls, _, _, _ = trace(lambda: ssd_forward(**kw, check_values=True))
        assert calls["contract", "check_vector_values"] == 1
        assert calls["kernels.call", "validate"] <= 1


def main():
    """Prints the calls and moves of a first and a second call (the closing note's figures)."""
    import kernels.plan
    kernels.plan._PLANS.clear()
    interpreter.launch = lambda grid, kernel, args: None
    kw = make_inputs(CASE)
    for label in ("first", "second"):
        calls, moves, bounces, entries = trace(lambda: ssd_forward(**kw, check_values=False,
                                                          return_final_states=True))
        seen, back = set(), 0
        for _, module in moves:
            back += module in seen
            seen.add(module)
        print(f"{label} call: {sum(calls.values())} calls in {len({m for m, _ in calls})} "
              f"modules, {len(moves)} moves between modules, {back} back into one visited, "
              f"{len(bounces)} into one waiting below on the stack; entered by each stage: "
              + ", ".join(f"{stage} -> {module} x{n}"
                          for (stage, module), n in stage_entries(entries).items()))
        for (m, f), n in sorted(calls.items()):
            print(f"  {m}.{f} x{n}")


if __name__ == "__main__":
    main()
