"""The emulated ggml-cpu paths as the vector kernels see them: one record per path (:class:`Simd`), the integer
codes the compiled functions take, and the NaN each platform's invalid operations return.

``lanes(path)`` is the float32 lane count of ``GGML_F32_VEC`` (simd-mappings.h: ``GGML_F32_EPR``): 16 AVX-512,
8 AVX2, 4 on the AArch64 NEON paths ``arm64-dotprod`` / ``arm64-i8mm`` / ``arm64-base`` — and that int is also the
*code* of the compiled vec functions (the ``lanes`` argument of :mod:`kernels.ggml.vec`, :data:`AVX512`, :data:`AVX2`,
:data:`NEON`): on the paths emulated so far it names the SIMD code uniquely. ggml's generic x86 build has no
``GGML_F32_VEC``; its silu / swiglu / soft_max take vec.h's ``__SSE2__`` branch, code :data:`SSE2` (4 lanes, no
FMA, kept apart from NEON's 4). ``arm64-sve128`` (SVE at 128 bits) has 4 lanes but its own code :data:`SVE128`
(vec.h / vec.cpp's SVE loops: :mod:`kernels.ggml.sve`), which :func:`lanes` refuses: a kernel that knows SVE reads
:func:`simd`. A path :data:`SIMD` does not list is refused by :func:`lanes` and :func:`simd` — never handed another
path's code.

NaNs: x86's invalid operations return 0xFFC00000, AArch64's (FPCR.DN = 0) 0x7FC00000; an operand NaN propagates,
quieted, on both. :func:`nan_swap` / :func:`follows_nans` turn an op computed on this x86 host into the AArch64
one where that is the only difference.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import numpy as np

from kernels.base.flags import jit
from kernels.ggml.build import EMULATED_PATHS, not_emulated

#: The codes of the compiled vec / expf functions (their ``lanes`` argument): the float32 lanes of GGML_F32_VEC,
#: which tell the SIMD code apart on the paths emulated so far, and ggml's generic x86 build's ``__SSE2__`` branch of
#: vec.h (silu / swiglu / soft_max only: 4 lanes, no FMA), kept apart from NEON's 4 lanes.
AVX512, AVX2, NEON = 16, 8, 4
SSE2 = 0x104
#: The code of the F16 vec functions (vec_dot_f16, vec_mad_f16, vec_scale_f16) on NEON *without* FP16 vector
#: arithmetic (``arm64-base``): ``GGML_F16_VEC`` is ``GGML_F32Cx4`` — halves widened to float32x4_t, float FMAs,
#: NEON's reduction (:func:`f16_code`); NEON itself means float16x8_t there.
NEON_F32C = 0x204
#: The code of ``arm64-sve128`` (``__ARM_FEATURE_SVE`` at 128 bits): 4 float lanes like NEON, but vec.h / vec.cpp's
#: SVE loops (``svcntw()``-wide, predicated tails instead of scalar ones, their own accumulators and reductions:
#: :mod:`kernels.ggml.sve`); kept apart from NEON's 4 so that no NEON code is taken for it silently.
SVE128 = 0x304
#: The code of ``arm64-sve256`` (the same SVE build on a 256-bit CPU): vec.h / vec.cpp's SVE loops at ``svcntw()`` = 8
#: float lanes (:mod:`kernels.ggml.sve`); kept apart from AVX2's 8 and from SVE128.
SVE256 = 0x504
#: The code of ``arm64-i8mm-clang`` (NEON, compiled by clang): the vec functions as :data:`NEON` — the NEON intrinsics
#: compile alike — but for the scalar in-order reductions clang's vectorizer blocks by 8 where GCC blocks by 4
#: (``ggml_vec_dot_f32``'s leftovers, ssm_conv's taps: :func:`kernels.ggml.simd.fold_left_unfused`); kept apart
#: from NEON so that no GCC reduction is taken for it silently. Its F16 and expf code is NEON's (:func:`f16_code`).
NEON_CLANG = 0x404


#: The NaN an invalid operation (inf - inf, 0·inf, 0/0, sqrt(-1), logf(-1) …) returns: x86's "real indefinite"
#: (sign set) and AArch64's default NaN (FPCR.DN = 0: a NaN *operand* still propagates, quieted, on both).
X86_NAN, ARM_NAN = 0xFFC00000, 0x7FC00000


@dataclass(frozen=True)
class Simd:
    """How ggml-cpu's shared vector code (vec.h, vec.cpp, simd-mappings.h) is built on one path."""

    key: str
    lanes: int | None  # GGML_F32_EPR; None: no GGML_SIMD (ggml's generic x86 build)
    code: int | None  # the ``lanes`` argument of kernels.ggml.vec (AVX512 / AVX2 / NEON); None without GGML_SIMD
    expf: int  # the code of silu / swiglu / soft_max (ggml_v_expf's branch; SSE2 on the generic build)
    fused: bool  # GCC contracts scalar ``a*b + c`` into one FMA (-ffp-contract=fast with FMA in the ISA)
    f16_epr: int | None  # GGML_F16_EPR: 8 on NEON with FP16 arithmetic (float16x8_t: *half* accumulators)
    f16_half: bool  # GGML_F16_VEC is float16x8_t (``__ARM_FEATURE_FP16_VECTOR_ARITHMETIC``): F16 FMAs round to half
    nan: int = 0xFFC00000  # the float32 NaN an invalid operation returns (x86's "real indefinite"; ARM_NAN on AArch64)
    # x86: GCC tuned for AMD Zen keeps a loop-carried scalar ``s += a*b`` a product and an add (kernels.ggml.tuning):
    # MXFP4's and IQ4_NL's odd last block (split_chains); the generic and Intel tunings fuse it
    split_chains: bool = False


