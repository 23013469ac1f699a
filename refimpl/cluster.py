"""Many tasks on a Dask distributed cluster: ``--cluster ADDRESS`` of ``golden make``, ``golden check``
and ``audit --streams`` (docs/cluster.md).

This module is imported only when ``--cluster`` is given; ``distributed`` is the optional
``cluster`` extra (``pip install -e '.[cluster]'``). :func:`refimpl.golden_run.run_tasks` calls
:func:`run_on_cluster`, which

1. connects to the scheduler (:func:`connect`; a bad address or a cluster without workers is a
   one-line error),
2. submits one task per item (a prompt, a stream pair): :func:`_on_worker` runs ``fn(job, item)`` on
   a worker, which opens the model on its first task and keeps it
   (:func:`refimpl.golden_run.loaded`, keyed by path, sha256 and ``--cache-mb``), after checking
   that the file at that path has the client's sha256,
3. yields ``(index, result)`` as tasks complete; run_tasks puts each in its place, so the caller
   writes in item order.

A worker that dies takes its running tasks (and results not yet fetched) with it; the scheduler runs
them again on the workers left — up to ``distributed.scheduler.allowed-failures`` times per task
(default 3) — and every index is filled exactly once, so nothing is lost or duplicated.
"""

from __future__ import annotations

import os
import threading
from dataclasses import replace

from refimpl.errors import RefimplError

CONNECT_TIMEOUT = 10  # seconds to reach the scheduler, and then for at least one worker to be connected

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


def _on_worker(fn, job, item):
    """On a worker: ``fn(job, item)``, one task at a time per process (the cores belong to one task's
    numba threads; numba's default threading layer is not re-entrant); a bad-input error names the worker."""
    from distributed import get_worker

    with _TASK_LOCK:
        try:
            return fn(job, item)
        except RefimplError as exc:
            raise RefimplError(f"worker {get_worker().address}: {exc}") from None


def run_on_cluster(address: str, job, fn, items: list):
    """``(index, fn(job, item))`` for every item, as the cluster's workers complete them."""
    from distributed import as_completed
    from distributed.scheduler import KilledWorker

    job = replace(job, path=os.path.abspath(job.path))  # the same path on every host, whatever a worker's cwd
    client = connect(address)
    try:
        futures = [client.submit(_on_worker, fn, job, x, pure=False) for x in items]
        index = {f.key: i for i, f in enumerate(futures)}
        for fut in as_completed(futures, loop=client.loop):
            i = index[fut.key]
            try:
                result = fut.result()
            except KilledWorker:
                raise RefimplError(f"item {i}: every worker that ran it died (distributed.scheduler.allowed-failures "
                                   f"times); out of memory? see the workers' logs and docs/cluster.md") from None
            except ImportError as exc:
                raise RefimplError(f"a worker cannot import what the task needs ({_first_line(exc)}): install the "
                                   f"same refimpl on every worker") from None
            yield i, result
    finally:
        client.close()
