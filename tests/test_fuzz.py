"""Fuzz the loader and the forward pass with mutated model files.

Each mutant of a real model file — bit flips and invalid UTF-8 in the header, a truncation, a
length / count / type / dimension / offset field of the header set to an extreme, random bytes in the
tensor data, a NaN or ±inf written where a block's scale (or an F32 weight) is — goes through one
command that opens a model (``inspect``, ``logits``, ``run``, ``run --mtp``, ``trace``, ``audit``,
``golden make``), called in this process (``refimpl.cli.main``). The property:

* the command runs: exit 0 (``audit``: 0 or 1, its verdict), with no traceback and no Python warning;
* or it refuses the file: exit 2 and exactly one line on stderr, ``refimpl: error: …``;
* never a traceback, a crash, or a hang (a watchdog stops an example after ``HANG_S`` seconds).

The bases are the built-in model (``refimpl/models/kjv-q8_0.gguf``: Q8_0 and F32, a 2048-token
vocabulary, an MTP head) and the tiny Q4_K_M fixture (Q4_K, Q5_K, Q6_K, Q8_0, F32). Hypothesis runs
derandomized (the same mutants on every machine, no example database); the verdict does not depend
on the CPU, its speed or which kernels were already compiled (numba's first-run notices are not
counted as stderr lines). 600 examples, well under a minute on two cores once the kernels are
compiled.
"""

from __future__ import annotations

import contextlib
import faulthandler
import io
import json
import signal
import struct
import threading
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from refimpl.fixtures.builtin import TRAINED_PATH

HANG_S = 30  # one example's limit; a normal one takes 10-150 ms
EXAMPLES_EACH = 75  # per mutation: 600 in all

# ---- the header, slot by slot ------------------------------------------------------------------


@dataclass(frozen=True)
class Slot:
    """A field of the header: ``size`` bytes at ``offset``. kind: a field of the format ("version",
    "count", "length", "type", "ndims", "dim", "ggml_type", "offset"; 4 or 8 bytes), a metadata
    value ("value": an integer of 1 to 8 bytes, "float": FLOAT32/64; also an array's items, but
    the tokenizer's) or the bytes of a string ("text"; "token" for an entry of tokenizer.ggml.tokens)."""

    offset: int
    size: int
    kind: str


_SCALAR_SIZES = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
                 GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1,
                 GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}


_FLOATS = (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64)


def header_slots(data: bytes) -> tuple[list[Slot], int]:
    """Every field of a (valid) GGUF header, and where the tensor table ends (gguf.cpp's layout,
    docs/gguf.md): written here from the format, independently of refimpl's reader."""
    pos, slots = 8, []

    def u(size: int, kind: str) -> int:
        nonlocal pos
        slots.append(Slot(pos, size, kind))
        (v,) = struct.unpack_from("<I" if size == 4 else "<Q", data, pos)
        pos += size
        return v

    def string(kind: str = "text") -> None:
        nonlocal pos
        n = u(8, "length")
        slots.append(Slot(pos, n, kind))
        pos += n

    def value(vtype: int, key: str, in_array: bool = False) -> None:
        nonlocal pos
        if vtype == GGUFValueType.STRING:
            string("token" if key == "tokenizer.ggml.tokens" else "text")
        elif vtype == GGUFValueType.ARRAY:
            item, n = u(4, "type"), u(8, "count")
            for _ in range(n):
                value(item, key, True)
        else:
            size = _SCALAR_SIZES[GGUFValueType(vtype)]
            if not (in_array and key.startswith("tokenizer.")):  # not the 2048 token types
                slots.append(Slot(pos, size, "float" if vtype in _FLOATS else "value"))
            pos += size

    slots.append(Slot(4, 4, "version"))
    n_tensors, n_kv = u(8, "count"), u(8, "count")
    for _ in range(n_kv):
        key_at = pos + 8
        string()
        key = data[key_at : pos].decode()
        value(u(4, "type"), key)
    for _ in range(n_tensors):
        string()
        for _ in range(u(4, "ndims")):
            u(8, "dim")
        u(4, "ggml_type")
        u(8, "offset")
    return slots, pos


# ---- the mutations -----------------------------------------------------------------------------

_NEVER_UTF8 = (0xC0, 0xC1, 0xF5, 0xFF)  # bytes that occur in no valid UTF-8 text
_NONFINITE = (np.nan, np.inf, -np.inf)
# where a block's scales are (byte offset in the block, float type): ggml-common.h block layouts
_SCALES = {
    GGMLQuantizationType.F32: ((0, "<f4"),),
    GGMLQuantizationType.Q8_0: ((0, "<f2"),),
    GGMLQuantizationType.Q4_K: ((0, "<f2"), (2, "<f2")),  # d, dmin
    GGMLQuantizationType.Q5_K: ((0, "<f2"), (2, "<f2")),
    GGMLQuantizationType.Q6_K: ((208, "<f2"),),  # ql[128] qh[64] scales[16] d
}


