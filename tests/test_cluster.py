"""--cluster on a real Dask cluster, not a mock: a ``distributed.LocalCluster`` of 2 worker processes
× 1 thread, and ``dask scheduler`` + two ``dask worker`` processes on 127.0.0.1 started as a user
would. Golden files are byte-identical to --jobs 1 (greedy, --mtp, --ngram, --emulate), a worker
killed mid-run loses and duplicates nothing, ``golden check`` and ``audit --streams`` give the local
verdicts, and a bad address, a cluster without workers or a worker without the file is one line."""

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from conftest import require_distributed
from refimpl.fixtures import builtin as B
from refimpl.oracle import cluster as C
from refimpl.oracle import golden as G
from refimpl.cli import main
from refimpl.errors import RefimplError

ROOT = Path(__file__).resolve().parents[1]
N = "6"  # tokens per prompt: enough for drafts to be accepted, few for speed
PROMPTS = '{"text": "Hello world"}\n{"tokens": [5, 6, 7]}\n{"text": "a"}\n{"tokens": [40, 41, 42, 43]}\n'
VARIANTS = {  # name: (model, flags)
    "greedy": ("builtin:tiny", []),
    "mtp": ("builtin:predictable/q8_0", ["--mtp", "--draft", "2"]),
    "ngram": ("builtin:tiny", ["--ngram", "--draft", "2"]),
    "emulate": ("builtin:tiny/q8_0", ["--emulate"]),
}
WAIT = 120  # seconds: the bound on every wait for a cluster (a loaded 2-core machine starts processes slowly)

pytestmark = [pytest.mark.usefixtures("fixture_cache"), pytest.mark.slow,
              pytest.mark.filterwarnings("ignore:Port 8787 is already in use")]  # a second cluster's HTTP server


def _worker_env() -> dict:
    """What a worker process needs: refimpl importable, one numba thread (two workers share 2 cores)."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return {"NUMBA_NUM_THREADS": "1", "PYTHONPATH": path}


@pytest.fixture(scope="module")
def distributed():
    return require_distributed()


def _local_cluster(distributed, n_workers=2):
    return distributed.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None,
                                    silence_logs=logging.ERROR, env=_worker_env())


@pytest.fixture(scope="module")
def cluster(distributed):
    with _local_cluster(distributed) as c:
        yield c.scheduler_address


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A directory with the prompts file; golden files are written here under one name per variant,
    so every run of a variant has the same `regenerate` line whatever ran it."""
    d = tmp_path_factory.mktemp("cluster")
    (d / "prompts.jsonl").write_text(PROMPTS)
    return d


def _make(work: Path, variant: str, *extra, n: str = N) -> bytes:
    model, flags = VARIANTS[variant]
    out = work / f"{variant}.golden.jsonl"
    out.unlink(missing_ok=True)
    assert main(["golden", "make", model, "--prompts", str(work / "prompts.jsonl"), "-n", n, *flags, "--out", str(out),
                 *extra]) == 0
    return out.read_bytes()


@pytest.fixture(scope="module")
def reference(work):
    """--jobs 1 bytes per variant, made on first use."""
    cache = {}

    def get(variant):
        if variant not in cache:
            cache[variant] = _make(work, variant)
        return cache[variant]

    return get


# ---- a LocalCluster: 2 worker processes × 1 thread --------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_make_on_a_cluster_is_byte_identical_to_jobs_1(cluster, work, reference, variant):
    ref = reference(variant)
    assert _make(work, variant, "--cluster", cluster) == ref
    assert len(G.read_golden(work / f"{variant}.golden.jsonl").prompts) == 4
    if variant == "mtp":
        assert all(r["draft"]["accepted"] > 0 for r in G.read_golden(work / "mtp.golden.jsonl").prompts)


