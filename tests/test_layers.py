"""The import layers of the product, checked from the source with `ast` (nothing is imported).

Every `import` / `from ... import` in each project file counts, top-level or nested in a function
(a lazy import is still a dependency), relative imports resolved. A module may import its own
layer or lower only; the four kernels of layer 1 may not import one another (what they share
lives in layer 0); the float64 references never import `kernels`; the whole graph has no cycle;
and every module sits in a layer of LAYERS, so a new module is placed on purpose. Why: the
references must stay an independent check on the kernels, and the kernels must build without
the tuner or the harness (an upward or circular import breaks that silently).
"""
from __future__ import annotations

import ast
from pathlib import Path

LAYERS = {  # bottom to top; "x.*" means the submodules of x (not x itself)
    # the input contract, shared constants, array backends, the helpers inside the kernels, the
    # tuning table, the CPU interpreter, the standalone launcher's skeleton
    0: ("contract", "kernels.constants", "kernels.arrays", "kernels.tiles",
        "kernels.tuning_table", "kernels.errors", "kernels.launcher", "kernels.interpreter",
        "kernels.interpreter.*"),
    # the float64 references, and the five kernels with their launchers (PEERS)
    1: ("reference", "reference.*", "kernels.chunk_cumsum", "kernels.fwd_pass_state",
        "kernels.compute_out", "kernels.ssd_scan", "kernels.ssd_varlen"),
    # the forward pass: the kernels chained (its launches, a call and its checks, the plan of
    # a signature, the torch op, the public function)
    2: ("kernels.launches", "kernels.call", "kernels.plan", "kernels.torch_op",
        "kernels.ssd_forward"),
    # the tuner, mamba_ssm's entry point (kernels.ssd_combined), and the package's public
    # surface (kernels/__init__.py)
    3: ("kernels.tuning", "kernels.ssd_combined", "kernels"),
    # the harness: property suite and benchmarks
    4: ("properties", "properties.*", "benchmarks", "benchmarks.*"),
    # pytest: may import anything; nothing below may import it
    5: ("conftest", "tests", "tests.*"),
}
PEERS = ("kernels.chunk_cumsum", "kernels.fwd_pass_state", "kernels.compute_out",
         "kernels.ssd_scan", "kernels.ssd_varlen")  # no imports among them
SOURCES = ("contract.py", "conftest.py", "kernels/**/*.py", "reference/**/*.py",
           "properties/**/*.py", "benchmarks/**/*.py")
REPO = Path(__file__).resolve().parent.parent


def discover(root: Path) -> dict[str, Path]:
    """Module name -> file, for the project files under root."""
    modules = {}
    for pattern in SOURCES:
        for path in sorted(root.glob(pattern)):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def resolve(name: str, modules) -> str | None:
    """The project module `name` denotes (its longest existing prefix); None if not a project's."""
    parts = name.split(".")
    if parts[0] in ("conftest", "tests"):  # not walked, but named: an import of them counts
        return name
    prefixes = (".".join(parts[:n]) for n in range(len(parts), 0, -1))
    return next((m for m in prefixes if m in modules), None)


def import_edges(root: Path):
    """(importer, file, line, imported) for each import between project modules; the modules."""
    modules = discover(root)
    edges = []
    for mod, path in modules.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                    base = ".".join(p for p in anchor + [base] if p)
                for alias in node.names:  # `from pkg import sub` names the submodule pkg.sub
                    sub = f"{base}.{alias.name}" if base else alias.name
                    targets.append(sub if sub in modules else base)
            for target in targets:
                imported = resolve(target, modules)
                if imported is not None and imported != mod:
                    edges.append((mod, path.relative_to(root).as_posix(), node.lineno, imported))
    return edges, modules


def layer_of(mod: str) -> int | None:
    return next((layer for layer, patterns in LAYERS.items() for p in patterns
                 if mod == p or (p.endswith(".*") and mod.startswith(p[:-1]))), None)


def unplaced(modules) -> list[str]:
    problems = [f"{m} is in no layer: put it in a layer of LAYERS" for m in modules
                if layer_of(m) is None]
    return problems + [f"{p} is in LAYERS but there is no such module" for ps in LAYERS.values()
                       for p in ps if p not in modules and "*" not in p and p != "tests"]


def upward(edges) -> list[str]:
    problems = []
    for mod, file, line, imp in edges:
        lo, li = layer_of(mod), layer_of(imp)
        if lo is not None and li is not None and li > lo:
            problems.append(f"{file}:{line}: {mod} (layer {lo}) imports {imp} (layer {li})")
        elif mod in PEERS and imp in PEERS:
            problems.append(f"{file}:{line}: {mod} imports {imp}: the kernels of layer {lo} "
                            "may not import each other (move what they share to layer 0)")
    return problems


