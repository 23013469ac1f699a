"""The AArch64 builds of llama.cpp, run under qemu-user, for the tests that compare the ARM emulation with them.

``.ci/build-llama-arm64`` cross-builds the vendored llama.cpp once per ARM build (:data:`BUILDS`: the path the
emulation names, the compiler, ``-march``) into ``$LLAMA_TOOLS_DIR/arm64-NAME/lib``, and unpacks Debian 12's arm64
``python3.11`` and ``python3-numpy`` into ``$LLAMA_TOOLS_DIR/arm64-sysroot``. A test then runs ggml in an
*aarch64 Python* under ``qemu-aarch64 -L SYSROOT -cpu MODEL``, on a CPU model with exactly the build's features
(:data:`QEMU_CPU`: an i8mm build on a CPU without i8mm dies of SIGILL, so a feature the emulation forgets cannot
hide behind the host):

* :func:`python_command`: the command line of that Python (``[sys.executable]`` for an x86 build), for
  ``tests/llama_ref.py``'s and ``tests/llama_trace.py``'s children, which drive libllama through llama-cpp-python's
  own (pure Python) bindings;
* :func:`call`: ``fn(*args)`` computed there, for the one-op graphs of ``tests/ggml_graph.py`` (``on_build``). The
  function is sent by value (cloudpickle: its module is test code the aarch64 Python cannot import, numba and all)
  and numpy arrays as ``.npy`` bytes (the two sides run numpy 2 and numpy 1.24, whose pickles differ), through one
  long-lived worker per build (``tests/arm64_worker.py``: qemu starts Python and numpy in ~6 s).
"""

from __future__ import annotations

import atexit
import functools
import io
import os
import pickle
import signal
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
#: build name → (path key of kernels.ggml.build, compiler, -march): .ci/build-llama-arm64's BUILDS
BUILDS = {
    "arm64-dotprod-gcc": ("arm64-dotprod", "gcc", "armv8.2-a+dotprod+fp16"),
    "arm64-i8mm-gcc": ("arm64-i8mm", "gcc", "armv8.6-a+dotprod+fp16+i8mm"),
    "arm64-base-gcc": ("arm64-base", "gcc", "armv8-a"),
    "arm64-sve128-gcc": ("arm64-sve128", "gcc", "armv9-a+sve2+i8mm+dotprod+fp16"),
    "arm64-sve256-gcc": ("arm64-sve256", "gcc", "armv9-a+sve2+i8mm+dotprod+fp16"),
    "arm64-i8mm-clang": ("arm64-i8mm-clang", "clang", "armv8.6-a+dotprod+fp16+i8mm"),
    "arm64-base-clang": ("arm64-base-clang", "clang", "armv8-a"),  # the Android guide's portable arm64-v8a build
    "arm64-dotprod-clang": ("arm64-dotprod-clang", "clang", "armv8.2-a+dotprod+fp16"),
    "arm64-sve128-clang": ("arm64-sve128-clang14", "clang", "armv9-a+sve2+i8mm+dotprod+fp16"),  # android_armv9.0_1
    # clang 19 (Debian 12's clang-19; the NDK r28's LLVM): the NEON builds compute clang 14's bits, the SVE build not
    "arm64-i8mm-clang19": ("arm64-i8mm-clang", "clang19", "armv8.6-a+dotprod+fp16+i8mm"),
    "arm64-dotprod-clang19": ("arm64-dotprod-clang", "clang19", "armv8.2-a+dotprod+fp16"),
    "arm64-base-clang19": ("arm64-base-clang", "clang19", "armv8-a"),
    "arm64-sve128-clang19": ("arm64-sve128-clang", "clang19", "armv9-a+sve2+i8mm+dotprod+fp16"),
    # clang 17 and 18 (ziglang's: the NDK r26's and r27's LLVM majors): the paths of clang 19's builds
    **{f"arm64-{kind}-clang{v}": (path, f"clang{v}", march) for v in (17, 18)
       for kind, path, march in (("i8mm", "arm64-i8mm-clang", "armv8.6-a+dotprod+fp16+i8mm"),
                                 ("dotprod", "arm64-dotprod-clang", "armv8.2-a+dotprod+fp16"),
                                 ("base", "arm64-base-clang", "armv8-a"),
                                 ("sve128", "arm64-sve128-clang", "armv9-a+sve2+i8mm+dotprod+fp16"))},
}
#: the builds .ci/build-llama-arm64 makes only when named or with ``ARM64_ALL=1`` (its ALL_ONLY): clang 17's and 18's
#: but the two the default suite runs; the tests on them are ``deep``
ALL_ONLY = frozenset({"arm64-i8mm-clang17", "arm64-dotprod-clang17", "arm64-base-clang17", "arm64-dotprod-clang18",
                      "arm64-base-clang18", "arm64-sve128-clang18"})
