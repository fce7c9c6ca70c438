"""Nightly fuzzing: every property for a time budget with the `nightly` profile, on a fleet of
worker processes that share one example database.

    python -m properties.fuzz --minutes 30 --backend gpu --out .fuzz/
    python -m properties.fuzz --minutes 30 --backend gpu --database redis://HOST:6379/0

The first runs `--per-gpu` workers on every visible GPU (default: one per two cores of each
GPU's share of the node, at most 8; on the interpreter one per core; `--workers N` to choose),
each pinned to its device (CUDA_VISIBLE_DEVICES), each drawing its own examples (Hypothesis seeds
every run from fresh entropy; an explicit seed would keep it from the database), all sharing
the node's compile cache and the example database: a directory (`--database PATH`, default
OUT/hypothesis-db; shared storage for several nodes) or a Redis server (`redis://HOST:PORT/DB`,
through Hypothesis' RedisExampleDatabase). The same command on several nodes with the same Redis
URL makes one fleet: every worker replays what any worker found (failures and the best-targeted
examples) before it generates anything new. A worker that cannot reach the database says so and
stops; the run then fails.

Each worker runs the properties round-robin, `--round` examples per property at a time (generate
and target phases: hypothesis.target climbs toward the worst bound ratio), and reads the clock
before every example: the run ends within the budget plus one example's time. Every failure is
shrunk and written at once as a self-contained reproducer, OUT/workers/I/<property>.npz (all
inputs, the options, the property's parameters) with a .txt beside it (the failure and the exact
replay command, `python -m properties.replay ... --backend ...`); each worker keeps its summary
(examples, worst err/(u*M) and err/bound per property, the classes of launch it reached)
up to date in OUT/workers/I/summary.json as it runs, so a worker stopped by a signal, or killed,
leaves what it ran. The fleet's report merges them into OUT/summary.json (examples per property
and per worker, worst ratios, failures with their replay command, worker and node, the reach
classes launched against those reachable at the nightly caps) and prints it; exit 1 if anything
failed or a worker did not finish. Ctrl-C or SIGTERM stops every worker cleanly, then reports.

`--mutant NAME` plants a bug of the catalogue (properties/mutants.py) first: the demonstration
that the fleet finds, shrinks and writes a failure that the replayer reproduces.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from pathlib import Path

# after the budget, how long a worker may take to finish its example before it is stopped (on the
# GPU an example compiles its kernels first: seconds each), and then to write its summary
GRACE_SECONDS = {"gpu": 300.0, "interpreter": 120.0}
STOP_SECONDS = 10.0
# how often a worker rewrites its summary while examples pass
SUMMARY_EVERY = 2.0
# workers per GPU where --per-gpu is not given: one per CORES_PER_WORKER of the cores each GPU
# has on its node, at most PER_GPU_MAX (a worker is compile- and host-bound: one leaves the GPU
# mostly idle; DECISIONS.md "Fuzz fleet: workers and threads")
CORES_PER_WORKER = 2
PER_GPU_MAX = 8
# the thread counts a worker's BLAS and OpenMP read (its share of the cores: the same section)
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
EXIT_DATABASE = 3  # a worker's status where it cannot reach the database
EXIT_BROKEN = 4  # a worker's status where the harness itself failed (not a kernel)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(KeyboardInterrupt):
    """The budget is spent or a signal asked the worker to stop: raised in a test's body, it ends
    Hypothesis' run at once, as Ctrl-C does: not a failure, nothing shrunk, nothing stored in the
    database."""


class Broken(KeyboardInterrupt):
    """The worker's own machinery failed inside a test's body (its summary could not be
    written): it ends Hypothesis' run at once without counting as a kernel failure."""


@contextlib.contextmanager
def _signals_held():
    """SIGTERM and SIGINT wait until the block ends: a file is written whole or not at all."""
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


# --------------------------------------------------------------------------------------------
# The database


def open_database(spec: str):
    """The example database `spec` names: a Redis URL (redis://HOST:PORT/DB, through
    Hypothesis' RedisExampleDatabase) or a directory; ConnectionError naming the URL where the
    server does not answer."""
    if spec.startswith(("redis://", "rediss://")):
        import redis
        from hypothesis.extra.redis import RedisExampleDatabase
        client = redis.Redis.from_url(spec, socket_connect_timeout=5)
        try:
            client.ping()
        except redis.RedisError as e:
            client.close()
            raise ConnectionError(f"--database {spec}: cannot reach the server ({e})") from None
        return RedisExampleDatabase(client)
    from hypothesis.database import DirectoryBasedExampleDatabase
    return DirectoryBasedExampleDatabase(spec)


