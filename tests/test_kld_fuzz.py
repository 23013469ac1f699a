"""Fuzz ``refimpl audit MODEL --kld-base FILE`` with mutated llama-perplexity base files.

Each mutant of a valid base file (``refimpl logits builtin:tiny --kld-base``: n_ctx 8, 2 chunks, a
512-token vocabulary) — bytes overwritten anywhere, a header count or a token id set to an extreme, a
row's scale or minimum set to a special float, a truncation, bytes appended, a span cut out or
repeated — goes through the command in this process, with tests/test_fuzz.py's harness and property:
it runs (exit 0, or 1: a wrong top token) with no traceback and no Python warning, or it refuses the
file with exit 2 and one line ``refimpl: error: …``; never a traceback, a crash or a hang (a watchdog
stops an example after ``HANG_S`` seconds). Hypothesis runs derandomized (the same mutants on every
machine, no example database); ~20 s on two busy cores.
"""

from __future__ import annotations

import collections
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from test_fuzz import call, verdict

MODEL = "builtin:tiny"
TEXT = Path(__file__).parent / "data" / "kjv-genesis-20.txt"
N_CTX, N_CHUNK, N_VOCAB = 8, 2, 512
EXAMPLES = 300

INTS = (0, 1, 2, 3, -1, 2**31 - 1, -(2**31), N_VOCAB - 1, N_VOCAB, N_CTX, 2**16)
FLOATS = (float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e30, -1e30, 1e-45, -1.0, 16 / 65535, 1.0)


@pytest.fixture(scope="module")
def base(fixture_cache, tmp_path_factory) -> tuple[bytes, Path]:
    """The valid file, and a directory for the mutants; one clean run compiles the kernels outside the examples."""
    tmp = tmp_path_factory.mktemp("kld-fuzz")
    path = tmp / "base.kld"
    rc, _, stderr, caught = call(["logits", MODEL, "--kld-base", str(path), "--text", str(TEXT), "--ctx", str(N_CTX),
                                  "--chunks", str(N_CHUNK)])
    assert rc == 0 and not caught, stderr
    rc, _, stderr, caught = call(["audit", MODEL, "--kld-base", str(path)])
    assert rc == 0 and not caught, stderr
    return path.read_bytes(), tmp


def _fields(data: bytes) -> list[int]:
    """Offsets of the int32 fields: n_ctx, n_vocab, n_chunk and every token."""
    return [8, 12, 16] + [20 + 4 * i for i in range(N_CTX * N_CHUNK)]


def _row_floats(data: bytes) -> list[int]:
    """Offsets of every row's scale and min_log_prob."""
    rows_at, row_bytes = 20 + 4 * N_CTX * N_CHUNK, 2 * (2 * ((N_VOCAB + 1) // 2) + 4)
    return [at + k for at in range(rows_at, len(data), row_bytes) for k in (0, 4)]


@st.composite
def mutants(draw, data: bytes):
    kind = draw(st.sampled_from(["bytes", "int", "float", "truncate", "append", "cut", "repeat"]))
    if kind == "bytes":
        out = bytearray(data)
        head = 20 + 4 * N_CTX * N_CHUNK + 16  # the header, the tokens and the first row's header: where bytes matter most
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, head - 1) | st.integers(0, len(data) - 1))
            out[at] = draw(st.integers(0, 255))
        return bytes(out), f"{kind}: {sum(a != b for a, b in zip(out, data))} bytes changed"
    if kind == "int":
        at = draw(st.sampled_from(_fields(data)))
        v = draw(st.sampled_from(INTS) | st.integers(-(2**31), 2**31 - 1))
        return data[:at] + struct.pack("<i", v) + data[at + 4 :], f"int32 at {at} = {v}"
    if kind == "float":
        at = draw(st.sampled_from(_row_floats(data)))
        v = draw(st.sampled_from(FLOATS) | st.floats(width=32))
        return data[:at] + struct.pack("<f", v) + data[at + 4 :], f"float32 at {at} = {v}"
    if kind == "truncate":
        n = draw(st.integers(0, len(data) - 1))
        return data[:n], f"truncated to {n} bytes"
    if kind == "append":
        extra = draw(st.binary(min_size=1, max_size=64))
        return data + extra, f"{len(extra)} bytes appended"
    a = draw(st.integers(0, len(data) - 1))
    b = draw(st.integers(a + 1, min(len(data), a + 4096)))
    if kind == "cut":
        return data[:a] + data[b:], f"bytes {a}..{b} cut out"
    return data[:b] + data[a:b] + data[b:], f"bytes {a}..{b} repeated"


def test_a_mutated_base_file_is_scored_or_refused_in_one_line(base):
    """The property on every mutant; and the mutants reach both outcomes — some are refused, some scored
    (a changed token or code leaves a valid file), so the run exercised the reader and the statistics."""
    valid, tmp = base
    outcomes = collections.Counter()

    @settings(max_examples=EXAMPLES, derandomize=True, database=None, deadline=None, print_blob=False,
              suppress_health_check=list(HealthCheck))
    @given(data=st.data())
    def one(data):
        mutant, how = data.draw(mutants(valid), label="mutation")
        path = tmp / "mutant.kld"
        path.write_bytes(mutant)
        rc, _, stderr, caught = call(["audit", MODEL, "--kld-base", str(path)])
        problem = verdict("audit", rc, stderr, caught)
        assert problem is None, f"{how}: refimpl audit --kld-base: {problem}"
        outcomes["refused" if rc == 2 else "scored"] += 1

    one()
    assert outcomes["refused"] and outcomes["scored"], outcomes
