"""compute-sanitizer's four tools over the reach model's cover problems (GPU).

    python -m properties.sanitize [--tools memcheck,initcheck,racecheck,synccheck] [--jobs 8]

The calls are the cover of properties.reach at the ci caps and this device's SM count: a few
small problems that launch every kernel object and launch class the property suite can reach
(float32, bfloat16 and float16 activations, the packed path, the standalone launchers), each run
by its property (reach.COVER_PROPERTY) so that its outputs are checked as well. Every (tool,
problem) pair runs in its own process under `compute-sanitizer --tool TOOL`, `--jobs` at a time.

Each report is attributed to a kernel object and the source lines it names. A report is
explained when a rule of EXPLAINED matches it: tool, kernel, the text of the reported source
line (looked up in the kernel's file, so a rule follows the line when code moves and fails
loudly when the line changes) and the report's kind; every rule names the DECISIONS.md section
that shows its cause on a minimal kernel. Prints a table (tool x kernel object: calls, reports,
explained) and every unexplained report, and exits 1 if there is one, or if a process failed or
a tool did not finish (a hidden report is an unexplained one).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TOOLS = ("memcheck", "initcheck", "racecheck", "synccheck")
# reports printed per process: enough for every report of a cover problem (small sizes); a
# process that hides reports beyond it fails (PRINT_LIMIT hidden reports are never explained)
PRINT_LIMIT = 100_000


@dataclass(frozen=True)
class Explained:
    """Reports of one tool at one source line of one kernel object, with their cause."""
    tool: str
    kernel: str  # the kernel's Python function (its compiled name without the specialization)
    path: str  # the kernel's file, relative to the repository root
    text: str  # the reported line's source text, in the kernel's function `count` times
    kind: str  # the start of the report's first line
    reason: str  # the DECISIONS.md section that reproduces and explains it
    nth: int = 0  # which of the occurrences (from the function's start)
    count: int = 1

    def where(self) -> str:
        """`file.py:line` as the tool prints it: the line of the kernel's function that holds
        `text`'s nth occurrence (the function must hold it `count` times)."""
        lines = (REPO / self.path).read_text().splitlines()
        start = next((i for i, line in enumerate(lines) if line.startswith(
            f"def {self.kernel}(")), None)
        if start is None:
            raise ValueError(f"sanitizer rule: no function {self.kernel} in {self.path}")
        end = next((i for i in range(start + 1, len(lines))
                    if lines[i][:1] not in ("", " ", ")", "#")), len(lines))
        found = [i + 1 for i in range(start, end) if self.text in lines[i]]
        if len(found) != self.count:
            raise ValueError(f"sanitizer rule for {self.kernel}: {self.text!r} occurs "
                             f"{len(found)} times in it in {self.path} (must be {self.count})")
        return f"{Path(self.path).name}:{found[self.nth]}"


# The reported lines: (kernel, file in kernels/, the line's text)
_CHUNK_END = ("_fwd_pass_state_kernel", "fwd_pass_state.py",
              "a_last = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, CHUNK - 1)")
_CHUNK_SEGMENT = ("_fwd_pass_state_kernel", "fwd_pass_state.py",
                  "seg_last = ct.load(seg, (i_b, last), shape=(1, 1))")
_PASS_CHUNK_END = ("_state_pass_kernel", "fwd_pass_state.py",
                   "a_last = ct.reshape(ct.load(dA_cumsum, (i_b, i_h, i_c, END)")
_BLOCK_END = "ct.load(dA_cumsum, (i_b, i_h, i_c, i_tc * BLOCK_T + BLOCK_T - 1),"
_OUT_BLOCK_END = ("_compute_out_chunk_kernel", "compute_out.py", _BLOCK_END)
# the scan's loads in its loop: the second of two (the first, in the segmented kernel's own
# pass, has not been seen reported)
_SCAN_BLOCK_END = ("_ssd_scan_kernel", "ssd_scan.py", _BLOCK_END, 1, 2)
_SCAN_SEGMENT = ("_ssd_scan_kernel", "ssd_scan.py",
                 "seg_last = ct.load(seg, (i_b, ct.minimum(i_t * BLOCK_T + BLOCK_T - 1,", 1, 2)
_VARLEN_DT = ("_ssd_varlen_kernel", "ssd_varlen.py",
              "dt_s = ct.gather(dt_out, (0, i_h, t // CHUNK, t % CHUNK), mask=inside)")
