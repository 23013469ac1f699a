"""LLVM IR for the row-lane kernels (:mod:`kernels.lanes`): the shared constants, the vocabulary of
vectors of ``LANES`` values (one per weight row), and the factory that turns a type's block emitter
(:mod:`kernels.lanes_blocks`) into a numba intrinsic accumulating one block of ``LANES`` rows.

Why IR, and what the kernels compute: the docstring of :mod:`kernels.lanes`.
"""

from __future__ import annotations

import numba
from llvmlite import binding as llvm_binding
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.extending import intrinsic

from .blocks import QT

LANES = 16  # weight rows per group: one float64 accumulator each (2 zmm per activation row)
MAX_T = 4  # activation rows per pass (4 x 4 accumulator registers)
#: MXFP4's 16-entry value table as one ``vpermps`` (an x86 AVX-512 intrinsic) when numba compiles
#: for this host and it has AVX-512F; numba's cache is keyed by the CPU, so the choice is per machine.
_PERMVAR = LANES == 16 and numba.config.CPU_NAME in (None, "host") and bool(llvm_binding.get_host_cpu_features().get("avx512f"))
#: int8 → float64 as ``vcvtqq2pd`` (AVX-512DQ) in the packed Q6_K kernel (``_int8_to_f64``); per machine, like ``_PERMVAR``.
_CVTQQ2PD = LANES % 8 == 0 and numba.config.CPU_NAME in (None, "host") and bool(llvm_binding.get_host_cpu_features().get("avx512dq"))
PREFETCH_BYTES = 2048  # packed kernels: prefetch the block(s) at least this far ahead of the current one

_F32, _Q8_0, _MXFP4, _Q4_K, _Q6_K = int(QT.F32), int(QT.Q8_0), int(QT.MXFP4), int(QT.Q4_K), int(QT.Q6_K)
LANE_TYPES = (QT.F32, QT.Q8_0, QT.MXFP4, QT.Q4_K, QT.Q6_K)
TYPE_SIZE = {_F32: 64, _Q8_0: 34, _MXFP4: 17, _Q4_K: 144, _Q6_K: 210}  # F32: a "block" of 16 values
BLOCK = {_F32: 16, _Q8_0: 32, _MXFP4: 32, _Q4_K: 256, _Q6_K: 256}
#: The byte offsets, within a block, of the 32-bit words each type's kernel reads (its emitter below
#: asks for exactly these). They are the *slots* of the packed layout (:func:`pack`).
SLOTS = {
    _F32: tuple(range(0, 64, 4)),
    _Q8_0: (0, *range(2, 34, 4)),  # d (+ qs[0:2]); qs
    _MXFP4: (0, *range(1, 17, 4)),  # e (+ qs[0:3]); qs
    _Q4_K: tuple(range(0, 144, 4)),  # d, dmin; scales; qs
}
#: Q8_0 and Q6_K are packed differently: their codes as int8, column by column (the LANES rows'
#: codes of column k are bytes k·LANES … k·LANES + LANES − 1 of the block), so their kernels load a
#: column with one vector load and form the weights in float64 (lanes_blocks ``_emit_*_codes``).
#: Q8_0: 8 slots of the 32 codes, 1 slot of d as float32 bits. Q6_K (whose 6-bit codes also cost
#: more to assemble than to store): 64 slots of the 256 codes q − 32, 4 slots of the 16 int8 scales,
#: 1 slot of d as float32 bits.
CODE_SLOTS = {_Q8_0: 9, _Q6_K: 69}

# --------------------------------------------------------------------------------------------
# LLVM IR vocabulary: vectors of LANES values, one per weight row


_i1, _i16, _i32, _i64 = ir.IntType(1), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_f16, _f32, _f64 = ir.HalfType(), ir.FloatType(), ir.DoubleType()


def _vec(t):
    return ir.VectorType(t, LANES)


