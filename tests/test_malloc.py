"""refimpl.io.malloc: the refimpl command's allocator policy — a large block freed and allocated again comes back
from the heap without a page fault; REFIMPL_MALLOC_REUSE=0 leaves glibc's defaults. Run in child processes: the
policy is process-wide."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

CHILD = """
import resource, numpy as np
from refimpl.io.malloc import reuse_freed_memory
applied = reuse_freed_memory()
a = np.ones(100 << 18, np.float32); del a  # 100 MiB
r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    a = np.empty(100 << 18, np.float32); a[:] = 1; del a
print(applied, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0) // 5)
"""


def _child(reuse: str) -> tuple[bool, int]:
    env = dict(os.environ, REFIMPL_MALLOC_REUSE=reuse)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True).stdout.split()
    return out[0] == "True", int(out[1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused():
    applied, faults = _child("1")
    assert applied
    assert faults < 10, f"{faults} page faults per 100 MiB block with the policy"
    applied, _ = _child("0")  # glibc's defaults: how many faults then depends on the kernel's page sizes, not asserted
    assert not applied


def test_the_command_applies_it(make_fixture, monkeypatch):
    """The refimpl command calls it before any work that computes (recorded, not applied: the policy is
    process-wide)."""
    import refimpl.io.malloc
    from refimpl.cli import main

    calls = []
    monkeypatch.setattr(refimpl.io.malloc, "reuse_freed_memory", lambda: calls.append(1) or True)
    assert main(["run", str(make_fixture("tiny", "q8_0", 0)), "--tokens", "1,2", "-n", "1"]) == 0
    assert calls == [1]