# (tool, kind of report, DECISIONS.md section, lines)
_RULES = (
    # initcheck: the loads of dA_cumsum's chunk- or block-end entry, which chunk_cumsum writes
    # with TMA stores (initcheck does not count those as writes)
    ("initcheck", "Uninitialized __global__ memory read of size 4 bytes",
     "compute-sanitizer: initcheck and TMA stores",
     (_CHUNK_END, _PASS_CHUNK_END, _SCAN_BLOCK_END)),
    # racecheck: a [1, 1] tile (or a [BLOCK_T, 1] column) loaded in a loop that the compiler
    # pipelines through shared memory: every thread that owns the tile copies the same bytes to
    # the same place
    ("racecheck", "Error: Race reported between Write access and Write access",
     "compute-sanitizer: racecheck and a replicated tile's asynchronous copy",
     (_CHUNK_END, _CHUNK_SEGMENT, _OUT_BLOCK_END, _SCAN_BLOCK_END, _SCAN_SEGMENT, _VARLEN_DT)),
)
EXPLAINED: tuple[Explained, ...] = tuple(
    Explained(tool, kernel, f"kernels/{path}", text, kind, reason, *at)
    for tool, kind, reason, lines in _RULES for kernel, path, text, *at in lines)


@dataclass(frozen=True)
class Report:
    """One report of a tool: its first line, its kernel object, the source lines it names."""
    tool: str
    kind: str
    kernel: str
    where: tuple[str, ...]

    def explained_by(self, rules) -> Explained | None:
        for rule in rules:
            if (rule.tool == self.tool and rule.kernel == self.kernel
                    and self.kind.startswith(rule.kind) and self.where
                    and all(w == rule.where() for w in self.where)):
                return rule
        return None


_PREFIX = "========="
# "at KERNEL_Kt2_<specialization>+0x1790 in fwd_pass_state.py:113"
_AT = re.compile(r"\bat (?P<kernel>[A-Za-z_]\w*)(?:\+0x[0-9a-f]+)?"
                 r"(?: in (?P<file>[^\s:]+):(?P<line>\d+))?")
_SPECIALIZATION = re.compile(r"_Kt\d+_\w*$")
_NOT_REPORTS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY",
                "Target application returned", "Program hit", "Saved host backtrace")


def parse(tool: str, output: str) -> tuple[list[Report], int | None]:
    """(the reports in a tool's output, the total its summary gives: None where it gives none)."""
    reports: list[Report] = []
    block: list[str] = []
    total = None

    def flush():
        if not block:
            return
        # the kind of report without its places; racecheck's names the second access too
        head = " ".join([block[0].split(" at ")[0]] + [
            line.split(" at ")[0] for line in block[1:] if line.startswith("and ")])
        kernel, where = "?", []
        for line in block:
            for m in _AT.finditer(line):
                if kernel == "?":
                    kernel = _SPECIALIZATION.sub("", m["kernel"])
                if m["file"]:
                    where.append(f"{m['file']}:{m['line']}")
        reports.append(Report(tool, head, kernel, tuple(dict.fromkeys(where))))
        block.clear()

    for raw in output.splitlines():
        if not raw.startswith(_PREFIX):
            continue
        line = raw[len(_PREFIX):]
        body = line.strip()
        if (m := re.fullmatch(r"(?:ERROR|RACECHECK) SUMMARY: (\d+) (?:errors?|hazards? "
                              r"displayed .*)", body)):
            flush()
            total = (total or 0) + int(m[1])
            continue
        if not body:
            flush()
        elif not line.startswith("  ") and not body.startswith(("and ", "at ", "by ")):
            flush()
            if not body.startswith(_NOT_REPORTS):
                block.append(body)
        elif block:
            block.append(body)
    flush()
    return reports, total


# --------------------------------------------------------------------------------------------
# The calls


def calls(sm_count: int) -> tuple:
    """The cover problems at the ci caps for `sm_count` SMs: ((kind, dims, options, params)...)."""
    os.environ["HYPOTHESIS_PROFILE"] = "ci"
    from properties.profiles import caps
    from properties.reach import cover
    return cover(caps(), sm_count)


def run_call(index: int) -> None:
    """Cover problem `index`, by its property, on the GPU (the process the tool watches).

    Without CuPy's memory pool and torch's caching allocator: every array is a fresh device
    allocation, so initcheck sees each read of memory the call has not written (a pool would
    hand out memory an earlier array of the process wrote, which initcheck counts as written).
    """
    os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    import cupy
    cupy.cuda.set_allocator(None)
    from kernels.arrays import Backend
    from properties.checks import run
    from properties.reach import COVER_PROPERTY
    from properties.strategies import problem, spec_of
    kind, dims, options, params = calls(Backend.of("cupy", 0).sm_count)[index]
    run(COVER_PROPERTY[kind], problem(spec_of(dims, dict(options))).replace(params=params or {}),
        "gpu")
    cupy.cuda.runtime.deviceSynchronize()


@dataclass
class Outcome:
    tool: str
    index: int
    returncode: int
    reports: list[Report]
    total: int | None
    seconds: float
    tail: str


