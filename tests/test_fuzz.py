"""The nightly fuzz fleet on the CPU (properties/fuzz.py): the budget is kept and nothing found is
lost (a signal or a killed worker leaves the summary of what ran), workers are pinned to the
devices named, a worker that cannot reach the database stops, and workers share their failures
through a real Redis server."""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
# Past the budget, what a run may take beyond its longest example: the fleet's own start (Python
# and the harness imported before the clock starts) and its end (the workers' exit, the merge),
# on a loaded 2-core machine
START_AND_END_SECONDS = 15.0


def fleet(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "properties.fuzz", "--backend", "interpreter", "--out",
            str(out), "--no-reach", *args]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_the_budget_is_kept_per_example(tmp_path):
    """6 s of a property whose round of 400 examples takes far longer on the interpreter (~0.1
    s each): the clock is read before every example, not between rounds, so the run ends within
    the budget plus its longest example (and its own start and end), with its summary."""
    out = tmp_path / "fuzz"
    start = time.time()
    rc = subprocess.run(fleet(out, "--minutes", "0.1", "--workers", "1", "--round", "400",
                              "--properties", "forward_tf32_bound"),
                        cwd=REPO, capture_output=True).returncode
    wall = time.time() - start
    s = summary(out)
    (worker,) = s["workers"]
    assert rc == 0 and worker["state"] == "budget spent" and s["examples"] >= 1, s
    assert wall <= 6.0 + worker["longest_example_s"] + START_AND_END_SECONDS, (wall, worker)


def _wait_for_examples(out: Path, workers: int, timeout: float = 120.0) -> list[dict]:
    """Each worker's summary once every worker has run an example."""
    end = time.time() + timeout
    while time.time() < end:
        paths = [out / "workers" / str(i) / "summary.json" for i in range(workers)]
        if all(p.exists() for p in paths):
            found = [json.loads(p.read_text()) for p in paths]
            if all(f["examples"] >= 1 for f in found):
                return found
        time.sleep(0.5)
    raise AssertionError(f"the workers ran no example within {timeout} s")


def test_a_signal_or_a_killed_worker_leaves_the_summary_of_what_ran(tmp_path):
    """One worker killed (SIGKILL: it writes nothing more) is reported and the other goes on;
    SIGTERM to the fleet stops the other cleanly; the report merges both, the killed one's
    examples from the summary it kept current as it ran."""
    out = tmp_path / "fuzz"
    run = subprocess.Popen(fleet(out, "--minutes", "5", "--workers", "2", "--properties",
                                 "chunk_cumsum_alone", "determinism"), cwd=REPO,
                           stdout=subprocess.DEVNULL)
    try:
        found = _wait_for_examples(out, 2)
        os.kill(found[1]["pid"], signal.SIGKILL)
        time.sleep(1.0)
        assert run.poll() is None  # the fleet goes on with worker 0
        run.send_signal(signal.SIGTERM)
        rc = run.wait(timeout=120)
    finally:
        run.kill()
    s = summary(out)
    assert rc == 1 and s["stopped_by"] == "SIGTERM" and s["workers_failed"] == [1], s
    assert s["workers"][0]["state"] == "stopped by SIGTERM" and s["workers"][0]["exit"] == 0
    assert s["workers"][1]["exit"] == -signal.SIGKILL and s["workers"][1]["examples"] >= 1
    assert s["examples"] == sum(w["examples"] for w in s["workers"])


def test_workers_are_pinned_to_the_devices_named(tmp_path):
    """Workers told to pin to devices a list names (on a GPU node: its GPUs), round-robin, each
    a process of its own."""
    out = tmp_path / "fuzz"
    rc = subprocess.run(fleet(out, "--minutes", "0.05", "--workers", "3", "--devices", "3,5",
                              "--properties", "chunk_cumsum_alone"),
                        cwd=REPO, capture_output=True).returncode
    workers = summary(out)["workers"]
    assert rc == 0 and all(w["finished"] and w["examples"] >= 1 for w in workers), workers
    assert [w["device"] for w in workers] == ["3", "5", "3"]
    assert len({w["pid"] for w in workers}) == 3