def test_check_on_a_cluster(cluster, work, reference, capsys):
    path = work / "emulate.golden.jsonl"
    path.write_bytes(reference("emulate"))
    assert main(["golden", "check", str(path), "--cluster", cluster]) == 0
    assert "ok, 4 prompts" in capsys.readouterr().out
    g = G.read_golden(path)  # a valid file whose prompt 2 says another token: the cluster must notice
    g.prompts[2]["ids"][-1] = (g.prompts[2]["ids"][-1] + 1) % 100
    G.write_golden(path, g.header, g.prompts)
    assert main(["golden", "check", str(path), "--cluster", cluster]) == 1
    err = capsys.readouterr().err
    assert "prompt 2 'a'" in err and "first divergence at generated step 5" in err and "MISMATCH in 1 of 4 prompts" in err


def test_audit_streams_on_a_cluster(cluster, tmp_path, capsys):
    from test_audit import Case, write_stream_dir

    write_stream_dir(Case(), tmp_path / "s")
    argv = ["audit", "builtin:tiny", "--streams", str(tmp_path / "s")]
    assert main(argv) == 1
    local = capsys.readouterr().out
    assert main(argv + ["--cluster", cluster]) == 1
    assert capsys.readouterr().out == local
    assert local.splitlines()[-1] == "result: 1 of 4 stream pairs wrong → exit 1"


def test_a_worker_without_the_file_or_the_code_is_one_error(cluster, monkeypatch):
    """Before any task: every worker must see the file and run the client's code (fingerprint); then
    each worker checks the file's sha256 before opening it. The client's own checks are bypassed here
    by calling run_all directly."""
    settings, missing = G.Settings(2), Path("/nonexistent/m.gguf")
    with pytest.raises(RefimplError, match=r"^worker tcp://127\.0\.0\.1:\d+: /nonexistent/m\.gguf: no such file \(every "
                                           r"worker needs the GGUF at the same path, or a shared filesystem\)$"):
        G.run_all(missing, [[1, 2]], settings, cluster=cluster, sha256="0" * 64)
    path = G.resolve_model("builtin:tiny")
    with pytest.raises(RefimplError, match=r"^worker tcp://.*: sha256 [0-9a-f]{12}… on this worker, but the run is for "
                                           r"000000000000… \(another file at the same path"):
        G.run_all(path, [[1, 2]], settings, cluster=cluster, sha256="0" * 64)
    assert len(C.fingerprint()) == 64
    monkeypatch.setattr(C, "fingerprint", lambda: "other code")  # this process (and the in-process scheduler)
    with pytest.raises(RefimplError, match=r"^worker tcp://.* has another refimpl, numpy, numba or gguf; the scheduler "
                                           r"and every worker need the same refimpl"):
        G.run_all(path, [[1, 2]], settings, cluster=cluster, sha256=B.sha256_file(path))


def _processing_worker(watch, deadline: float) -> str:
    """The address of a worker running one of refimpl's tasks (polled until ``deadline``)."""
    while time.monotonic() < deadline:
        for addr, keys in watch.processing().items():
            if any(str(k).startswith("_on_worker") for k in keys):
                return addr
        time.sleep(0.02)
    raise AssertionError("no refimpl task started on the cluster in time")


def _retried_keys(watch) -> list:
    """Keys the scheduler sent to a worker more than once (its transition log)."""
    def on_scheduler(dask_scheduler):
        return [str(t.key) for t in dask_scheduler.transition_log if t.finish == "processing"]

    counts = Counter(watch.run_on_scheduler(on_scheduler))
    return [k for k, n in counts.items() if n > 1 and k.startswith("_on_worker")]


def _in_thread(fn):
    result = {}
    t = threading.Thread(target=lambda: result.update(value=fn()), daemon=True)
    t.start()
    return t, result