#: Every path whose vector code is emulated, by key (checked against EMULATED_PATHS' lanes at import).
SIMD = {
    "avx512": Simd("avx512", 16, AVX512, AVX512, True, 16, False, split_chains=True),  # GCC tuned for AMD Zen
    "avx2-zen": Simd("avx2-zen", 8, AVX2, AVX2, True, 8, False, split_chains=True),  # AVX2's code, tuned for AMD Zen
    "avx2": Simd("avx2", 8, AVX2, AVX2, True, 8, False),
    "generic": Simd("generic", None, None, SSE2, False, None, False),
    # GCC 12, -march=armv8.2-a+dotprod+fp16 / armv8.6-a+…+i8mm: the same NEON code for every op here (disassembly)
    "arm64-dotprod": Simd("arm64-dotprod", 4, NEON, NEON, True, 8, True, ARM_NAN),
    "arm64-i8mm": Simd("arm64-i8mm", 4, NEON, NEON, True, 8, True, ARM_NAN),
    # GCC 12, -march=armv8-a: the same F32 NEON code; GGML_F16_VEC is GGML_F32Cx4 (float32x4_t, F16_STEP 16, EPR 4)
    "arm64-base": Simd("arm64-base", 4, NEON, NEON, True, 4, False, ARM_NAN),
    # GCC 12, -march=armv9-a+sve2+i8mm+dotprod+fp16 at a 128-bit vector length: SVE loops (code SVE128); the NEON
    # float16x8_t F16 macros stay defined (simd-mappings.h) for the code without an SVE branch
    "arm64-sve128": Simd("arm64-sve128", 4, SVE128, SVE128, True, 8, True, ARM_NAN),
    # the same GCC build at a 256-bit vector length: 8 float lanes in the SVE loops (code SVE256)
    "arm64-sve256": Simd("arm64-sve256", 8, SVE256, SVE256, True, 8, True, ARM_NAN),
    # clang 14, -march=armv8.6-a+dotprod+fp16+i8mm: the NEON code, but clang's vectorizer (NEON_CLANG) and
    # -ffp-contract=on (``fused`` is about scalar ``a*b + c`` in one expression, which clang contracts too)
    "arm64-i8mm-clang": Simd("arm64-i8mm-clang", 4, NEON_CLANG, NEON, True, 8, True, ARM_NAN),
    "arm64-dotprod-clang": Simd("arm64-dotprod-clang", 4, NEON_CLANG, NEON, True, 8, True, ARM_NAN),
    # clang 14, -march=armv8-a: arm64-base's NEON code (GGML_F16_VEC = GGML_F32Cx4) with clang's vectorizer
    "arm64-base-clang": Simd("arm64-base-clang", 4, NEON_CLANG, NEON, True, 4, False, ARM_NAN),
    # clang 14-19, -march=armv9-a+sve2+i8mm+dotprod+fp16 at 128 bits: the SVE intrinsics compile as GCC's (code SVE128);
    # clang's own choices (ssm_conv's taps, NEON kernels' contractions, Q6_K's don't-care lanes) are the ops' own
    "arm64-sve128-clang": Simd("arm64-sve128-clang", 4, SVE128, SVE128, True, 8, True, ARM_NAN),
    "arm64-sve128-clang14": Simd("arm64-sve128-clang14", 4, SVE128, SVE128, True, 8, True, ARM_NAN),
}
for _p in EMULATED_PATHS:
    assert _p.key not in SIMD or SIMD[_p.key].lanes == _p.lanes, _p.key