def cycles(edges) -> list[str]:
    """The shortest import cycle through each module that is on one, each cycle once."""
    graph, where = {}, {}
    for mod, file, line, imp in edges:
        graph.setdefault(mod, set()).add(imp)
        where.setdefault((mod, imp), f"{file}:{line}")
    found = {}
    for start in sorted(graph):  # breadth first from start until an edge leads back to it
        paths, frontier, cycle = {start: [start]}, [start], None
        while frontier and cycle is None:
            nxt = []
            for v in frontier:
                for w in sorted(graph.get(v, ())):
                    if w == start and cycle is None:
                        cycle = paths[v] + [start]
                    elif w not in paths:
                        paths[w] = paths[v] + [w]
                        nxt.append(w)
            frontier = nxt
        if cycle:
            found.setdefault(frozenset(cycle), cycle)
    return ["import cycle: " + " -> ".join(f"{a} ({where[a, b]})" for a, b in zip(c, c[1:]))
            + f" -> {c[0]}" for c in found.values()]


def reference_to_kernels(edges) -> list[str]:
    return [f"{file}:{line}: {mod} imports {imp}: the float64 references never import kernels"
            for mod, file, line, imp in edges
            if mod.split(".")[0] == "reference" and imp.split(".")[0] == "kernels"]


def test_every_module_in_a_layer():
    problems = unplaced(import_edges(REPO)[1])
    assert not problems, "\n".join(problems)


def test_no_upward_import():
    problems = upward(import_edges(REPO)[0])
    assert not problems, "\n".join(problems)


def test_no_import_cycle():
    problems = cycles(import_edges(REPO)[0])
    assert not problems, "\n".join(problems)


def test_reference_never_imports_kernels():
    problems = reference_to_kernels(import_edges(REPO)[0])
    assert not problems, "\n".join(problems)


def test_checker_on_synthetic_trees(tmp_path):
    def tree(name, files):
        root = tmp_path / name
        for rel, text in {**good, **files}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text)
        return import_edges(root)

    good = {"contract.py": "import numpy\n", "kernels/__init__.py": "from kernels import tuning\n",
            "kernels/arrays.py": "from contract import x\n", "kernels/constants.py": "",
            "kernels/tuning_table.py": "", "kernels/errors.py": "", "kernels/torch_op.py": "",
            "kernels/launcher.py": "", "kernels/tiles.py": "",
            "kernels/interpreter/_ops.py": "from .. import arrays\n",
            "kernels/interpreter/__init__.py": "from . import _ops\n",
            "kernels/tuning.py": "def f():\n    from .ssd_forward import g\n",
            "kernels/ssd_combined.py": "", "kernels/launches.py": "", "kernels/call.py": "",
            "kernels/plan.py": "",
            "kernels/ssd_forward.py": "from kernels import chunk_cumsum, fwd_pass_state\n",
            "kernels/chunk_cumsum.py": "from kernels.constants import LOG2E\n",
            "kernels/fwd_pass_state.py": "", "kernels/compute_out.py": "from . import arrays\n",
            "kernels/ssd_scan.py": "", "kernels/ssd_varlen.py": "",
            "reference/__init__.py": "import contract\n", "properties/__init__.py": "",
            "properties/checks.py": "import reference\n",
            "benchmarks/__init__.py": "from properties import checks\n", "conftest.py": ""}
    edges, modules = tree("good", {})
    assert not unplaced(modules) and not upward(edges) and not cycles(edges)
    assert ("kernels.interpreter._ops", "kernels/interpreter/_ops.py", 1,
            "kernels.arrays") in edges  # a relative import, resolved
    assert ("kernels.tuning", "kernels/tuning.py", 2, "kernels.ssd_forward") in edges
    assert len(edges) == 12
    lazy = "def f():\n    if 1:\n        import kernels.tuning\n"  # upward, inside a function
    edges, _ = tree("up", {"kernels/arrays.py": lazy,
                           "kernels/compute_out.py": "from kernels.chunk_cumsum import LOG2E\n",
                           "properties/checks.py": "from conftest import gpu\n"})
    assert sorted(":".join(p.split(":")[:2]) for p in upward(edges)) == [
        "kernels/arrays.py:3", "kernels/compute_out.py:1", "properties/checks.py:1"]
    edges, _ = tree("cycle", {"kernels/constants.py": "from .arrays import a\n",
                              "kernels/arrays.py": "from kernels.constants import b\n"})
    assert cycles(edges) == ["import cycle: kernels.arrays (kernels/arrays.py:1) -> "
                             "kernels.constants (kernels/constants.py:1) -> kernels.arrays"]
    edges, modules = tree("new", {"kernels/extra.py": "", "reference/m.py": "import kernels\n"})
    assert unplaced(modules) == ["kernels.extra is in no layer: put it in a layer of LAYERS"]
    assert [p.split(":")[:2] for p in reference_to_kernels(edges)] == [["reference/m.py", "1"]]
    assert len(import_edges(REPO)[0]) > 20  # the real tree: a parser that finds nothing fails