def test_workers_per_gpu_follow_the_cores_each_gpu_has():
    """The default per GPU: one worker per CORES_PER_WORKER cores of each GPU's share, at least
    one, at most PER_GPU_MAX (the H200 figure: DECISIONS.md "Fuzz fleet: workers and threads")."""
    from properties.fuzz import CORES_PER_WORKER, PER_GPU_MAX, per_gpu
    assert per_gpu(1, 16) == min(PER_GPU_MAX, 16 // CORES_PER_WORKER) == 8
    assert per_gpu(8, 128) == 8  # an 8-GPU node of 128 cores: 64 workers
    assert per_gpu(2, 8) == 2
    assert per_gpu(4, 2) == 1  # fewer cores than GPUs: still one each


def test_a_workers_threads_are_its_share_of_the_cores():
    """Each worker's BLAS / OpenMP threads: the node's cores over the workers (at least one),
    unless the caller set them; pinned where a device is named."""
    from properties.fuzz import THREAD_VARIABLES, worker_env
    env = worker_env({"PATH": "/bin"}, "3", cores=16, workers=8)
    assert env["CUDA_VISIBLE_DEVICES"] == "3" and env["PATH"] == "/bin"
    assert all(env[name] == "2" for name in THREAD_VARIABLES)
    env = worker_env({"OMP_NUM_THREADS": "4"}, None, cores=2, workers=4)
    assert "CUDA_VISIBLE_DEVICES" not in env and env["OMP_NUM_THREADS"] == "4"
    assert env["OPENBLAS_NUM_THREADS"] == "1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_worker_that_cannot_reach_the_database_stops(tmp_path):
    url = f"redis://127.0.0.1:{_free_port()}/0"  # nothing listens there
    run = subprocess.run(fleet(tmp_path / "fuzz", "--minutes", "1", "--workers", "1",
                               "--database", url), cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 3 and url in run.stderr and "cannot reach" in run.stderr


@pytest.fixture
def redis_url(tmp_path):
    """A real redis-server on a free port, stopped at the end of the test."""
    server = shutil.which("redis-server")
    if server is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing: .ci/run installs it")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL)
    import redis
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.1)
    try:
        yield f"redis://127.0.0.1:{port}/0", client
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_worker_replays_another_workers_failure_from_redis_first(tmp_path, redis_url):
    """A planted bug (D's term dropped: the simplest example, without D, passes it) found by one
    worker is stored in Redis; a second worker, on another run, fails on the very first example
    it runs, the first one's reproducer, before generating anything. A property that the bug
    leaves passing runs first in both: its examples are stored under its own key, so it neither
    replays the other's failure nor deletes it."""
    url, client = redis_url
    found = []
    # the first run ends once its one property failed; the second, whose chunk_cumsum_alone
    # passes, runs its budget
    for run, minutes, names in (("first", "3", ["forward_tf32_bound"]),
                                ("second", "0.5", ["chunk_cumsum_alone", "forward_tf32_bound"])):
        out = tmp_path / run
        rc = subprocess.run(fleet(out, "--minutes", minutes, "--workers", "1", "--database",
                                  url, "--round", "20", "--properties", *names,
                                  "--mutant", "D_term_dropped"),
                            cwd=REPO, capture_output=True).returncode
        (failure,) = summary(out)["failures"]["forward_tf32_bound"]
        assert rc == 1, summary(out)
        with np.load(failure["reproducer"]) as f:
            found.append((failure, json.loads(str(f["meta"]))["spec"]))
        if run == "first":
            assert client.dbsize() > 0  # the failure went to the server
    (first, first_written), (second, _) = found
    assert first["first_failure"] > 1  # generated: the simplest example passes
    # replayed from Redis first: the example the first run wrote (the database's smallest, even
    # where its shrinking was stopped)
    assert second["first_failure"] == 1 and second["first_failing_spec"] == first_written