#: simd-mappings.h: GGML_F32_EPR of each emulated path that has GGML_F32_VEC and whose vector code is emulated
#: (SVE128's code is not its lane count: :func:`lanes` refuses it, and a caller that knows SVE reads :func:`simd`)
LANES = {p.key: p.lanes for p in EMULATED_PATHS if p.lanes and p.key in SIMD and SIMD[p.key].code == p.lanes}
PATHS = tuple(LANES)


def simd(path: str, op: str = "vec.h / vec.cpp's vector code") -> Simd:
    """The :class:`Simd` record of ``path``; :class:`kernels.ggml.build.NotEmulated` naming ``op`` for an emulated
    path whose vector code is not (none today: every AArch64 key has its record, SVE at 128 bits only)."""
    check_path(path)
    if path not in SIMD:
        raise not_emulated(op, path)
    return SIMD[path]


#: Every emulated path: ``PATHS`` and ggml's generic x86 path (a build without SIMD: docs/ggml-generic-x86.md), which
#: only the ops that emulate it accept (:func:`check_path`); :func:`lanes` refuses it (no ``GGML_F32_VEC`` there).
ALL_PATHS = tuple(p.key for p in EMULATED_PATHS)


def _nan_of(path: str, op: str = "vec.h / vec.cpp's vector code") -> int:
    """:attr:`Simd.nan` of ``path`` (read per op: one dict look-up; :func:`simd`'s checks where it is not listed)."""
    s = SIMD.get(path)
    return (s if s is not None else simd(path, op)).nan


_F32, _F16 = np.dtype(np.float32), np.dtype(np.float16)
#: up to this many values :func:`_has_nan` loops in compiled code (~0.3 µs a call: no ufunc set-up, an early exit);
#: above, ``np.minimum``'s vector reduction is the faster
NAN_LOOP_BELOW = 2048


@jit()
def _nan_in(a):
    """Whether float32 array ``a`` (C-contiguous, any shape) holds a NaN."""
    for x in a.flat:
        if x != x:
            return True
    return False


def _has_nan(a: np.ndarray) -> bool:
    """Whether float array ``a`` holds a NaN: one reduction (``np.minimum`` returns a NaN it meets), no temporary;
    a small contiguous float32 one in one compiled loop (:func:`_nan_in`, :data:`NAN_LOOP_BELOW`)."""
    if a.size <= NAN_LOOP_BELOW and a.dtype == _F32 and a.flags.c_contiguous:
        return _nan_in(a)
    if a.size == 0:
        return False
    m = np.minimum.reduce(a, axis=None)
    return bool(m != m)


def _is_float(v) -> bool:
    """``v`` is a float32 or float16 array (what :func:`nan_swap` swaps)."""
    return isinstance(v, np.ndarray) and (v.dtype == _F32 or v.dtype == _F16)