class _Emit:
    """Helpers that emit IR for one block of ``LANES`` rows (``b``: the IR builder;
    ``row_ptrs``: <LANES x i64>, the address of this block's first byte in each row)."""

    def __init__(self, b, row_ptrs):
        self.b = b
        self.row_ptrs = row_ptrs

    def const(self, value, t=_i32):
        return ir.Constant(_vec(t), [value] * LANES)

    def splat(self, x, t):
        v = self.b.insert_element(ir.Constant(_vec(t), ir.Undefined), x, ir.Constant(_i32, 0))
        return self.b.shuffle_vector(v, ir.Constant(_vec(t), ir.Undefined), ir.Constant(_vec(_i32), [0] * LANES))

    def dwords(self, offset: int, n: int = 1, dyn=None) -> list:
        """n × <LANES x i32>: the little-endian 4-byte words at ``offset``, ``offset + 4``, … in this
        block of every row (one gather each: one 32-bit load per lane); ``dyn`` (an IR i64, a
        multiple of 4) is added to the offset at run time (inside a ``_Loop``)."""
        b = self.b
        ptr_t = ir.VectorType(_i32.as_pointer(), LANES)
        fnty = ir.FunctionType(_vec(_i32), [ptr_t, _i32, _vec(_i1), _vec(_i32)])
        gather = cgutils.get_or_insert_function(b.module, fnty, f"llvm.masked.gather.v{LANES}i32.v{LANES}p0")
        rows = self.row_ptrs if dyn is None else b.add(self.row_ptrs, self.splat(dyn, _i64))
        words = []
        for o in range(offset, offset + 4 * n, 4):
            ptrs = b.inttoptr(b.add(rows, ir.Constant(_vec(_i64), [o] * LANES)), ptr_t)
            words.append(b.call(gather, [ptrs, ir.Constant(_i32, 1), ir.Constant(_vec(_i1), [1] * LANES),
                                         ir.Constant(_vec(_i32), ir.Undefined)]))
        return words

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

    def const64(self, value: int):
        return ir.Constant(_i64, value)

    def byte(self, dw, k: int):
        """Unsigned byte k (0..3) of each lane's dword."""
        return self.b.and_(self.b.lshr(dw, self.const(8 * k)), self.const(0xFF))

    def sbyte(self, dw, k: int):
        """Signed byte k (0..3) of each lane's dword (int8 sign-extended)."""
        return self.b.ashr(self.b.shl(dw, self.const(24 - 8 * k)), self.const(24))

    def f16(self, dw, high: bool):
        """The binary16 in the low (or high) half of each dword, as float32: exact, and NaN becomes
        ±the canonical NaN, as ``floats.f16_bits_to_f32`` (and so ``dequant``) does."""
        b = self.b
        bits = b.lshr(dw, self.const(16)) if high else b.and_(dw, self.const(0xFFFF))
        v = b.fpext(b.bitcast(b.trunc(bits, _vec(_i16)), _vec(_f16)), _vec(_f32))
        nan = b.or_(self.const(0x7FC00000), b.shl(b.and_(bits, self.const(0x8000)), self.const(16)))
        return b.select(b.fcmp_unordered("uno", v, v), b.bitcast(nan, _vec(_f32)), v)

    def u2f(self, q):
        return self.b.uitofp(q, _vec(_f32))

    def s2f(self, q):
        return self.b.sitofp(q, _vec(_f32))


