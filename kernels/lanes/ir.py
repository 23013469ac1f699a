"""LLVM IR for the row-lane kernels (:mod:`kernels.lanes.pack`): the shared constants, the instruction-set
levels, the vocabulary of vectors of weight-row lanes, and the factories that turn a type's block
emitter (:mod:`kernels.lanes.blocks`, :mod:`kernels.lanes.blocks_iq`) into numba intrinsics.

Why IR, and what the kernels compute: the docstring of :mod:`kernels.lanes.pack`.

Instruction-set levels (``isa``, a compile-time literal of every lane kernel, so numba caches each
level's code apart). ``ISA_GENERIC`` emits target-independent IR only (``llvm.masked.gather``,
``llvm.fma``, plain vector arithmetic): correct on every CPU LLVM targets (ARM64 NEON included),
vectors of 8 lanes. ``ISA_AVX2`` adds one x86 intrinsic, ``vpshufb`` (16-entry byte tables: MXFP4's
and IQ4's values, four per lane at once), vectors of 8 lanes (16 ymm registers: 8 float64 lanes are
2 ymm), or all 16 for a single activation row (``vector_lanes``). ``ISA_AVX512`` uses 16-lane vectors
(32 zmm registers), the 512-bit ``vpshufb`` and ``vcvtqq2pd``.
The level is the best the numba target has (``NUMBA_CPU_NAME`` / ``NUMBA_CPU_FEATURES``, else the
host), capped by ``flags.KERNEL_ISA``; every level gives the same bits (tests/test_kernels_lanes.py
compares each level the host can run with ``ISA_GENERIC``).
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from kernels.base.blocks import QT
from kernels.plain.dequant import (_BF16, _F16, _F32, _IQ1_M, _IQ1_S, _IQ2_S, _IQ2_XS, _IQ2_XXS, _IQ3_S, _IQ3_XXS, _IQ4_NL, _IQ4_XS,  # noqa: F401
                      _MXFP4, _Q2_K, _Q3_K, _Q4_0, _Q4_1, _Q4_K, _Q5_0, _Q5_1, _Q5_K, _Q6_K, _Q8_0, _TQ1_0, _TQ2_0)
from kernels.base.flags import KERNEL_ISA

LANES = 16  # weight rows per group: the packed layout's width, one float64 sum each
MAX_T = 4  # activation rows per pass (4 accumulators per vector of lanes)
SPAN = 256  # the wide path: columns decoded into a float64 buffer per pass
#: T from which the lane kernels take the wide path (each block decoded once for all T rows) instead of
#: decoding it once per MAX_T rows: at T = 5 … 8 decoding twice measured as fast or faster (packed Q8_0).
WIDE_FROM = 9
PREFETCH_BYTES = 2048  # packed kernels: prefetch the block(s) at least this far ahead of the current one

ISA_GENERIC, ISA_AVX2, ISA_AVX512 = 0, 1, 2
ISA_NAMES = ("generic", "avx2", "avx512")


def _target_isa() -> int:
    """The best level the CPU numba compiles for has (its feature string, as numba's codegen takes it)."""
    feats = numba.config.CPU_FEATURES
    if feats is None:
        feats = llvm_binding.get_host_cpu_features().flatten()
    have = {f[1:] for f in feats.split(",") if f.startswith("+")}
    if {"avx512f", "avx512dq", "avx512bw", "avx512vl", "fma", "f16c"} <= have:
        return ISA_AVX512
    if {"avx2", "fma", "f16c"} <= have:
        return ISA_AVX2
    return ISA_GENERIC


TARGET_ISA = _target_isa()
if KERNEL_ISA not in ("auto", *ISA_NAMES):
    raise ValueError(f"REFIMPL_KERNEL_ISA must be auto, {', '.join(ISA_NAMES)}; got {KERNEL_ISA!r}")
#: The level the lane kernels are built for by default.
ISA = TARGET_ISA if KERNEL_ISA == "auto" else min(TARGET_ISA, ISA_NAMES.index(KERNEL_ISA))


def vector_lanes(isa: int, nt: int = 0) -> int:
    """Lanes per IR vector at level ``isa`` for ``nt`` activation rows (0: decoding into a buffer): a group
    of LANES rows is computed in LANES // that passes. At ``ISA_AVX2`` a single row (nt = 1, a decoded
    token) takes all 16 lanes in one pass too: each lane's sum is a chain of dependent fmas (4 cycles
    each), so the pass's speed is bound by how many chains run side by side — 4 ymm of 4 lanes instead of
    2 — while more rows (4 accumulators each) would not fit in AVX2's 16 registers."""
    return 16 if isa == ISA_AVX512 or (isa == ISA_AVX2 and nt == 1) else 8


#: Bytes and values of one "block" as the lane kernels walk a row (F32/F16/BF16: 16 values).
TYPE_SIZE = {_F32: 64, _F16: 32, _BF16: 32, _Q8_0: 34, _Q4_0: 18, _Q4_1: 20, _Q5_0: 22, _Q5_1: 24, _MXFP4: 17,
             _IQ4_NL: 18, _Q2_K: 84, _Q3_K: 110, _Q4_K: 144, _Q5_K: 176, _Q6_K: 210, _IQ4_XS: 136,
             _IQ2_XXS: 66, _IQ2_XS: 74, _IQ2_S: 82, _IQ3_XXS: 98, _IQ3_S: 110, _IQ1_S: 50, _IQ1_M: 56,
             _TQ1_0: 54, _TQ2_0: 66}
BLOCK = {k: (16 if k in (_F32, _F16, _BF16) else 32 if TYPE_SIZE[k] <= 34 else 256) for k in TYPE_SIZE}
LANE_TYPES = tuple(QT(k) for k in TYPE_SIZE)


def _every4(start: int, stop: int) -> tuple:
    return tuple(range(start, stop, 4))


#: The byte offsets, within a block, of the 32-bit words each type's emitter reads (every word lies
#: inside the block: a 2-byte field at the end is read as the high half of the word before it).
#: They are the *slots* of the packed layout (:func:`kernels.lanes.pack.pack`).
SLOTS = {
    _F32: _every4(0, 64), _F16: _every4(0, 32), _BF16: _every4(0, 32),
    _Q8_0: (0, *_every4(2, 34)),  # d (+ qs[0:2]); qs
    _Q4_0: (0, *_every4(2, 18)), _IQ4_NL: (0, *_every4(2, 18)),  # d; qs
    _Q4_1: _every4(0, 20),  # d, m; qs
    _Q5_0: (0, *_every4(2, 22)),  # d; qh; qs
    _Q5_1: _every4(0, 24),  # d, m; qh; qs
    _MXFP4: (0, *_every4(1, 17)),  # e (+ qs[0:3]); qs
    _Q2_K: _every4(0, 84),  # scales; qs; d, dmin
    _Q3_K: (*_every4(0, 108), 106),  # hmask; qs; scales; (scales[10:12]) d
    _Q4_K: _every4(0, 144),  # d, dmin; scales; qs
    _Q5_K: _every4(0, 176),  # d, dmin; scales; qh; qs
    _IQ4_XS: _every4(0, 136),  # d, scales_h; scales_l; qs
    _IQ2_XXS: (0, *_every4(2, 66)),  # d; 8 x (4 grid indices, signs and scale)
    _IQ2_XS: (0, *_every4(2, 74)),  # d; qs; scales
    _IQ2_S: (0, *_every4(2, 82)),  # d; qs; signs; qh; scales
    _IQ3_XXS: (0, *_every4(2, 98)),  # d; qs; scales and signs
    _IQ3_S: (0, *_every4(2, 110)),  # d; qs; qh; signs; scales
    _IQ1_S: (0, *_every4(2, 50)),  # d; qs; qh
    _IQ1_M: _every4(0, 56),  # qs; qh; scales (and d)
    _TQ1_0: (*_every4(0, 52), 50),  # qs; qh; (qh[2:4]) d
    _TQ2_0: (*_every4(0, 64), 62),  # qs; (qs[62:64]) d
}
#: Q8_0 and Q6_K are packed differently: their codes as int8, column by column (the LANES rows'
#: codes of column k are bytes k·LANES … k·LANES + LANES − 1 of the block), so their kernels load a
#: column with one vector load and form the weights in float64 (lanes_blocks ``_emit_*_codes``).
#: Q8_0: 8 slots of the 32 codes, 1 slot of d as float32 bits. Q6_K (whose 6-bit codes also cost
#: more to assemble than to store): 64 slots of the 256 codes q − 32, 4 slots of the 16 int8 scales,
#: 1 slot of d as float32 bits.
CODE_SLOTS = {_Q8_0: 9, _Q6_K: 69}
assert all(0 <= o and o + 4 <= TYPE_SIZE[k] for k, slots in SLOTS.items() for o in slots)

# --------------------------------------------------------------------------------------------
# LLVM IR vocabulary: vectors of weight-row lanes

_i1, _i8, _i16, _i32, _i64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_f16, _f32, _f64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()


def _half(b, v, h: int):
    """Lanes 8h … 8h + 7 of the 16-lane vector ``v``."""
    return b.shuffle_vector(v, v, ir.Constant(ir.VectorType(_i32, 8), list(range(8 * h, 8 * h + 8))))


def _concat(b, halves: list, n: int):
    """Two n-lane vectors as one of 2n lanes."""
    return b.shuffle_vector(halves[0], halves[1], ir.Constant(ir.VectorType(_i32, 2 * n), list(range(2 * n))))


class _Emit:
    """Helpers that emit IR for one block of ``n`` rows (lanes ``lane0 … lane0 + n − 1`` of a group;
    ``b``: the IR builder; ``base`` (IR i64) + ``offsets`` (<n x i32>): the address of this block's
    first byte in each row; ``isa``: the instruction-set level)."""

    def __init__(self, b, n: int, isa: int, base=None, offsets=None):
        self.b, self.n, self.isa, self.base, self.offsets = b, n, isa, base, offsets

    def vec(self, t):
        return ir.VectorType(t, self.n)

    def const(self, value, t=_i32):
        return ir.Constant(self.vec(t), [value] * self.n)

    def const64(self, value: int):
        return ir.Constant(_i64, value)

    def splat(self, x, t):
        v = self.b.insert_element(ir.Constant(self.vec(t), ir.Undefined), x, ir.Constant(_i32, 0))
        return self.b.shuffle_vector(v, ir.Constant(self.vec(t), ir.Undefined), ir.Constant(self.vec(_i32), [0] * self.n))

    def gather32(self, base, offsets):
        """<lanes x i32>: the 4-byte words at byte ``base`` (an IR i64 address) + ``offsets`` (<lanes x i32>)
        of each lane. ``llvm.masked.gather``; at ``ISA_AVX2`` the x86 ``vpgatherdd`` itself, since LLVM
        turns a generic gather into scalar loads for CPUs whose gathers it deems slow (Haswell, AMD Zen),
        where the instruction still measured faster than the scalar loads."""
        b, n = self.b, self.n
        if self.isa == ISA_AVX2 and n == 16:  # two vpgatherdd of 8 lanes
            return _concat(b, [_Emit(b, 8, self.isa).gather32(base, _half(b, offsets, h)) for h in (0, 1)], 8)
        if self.isa == ISA_AVX2 and n == 8:
            fnty = ir.FunctionType(self.vec(_i32), [self.vec(_i32), _i8.as_pointer(), self.vec(_i32), self.vec(_i32), _i8])
            fn = cgutils.get_or_insert_function(b.module, fnty, "llvm.x86.avx2.gather.d.d.256")
            return b.call(fn, [ir.Constant(self.vec(_i32), ir.Undefined), b.inttoptr(base, _i8.as_pointer()), offsets,
                               self.const(-1), ir.Constant(_i8, 1)])
        ptrs = b.inttoptr(b.add(self.splat(base, _i64), b.sext(offsets, self.vec(_i64))), ir.VectorType(_i32.as_pointer(), n))
        fnty = ir.FunctionType(self.vec(_i32), [ptrs.type, _i32, self.vec(_i1), self.vec(_i32)])
        gather = cgutils.get_or_insert_function(b.module, fnty, f"llvm.masked.gather.v{n}i32.v{n}p0")
        return b.call(gather, [ptrs, ir.Constant(_i32, 1), ir.Constant(self.vec(_i1), [1] * n), ir.Constant(self.vec(_i32), ir.Undefined)])

    def dwords(self, offset: int, n: int = 1, dyn=None) -> list:
        """n × <lanes x i32>: the little-endian 4-byte words at ``offset``, ``offset + 4``, … in this
        block of every row (one gather each: one 32-bit load per lane); ``dyn`` (an IR i64, a
        multiple of 4) is added to the offset at run time (inside a ``_Loop``)."""
        b = self.b
        base = self.base if dyn is None else b.add(self.base, dyn)
        return [self.gather32(b.add(base, ir.Constant(_i64, o)), self.offsets) for o in range(offset, offset + 4 * n, 4)]

    def table(self, values: list):
        """Spill ``values`` (vectors of one type) to a stack table, for ``pick`` inside a ``_Loop``."""
        t = values[0].type
        ptr = cgutils.alloca_once(self.b, ir.ArrayType(t, len(values)))
        for i, v in enumerate(values):
            self.b.store(v, self.b.gep(ptr, [ir.Constant(_i32, 0), ir.Constant(_i32, i)]))
        return ptr

    def pick(self, table, index):
        """table[index] for an IR i64 index."""
        return self.b.load(self.b.gep(table, [ir.Constant(_i32, 0), index]))

    def byte(self, dw, k: int):
        """Unsigned byte k (0..3) of each lane's dword."""
        return self.b.and_(self.b.lshr(dw, self.const(8 * k)), self.const(0xFF)) if k < 3 else self.b.lshr(dw, self.const(24))

    def sbyte(self, dw, k: int):
        """Signed byte k (0..3) of each lane's dword (int8 sign-extended)."""
        return self.b.ashr(self.b.shl(dw, self.const(24 - 8 * k)), self.const(24))

    def bits(self, dw, shift, width: int):
        """``(dw >> shift) & (2**width − 1)``; ``shift`` an int or an IR i32 (the same for every lane)."""
        b = self.b
        if not isinstance(shift, int):
            s = b.lshr(dw, self.splat(shift, _i32))
        else:
            s = b.lshr(dw, self.const(shift)) if shift else dw
            if shift + width >= 32:
                return s
        return b.and_(s, self.const((1 << width) - 1))

    def f16(self, dw, high: bool):
        """The binary16 in the low (or high) half of each dword, as float32: exact, and NaN becomes
        ±the canonical NaN, as ``floats.f16_bits_to_f32`` (and so ``dequant``) does."""
        b = self.b
        bits = b.lshr(dw, self.const(16)) if high else b.and_(dw, self.const(0xFFFF))
        v = b.fpext(b.bitcast(b.trunc(bits, self.vec(_i16)), self.vec(_f16)), self.vec(_f32))
        nan = b.or_(self.const(0x7FC00000), b.shl(b.and_(bits, self.const(0x8000)), self.const(16)))
        return b.select(b.fcmp_unordered("uno", v, v), b.bitcast(nan, self.vec(_f32)), v)

    def i2f(self, q):
        """int32 lanes → float32 (exact for the small integers the decoders form)."""
        return self.b.sitofp(q, self.vec(_f32))

    u2f = s2f = i2f

    def fma32(self, a, b_, c):
        """``a·b + c`` rounded once (``llvm.fma``). Used only where ``a·b`` is exact in float32, so it
        equals the row decoder's ``fsub``/``fadd`` of the rounded product (the docstrings say why)."""
        fnty = ir.FunctionType(self.vec(_f32), [self.vec(_f32)] * 3)
        fn = cgutils.get_or_insert_function(self.b.module, fnty, f"llvm.fma.v{self.n}f32")
        return self.b.call(fn, [a, b_, c])

    def all_finite(self, w):
        """IR i1: every lane of the float32 lanes ``w`` is finite (its exponent is not all ones)."""
        b = self.b
        exponent = b.and_(b.bitcast(w, self.vec(_i32)), self.const(0x7F800000))
        return self.all_lanes(b.icmp_unsigned("!=", exponent, self.const(0x7F800000)))

    def all_lanes(self, cond):
        """IR i1: ``cond`` (<lanes x i1>) holds in every lane."""
        b = self.b
        return b.icmp_unsigned("==", b.bitcast(cond, ir.IntType(self.n)), ir.Constant(ir.IntType(self.n), (1 << self.n) - 1))

    def negate_if(self, w, bit):
        """``w`` with its sign flipped in the lanes where ``bit`` (0/1 int32 lanes) is 1: the row decoder's
        ``w · (−1.0)`` (``dequant_iq.SIGN_F32``), which is exactly a sign flip."""
        b = self.b
        flipped = b.xor(b.bitcast(w, self.vec(_i32)), b.shl(bit, self.const(31)))
        return b.bitcast(flipped, self.vec(_f32))

    def global_words(self, name: str, words: np.ndarray):
        """An i32* to a module constant holding ``words`` (uint32), created once per module."""
        module = self.b.module
        gv = module.globals.get(name)
        if gv is None:
            arr_t = ir.ArrayType(_i32, len(words))
            gv = ir.GlobalVariable(module, arr_t, name)
            gv.linkage, gv.global_constant = "internal", True
            gv.initializer = ir.Constant(arr_t, [int(v) for v in words])
        return self.b.bitcast(gv, _i32.as_pointer())

    def table_words(self, name: str, words: np.ndarray, index):
        """<lanes x i32>: ``words[index]`` per lane (a gather from the constant table ``name``)."""
        b = self.b
        return self.gather32(b.ptrtoint(self.global_words(name, words), _i64), b.shl(index, self.const(2)))

    def lookup16(self, name: str, values, code):
        """<lanes x float> ``values[code & 15]`` for a 16-entry float table: one ``vpermps`` of 16 entries
        at ``ISA_AVX512`` (it reads the low 4 bits of ``code`` only), else a gather from a constant table
        (``code`` must then be < 16; AVX2 looks four values up at once instead: ``byte_table16``)."""
        b = self.b
        if self.isa == ISA_AVX512 and self.n == 16:
            fnty = ir.FunctionType(self.vec(_f32), [self.vec(_f32), self.vec(_i32)])
            fn = cgutils.get_or_insert_function(b.module, fnty, "llvm.x86.avx512.permvar.sf.512")
            return b.call(fn, [ir.Constant(self.vec(_f32), [float(v) for v in values]), code])
        words = np.array(values, dtype=np.float32).view(np.uint32)
        return b.bitcast(self.table_words(name, words, code), self.vec(_f32))

    def byte_table16(self, values, nibbles):
        """<lanes x i32> whose every byte is ``values[n]`` (an int8 table of 16) for the byte ``n`` (0..15)
        at the same place in ``nibbles``: one ``vpshufb`` for four bytes per lane (x86: AVX2, or
        AVX-512BW for 16 lanes; the callers' generic twin looks the values up one at a time)."""
        b = self.b
        nbytes = 4 * self.n
        if self.isa == ISA_AVX2 and nbytes == 64:  # two 256-bit vpshufb
            halves = [_Emit(b, 8, self.isa).byte_table16(values, _half(b, nibbles, h)) for h in (0, 1)]
            return _concat(b, halves, 8)
        vt = ir.VectorType(_i8, nbytes)
        assert self.isa >= ISA_AVX2 and nbytes in (32, 64)
        name = "llvm.x86.avx512.pshuf.b.512" if nbytes == 64 else "llvm.x86.avx2.pshuf.b"
        fn = cgutils.get_or_insert_function(b.module, ir.FunctionType(vt, [vt, vt]), name)
        table = ir.Constant(vt, [int(v) for v in values] * (nbytes // 16))
        return b.bitcast(b.call(fn, [table, b.bitcast(nibbles, vt)]), self.vec(_i32))


class _PackedEmit(_Emit):
    """The same helpers over a packed block (:func:`pack`): the words of all LANES rows at one byte
    offset are stored side by side, so ``dwords`` is a plain vector load instead of a gather."""

    def __init__(self, b, n, isa, block_ptr, lane0, slots):
        super().__init__(b, n, isa)
        self.block_ptr = block_ptr  # i32*: this group's packed block, [slot][LANES]
        self.lane0 = lane0  # IR i64: the first lane of this pass
        self.slot = {o: i for i, o in enumerate(slots)}

    def words(self, slot: int, n: int = 1, dyn=None) -> list:
        """n × <lanes x i32>: packed slots ``slot`` … ``slot + n − 1`` (plus ``dyn``, an IR i64)."""
        b = self.b
        base = b.gep(self.block_ptr, [self.lane0])
        base = base if dyn is None else b.gep(base, [b.mul(dyn, ir.Constant(_i64, LANES))])
        return [b.load(b.bitcast(b.gep(base, [ir.Constant(_i64, s * LANES)]), self.vec(_i32).as_pointer()), align=4)
                for s in range(slot, slot + n)]

    def dwords(self, offset: int, n: int = 1, dyn=None) -> list:
        """As ``_Emit.dwords``; with a run-time ``dyn`` the slots from ``offset`` on must be every 4 bytes."""
        if dyn is not None:
            first = self.slot[offset]
            assert all(self.slot.get(o) == first + (o - offset) // 4 for o in range(offset, offset + 4 * n, 4)), "dyn needs linear slots"
            return self.words(first, n, dyn=self.b.udiv(dyn, ir.Constant(_i64, 4)))
        return [self.words(self.slot[o])[0] for o in range(offset, offset + 4 * n, 4)]

    def codes(self, index):
        """<lanes x i8>: byte ``index`` (an IR i64) of this block's lanes in the column-major code layout
        (``CODE_SLOTS``: the LANES codes of column k at bytes k·LANES …)."""
        b = self.b
        base = b.gep(b.bitcast(self.block_ptr, _i8.as_pointer()), [self.lane0])
        return b.load(b.bitcast(b.gep(base, [b.mul(index, ir.Constant(_i64, LANES))]), self.vec(_i8).as_pointer()), align=1)


def _prefetch(b, ptr, ahead: int, nbytes: int, locality: int = 3) -> None:
    """Software-prefetch the ``nbytes`` that lie ``ahead`` bytes past ``ptr`` (a later block of the group,
    read a few blocks from now), one cache line at a time, into the level ``locality`` says (3: L1,
    ``prefetcht0``; 2: L2, ``prefetcht1``). The hardware prefetcher alone left the packed Q8_0 kernel at ~65 %
    of one core's read bandwidth; this made it ~37 % faster."""
    fnty = ir.FunctionType(ir.VoidType(), [_i8.as_pointer(), _i32, _i32, _i32])
    fn = cgutils.get_or_insert_function(b.module, fnty, "llvm.prefetch.p0")
    base = b.bitcast(ptr, _i8.as_pointer())
    for line in range(0, nbytes, 64):
        b.call(fn, [b.gep(base, [ir.Constant(_i64, ahead + line)]), ir.Constant(_i32, 0), ir.Constant(_i32, locality),
                    ir.Constant(_i32, 1)])


class _Loop:
    """An emitter item: ``n`` iterations of ``body(e, it)`` (``it`` an IR i64, 0 … n−1), each
    covering ``step`` consecutive k, yielding (k within the iteration, weights). Emitted as an IR
    loop, so a 256-value super-block compiles to a loop of 32 or 64 values instead of 256 unrolled
    ones: as fast (measured) and half the compile time."""

    def __init__(self, n: int, step: int, body):
        self.n, self.step, self.body = n, step, body


class _Choice:
    """An emitter item: the items ``fast`` where ``cond`` (an IR i1, computed once per block) holds at
    run time, else the items ``slow`` — two ways to the same weights, the fast one valid only under
    ``cond`` (``kernels.lanes.exact64._scaled_codes``). The two are emitted as two branches and their
    states joined; pass generators, so each branch's IR is emitted inside it."""

    def __init__(self, cond, fast, slow):
        self.cond, self.fast, self.slow = cond, fast, slow


def _ir_loop(b, n, state: list, body):
    """Emit ``for it in range(n): state = body(it, state)`` (n an int or IR i64); return the final state.
    ``state``: IR values carried through the loop (phis)."""
    pre = b.block
    head, blk, done = b.append_basic_block("lanes.loop"), b.append_basic_block("lanes.body"), b.append_basic_block("lanes.done")
    b.branch(head)
    b.position_at_end(head)
    it = b.phi(_i64)
    it.add_incoming(ir.Constant(_i64, 0), pre)
    phis = []
    for v in state:
        phis.append(b.phi(v.type))
        phis[-1].add_incoming(v, pre)
    limit = n if not isinstance(n, int) else ir.Constant(_i64, n)
    b.cbranch(b.icmp_signed("<", it, limit), blk, done)
    b.position_at_end(blk)
    out = body(it, list(phis))
    nxt = b.add(it, ir.Constant(_i64, 1))
    latch = b.block
    b.branch(head)
    it.add_incoming(nxt, latch)
    for phi, v in zip(phis, out):
        phi.add_incoming(v, latch)
    b.position_at_end(done)
    return list(phis)


def _run_items(e: _Emit, items, k0, consume, state: list) -> list:
    """Feed an emitter's (j, weights) items, in order, to ``consume(kbase, j, w, state) -> state``;
    ``kbase``: IR i64, the k within the block of the current iteration's first value."""
    b = e.b
    for item in items:
        if isinstance(item, _Choice):
            fast, slow, join = (b.append_basic_block(f"lanes.{name}") for name in ("fast", "slow", "join"))
            b.cbranch(item.cond, fast, slow)
            ends = []
            for block, branch in ((fast, item.fast), (slow, item.slow)):
                b.position_at_end(block)
                ends.append((_run_items(e, branch, k0, consume, state), b.block))
                b.branch(join)
            b.position_at_end(join)
            merged = []
            for i, v in enumerate(state):
                phi = b.phi(v.type)
                for st, block in ends:
                    phi.add_incoming(st[i], block)
                merged.append(phi)
            state = merged
            continue
        if not isinstance(item, _Loop):
            state = consume(k0, item[0], item[1], state)
            continue

        def body(it, st, item=item):
            kbase = b.add(k0, b.mul(it, ir.Constant(_i64, item.step)))
            for j, w in item.body(e, it):
                st = consume(kbase, j, w, st)
            return st

        state = _ir_loop(b, item.n, state, body)
    return state


def _over_halves(b, n: int, body) -> None:
    """``body(lane0)`` for lane0 = 0, n, … < LANES (an IR i64); an IR loop when there are several."""
    if n == LANES:
        body(ir.Constant(_i64, 0))
    else:
        _ir_loop(b, LANES // n, [], lambda it, st: (body(b.mul(it, ir.Constant(_i64, n))), [])[1])


def _fma(b, n):
    fnty = ir.FunctionType(ir.VectorType(_f64, n), [ir.VectorType(_f64, n)] * 3)
    return cgutils.get_or_insert_function(b.module, fnty, f"llvm.fma.v{n}f64")


def _widen(e: _Emit, w):
    """float32 lanes → float64 (exact); float64 lanes unchanged."""
    return w if w.type == e.vec(_f64) else e.b.fpext(w, e.vec(_f64))


# --------------------------------------------------------------------------------------------
# The intrinsics: one block of LANES rows accumulated, or decoded into a buffer


def _block_kernel(name: str, emitters: dict, packed: bool = False, decode: bool = False):
    """An intrinsic for block ``blk`` of the LANES rows of a group, of type ``kind``, whose weights
    ``emitters[kind]`` emits (``kind``, ``isa``, ``nt``: compile-time literals):

    ``kernel(kind, isa, acc, w, row0, blk, x, nt)``:
        for t < nt, i < LANES, j < block (in that order of j):
            acc[t, i] += float64(W[row0 + i, block·blk + j]) * x[t, block·blk + j]   (fma, exact product)
        acc float64 [MAX_T, LANES]; x float64 [nt, K].
    ``decode=True`` — ``kernel(kind, isa, buf, w, row0, blk, col)``:
        buf[col + j, i] = float64(W[row0 + i, block·blk + j]) for j < block; buf float64 [SPAN, LANES].

    w uint8 [N, row bytes] (C-contiguous); with ``packed``, :func:`pack`'s uint32
    [groups, blocks, slots, LANES] and ``row0`` the group index.
    """

    def kernel(typingctx, kind, isa, out, w, row0, blk, x_or_col, *nt):
        literals = (kind, isa) + (() if decode else nt)
        if not all(isinstance(v, types.IntegerLiteral) for v in literals):
            return None  # numba retries with the literal values
        if kind.literal_value not in emitters:
            return None
        k, level = kind.literal_value, isa.literal_value
        emit = emitters[k]
        n = vector_lanes(level, 0 if decode else nt[0].literal_value)
        type_size = TYPE_SIZE[k]
        slots = SLOTS.get(k, ())
        n_slots = CODE_SLOTS[k] if packed and k in CODE_SLOTS else len(slots)
        NT = 0 if decode else nt[0].literal_value
        sig = types.void(kind, isa, out, w, row0, blk, x_or_col, *nt)

        def codegen(context, builder, signature, args):
            b = builder
            out_a, w_a = (context.make_array(signature.args[i])(context, b, args[i]) for i in (2, 3))
            row0_v, blk_v = args[4], args[5]
            out_ptr = b.bitcast(out_a.data, _f64.as_pointer())
            if packed:  # w[group, blk] holds the block's words: [slot][lane]
                n_blocks = b.extract_value(w_a.shape, 1)
                first = b.mul(b.add(b.mul(row0_v, n_blocks), blk_v), ir.Constant(_i64, n_slots * LANES))
                group_block = b.gep(b.bitcast(w_a.data, _i32.as_pointer()), [first])
                block_bytes = 4 * n_slots * LANES
                _prefetch(b, group_block, -(-PREFETCH_BYTES // block_bytes) * block_bytes, block_bytes)
            else:  # the address of this block in row row0 (lane i: + i·row_stride)
                row_stride = b.extract_value(w_a.strides, 0)
                first = b.add(b.ptrtoint(w_a.data, _i64), b.add(b.mul(row0_v, row_stride), b.mul(blk_v, ir.Constant(_i64, type_size))))
            if decode:
                col = args[6]
            else:
                x_a = context.make_array(signature.args[6])(context, b, args[6])
                K = b.extract_value(x_a.shape, 1)
            k0 = b.mul(blk_v, ir.Constant(_i64, BLOCK[k]))

            def half(lane0):
                if packed:
                    e = _PackedEmit(b, n, level, group_block, lane0, slots)
                else:
                    e = _Emit(b, n, level, base=first)
                    lane = b.add(e.splat(b.trunc(lane0, _i32), _i32), ir.Constant(e.vec(_i32), list(range(n))))
                    e.offsets = b.mul(lane, e.splat(b.trunc(row_stride, _i32), _i32))  # < 2^31: lanes.matmul_lanes
                vptr = e.vec(_f64).as_pointer()

                if decode:
                    def consume(kbase, j, w, st):
                        row = b.add(b.add(col, b.sub(kbase, k0)), ir.Constant(_i64, j))
                        b.store(_widen(e, w), b.bitcast(b.gep(out_ptr, [b.add(b.mul(row, ir.Constant(_i64, LANES)), lane0)]), vptr), align=8)
                        return st

                    _run_items(e, emit(e), k0, consume, [])
                    return
                fma = _fma(b, n)
                acc_ptrs = [b.bitcast(b.gep(out_ptr, [b.add(ir.Constant(_i64, t * LANES), lane0)]), vptr) for t in range(NT)]
                accs = [b.load(p, align=8) for p in acc_ptrs]

                def consume(kbase, j, w, accs):
                    w64 = _widen(e, w)
                    out = []
                    for t in range(NT):
                        xi = b.add(b.mul(ir.Constant(_i64, t), K), b.add(kbase, ir.Constant(_i64, j)))
                        out.append(b.call(fma, [w64, e.splat(b.load(b.gep(x_a.data, [xi])), _f64), accs[t]]))
                    return out

                for p, a in zip(acc_ptrs, _run_items(e, emit(e), k0, consume, accs)):
                    b.store(a, p, align=8)

            _over_halves(b, n, half)
            return context.get_dummy_value()

        return sig, codegen

    if decode:
        def kernel_d(typingctx, kind, isa, buf, w, row0, blk, col):
            return kernel(typingctx, kind, isa, buf, w, row0, blk, col)
        fn = kernel_d
    else:
        def kernel_a(typingctx, kind, isa, acc, w, row0, blk, x, nt):
            return kernel(typingctx, kind, isa, acc, w, row0, blk, x, nt)
        fn = kernel_a
    fn.__name__ = fn.__qualname__ = name
    return intrinsic(fn)


@intrinsic
def fma_cols(typingctx, isa, acc, buf, x, t0, nt, k0, ncols):
    """``acc[t0 + t, i] += buf[j, i] * x[t0 + t, k0 + j]`` for t < nt, i < LANES, j < ncols (in that order
    of j; fma of an exact product): the wide path's accumulation from a decoded buffer.
    acc float64 [T, LANES], buf float64 [SPAN, LANES], x float64 [T, K]; ``isa``, ``nt`` literals."""
    if not isinstance(isa, types.IntegerLiteral) or not isinstance(nt, types.IntegerLiteral):
        return None
    n, NT = vector_lanes(isa.literal_value), nt.literal_value
    sig = types.void(isa, acc, buf, x, t0, nt, k0, ncols)

    def codegen(context, b, signature, args):
        acc_a, buf_a, x_a = (context.make_array(signature.args[i])(context, b, args[i]) for i in (1, 2, 3))
        t0_v, k0_v, ncols_v = args[4], args[6], args[7]
        K = b.extract_value(x_a.shape, 1)
        vec = ir.VectorType(_f64, n)
        e = _Emit(b, n, isa.literal_value)
        fma = _fma(b, n)

        def half(lane0):
            acc_ptrs = [b.bitcast(b.gep(acc_a.data, [b.add(b.mul(b.add(t0_v, ir.Constant(_i64, t)), ir.Constant(_i64, LANES)), lane0)]),
                                  vec.as_pointer()) for t in range(NT)]
            x_rows = [b.gep(x_a.data, [b.add(b.mul(b.add(t0_v, ir.Constant(_i64, t)), K), k0_v)]) for t in range(NT)]

            def body(j, accs):
                w = b.load(b.bitcast(b.gep(buf_a.data, [b.add(b.mul(j, ir.Constant(_i64, LANES)), lane0)]), vec.as_pointer()), align=8)
                return [b.call(fma, [w, e.splat(b.load(b.gep(x_rows[t], [j])), _f64), accs[t]]) for t in range(NT)]

            for p, a in zip(acc_ptrs, _ir_loop(b, ncols_v, [b.load(p, align=8) for p in acc_ptrs], body)):
                b.store(a, p, align=8)

        _over_halves(b, n, half)
        return context.get_dummy_value()

    return sig, codegen