def nan_swap(path: str, a):
    """``a`` (float32 or float16) with x86's default NaN and ``path``'s swapped, bit pattern for bit pattern — the
    identity on x86. The kernels run on this (x86) host, whose invalid operations return ``X86_NAN``; on AArch64
    they return ``ARM_NAN``, and a NaN operand propagates alike on both. So an op that only adds, multiplies,
    compares and propagates NaNs computes on AArch64 ``nan_swap(op(nan_swap(inputs)))`` of what it computes
    here: a generated NaN comes out as ARM's, an input NaN of either pattern as itself (an op that drops NaN
    payloads or takes ``fabs`` of a NaN does not commute with the swap: it is not wrapped)."""
    nan = _nan_of(path)
    if nan == X86_NAN:
        return a
    a = np.asarray(a)
    return _swap(nan, a) if not _is_float(a) or _has_nan(a) else a  # no NaN (the common case): nothing to swap


def _swap(nan: int, a: np.ndarray) -> np.ndarray:
    """:func:`nan_swap` of ``a`` on a path whose default NaN is ``nan`` (not x86's)."""
    if a.dtype == _F32:
        u, p, q = a.view(np.uint32), X86_NAN, nan
    elif a.dtype == _F16:
        u, p, q = a.view(np.uint16), X86_NAN >> 16, nan >> 16
    else:
        raise TypeError(f"nan_swap: {a.dtype} array")
    is_p, is_q = u == p, u == q
    if not (is_p.any() or is_q.any()):
        return a
    u = u.copy()
    u[is_p], u[is_q] = q, p
    return u.view(a.dtype)


def follows_nans(fn):
    """Decorator: ``fn`` computed with :func:`nan_swap` around it on its ``path`` argument (its float32 / float16
    array arguments swapped, then its result); ``path`` None or an x86 path: ``fn`` itself. The arguments are
    swapped only when one of them holds a NaN (the swap is the identity on the others)."""
    names = list(inspect.signature(fn).parameters)
    at = names.index("path")  # where a positional ``path`` sits
    op = f"ggml_{fn.__name__.strip('_')}"

    def swapped(nan, v):
        return _swap(nan, v) if _is_float(v) else v

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):  # no inspect.Signature.bind per call: this runs for every element-wise op of a decode
        path = kwargs.get("path", args[at] if len(args) > at else None)
        nan = X86_NAN if path is None else _nan_of(path, op)
        if nan == X86_NAN:
            return fn(*args, **kwargs)
        if any(_is_float(v) and _has_nan(v) for v in (*args, *kwargs.values())):
            args, kwargs = tuple(swapped(nan, v) for v in args), {k: swapped(nan, v) for k, v in kwargs.items()}
        out = fn(*args, **kwargs)
        return tuple(nan_swap(path, o) for o in out) if isinstance(out, tuple) else nan_swap(path, out)

    return wrapper


def f16_code(path: str, op: str = "vec.h's F16 vector code") -> int | None:
    """The code the F16 vec functions take on ``path``: :data:`NEON_F32C` on NEON without FP16 vector arithmetic
    (``arm64-base``, ``arm64-base-clang``), :data:`NEON` on ``arm64-i8mm-clang``, else the path's :attr:`Simd.code`."""
    s = simd(path, op)
    code = NEON if s.code == NEON_CLANG else s.code  # the F16 loops are intrinsics (vfmaq_f16 …): clang's = GCC's
    return NEON_F32C if code == NEON and not s.f16_half else code


def check_path(path: str) -> str:
    """``path`` if it is one of :data:`ALL_PATHS` (an op that computes the same on every path, generic included)."""
    if path not in ALL_PATHS:
        raise ValueError(f"unknown ggml-cpu path {path!r} (expected one of {ALL_PATHS})")
    return path


def lanes(path: str) -> int:
    """float32 lanes of ``GGML_F32_VEC`` on ``path`` (16: ``__AVX512F__``, 8: ``__AVX2__``, 4: AArch64 NEON) — also
    the code of the compiled vec functions (:data:`NEON` …); checks the path."""
    if path not in LANES:
        if path in SIMD:  # SVE128, NEON_CLANG: 4 lanes whose code is not 4 — never handed NEON's code
            raise ValueError(f"ggml-cpu path {path!r}: its vec code is not its lane count; read simd(path).code")
        if path in ALL_PATHS and path != "generic":
            raise not_emulated("GGML_F32_VEC's kernels", path)
        raise ValueError(f"ggml-cpu path {path!r} has no emulated GGML_F32_VEC (expected one of {PATHS})")
    return LANES[path]