class _PackedEmit(_Emit):
    """The same helpers over a packed block (:func:`pack`): the words of all LANES rows at one byte
    offset are stored side by side, so ``dwords`` is a plain vector load instead of a gather."""

    def __init__(self, b, block_ptr, slots):
        super().__init__(b, None)
        self.block_ptr = block_ptr  # i32*: this group's packed block, [slot][LANES]
        self.slot = {o: i for i, o in enumerate(slots)}

    def prefetch(self, ahead: int, nbytes: int) -> None:
        """Software-prefetch the ``nbytes`` that lie ``ahead`` bytes past this block (a later block of
        the group, read a few blocks from now), one cache line at a time. The hardware prefetcher alone
        left the packed Q8_0 kernel at ~65 % of one core's read bandwidth; this made it ~37 % faster."""
        b = self.b
        fnty = ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), _i32, _i32, _i32])
        fn = cgutils.get_or_insert_function(b.module, fnty, "llvm.prefetch.p0")
        base = b.bitcast(self.block_ptr, ir.IntType(8).as_pointer())
        for line in range(0, nbytes, 64):
            ptr = b.gep(base, [ir.Constant(_i64, ahead + line)])
            b.call(fn, [ptr, ir.Constant(_i32, 0), ir.Constant(_i32, 3), ir.Constant(_i32, 1)])

    def words(self, slot: int, n: int = 1, dyn=None) -> list:
        """n × <LANES x i32>: packed slots ``slot`` … ``slot + n − 1`` (plus ``dyn``, an IR i64)."""
        b = self.b
        base = self.block_ptr if dyn is None else b.gep(self.block_ptr, [b.mul(dyn, ir.Constant(_i64, LANES))])
        return [b.load(b.bitcast(b.gep(base, [ir.Constant(_i64, s * LANES)]), _vec(_i32).as_pointer()), align=4)
                for s in range(slot, slot + n)]

    def dwords(self, offset: int, n: int = 1, dyn=None) -> list:
        """As ``_Emit.dwords``; a run-time ``dyn`` needs slots that are every 4 bytes (Q4_K, F32)."""
        if dyn is not None:
            assert all(self.slot.get(o) == o // 4 for o in range(offset, offset + 4 * n, 4)), "dyn needs linear slots"
            return self.words(offset // 4, n, dyn=self.b.udiv(dyn, ir.Constant(_i64, 4)))
        return [self.words(self.slot[o])[0] for o in range(offset, offset + 4 * n, 4)]


class _Loop:
    """An emitter item: ``n`` iterations of ``body(e, it)`` (``it`` an IR i64, 0 … n−1), each
    covering ``step`` consecutive k, yielding (k within the iteration, weights). Emitted as an IR
    loop, so a 256-value super-block compiles to a loop of 32 or 64 values instead of 256 unrolled
    ones: as fast (measured) and half the compile time."""

    def __init__(self, n: int, step: int, body):
        self.n, self.step, self.body = n, step, body


# --------------------------------------------------------------------------------------------
# The block kernel: one emitter's weights accumulated into LANES float64 sums per activation row


def _block_kernel(name: str, emitters: dict, packed: bool = False):
    """An intrinsic ``kernel(kind, acc, w, row0, blk, x, nt)`` for block ``blk`` of LANES rows of type
    ``kind``, whose weights ``emitters[kind]`` emits:

    for t < nt, i < LANES, j < block (in that order of j):
        acc[t, i] += float64(W[row0 + i, block·blk + j]) * x[t, block·blk + j]   (fma, exact product)

    acc float64 [MAX_T, LANES]; w uint8 [N, row bytes] (C-contiguous); x float64 [nt, K];
    kind (a type code) and nt (1..MAX_T) compile-time literals: only that type's code is generated.
    With ``packed``: ``w`` is :func:`pack`'s uint32 [groups, blocks, slots, LANES] and ``row0`` the
    group index.
    """

    def kernel(typingctx, kind, acc, w, row0, blk, x, nt):
        if not isinstance(kind, types.IntegerLiteral) or not isinstance(nt, types.IntegerLiteral):
            return None  # numba retries with the literal values
        if kind.literal_value not in emitters:
            return None
        emit = emitters[kind.literal_value]
        type_size, block = TYPE_SIZE[kind.literal_value], BLOCK[kind.literal_value]
        slots = SLOTS.get(kind.literal_value, ())
        n_slots = CODE_SLOTS[kind.literal_value] if packed and kind.literal_value in CODE_SLOTS else len(slots)
        NT = nt.literal_value
        sig = types.void(kind, acc, w, row0, blk, x, nt)

        def codegen(context, builder, signature, args):
            acc_a, w_a, x_a = (context.make_array(signature.args[i])(context, builder, args[i]) for i in (1, 2, 5))
            row0_v, blk_v = args[3], args[4]
            K = builder.extract_value(x_a.shape, 1)
            if packed:  # w[group, blk] holds the block's words: [slot][lane]
                n_blocks = builder.extract_value(w_a.shape, 1)
                first = builder.mul(builder.add(builder.mul(row0_v, n_blocks), blk_v), ir.Constant(_i64, n_slots * LANES))
                e = _PackedEmit(builder, builder.gep(builder.bitcast(w_a.data, _i32.as_pointer()), [first]), slots)
                block_bytes = 4 * n_slots * LANES
                e.prefetch(-(-PREFETCH_BYTES // block_bytes) * block_bytes, block_bytes)  # whole blocks ahead
            else:  # the address of this block in each of the LANES rows
                row_stride = builder.extract_value(w_a.strides, 0)
                first = builder.add(builder.ptrtoint(w_a.data, _i64),
                                    builder.add(builder.mul(row0_v, row_stride), builder.mul(blk_v, ir.Constant(_i64, type_size))))
                e = _Emit(builder, None)
                lane = ir.Constant(_vec(_i64), list(range(LANES)))
                e.row_ptrs = builder.add(e.splat(first, _i64), builder.mul(lane, e.splat(row_stride, _i64)))
            acc_ptr = builder.bitcast(acc_a.data, _vec(_f64).as_pointer())
            accs = [builder.load(builder.gep(acc_ptr, [ir.Constant(_i64, t)]), align=8) for t in range(NT)]
            fma_ty = ir.FunctionType(_vec(_f64), [_vec(_f64)] * 3)
            fma = cgutils.get_or_insert_function(builder.module, fma_ty, f"llvm.fma.v{LANES}f64")
            k0 = builder.mul(blk_v, ir.Constant(_i64, block))

            def accumulate(accs, kbase, items):
                """accs[t] += w·x[t, kbase + j] for each (j, w) of ``items``, in order."""
                for j, w in items:
                    w64 = w if w.type == _vec(_f64) else builder.fpext(w, _vec(_f64))  # exact
                    for t in range(NT):
                        xi = builder.add(builder.mul(ir.Constant(_i64, t), K), builder.add(kbase, ir.Constant(_i64, j)))
                        xv = e.splat(builder.load(builder.gep(x_a.data, [xi])), _f64)
                        accs[t] = builder.call(fma, [w64, xv, accs[t]])
                return accs

            for item in emit(e):
                if not isinstance(item, _Loop):
                    accs = accumulate(accs, k0, [item])
                    continue
                pre = builder.block
                head, body = builder.append_basic_block("lanes.loop"), builder.append_basic_block("lanes.body")
                done = builder.append_basic_block("lanes.done")
                builder.branch(head)
                builder.position_at_end(head)
                it = builder.phi(_i64)
                it.add_incoming(ir.Constant(_i64, 0), pre)
                phis = []
                for a in accs:
                    phis.append(builder.phi(a.type))
                    phis[-1].add_incoming(a, pre)
                builder.cbranch(builder.icmp_signed("<", it, ir.Constant(_i64, item.n)), body, done)
                builder.position_at_end(body)
                kbase = builder.add(k0, builder.mul(it, ir.Constant(_i64, item.step)))
                out = accumulate(list(phis), kbase, item.body(e, it))
                it_next = builder.add(it, ir.Constant(_i64, 1))
                latch = builder.block
                builder.branch(head)
                it.add_incoming(it_next, latch)
                for phi, a in zip(phis, out):
                    phi.add_incoming(a, latch)
                builder.position_at_end(done)
                accs = phis
            for t in range(NT):
                builder.store(accs[t], builder.gep(acc_ptr, [ir.Constant(_i64, t)]), align=8)
            return context.get_dummy_value()

        return sig, codegen

    kernel.__name__ = kernel.__qualname__ = name
    return intrinsic(kernel)