# --------------------------------------------------------------------------------------------
# A worker


class Worker:
    """One worker's run: the properties round-robin until `deadline` (epoch seconds), its
    summary kept in `out`/summary.json."""

    def __init__(self, index: int, out: Path, backend: str, names: list[str], per_round: int,
                 deadline: float, database, planted: str | None):
        self.index, self.out, self.backend, self.names = index, out, backend, names
        self.per_round, self.deadline, self.database = per_round, deadline, database
        self.planted = planted
        self.examples = {n: 0 for n in names}
        self.worst: dict[str, dict[str, float]] = {n: {} for n in names}
        self.failures: dict[str, dict] = {}
        self.longest = 0.0  # the longest example, seconds
        self.rounds = 0
        self.state = "running"
        self.written = 0.0
        from properties.reach import Record
        self.record = Record()

    def run(self) -> int:
        """0: every property held; 1: a property failed (its reproducer written); EXIT_BROKEN:
        the harness failed. Stopped (the budget, a signal) ends it as it is."""
        from hypothesis import given, settings

        from properties.checks import PROPERTIES
        self.out.mkdir(parents=True, exist_ok=True)
        base = settings(settings.get_profile("nightly"), max_examples=self.per_round,
                        database=self.database, report_multiple_bugs=False)
        try:
            while len(self.failures) < len(self.names):
                self.rounds += 1
                for name in self.names:
                    if name in self.failures:
                        continue
                    self._clock()
                    last: dict = {}
                    test = base(given(PROPERTIES[name].strategy())(self._body(name, last)))
                    try:
                        with self.record.recording(name):
                            test()
                    except Stopped:
                        if "failing" in last:  # stopped while shrinking: the smallest so far
                            self._failed(name, last, shrunk=False)
                        raise
                    except Exception:
                        if "failing" not in last:  # no example failed: the harness broke
                            raise
                        self._failed(name, last, shrunk=True)  # the shrunk failure ran last
            self.state = "every property failed"
        except Stopped as stop:
            self.state = str(stop) or "stopped"
        except (Exception, Broken) as e:
            self.state = f"broken: {type(e).__name__}: {e}"
            traceback.print_exc()
            return EXIT_BROKEN
        return 1 if self.failures else 0

    def _clock(self):
        if time.time() >= self.deadline:
            raise Stopped("budget spent")

    def _body(self, name: str, last: dict):
        """The test body of property `name`: reads the clock, counts the example, keeps the
        problem (and the last failing one), targets and records the metrics, keeps the summary
        current."""
        from hypothesis import target

        from properties.checks import run

        def body(problem):
            self._clock()
            self.examples[name] += 1
            last.setdefault("first", self.examples[name])  # the run's first example's number
            start = time.time()
            try:
                for label, value in run(name, problem, self.backend).items():
                    target(value, label=label)
                    self.worst[name][label] = max(self.worst[name].get(label, 0.0), value)
            except Exception as e:
                last.setdefault("first_failure", self.examples[name] - last["first"] + 1)
                last.setdefault("first_failing", problem)
                last["failing"], last["error"] = problem, e
                raise
            finally:
                self.longest = max(self.longest, time.time() - start)
                try:
                    self.write_summary()
                except OSError as e:  # the worker's disk, not the kernel: no failure of it
                    raise Broken(f"cannot write the summary: {e}") from e

        body.__name__ = body.__qualname__ = f"fuzz_{name}_{self.backend}"
        # Hypothesis keys the database by the function's source, the same for every property:
        # the property's name sets each its own key, the same in every worker, so that each
        # replays what any worker stored for it
        body._hypothesis_internal_add_digest = f"{name}:{self.backend}".encode()
        return body

    def _failed(self, name: str, last: dict, shrunk: bool):
        """Write the failure of property `name` (the last failing example of `last`) at once."""
        path = self.out / f"{name}.npz"
        command = f"python -m properties.replay {path} --backend {self.backend}"
        if self.planted:
            command += f" --mutant {self.planted}"
        error = last["error"]
        text = "".join(traceback.format_exception_only(type(error), error))
        with _signals_held():
            last["failing"].save(path, name)
            (self.out / f"{name}.txt").write_text(
                f"property: {name}\nreplay: {command}\nshrunk: {shrunk}\n\n{text}")
            # first_failure: which example of the run that found it failed first (1: the first
            # one it ran, as where the database hands it a stored failure), and its spec
            self.failures[name] = dict(replay=command, reproducer=str(path), shrunk=shrunk,
                                       first_failure=last.get("first_failure"),
                                       first_failing_spec=last["first_failing"].spec)
        print(f"FAIL {name}: reproducer {path}", flush=True)
        self.write_summary(force=True)

    def summary(self) -> dict:
        return {
            "worker": self.index, "node": socket.gethostname(), "pid": os.getpid(),
            "device": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "backend": self.backend, "state": self.state, "rounds": self.rounds,
            "planted_mutant": self.planted, "examples": sum(self.examples.values()),
            "examples_per_property": self.examples, "longest_example_s": self.longest,
            "worst_per_property": self.worst, "failures": self.failures,
            "reach": self.record.as_dict(),
        }

    def write_summary(self, force: bool = False):
        """summary.json, replaced atomically (a reader never sees half a file); at most every
        SUMMARY_EVERY seconds unless forced."""
        now = time.time()
        if not force and now - self.written < SUMMARY_EVERY:
            return
        self.written = now
        part = self.out / f"summary.json.{os.getpid()}.part"
        with _signals_held():
            part.write_text(json.dumps(self.summary(), indent=1))
            part.replace(self.out / "summary.json")