#: the qemu CPU model each build runs on: exactly its features (qemu 7.2's models; ``max`` has all of them, so the
#: features a build must not see are switched off)
QEMU_CPU = {
    "arm64-dotprod-gcc": "cortex-a76",  # ARMv8.2: dotprod, fp16 arithmetic; no i8mm (SIGILL), no SVE
    "arm64-i8mm-gcc": "max,sve=off,sme=off",
    "arm64-i8mm-clang": "max,sve=off,sme=off",
    "arm64-base-clang": "cortex-a53",
    "arm64-dotprod-clang": "cortex-a76",
    "arm64-base-gcc": "cortex-a53",  # ARMv8.0: NEON only
    "arm64-sve128-gcc": "max,sve-default-vector-length=16,sme=off",
    "arm64-sve256-gcc": "max,sve-default-vector-length=32,sme=off",
    "arm64-sve128-clang": "max,sve-default-vector-length=16,sme=off",
    "arm64-i8mm-clang19": "max,sve=off,sme=off",
    "arm64-dotprod-clang19": "cortex-a76",
    "arm64-base-clang19": "cortex-a53",
    "arm64-sve128-clang19": "max,sve-default-vector-length=16,sme=off",
}
QEMU_CPU.update({f"{b[:-2]}{v}": QEMU_CPU[b] for b in list(QEMU_CPU) if b.endswith("clang19") for v in (17, 18)})
#: how much longer a child under qemu may take than its x86 timeout allows
ARM_SLOWDOWN = 10
#: pure-Python packages of this venv the aarch64 Python imports (x86 extension modules in them are not matched by
#: its import suffix and fall back to their Python code)
PURE_PACKAGES = ("cloudpickle", "llama_cpp", "jinja2", "markupsafe", "diskcache", "typing_extensions")


def tools_root() -> Path:
    return Path(os.environ.get("LLAMA_TOOLS_DIR") or HERE.parent / "build" / "llama-tools")


def sysroot() -> Path:
    return tools_root() / "arm64-sysroot"


#: builds that are another build's libraries on another CPU: an SVE library reads its vector length at run time, so
#: ``arm64-sve256-gcc`` is ``arm64-sve128-gcc``'s files run at 256 bits (a folder of links, so that the folder names
#: the build: :func:`build_of`)
SAME_LIBRARY = {"arm64-sve256-gcc": "arm64-sve128-gcc"}


def lib_dir(build: str) -> Path:
    d = tools_root() / build / "lib"
    if build in SAME_LIBRARY:
        src = tools_root() / SAME_LIBRARY[build] / "lib"
        if src.is_dir() and not (d / "libggml-cpu.so").exists():
            d.mkdir(parents=True, exist_ok=True)
            for f in src.iterdir():
                if not (d / f.name).is_symlink():
                    (d / f.name).symlink_to(f.resolve())
    return d


def sve_bits(build: str) -> int | None:
    """The SVE vector length ``build`` runs at here (its :data:`QEMU_CPU`'s ``sve-default-vector-length``, in bytes;
    qemu-user's own default is 64 bytes), None for a CPU model without SVE: ``kernels.ggml.build.detect``'s
    ``sve_bits``, since an SVE library reads its vector length from the CPU at run time."""
    cpu = QEMU_CPU[build]
    if "sve=off" in cpu or not cpu.startswith("max"):
        return None
    length = [o.partition("=")[2] for o in cpu.split(",") if o.startswith("sve-default-vector-length=")]
    return 8 * int(length[0]) if length else 8 * 64


def is_arm64(directory) -> bool:
    """Whether the ``libggml-cpu.so`` in ``directory`` is AArch64 code (its ELF header's e_machine, EM_AARCH64)."""
    so = Path(directory) / "libggml-cpu.so"
    try:
        with open(so, "rb") as f:
            elf = f.read(20)
    except OSError:
        return False
    return elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183


def build_of(directory) -> str:
    """The :data:`BUILDS` name of an ARM library folder (``…/arm64-NAME/lib``)."""
    name = Path(directory).resolve().parent.name
    if name not in BUILDS:
        raise ValueError(f"{directory} is not one of the ARM builds {tuple(BUILDS)}")
    return name


def missing(build: str) -> str | None:
    """Why ``build`` cannot run here (None: it can)."""
    if build not in BUILDS:
        return f"unknown ARM build {build!r}"
    for need, what in ((lib_dir(build) / "libggml-cpu.so", "the library"),
                       (sysroot() / "usr/bin/python3.11", "the aarch64 Python")):
        if not need.exists():
            how = f" {build}" if build in ALL_ONLY else ""
            return f"{need} ({what}) is missing: build it with .ci/build-llama-arm64{how}"
    for tool in ("qemu-aarch64",):
        if not any((Path(p) / tool).is_file() for p in os.environ.get("PATH", "").split(os.pathsep)):
            return f"{tool} is not installed (Debian: apt-get install qemu-user)"
    return None


def require(build: str) -> None:
    """Skip (fail under ``CI=true``) a test whose ARM build cannot run here."""
    import pytest

    why = missing(build)
    if why:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why} (required under CI=true)")
        pytest.skip(why)


