"""Every file a command writes is handled one way (README, "Output files").

The rule, for every option that names an output — ``logits --out`` / ``--mtp-out``, ``run --csv`` /
``--route-trace``, ``trace --out`` (a directory), ``golden make --out``, ``fixture OUT``, ``logits --kld-base``, ``validate --report``, ``audit --html``, ``validate --html``,
``plot … --out`` — and for the cache of ``builtin:`` fixtures (``$REFIMPL_CACHE``):

* missing parent directories are created (for a directory output, the directory itself);
* a location that cannot be written is refused with one line, ``refimpl: error: cannot write
  --out PATH: REASON``, exit code 2 — a directory where a file is wanted (or a file where a directory
  is), a parent that is a file, a directory where files cannot be created (read-only, or a special
  file system such as /proc). The check runs when the command starts, before any work, and creates
  nothing; the directories are made when the file is written.

``check_output`` is the check; ``writing`` (a context manager) is the write: it checks again, creates
the missing directories, and turns an ``OSError`` raised while writing into the same one-line error.
``replace_atomically`` writes a whole file so that a reader sees the old one or the new one, never a part.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

from refimpl.errors import RefimplError


def check_output(path, what: str, *, directory: bool = False) -> Path:
    """``path`` as a Path when ``what`` (the option, e.g. ``--out``) can be written there; otherwise
    :class:`RefimplError` (one line). Creates nothing."""
    p = Path(path)

    def refuse(reason: str):
        raise RefimplError(f"cannot write {what} {p}: {reason}")

    if directory and p.exists() and not p.is_dir():
        refuse("it exists and is not a directory")
    if not directory and p.is_dir():
        refuse("it is a directory")
    folder = p if directory else p.parent
    existing = folder.absolute()
    while not os.path.lexists(existing):  # the nearest ancestor that exists: where the directories would be made
        existing = existing.parent
    if not existing.is_dir():
        refuse(f"{existing} is not a directory")
    try:  # can files (and so directories) be created there? os.access cannot say for root or for /proc
        fd, probe = tempfile.mkstemp(prefix=".refimpl-probe-", dir=existing)
    except OSError as exc:
        refuse(f"cannot create files in {existing} ({exc.strerror or exc})")
    os.close(fd)
    os.unlink(probe)
    if p.exists() and not directory and not os.access(p, os.W_OK):
        refuse("permission denied")
    return p


@contextlib.contextmanager
def writing(path, what: str, *, directory: bool = False) -> Iterator[Path]:
    """``with writing(path, "--out") as p:`` write ``p`` inside the block: checked (:func:`check_output`),
    its missing parent directories (or, with ``directory``, itself) created; an ``OSError`` in the block
    becomes a one-line :class:`RefimplError`."""
    p = check_output(path, what, directory=directory)
    try:
        (p if directory else p.parent).mkdir(parents=True, exist_ok=True)
        yield p
    except OSError as exc:
        raise RefimplError(f"cannot write {what} {p}: {exc.strerror or exc}") from None


def replace_atomically(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file next to it (flushed to disk), then renamed into
    place: a reader sees the old file or the complete new one, never a part. The file gets the usual
    permissions (``mkstemp`` makes 0600); the temporary file is removed if anything fails."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