def _stop_on_signals():
    """SIGTERM and SIGINT raise Stopped where the worker is (between or inside examples)."""
    def stop(signum, frame):
        raise Stopped(f"stopped by {signal.Signals(signum).name}")
    for s in STOP_SIGNALS:
        signal.signal(s, stop)


def worker_main(args) -> int:
    os.environ["HYPOTHESIS_PROFILE"] = "nightly"  # the strategies' size caps follow it
    from properties.profiles import register_profiles
    register_profiles()
    out = args.out / "workers" / str(args.worker)
    try:
        database = open_database(args.database)
    except (ConnectionError, ImportError) as e:
        print(f"worker {args.worker}: {e}; stopping (a worker never fuzzes alone)",
              file=sys.stderr, flush=True)
        return EXIT_DATABASE
    worker = Worker(args.worker, out, args.backend, args.properties, args.round, args.deadline,
                    database, args.planted)
    _stop_on_signals()
    try:
        return worker.run()
    finally:
        for s in STOP_SIGNALS:  # the last summary is written whatever comes now
            signal.signal(s, signal.SIG_IGN)
        worker.write_summary(force=True)


# --------------------------------------------------------------------------------------------
# The fleet


def devices(backend: str, listed: str | None) -> list[str | None]:
    """The devices workers are pinned to: `listed` (comma-separated ids, e.g. to name devices
    the process cannot see), else on the GPU each visible one, on the interpreter none."""
    if listed:
        return listed.split(",")
    if backend != "gpu":
        return [None]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return [d.strip() for d in visible.split(",") if d.strip()]
    import cupy
    return [str(d) for d in range(cupy.cuda.runtime.getDeviceCount())]