@dataclass(frozen=True, repr=False)
class Base:
    """A model file to mutate, with its header slots and tensor table."""

    name: str
    data: bytes
    slots: tuple[Slot, ...]
    header_end: int
    tensors: tuple[tuple[str, GGMLQuantizationType, int, int], ...]  # name, type, absolute offset, bytes

    def __repr__(self) -> str:  # hypothesis prints the fixture in a failing case: not the 7 MB
        return f"Base({self.name!r}, {len(self.data)} bytes)"


def _base(name: str, path: Path) -> Base:
    from refimpl.io.gguf_file import GGUFFile

    data = path.read_bytes()
    slots, end = header_slots(data)
    tensors = tuple((t.name, t.qtype, t.offset, t.n_bytes) for t in GGUFFile(path).tensors.values())
    return Base(name, data, tuple(slots), end, tensors)


def _put(data: bytearray, offset: int, raw: bytes) -> None:
    data[offset : offset + len(raw)] = raw


#: The mutations, each given the same number of examples: bit flips in the header; a truncation; a
#: field of the format (a count, a length, a type, a dimension, an offset) or a metadata value set to
#: an extreme; a byte that is never UTF-8 in a string of the header; random bytes in a tensor's data;
#: a NaN or ±inf scale (or F32 weight) in one block of a tensor, or in all of them.
MUTATIONS = ("flip", "truncate", "format-field", "metadata-value", "utf8", "bytes", "nonfinite", "nonfinite-all")
_FORMAT_KINDS = ("version", "count", "length", "type", "ndims", "dim", "ggml_type", "offset")