def sanitized(tool: str, index: int, sanitizer: str, timeout: float) -> Outcome:
    """Call `index` in its own process under `tool`."""
    start = time.time()
    args = [sanitizer, "--tool", tool, "--print-limit", str(PRINT_LIMIT), "--show-backtrace", "no",
            "--error-exitcode", "0", sys.executable, "-m", "properties.sanitize",
            "--call", str(index)]
    try:
        done = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout)
        output, rc = done.stdout + done.stderr, done.returncode
    except subprocess.TimeoutExpired as e:
        output, rc = f"{e.stdout or ''}{e.stderr or ''}\n(timed out after {timeout:.0f} s)", -1
    reports, total = parse(tool, output)
    return Outcome(tool, index, rc, reports, total, time.time() - start, output[-2000:])


def table(outcomes: list[Outcome], rules=EXPLAINED) -> tuple[str, list[str]]:
    """(the table tool x kernel object: calls, reports, explained; the problems, each a line)."""
    calls_of: dict[tuple[str, str], set] = defaultdict(set)
    reported: Counter = Counter()
    explained: Counter = Counter()
    problems: list[str] = []
    unexplained: Counter = Counter()
    for o in outcomes:
        for r in o.reports:
            key = (o.tool, r.kernel)
            calls_of[key].add(o.index)
            reported[key] += 1
            if r.explained_by(rules):
                explained[key] += 1
            else:
                unexplained[(o.tool, o.index, r.kind, r.kernel, r.where)] += 1
        if o.returncode != 0:
            problems.append(f"{o.tool} call {o.index}: the process failed ({o.returncode}):\n"
                            f"{o.tail}")
        if o.total is None:
            problems.append(f"{o.tool} call {o.index}: the tool printed no summary:\n{o.tail}")
        elif o.total > len(o.reports):
            problems.append(f"{o.tool} call {o.index}: {o.total} reports, {len(o.reports)} "
                            f"printed (the rest unexplained)")
    problems[:0] = [f"{tool} call {index}: {n} unexplained: {kind} in {kernel} at "
                    f"{', '.join(where) or 'no source line'}"
                    for (tool, index, kind, kernel, where), n in unexplained.items()]
    lines = [f"{'tool':10s} {'kernel object':28s} {'calls':>6s} {'reports':>9s} {'explained':>9s}"]
    tools = sorted({o.tool for o in outcomes}, key=TOOLS.index)
    for tool in tools:
        ran = {o.index for o in outcomes if o.tool == tool}
        keys = sorted(k for k in reported if k[0] == tool)
        lines.append(f"{tool:10s} {'(every kernel)':28s} {len(ran):6d} "
                     f"{sum(reported[k] for k in keys):9d} {sum(explained[k] for k in keys):9d}")
        for key in keys:
            lines.append(f"{'':10s} {key[1]:28s} {len(calls_of[key]):6d} {reported[key]:9d} "
                         f"{explained[key]:9d}")
    return "\n".join(lines), problems


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH, else in $CUDA_HOME/bin or the CUDA toolkit's usual place."""
    homes = (os.environ.get("CUDA_HOME"), "/usr/local/cuda")
    return shutil.which("compute-sanitizer") or next(
        (str(p) for p in (Path(h) / "bin" / "compute-sanitizer" for h in homes if h)
         if p.exists()), None)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tools", default=",".join(TOOLS),
                        help=f"comma-separated, of {', '.join(TOOLS)}")
    parser.add_argument("--jobs", type=int, default=8, help="processes at a time")
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds per process")
    parser.add_argument("--call", type=int, help=argparse.SUPPRESS)  # a watched process
    args = parser.parse_args(argv)
    if args.call is not None:
        run_call(args.call)
        return 0
    tools = [t.strip() for t in args.tools.split(",") if t.strip()]
    if bad := [t for t in tools if t not in TOOLS]:
        parser.error(f"--tools: unknown {bad}; choose from {TOOLS}")
    from kernels.arrays import Backend, gpu_available
    if not gpu_available():
        print("properties.sanitize needs a CUDA device (none found)", file=sys.stderr)
        return 2
    sanitizer = sanitizer_path()
    if sanitizer is None:
        print("properties.sanitize needs compute-sanitizer (not on PATH, in $CUDA_HOME/bin "
              "nor /usr/local/cuda/bin)", file=sys.stderr)
        return 2
    for rule in EXPLAINED:
        rule.where()  # a rule whose line moved or changed fails here, before any run
    start = time.time()
    n = len(calls(Backend.of("cupy", 0).sm_count))
    jobs = [(tool, i) for i in range(n) for tool in tools]
    print(f"{len(jobs)} processes: {n} cover problems x {len(tools)} tools, {args.jobs} at a "
          f"time", flush=True)
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        outcomes = list(pool.map(lambda j: sanitized(*j, sanitizer, args.timeout), jobs))
    text, problems = table(outcomes)
    print(text)
    for p in problems:
        print(p)
    print(f"{len(problems)} problems; {time.time() - start:.0f} s")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
