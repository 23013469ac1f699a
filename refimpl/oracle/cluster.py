"""Many tasks on a Dask distributed cluster: ``--cluster ADDRESS`` of ``golden make``, ``golden check``
and ``audit --streams`` (docs/cluster.md).

This module is imported only when ``--cluster`` is given; ``distributed`` is the optional
``cluster`` extra (``pip install -e '.[cluster]'``). :func:`refimpl.oracle.golden_run.run_tasks` calls
:func:`run_on_cluster`, which

1. connects to the scheduler (:func:`connect`; a bad address or a cluster without workers is a
   one-line error), and asks the scheduler and every worker for their :func:`fingerprint` (refimpl's
   code and the versions of numpy, numba, gguf) and whether the model file is there
   (:func:`_preflight`): a worker that runs other code could put other numbers in the file,
2. submits one task per item (a prompt, a stream pair): :func:`_on_worker` runs ``fn(job, item)`` on
   a worker, which opens the model on its first task and keeps it
   (:func:`refimpl.oracle.golden_run.loaded`, keyed by path, sha256 and ``--cache-mb``), after checking
   that the file at that path has the client's sha256,
3. yields ``(index, result)`` as tasks complete; run_tasks puts each in its place, so the caller
   writes in item order.

A worker that dies takes its running tasks (and results not yet fetched) with it; the scheduler runs
them again on the workers left — up to ``distributed.scheduler.allowed-failures`` times per task
(default 3) — and every index is filled exactly once, so nothing is lost or duplicated. If every
worker is gone for ``NO_WORKER_TIMEOUT`` seconds, the run stops with one line instead of waiting.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace
from pathlib import Path

from refimpl.errors import RefimplError

SAME_FILE = "every worker needs the GGUF at the same path, or a shared filesystem"


CONNECT_TIMEOUT = 10  # seconds to reach the scheduler, and then for at least one worker to be connected
NO_WORKER_TIMEOUT = 60  # seconds without any worker before a run gives up
_SAME_CODE = "the scheduler and every worker need the same refimpl (and numpy, numba, gguf) as this client"

_TASK_LOCK = threading.Lock()  # a worker process runs one task at a time, whatever its --nthreads


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else exc.__class__.__name__


def connect(address: str):
    """A ``distributed.Client`` for the scheduler at ``address`` with at least one worker."""
    try:
        import distributed
    except ImportError:
        raise RefimplError("--cluster needs the 'distributed' package: pip install 'refimpl[cluster]'") from None
    from distributed.comm import resolve_address

    try:
        resolve_address(address)  # the scheme, the port and the host name (DNS), before any connection
    except ValueError as exc:
        raise RefimplError(f"--cluster {address}: not a scheduler address ({_first_line(exc)}); expected "
                           f"tcp://HOST:PORT") from None
    except OSError as exc:
        raise RefimplError(f"--cluster {address}: no Dask scheduler reachable there ({_first_line(exc)})") from None
    try:
        client = distributed.Client(address, timeout=CONNECT_TIMEOUT, set_as_default=False)
    except OSError as exc:  # the connect timeout
        raise RefimplError(f"--cluster {address}: no Dask scheduler reachable there ({_first_line(exc)})") from None
    try:
        client.wait_for_workers(1, timeout=CONNECT_TIMEOUT)
    except TimeoutError:
        client.close()
        raise RefimplError(f"--cluster {address}: no worker connected to the scheduler within {CONNECT_TIMEOUT} s "
                           f"(start one: dask worker {address} --nthreads 1)") from None
    return client


def fingerprint() -> str:
    """sha256 over refimpl's and kernels' source files and the numpy, numba and gguf versions: what,
    besides the model file and the settings, decides the numbers a process computes."""
    import hashlib
    from importlib.metadata import version

    import kernels

    h = hashlib.sha256()
    for root in (Path(__file__).parents[1], Path(kernels.__file__).parent):  # refimpl/ (this file is refimpl/oracle/…), kernels/
        for f in sorted(root.rglob("*.py")):
            h.update(f.relative_to(root.parent).as_posix().encode() + b"\0" + f.read_bytes() + b"\0")
    h.update(" ".join(f"{p} {version(p)}" for p in ("numpy", "numba", "gguf")).encode())
    return h.hexdigest()


def _probe(path: str) -> tuple[str, bool]:
    """On a worker (or the scheduler): its fingerprint, and whether ``path`` is a file there."""
    return fingerprint(), os.path.isfile(path)


def _preflight(client, address: str, path: str) -> None:
    """The scheduler (which unpickles the tasks) and the workers connected now run this client's
    code, and every worker sees the model file (workers that join later are checked by their tasks)."""
    mine = fingerprint()
    try:
        theirs = client.run_on_scheduler(_probe, path)[0]
    except Exception as exc:  # noqa: BLE001 - whatever the scheduler's environment raised
        raise RefimplError(f"the scheduler at {address} cannot run refimpl ({_first_line(exc)}); {_SAME_CODE}") from None
    if theirs != mine:
        raise RefimplError(f"the scheduler at {address} has another refimpl, numpy, numba or gguf; {_SAME_CODE}")
    for worker, answer in sorted(client.run(_probe, path, on_error="return").items()):
        if isinstance(answer, BaseException):
            raise RefimplError(f"worker {worker} cannot run refimpl ({_first_line(answer)}); {_SAME_CODE}")
        if answer[0] != mine:
            raise RefimplError(f"worker {worker} has another refimpl, numpy, numba or gguf; {_SAME_CODE}")
        if not answer[1]:
            raise RefimplError(f"worker {worker}: {path}: no such file ({SAME_FILE})")


def _on_worker(fn, job, item):
    """On a worker: ``fn(job, item)``, one task at a time per process (the cores belong to one task's
    numba threads; numba's default threading layer is not re-entrant); a bad-input error names the worker."""
    from distributed import get_worker

    with _TASK_LOCK:
        try:
            return fn(job, item)
        except RefimplError as exc:
            raise RefimplError(f"worker {get_worker().address}: {exc}") from None


def _completed(client, futures: list):
    """``futures`` as they complete; RefimplError when the cluster has had no worker for
    NO_WORKER_TIMEOUT seconds (the scheduler would wait for one forever)."""
    import time

    from distributed import as_completed

    done = as_completed(futures, loop=client.loop)
    checked = alone_since = time.monotonic()
    while not done.is_empty():
        batch = done.next_batch(block=False)
        yield from batch
        if batch:
            continue
        time.sleep(0.05)
        if time.monotonic() - checked < 2:
            continue
        checked = time.monotonic()
        if client.nthreads():
            alone_since = checked
        elif checked - alone_since > NO_WORKER_TIMEOUT:
            n = sum(f.done() for f in futures)
            raise RefimplError(f"every worker left the cluster ({n} of {len(futures)} items done); "
                               f"nothing has been written (see the workers' logs; out of memory?)")


def run_on_cluster(address: str, job, fn, items: list):
    """``(index, fn(job, item))`` for every item, as the cluster's workers complete them."""
    from distributed.scheduler import KilledWorker

    job = replace(job, path=os.path.abspath(job.path))  # the same path on every host, whatever a worker's cwd
    client = connect(address)
    try:
        _preflight(client, address, job.path)
        futures = [client.submit(_on_worker, fn, job, x, pure=False) for x in items]
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in _completed(client, futures):
            i = index[fut.key]
            try:
                result = fut.result()
            except KilledWorker:
                raise RefimplError(f"item {i}: every worker that ran it died (distributed.scheduler.allowed-failures "
                                   f"times); out of memory? see the workers' logs and docs/cluster.md") from None
            except RuntimeError as exc:
                if "deserializ" not in str(exc):
                    raise  # a bug, not the environment: with its traceback
                raise RefimplError(f"the cluster cannot read refimpl's tasks ({_first_line(exc)}); {_SAME_CODE}") from None
            yield i, result
    finally:
        client.close()