def test_a_worker_killed_mid_run_loses_nothing(distributed, work, reference):
    """SIGKILL a worker process while it runs a prompt (its first: opening the model): the scheduler
    runs its prompts again elsewhere, the file is complete and byte-identical."""
    ref = reference("greedy")
    with _local_cluster(distributed) as c, distributed.Client(c.scheduler_address, set_as_default=False) as watch:
        t, result = _in_thread(lambda: _make(work, "greedy", "--cluster", c.scheduler_address))
        victim = _processing_worker(watch, time.monotonic() + WAIT)
        pid = watch.run(os.getpid, workers=[victim])[victim]
        os.kill(pid, signal.SIGKILL)
        t.join(timeout=WAIT)
        assert not t.is_alive(), "golden make did not finish after a worker died"
        assert result["value"] == ref
        assert _retried_keys(watch), "the killed worker's task was not run again (was it killed mid-task?)"


def test_a_cluster_left_without_workers_stops_the_run(distributed, work, monkeypatch, capsys):
    """The scheduler would wait forever for a worker; the client gives up after NO_WORKER_TIMEOUT, in one line."""
    monkeypatch.setattr(C, "NO_WORKER_TIMEOUT", 2)
    out = work / "greedy.golden.jsonl"
    out.unlink(missing_ok=True)
    with _local_cluster(distributed, n_workers=1) as c, distributed.Client(c.scheduler_address, set_as_default=False) as watch:
        t, result = _in_thread(lambda: main(["golden", "make", "builtin:tiny", "--prompts", str(work / "prompts.jsonl"),
                                             "-n", N, "--out", str(out), "--cluster", c.scheduler_address]))
        _processing_worker(watch, time.monotonic() + WAIT)
        c.scale(0)
        t.join(timeout=WAIT)
        assert not t.is_alive() and result["value"] == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("refimpl: error: every worker left the cluster (") and "nothing has been written" in err
    assert not out.exists()


# ---- dask scheduler + two dask worker processes, as a user starts them ------------------------------


def _dask() -> list[str]:
    exe = Path(sys.executable).parent / "dask"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "dask"]


@contextlib.contextmanager
def _dask_cluster(tmp_path: Path, distributed):
    """`dask scheduler` on a free port of 127.0.0.1 and two `dask worker ADDRESS --nthreads 1`, each
    in its own process group; yields (address, {worker name: Popen}); always stopped."""
    env = {**os.environ, **_worker_env()}
    procs = []

    def start(*argv, name):
        log = open(tmp_path / f"{name}.log", "w")
        procs.append(subprocess.Popen([*_dask(), *argv], env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True, cwd=tmp_path))
        return procs[-1]

    try:
        info = tmp_path / "scheduler.json"
        start("scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(info),
              name="scheduler")
        deadline = time.monotonic() + WAIT
        while not info.exists() or not info.read_text().strip():
            assert procs[0].poll() is None, (tmp_path / "scheduler.log").read_text()
            assert time.monotonic() < deadline, "dask scheduler did not start"
            time.sleep(0.1)
        address = json.loads(info.read_text())["address"]
        workers = {name: start("worker", address, "--nthreads", "1", "--host", "127.0.0.1", "--no-dashboard",
                               "--name", name, name=name) for name in ("w0", "w1")}
        with distributed.Client(address, set_as_default=False, timeout=WAIT) as c:
            c.wait_for_workers(2, timeout=WAIT)
        yield address, workers
    finally:
        for p in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=20)