@st.composite
def mutants(draw, base: Base, how: str) -> tuple[bytes, str]:
    """(the mutated file, what was done to it)."""
    data = bytearray(base.data)
    kinds = sorted({s.kind for s in base.slots})
    if how == "flip":  # bit flips in the header: anywhere (mostly vocabulary text), or in fields of one kind
        anywhere = st.integers(0, 8 * base.header_end - 1)
        kind = draw(st.sampled_from(kinds))
        slot = draw(st.sampled_from([s for s in base.slots if s.kind == kind and s.size]))
        in_slot = st.integers(8 * slot.offset, 8 * (slot.offset + slot.size) - 1)
        bits = draw(st.lists(st.one_of(anywhere, in_slot), min_size=1, max_size=8))
        for b in bits:
            data[b // 8] ^= 1 << (b % 8)
        return bytes(data), f"bits {bits} flipped"
    if how == "truncate":
        cut = draw(st.one_of(st.integers(0, base.header_end), st.integers(0, len(data) - 1)))
        return bytes(data[:cut]), f"truncated to {cut} bytes"
    if how in ("format-field", "metadata-value"):  # set to an extreme
        kind = draw(st.sampled_from(_FORMAT_KINDS if how == "format-field" else ("value", "float")))
        slot = draw(st.sampled_from([s for s in base.slots if s.kind == kind]))
        old = data[slot.offset : slot.offset + slot.size]
        if kind == "float":
            dtype = "<f4" if slot.size == 4 else "<f8"
            new = np.array([draw(st.sampled_from((np.nan, np.inf, -np.inf, 0.0, -1.0, 1e30, 1e-30)))], dtype).tobytes()
        else:
            top = 2 ** (8 * slot.size)
            (v,) = struct.unpack_from("<" + "BHIQ"[slot.size.bit_length() - 1], data, slot.offset)
            extremes = (0, 1, top // 2 - 1, top // 2, top - 1) + ((2**32,) if slot.size == 8 else ())  # 0, 1, the largest
            # and the smallest signed, -1 (the largest unsigned); 2^32 past a 32-bit count
            new = ((draw(st.sampled_from(extremes + (v + 1, v - 1, 2 * v))) % top)).to_bytes(slot.size, "little")
        _put(data, slot.offset, new)
        return bytes(data), f"{kind} field at {slot.offset} set from {old.hex()} to {new.hex()} (little-endian)"
    if how == "utf8":  # a key, a string value, a tensor name or (often) a token: not UTF-8
        kind = draw(st.sampled_from(("token", "text")))
        slot = draw(st.sampled_from([s for s in base.slots if s.kind == kind and s.size > 0]))
        at, byte = slot.offset + draw(st.integers(0, slot.size - 1)), draw(st.sampled_from(_NEVER_UTF8))
        data[at] = byte
        return bytes(data), f"byte {at} ({kind} of {slot.size} bytes at {slot.offset}) set to {byte:#x}"
    name, qtype, offset, n_bytes = draw(st.sampled_from(base.tensors))
    if how == "bytes":  # random bytes in a tensor's data
        raw = draw(st.binary(min_size=1, max_size=64))
        at = offset + draw(st.integers(0, max(0, n_bytes - len(raw))))
        _put(data, at, raw[: offset + n_bytes - at])
        return bytes(data), f"{len(raw)} random bytes at {at} in {name}"
    block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
    value = draw(st.sampled_from(_NONFINITE))
    if how == "nonfinite-all":  # every scale (every weight of an F32 tensor) of the tensor
        for b in range(n_bytes // block_bytes):
            for at, dtype in _SCALES.get(qtype, ()):
                _put(data, offset + b * block_bytes + at, np.array([value], dtype).tobytes())
        return bytes(data), f"every scale of {name} ({qtype.name}) set to {value}"
    block = draw(st.integers(0, n_bytes // block_bytes - 1))
    at, dtype = draw(st.sampled_from(_SCALES.get(qtype, ((0, "<f2"),))))
    _put(data, offset + block * block_bytes + at, np.array([value], dtype).tobytes())
    return bytes(data), f"scale at byte {at} of block {block} of {name} ({qtype.name}) set to {value}"


# ---- the commands ------------------------------------------------------------------------------


def commands(model: Path, tmp: Path) -> dict[str, list[str]]:
    """Every command that opens a model, on small inputs (a few tokens, -n ≤ 3)."""
    stream, prompts = tmp / "stream.json", tmp / "prompts.txt"
    stream.write_text(json.dumps([5, 6, 7]))
    prompts.write_text("And the LORD\n")
    m = str(model)
    return {
        "inspect": ["inspect", m],
        "logits": ["logits", m, "--tokens", "1,2,3", "--out", str(tmp / "l.npy")],
        "logits --emulate": ["logits", m, "--tokens", "1,2,3", "--out", str(tmp / "l.npy"), "--emulate"],
        "run": ["run", m, "--tokens", "1,2", "-n", "3", "--json"],
        "run -p": ["run", m, "-p", "And the LORD said", "-n", "2"],
        "run --mtp": ["run", m, "--tokens", "1,2", "-n", "3", "--mtp", "--draft", "2"],
        "trace": ["trace", m, "--tokens", "1,2", "--out", str(tmp / "trace")],
        "audit": ["audit", m, str(stream), "--prompt-tokens", "1,2"],
        "golden make": ["golden", "make", m, "--prompts", str(prompts), "-n", "2", "--out", str(tmp / "g.jsonl")],
    }


_COMPILE_NOTICES = ("refimpl: compiling kernels", "refimpl:   [", "refimpl: compiled ")  # refimpl.cli.compile_report


MEMORY_GUARD = 4 << 30  # bytes an example may allocate beyond what the process holds (RLIMIT_DATA)


def _data_bytes() -> int:
    """The process's data size now (VmData: heap and private anonymous mappings, what RLIMIT_DATA limits)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmData:"):
            return int(line.split()[1]) * 1024
    return 0


@contextlib.contextmanager
def memory_guard():
    """A mutant that makes refimpl allocate without bound gets a MemoryError (a traceback, reported)
    instead of the machine's OOM killer, on Linux; elsewhere nothing is limited."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
        used = _data_bytes()
    except (ImportError, OSError, ValueError, AttributeError):
        yield
        return
    limit = used + MEMORY_GUARD if used else resource.RLIM_INFINITY
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_DATA, (soft, hard))


class _Hang(BaseException):
    """Raised by the watchdog: a BaseException, so that no ``except Exception`` swallows it."""


def call(argv: list[str]) -> tuple[object, str, str, list[str]]:
    """``refimpl.cli.main(argv)`` in this process: (exit code, or "traceback: …", stdout, stderr, warnings)."""
    from refimpl.cli import main

    out, err = io.StringIO(), io.StringIO()
    alarm = threading.current_thread() is threading.main_thread()

    def hang(signum, frame):
        raise _Hang()

    if alarm:
        previous = signal.signal(signal.SIGALRM, hang)
        signal.setitimer(signal.ITIMER_REAL, HANG_S)
    faulthandler.dump_traceback_later(3 * HANG_S, exit=True)  # a hang inside compiled code: stop the run, with stacks
    try:
        with memory_guard(), warnings.catch_warnings(record=True) as caught, contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            warnings.simplefilter("always")
            try:
                rc = main(argv)
            except SystemExit as exc:
                rc = exc.code
            except _Hang:
                rc = f"hang: no result after {HANG_S} s"
            except BaseException:  # noqa: BLE001 - the property under test
                rc = "traceback: " + traceback.format_exc()
    finally:
        faulthandler.cancel_dump_traceback_later()
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    return rc, out.getvalue(), err.getvalue(), [f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})" for w in caught]


#: Tracebacks this fuzz found and that are not fixed yet: (the exception line, text of the frame that
#: raised) — let through by :func:`verdict`. Empty: every one found so far is fixed and pinned by
#: test_fixed_failure below.
KNOWN: dict[str, tuple[str, str]] = {}


def _known(rc: str) -> bool:
    lines = rc.strip().splitlines()
    return any(lines[-1] == error and frame in rc for error, frame in KNOWN.values())


def verdict(command: str, rc, stderr: str, caught: list[str], *, known: bool = True) -> str | None:
    """None when the property holds, else what broke it (``known``: a traceback of :data:`KNOWN` is
    let through)."""
    lines = [line for line in stderr.splitlines() if not line.startswith(_COMPILE_NOTICES)]
    if isinstance(rc, str):
        return None if known and rc.startswith("traceback: ") and _known(rc) else rc
    if caught:
        return "Python warnings: " + "; ".join(caught)
    if rc == 0 or (rc == 1 and command == "audit"):
        return "a traceback on stderr" if "Traceback" in stderr else None
    if rc == 2:
        if len(lines) == 1 and lines[0].startswith("refimpl: error: "):
            return None
        return f"exit 2 with {len(lines)} stderr lines: {[line[:200] for line in lines[:5]]}"
    return f"exit code {rc!r}; stderr {[line[:200] for line in lines[-5:]]}"


# ---- the test ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bases(make_fixture, fixture_cache):
    return {"kjv": _base("kjv", Path(TRAINED_PATH)), "tiny-q4_k_m": _base("tiny-q4_k_m", make_fixture("tiny", "q4_k_m"))}


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, bases):
    """A directory for the mutants and the commands' outputs, after one clean run of every command on
    each base (which compiles the kernels the bases need, outside the examples)."""
    tmp = tmp_path_factory.mktemp("fuzz")
    for base in bases.values():
        path = tmp / f"{base.name}.gguf"
        path.write_bytes(base.data)
        for command, argv in commands(path, tmp).items():
            rc, _, stderr, caught = call(argv)
            assert verdict(command, rc, stderr, caught) is None and rc in (0, 1), (command, rc, stderr, caught)
    return tmp


def test_header_slots_cover_the_header(bases):
    """The walker reads each base to the end of its tensor table, where the data starts (after the
    alignment padding), and finds every token of the built-in model's vocabulary."""
    from refimpl.io.gguf_file import GGUFFile

    for base in bases.values():
        first_data = min(offset for _, _, offset, _ in base.tensors)
        assert base.header_end <= first_data < base.header_end + 32
    n_tokens = len(GGUFFile(TRAINED_PATH).key("tokenizer.ggml.tokens"))
    assert sum(s.kind == "token" for s in bases["kjv"].slots) == n_tokens


@pytest.mark.parametrize("mutation", MUTATIONS)
@settings(max_examples=EXAMPLES_EACH, derandomize=True, database=None, deadline=None, print_blob=False,
          suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_a_mutated_file_runs_or_is_refused_in_one_line(bases, workdir, mutation, data):
    base = bases[data.draw(st.sampled_from(sorted(bases)), label="base")]
    mutant, how = data.draw(mutants(base, mutation), label="mutation")
    path = workdir / "mutant.gguf"
    path.write_bytes(mutant)
    table = commands(path, workdir)
    command = data.draw(st.sampled_from(sorted(table)), label="command")
    rc, _, stderr, caught = call(table[command])
    problem = verdict(command, rc, stderr, caught)
    assert problem is None, f"{base.name}, {how}: refimpl {command}: {problem}"


def _set_value(data: bytes, key: str, value: int) -> bytes:
    """``data`` with the (4-byte integer) value of metadata key ``key`` replaced."""
    slots, _ = header_slots(data)
    for i, slot in enumerate(slots):
        if slot.kind == "text" and data[slot.offset : slot.offset + slot.size] == key.encode():
            target = slots[i + 2]  # the key's text, its value type, its value
            assert target.kind == "value" and target.size == 4, target
            return data[: target.offset] + value.to_bytes(4, "little") + data[target.offset + 4 :]
    raise KeyError(key)


@pytest.mark.parametrize("case, key, value", [("ssm.group_count 0", "qwen35moe.ssm.group_count", 0),
                                              ("block_count 2^31 - 1", "qwen35moe.block_count", 2**31 - 1)])
def test_fixed_failure(bases, workdir, case, key, value):
    """Mutants that once gave a traceback (a ZeroDivisionError; a MemoryError from a 2^31-entry
    per-layer array — llama.cpp refuses more than LLAMA_MAX_LAYERS = 512), each refused in one line."""
    path = workdir / "known.gguf"
    path.write_bytes(_set_value(bases["kjv"].data, key, value))
    rc, _, stderr, caught = call(["inspect", str(path)])
    problem = verdict("inspect", rc, stderr, caught, known=False)
    assert problem is None, f"{case}: {problem}"