@functools.cache
def _pure_path() -> Path:
    """A folder of links to :data:`PURE_PACKAGES` (and tests/), for the aarch64 Python's PYTHONPATH."""
    import importlib.util

    d = tools_root() / "arm64-pure"
    d.mkdir(parents=True, exist_ok=True)
    for name in PURE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin:
            continue
        src = Path(spec.origin)
        src = src.parent if src.name == "__init__.py" else src
        link = d / src.name
        if not link.is_symlink() or link.resolve() != src.resolve():
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(src)
    return d


def python_command(build: str, cpu: str | None = None) -> tuple[list[str], dict[str, str]]:
    """(argv prefix, environment) of the aarch64 Python under qemu on ``build``'s CPU model (or on ``cpu``: a model
    without some of its features, to see it die of SIGILL), with ``LLAMA_CPP_LIB_PATH`` set to its libraries."""
    root = sysroot()
    env = dict(os.environ)
    env.pop("PYTHONHOME", None)
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(HERE.parent), str(_pure_path()),
                                         str(root / "usr/lib/python3/dist-packages")])
    env["LLAMA_CPP_LIB_PATH"] = str(lib_dir(build))
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # the .pyc of 3.11.2 and of this venv's Python must not meet
    argv = ["qemu-aarch64", "-L", str(root), "-cpu", cpu or QEMU_CPU[build], str(root / "usr/bin/python3.11")]
    return argv, env


def command_for(directory) -> tuple[list[str], dict[str, str] | None]:
    """The Python that runs llama.cpp's libraries in ``directory``: qemu's for an ARM build, else this one."""
    if directory and is_arm64(directory):
        return python_command(build_of(directory))
    return [sys.executable], None


# ---- the worker protocol: length-prefixed pickles; arrays as .npy bytes both ways ----

def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a, allow_pickle=False)
    return buf.getvalue()


def from_npy(data: bytes, scalar: bool = False):
    a = np.load(io.BytesIO(data), allow_pickle=False)
    return a[()] if scalar else a


def reduce_numpy(obj):
    """``reducer_override`` of both sides: ndarrays and numpy scalars travel as .npy bytes."""
    if isinstance(obj, np.ndarray) and obj.dtype != object:
        return from_npy, (_npy(obj),)
    if isinstance(obj, np.generic):
        return from_npy, (_npy(np.asarray(obj)), True)
    return NotImplemented


def send(stream, payload: bytes) -> None:
    stream.write(struct.pack("<Q", len(payload)) + payload)
    stream.flush()


def receive(stream) -> bytes | None:
    head = stream.read(8)
    if len(head) < 8:
        return None
    (n,) = struct.unpack("<Q", head)
    return stream.read(n)


def _no_core() -> None:
    """No core file of a guest that dies (qemu-user writes ``qemu_*.core`` into the working directory)."""
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _Worker:
    def __init__(self, build: str, cpu: str | None = None):
        argv, env = python_command(build, cpu)
        self.build, self.cpu = build, cpu or QEMU_CPU[build]
        self.proc = subprocess.Popen(argv + [str(HERE / "arm64_worker.py")], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=env, preexec_fn=_no_core)
        atexit.register(self.close)

    def call(self, fn, *args):
        import cloudpickle

        class Pickler(cloudpickle.Pickler):
            def reducer_override(self, obj):
                r = reduce_numpy(obj)
                return r if r is not NotImplemented else super().reducer_override(obj)

        if self.proc.poll() is not None:  # died on an earlier call (SIGILL …): say so again, not a broken pipe
            raise RuntimeError(died(self.build, self.cpu, self.proc.returncode))
        module = sys.modules.get(getattr(fn, "__module__", ""), None)
        if module is not None and module.__name__ not in ("ggml_graph", "arm64"):
            cloudpickle.register_pickle_by_value(module)
        buf = io.BytesIO()
        Pickler(buf, protocol=4).dump((fn, args))
        send(self.proc.stdin, buf.getvalue())
        reply = receive(self.proc.stdout)
        if reply is None:
            raise RuntimeError(died(self.build, self.cpu, self.proc.wait()))
        ok, value = pickle.loads(reply)
        if not ok:
            raise RuntimeError(f"on {self.build} (aarch64, qemu): {value}")
        return value

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self.proc.kill()


def died(build: str, cpu: str, code: int) -> str:
    """Why an aarch64 process of ``build`` on qemu's ``-cpu cpu`` ended with ``code`` (one line)."""
    if code == -signal.SIGILL:
        return (f"the aarch64 process of {build} died of SIGILL on qemu -cpu {cpu}: the library ran an instruction "
                f"this CPU model does not have (built for -march={BUILDS[build][2]})")
    return f"the aarch64 process of {build} on qemu -cpu {cpu} died (exit code {code})"


@functools.cache
def _worker(build: str, cpu: str | None = None) -> _Worker:
    return _Worker(build, cpu)


def call(build: str, fn, *args, cpu: str | None = None):
    """``fn(*args)`` computed by the aarch64 Python of ``build`` (its libggml loaded), the result returned; ``cpu``:
    on that qemu CPU model instead of :data:`QEMU_CPU`'s (a worker of its own)."""
    require(build)
    return _worker(build, cpu).call(fn, *args)