def _refimpl(*argv, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": _worker_env()["PYTHONPATH"]}
    return subprocess.Popen([sys.executable, "-m", "refimpl", *argv], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_dask_scheduler_and_workers_started_by_hand(distributed, work, reference, tmp_path):
    """The user's recipe (docs/cluster.md) on one host; then one `dask worker` killed outright
    (nanny and all) mid-run: the other finishes, the file is still byte-identical."""
    ref = reference("ngram")
    model, flags = VARIANTS["ngram"]
    out = work / "ngram.golden.jsonl"
    argv = ["golden", "make", model, "--prompts", str(work / "prompts.jsonl"), "-n", N, *flags, "--out", str(out)]
    with _dask_cluster(tmp_path, distributed) as (address, workers):
        out.unlink()
        proc = _refimpl(*argv, "--cluster", address)
        stdout, stderr = proc.communicate(timeout=WAIT)
        assert proc.returncode == 0, stderr
        assert out.read_bytes() == ref

        out.unlink()
        with distributed.Client(address, set_as_default=False) as watch:
            proc = _refimpl(*argv, "--cluster", address)
            victim = _processing_worker(watch, time.monotonic() + WAIT)
            name = watch.scheduler_info()["workers"][victim]["name"]
            os.killpg(workers[name].pid, signal.SIGKILL)
            stdout, stderr = proc.communicate(timeout=WAIT)
            assert proc.returncode == 0, stderr
            assert out.read_bytes() == ref
            assert len(watch.scheduler_info()["workers"]) == 1
            assert _retried_keys(watch)


# ---- bad addresses ----------------------------------------------------------------------------------


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bad_address_is_one_line(work, tmp_path, monkeypatch, capsys, distributed):
    """Nothing listening at the address (make, check, audit --streams), or a scheduler without workers."""
    monkeypatch.setattr(C, "CONNECT_TIMEOUT", 1)
    nobody = f"tcp://127.0.0.1:{_free_port()}"
    golden = tmp_path / "g.jsonl"
    assert main(["golden", "make", "builtin:tiny", "--prompts", str(work / "prompts.jsonl"), "-n", "2", "--out", str(golden)]) == 0
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "x.A.json").write_text("[1, 2]")
    for argv in (["golden", "make", "builtin:tiny", "--prompts", str(work / "prompts.jsonl"), "--out", str(tmp_path / "h.jsonl")],
                 ["golden", "check", str(golden)],
                 ["audit", "builtin:tiny", "--streams", str(tmp_path / "s"), "--prompt", "x"]):
        capsys.readouterr()
        assert main([*argv, "--cluster", nobody]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"refimpl: error: --cluster {nobody}: no Dask scheduler reachable there (Timed out trying to "
                       f"connect to {nobody} after 1 s)"), err
    assert not (tmp_path / "h.jsonl").exists()
    with _local_cluster(distributed, n_workers=0) as empty:
        assert main(["golden", "check", str(golden), "--cluster", empty.scheduler_address]) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith(f"refimpl: error: --cluster {empty.scheduler_address}: no worker connected")


def test_bad_address_from_the_command_line(work):
    """As a user sees it: one line on stderr, exit 2, nothing on stdout."""
    for address, why in [("nonsense", "not a scheduler address (missing port number in address 'nonsense'); "
                                      "expected tcp://HOST:PORT"),
                         ("tcp://nohost.invalid:8786", "no Dask scheduler reachable there ("),
                         ("udp://127.0.0.1:8786", "not a scheduler address (unknown address scheme 'udp'")]:
        proc = _refimpl("golden", "make", "builtin:tiny", "--prompts", str(work / "prompts.jsonl"), "--cluster", address)
        stdout, stderr = proc.communicate(timeout=WAIT)
        assert (proc.returncode, stdout, stderr.count("\n")) == (2, "", 1), stderr
        assert stderr.startswith(f"refimpl: error: --cluster {address}: {why}"), stderr


def test_nothing_imports_distributed_without_cluster(work, tmp_path):
    code = ("import sys; from refimpl.cli import main; "
            f"rc = main(['golden', 'make', 'builtin:tiny', '--prompts', {str(work / 'prompts.jsonl')!r}, '-n', '2', "
            f"'--out', {str(tmp_path / 'g.jsonl')!r}]); "
            "assert rc == 0; bad = sorted(m for m in sys.modules if m.split('.')[0] in ('distributed', 'dask')); "
            "print(bad); sys.exit(1 if bad else 0)")
    env = {**os.environ, "PYTHONPATH": _worker_env()["PYTHONPATH"]}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=WAIT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