def per_gpu(gpus: int, cores: int) -> int:
    """The default workers per GPU on a node of `cores` cores and `gpus` GPUs."""
    return max(1, min(PER_GPU_MAX, cores // (CORES_PER_WORKER * gpus)))


def worker_env(environ, pin: str | None, cores: int, workers: int) -> dict:
    """A worker's environment: pinned to device `pin` (None: not pinned), and its BLAS and
    OpenMP threads (the float64 references, the interpreter) its share of the node's cores,
    where the caller has not set them (each library's default, a thread per core in every
    worker, oversubscribes the node)."""
    env = dict(environ) | ({} if pin is None else {"CUDA_VISIBLE_DEVICES": pin})
    for name in THREAD_VARIABLES:
        env.setdefault(name, str(max(1, cores // workers)))
    return env


def fleet(args) -> int:
    from properties.runner import resolve_backend
    backend = resolve_backend(args.backend)
    out = args.out.resolve()
    database = args.database or str(out / "hypothesis-db")
    try:
        probe = open_database(database)  # refused here, before any worker starts
    except (ConnectionError, ImportError) as e:
        print(f"fuzz: {e}", file=sys.stderr)
        return EXIT_DATABASE
    if hasattr(probe, "redis"):  # the probe's connection: each worker opens its own
        probe.redis.close()
    pins = devices(backend, args.devices)
    if not pins:
        print("fuzz: no GPU is visible to pin workers to", file=sys.stderr)
        return EXIT_BROKEN
    cores = os.cpu_count() or 1
    on_gpus = backend == "gpu" and pins != [None]
    count = args.workers or (len(pins) * (args.per_gpu or per_gpu(len(pins), cores)) if on_gpus
                             else cores)
    deadline = time.time() + 60.0 * args.minutes
    shutil.rmtree(out / "workers", ignore_errors=True)  # an earlier run's workers are not ours
    stopping: list[str] = []

    def stop(signum, frame):
        stopping.append(signal.Signals(signum).name)
    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    procs, logs, overran = [], [], set()
    try:
        for i in range(count):
            if stopping:
                break
            env = worker_env(os.environ, pins[i % len(pins)], cores, count)
            command = [sys.executable, "-m", "properties.fuzz", "--worker", str(i),
                       "--deadline", repr(deadline), "--backend", backend, "--out", str(out),
                       "--database", database, "--round",
                       str(args.round), "--properties", *args.properties]
            if args.planted:
                command += ["--planted", args.planted]
            (out / "workers" / str(i)).mkdir(parents=True)
            logs.append(open(out / "workers" / str(i) / "log.txt", "w"))
            procs.append(subprocess.Popen(command, env=env, stdout=logs[-1],
                                          stderr=subprocess.STDOUT, start_new_session=True))
        pinned = ",".join(p for p in pins if p) if pins != [None] else None
        print(f"fuzz: {count} workers on {backend} "
              f"({'devices ' + pinned if pinned else 'no pinning'}), database {database}, "
              f"until {time.strftime('%H:%M:%S', time.localtime(deadline))}", flush=True)
        overran = _wait(procs, deadline + GRACE_SECONDS[backend], stopping)
    finally:
        for p in procs:  # an exception here leaves no worker behind
            if p.poll() is None:
                p.kill()
                p.wait()
        for s, handler in previous.items():
            signal.signal(s, handler)
        for log in logs:
            log.close()
    summary = merge(out, [p.returncode for p in procs], backend, args.reach, overran)
    summary["stopped_by"] = stopping[0] if stopping else None
    part = out / "summary.json.part"
    part.write_text(json.dumps(summary, indent=1))
    part.replace(out / "summary.json")
    print(json.dumps({k: v for k, v in summary.items() if k != "reach_missing"}, indent=1))
    return 1 if summary["failures"] or summary["workers_failed"] else 0


def _wait(procs: list, last: float, stopping: list) -> set[int]:
    """Wait for every worker: SIGTERM to all once a signal asks the fleet to stop or `last`
    passes, SIGKILL to those still running STOP_SECONDS later. The workers that ran past `last`
    (they did not finish)."""
    terminated, overran = None, set()
    while any(p.poll() is None for p in procs):
        now = time.time()
        if terminated is None and (stopping or now >= last):
            terminated = now
            for i, p in enumerate(procs):
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    if not stopping:  # the fleet's budget and grace are spent, not a signal
                        overran.add(i)
        elif terminated is not None and now - terminated >= STOP_SECONDS:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.2)
    return overran


def merge(out: Path, returncodes: list[int], backend: str, reach: bool,
          overran: set[int] = frozenset()) -> dict:
    """The fleet's report from each worker's summary.json and exit status. A worker failed
    (workers_failed) where it exited otherwise than 0 (passed) or 1 with a failure written (a
    property failed): killed, unable to reach the database, broken, or exit 1 without a failure
    (an error outside the harness' handling); or where it ran past the grace (`overran`)."""
    workers, failures, per_property, worst = [], {}, {}, {}
    launched: dict[str, dict[str, int]] = {}
    sm_counts: set[int] = set()
    for i, rc in enumerate(returncodes):
        path = out / "workers" / str(i) / "summary.json"
        s = json.loads(path.read_text()) if path.exists() else {}
        finished = (rc == 0 or (rc == 1 and bool(s.get("failures")))) and i not in overran
        workers.append(dict(worker=i, node=s.get("node"), device=s.get("device"),
                            pid=s.get("pid"), exit=rc, finished=finished,
                            state=s.get("state", "no summary"), examples=s.get("examples", 0),
                            longest_example_s=s.get("longest_example_s")))
        for name, n in s.get("examples_per_property", {}).items():
            per_property[name] = per_property.get(name, 0) + n
        for name, labels in s.get("worst_per_property", {}).items():
            for label, value in labels.items():
                worst.setdefault(name, {})[label] = max(worst.get(name, {}).get(label, 0.0), value)
        for name, found in s.get("failures", {}).items():
            failures.setdefault(name, []).append(dict(found, worker=i, node=s.get("node")))
        for c, counts in s.get("reach", {}).get("launched", {}).items():
            for prop, n in counts.items():
                launched.setdefault(c, {})[prop] = launched.get(c, {}).get(prop, 0) + n
        sm_counts |= set(s.get("reach", {}).get("sm_counts", []))

    def top(kind):
        return max((v for w in worst.values() for k, v in w.items() if k.endswith(kind)),
                   default=0.0)
    summary = {
        "backend": backend, "workers": workers,
        "workers_failed": [w["worker"] for w in workers if not w["finished"]],
        "examples": sum(per_property.values()), "examples_per_property": per_property,
        "worst_err_over_uM": top("err/(u*M)"), "worst_err_over_bound": top("err/bound"),
        "worst_per_property": worst, "failures": failures,
        "reach_launched": len(launched),
    }
    if reach and launched:
        from properties.profiles import CAPS
        from properties.reach import reachable
        reachable_classes = frozenset.intersection(
            *(reachable(CAPS["nightly"], n) for n in sm_counts or {1}))
        missing = sorted(reachable_classes - set(launched))
        summary |= {"reach_reachable": len(reachable_classes), "reach_missing": missing}
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--backend", choices=("auto", "gpu", "interpreter"), default="auto")
    parser.add_argument("--out", type=Path, default=Path(".fuzz"))
    parser.add_argument("--properties", nargs="*", help="names (default: all)")
    parser.add_argument("--round", type=int, default=50, help="examples per property per round")
    parser.add_argument("--workers", type=int,
                        help="worker processes (default: per GPU x --per-gpu; on the "
                             "interpreter one per core)")
    parser.add_argument("--per-gpu", type=int,
                        help=f"workers per GPU (default: one per {CORES_PER_WORKER} cores of "
                             f"each GPU's share of the node, at most {PER_GPU_MAX})")
    parser.add_argument("--devices", help="comma-separated device ids to pin workers to "
                                          "(default: every visible GPU)")
    parser.add_argument("--database", help="PATH or redis://HOST:PORT/DB (default: "
                                           "OUT/hypothesis-db)")
    parser.add_argument("--no-reach", dest="reach", action="store_false",
                        help="skip the report's classes of launch reachable at the nightly caps "
                             "that no worker launched (a minute to derive, once per version)")
    parser.add_argument("--mutant", help="plant this catalogue bug first (a demonstration)")
    parser.add_argument("--planted", help=argparse.SUPPRESS)  # set by --mutant's re-run
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)  # set by the fleet
    parser.add_argument("--deadline", type=float, help=argparse.SUPPRESS)  # set by the fleet
    args = parser.parse_args(argv)
    if args.worker is not None:
        return worker_main(args)
    if args.mutant:  # the same command in a copy of the tree elsewhere: paths made absolute
        from properties.mutants import run_planted
        database = args.database
        if database and not database.startswith(("redis://", "rediss://")):
            database = str(Path(database).resolve())
        rest = ["--minutes", str(args.minutes), "--backend", args.backend, "--out",
                str(args.out.resolve()), "--round", str(args.round), "--planted", args.mutant]
        for flag, value in (("--workers", args.workers), ("--per-gpu", args.per_gpu),
                            ("--devices", args.devices), ("--database", database)):
            rest += [] if value is None else [flag, str(value)]
        rest += [] if args.reach else ["--no-reach"]
        rest += ["--properties", *args.properties] if args.properties else []
        return run_planted(args.mutant, ["-m", "properties.fuzz", *rest])
    from properties.checks import PROPERTIES
    names = args.properties or list(PROPERTIES)
    unknown = sorted(set(names) - set(PROPERTIES))
    if unknown:
        parser.error(f"unknown properties {unknown}; known: {sorted(PROPERTIES)}")
    args.properties = names
    return fleet(args)


if __name__ == "__main__":
    sys.exit(main())
