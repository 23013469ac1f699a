"""kernels.ggml.columns_arm (the AArch64 repacked kernels from ``--emulate=ggml``'s column layout) gives the bits of
the stored-row kernels it stands in for: kernels.ggml.repack_arm_k (Q4_K, Q5_K, Q6_K; 8x4 on dotprod, 8x8 on i8mm)
and kernels.ggml.repack_arm (Q4_0, IQ4_NL, MXFP4), which tests/test_ggml_ops_repack_arm64*.py prove against the
GCC and clang libraries under qemu. Here, on the host: every kernels' path (the GCC and clang contractions), decode,
verify and prompt row counts (gemm rows then gemv rows), the ARM quantizers' hard rows (ties, NaN, inf, zeros,
tiny), extreme weight scales, column ranges inside and across tiles, mul_mat_id's grouping, thread counts, and a
model loaded with the layout against one without; and a weight in a plain buffer, whose 1-row vec_dot
(kernels.ggml.mulmat_arm_q, proven by tests/test_ggml_ops_mulmat_arm64.py) the layout serves on every ARM build.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from test_ggml_columns import assert_interpreted
from test_ggml_ops_repack_arm64 import acts, acts_k, bits, weight_bytes

from kernels.ggml import columns, columns_arm, columns_arm_lanes, columns_ir, mulmat

KQ = (QT.Q4_K, QT.Q5_K, QT.Q6_K)
B32 = (QT.Q4_0, QT.IQ4_NL, QT.MXFP4)


def by_type(types, default):
    """pytest params of ``types``, those not in ``default`` with ``-m deep`` (each type compiles its own kernels:
    ~5-8 s a kernel on a cold cache; the suite's budget)."""
    return [pytest.param(t, id=t.name, marks=() if t in default else pytest.mark.deep) for t in types]
#: one path per kernels' path (kernels.ggml.repack_arm.KERNELS_OF; the 128-bit SVE paths run the i8mm kernels, the
#: 256-bit one its own: Q4_0 8x8, Q4_K's fused gemm)
PATHS = ("arm64-i8mm", "arm64-dotprod", "arm64-i8mm-clang", "arm64-dotprod-clang", "arm64-sve256")


def _acts(qt, rng, t, k):
    return acts_k(rng, t, k) if qt in KQ else acts(rng, t, k)


@pytest.mark.parametrize("qtype", by_type(KQ + B32, (QT.Q4_K,)))
def test_mul_mat_equals_stored_rows(qtype):
    rng = np.random.default_rng(int(qtype) + 40)
    for path in PATHS:
        for N, K, scales in ((64, 256, "normal"), (136, 512, "normal"), (24, 256, "extreme")):
            w = weight_bytes(qtype, N, K, rng, scales)
            cols = columns.layout(w, qtype)
            for T in (1, 2, 3, 4, 5, 8, 9):  # gemv; gemm rows then gemv rows (T % 4); the quantizers' hard rows
                x = _acts(qtype, rng, T, K)
                want = mulmat.mul_mat(w, qtype, x, path, repack=True)  # the stored-row kernels
                got = mulmat.mul_mat(w, qtype, x, path, repack=True, cols=cols)
                assert np.array_equal(bits(got), bits(want)), (path, N, K, scales, T)
                assert np.array_equal(bits(columns_arm.mul_mat_cols_arm(cols, x, path)), bits(want))
                for start, stop in ((8, 24), (60, min(N, 136))):  # inside a tile; across a tile's end
                    if stop > start:
                        part = columns_arm.mul_mat_cols_arm(cols.columns(start, stop), x, path)
                        assert np.array_equal(bits(part), bits(want[:, start:stop])), (path, start, stop, T)


@pytest.mark.parametrize("qtype", by_type(KQ + B32, ()))  # by default: test_thread_count_changes_no_bit's
def test_mul_mat_id_equals_stored_rows(qtype):
    """Every routed row through the gemv (forward_mul_mat_id), slots grouped by expert; the gate or up half of a fused
    gate_up stack (its columns)."""
    rng = np.random.default_rng(int(qtype) + 41)
    stack = np.stack([weight_bytes(qtype, 80, 512, rng) for _ in range(3)])
    cols = columns.layout(stack, qtype)
    for path in PATHS:
        for T, n_x in ((1, 1), (4, 1), (3, 2), (5, 2)):
            ids = rng.integers(0, 3, (T, 2)).astype(np.int32)
            x = _acts(qtype, rng, T * n_x, 512).reshape(T, n_x, 512)
            want = mulmat.mul_mat_id(stack, qtype, x, ids, path, repack=True)
            got = mulmat.mul_mat_id(stack, qtype, x, ids, path, repack=True, cols=cols)
            assert np.array_equal(bits(got), bits(want)), (path, T, n_x)
            half = columns_arm.mul_mat_id_cols_arm(cols.columns(40, 80), x, ids, path)
            assert np.array_equal(bits(half), bits(want[..., 40:80])), (path, T, n_x)


PLAIN = (QT.Q4_K, QT.Q5_K, QT.Q6_K, QT.MXFP4, QT.IQ4_NL, QT.Q8_0, QT.Q4_0)
#: every vec_dot build a plain buffer meets: armv8-a (vmull lanes; nothing repacked), dotprod, i8mm, SVE-128, clang
PLAIN_PATHS = ("arm64-base", "arm64-base-clang", "arm64-dotprod", "arm64-i8mm", "arm64-i8mm-clang", "arm64-sve128",
               "arm64-sve128-clang", "arm64-sve128-clang14")


@pytest.mark.parametrize("qtype", by_type(PLAIN, (QT.Q8_0,)))
def test_plain_buffer_equals_stored_rows(qtype):
    """A weight in a plain buffer (``arm64-base``; ``--no-repack``): its 1-row ``vec_dot`` from the layout (Q8_0's
    and Q4_0's lanes in sdot's and vmull's orders, SVE's sum), every element of a decode, of an odd batch and of
    mul_mat_id; where an i8mm 2-row kernel takes elements (an even batch of Q4_K / Q6_K / Q8_0 / Q4_0), and for Q6_K
    on ``arm64-sve128-clang14`` (its wrong high bits), the stored rows — the same bits either way."""
    rng = np.random.default_rng(int(qtype) + 45)
    K = 512 if qtype in KQ else 480  # the 32-value blocks: an odd count (the last block's own step)
    w = weight_bytes(qtype, 80, K, rng)
    cols = columns.layout(w, qtype)
    stack = np.stack([w, weight_bytes(qtype, 80, K, rng)])
    scols = columns.layout(stack, qtype)
    for path in PLAIN_PATHS:
        assert columns_arm.covers(qtype, path, False) == (qtype != QT.Q6_K or path != "arm64-sve128-clang14")
        for T in (1, 3, 4, 9):
            x = _acts(qtype, rng, T, K)
            want = mulmat.mul_mat(w, qtype, x, path, repack=False)
            if columns_arm.covers(qtype, path, False):
                got = mulmat.mul_mat(w, qtype, x, path, repack=False, cols=cols)
                assert np.array_equal(bits(got), bits(want)), (path, T)
                if T % 2:  # no 2-row kernel anywhere
                    part = columns_arm.mul_mat_cols_arm(cols.columns(8, 72), x, path, repacked=False)
                    assert np.array_equal(bits(part), bits(want[:, 8:72])), (path, T)
                ids = rng.integers(0, 2, (T, 2)).astype(np.int32)
                xs = x.reshape(T, 1, K)
                got = mulmat.mul_mat_id(stack, qtype, xs, ids, path, repack=False, cols=scols)
                assert np.array_equal(bits(got), bits(mulmat.mul_mat_id(stack, qtype, xs, ids, path))), (path, T)
            else:
                with pytest.raises(ValueError, match="Q6_K in a plain buffer given on the arm64-sve128-clang14 path"):
                    mulmat.mul_mat(w, qtype, x, path, repack=False, cols=cols)


def test_lane_dots_are_their_definition():
    """ggml_vdotq_s32's lanes from the pairs layout (vector IR) against the definition, and the definition against
    the bytes themselves in both lane orders: -128 and 127 on both sides."""
    rng = np.random.default_rng(46)
    w = weight_bytes(QT.Q8_0, 32, 64, rng)
    w[3, 2:6] = np.array([-128, 127, -128, 127], np.int8).view(np.uint8)
    cols = columns.layout(w, QT.Q8_0)
    q = cols.q[0, 0]
    y = rng.integers(-128, 128, 64).astype(np.int8)
    y[:4] = (-128, 127, -128, -128)
    values = w.reshape(32, 2, 34)[:, :, 2:].view(np.int8).reshape(32, 64).astype(np.int64)
    for vmull in (False, True):
        for k0, c in ((0, 0), (32, 16)):
            got, want = np.zeros((4, 16), np.int32), np.zeros((4, 16), np.int32)
            columns_arm_lanes.lane_dots(got, q, k0, c, 16, y, k0, vmull)
            columns_arm_lanes.lane_dots_def(want, q, k0, c, 16, y, k0, vmull)
            assert np.array_equal(got, want), (vmull, k0, c)
            for lane in range(4):
                idx = [2 * lane + (e & 1) + 8 * (e >> 1) if vmull else 4 * lane + e for e in range(4)]
                idx += [i + 16 for i in idx]
                assert np.array_equal(want[lane], (values[c:c + 16][:, [k0 + i for i in idx]] * y[[k0 + i for i in idx]]).sum(1))


@pytest.mark.parametrize("qtype", (QT.Q4_K, QT.Q5_K), ids=["Q4_K", "Q5_K"])
def test_group_dots_are_their_definition(qtype):
    """Each 32-value group's scaled dot (columns_ir.kq16_groups, every level the host runs) against the definition
    and against the arithmetic itself: extreme codes, the 6-bit scales' 63, a -128 activation."""
    rng = np.random.default_rng(int(qtype) + 42)
    cols = columns.layout(weight_bytes(qtype, 32, 512, rng), qtype)
    q, sc = cols.q[0, 0], cols.sc[0, 0].copy()
    form = 2 if qtype == QT.Q4_K else 0
    sc[8, 16:20] = (63, 0, 63, 1)
    y = rng.integers(-127, 128, 512).astype(np.int8)
    y[256:259] = (-128, 127, -127)
    for level in range(columns_ir.LEVEL + 1):
        for blk, c in ((0, 0), (1, 16)):
            got, want = np.zeros((8, 16), np.int32), np.zeros((8, 16), np.int32)
            columns_ir.kq16_groups(got, q, blk, c, y, sc, form, level)
            columns_ir.kq_groups_def(want, q, blk, c, 16, y, sc, form)
            assert np.array_equal(got, want), (level, blk, c)
    total = np.zeros((8, 16), np.int32)
    columns_ir.kq_def(total, 0, 16, q, 1, 0, 8, 16, y, sc, np.empty(0, np.int64), form, 1)
    assert np.array_equal(want.astype(np.int64).sum(axis=0), total[0])  # the groups sum to the super-block's total


@pytest.mark.parametrize("qtype", by_type((QT.Q4_K, QT.Q6_K, QT.MXFP4), (QT.Q4_K,)))
def test_thread_count_changes_no_bit(qtype):
    """Tiles, and mul_mat_id's (expert group, tile) items, split between 1, 2 or 3 threads: the same bits."""
    import numba

    rng = np.random.default_rng(43)
    before = numba.get_num_threads()
    try:
        w = weight_bytes(qtype, 200, 1536, rng)  # 4 tiles, the last partial; parallel from one row
        cols = columns.layout(w, qtype)
        stack = columns.layout(np.stack([w, weight_bytes(qtype, 200, 1536, rng)]), qtype)
        ids = np.array([[0, 1], [1, 0], [1, 1]], np.int32)
        for T in (1, 4, 5):
            x = _acts(qtype, rng, T, 1536)
            outs = []
            for nth in (1, 2, 3):
                numba.set_num_threads(min(nth, numba.config.NUMBA_NUM_THREADS))
                outs.append((bits(columns_arm.mul_mat_cols_arm(cols, x, "arm64-i8mm")),
                             bits(columns_arm.mul_mat_id_cols_arm(stack, x[:3, None], ids[:min(T, 3)],
                                                                  "arm64-i8mm") if T >= 3 else np.zeros(1))))
            assert all(np.array_equal(o[k], outs[0][k]) for o in outs[1:] for k in (0, 1)), (qtype.name, T)
    finally:
        numba.set_num_threads(before)


def test_the_builtin_model_on_arm64_base_is_laid_out():
    """builtin:kjv (Q8_0) on ``arm64-base``, which repacks nothing: every matrix laid out for its 1-row vec_dot's
    lanes, the logits equal those of the stored rows bit for bit."""
    from refimpl.fixtures.builtin import TRAINED_PATH
    from refimpl.model.ops import emulation_ctx
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward, load_model

    laid, rows = load_model(TRAINED_PATH, pack=True, ggml=("arm64-base", True)), load_model(TRAINED_PATH, pack=False)
    assert laid.weights.output.cols is not None and laid.weights.layers[0].ffn.experts.down_exps.cols is not None
    ctx = emulation_ctx("ggml", ggml="arm64-base", n_threads=2)
    tokens = [3, 17, 5, 9, 11, 2, 8]
    got = forward(laid, SeqState.fresh(laid.config), tokens, ctx)[0]
    want = forward(rows, SeqState.fresh(rows.config), tokens, ctx)[0]
    assert np.array_equal(bits(got), bits(want))


@pytest.mark.deep
@pytest.mark.parametrize("quant,laid_type", [("q4_k_m", QT.Q4_K), ("mxfp4", QT.MXFP4)])
def test_the_model_is_laid_out_where_the_repacked_kernels_are(quant, laid_type):
    """``load_model(ggml=(ARM path, repack))`` lays out the matrices that path's CPU_REPACK buffer takes (K-quants,
    MXFP4), experts included, and with ``--no-repack`` or on ``arm64-base`` (which repacks nothing) those whose 1-row
    vec_dot has a layout kernel; the logits of the laid-out model equal those of the stored rows bit for bit (and
    those equal llama.cpp's: tests/test_ggml_e2e_arm64.py)."""
    import dataclasses

    from refimpl.fixtures.builtin import fixture_path
    from refimpl.model.ops import emulation_ctx
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward, load_model

    path = fixture_path("tiny", quant)
    for arm in ("arm64-i8mm", "arm64-dotprod-clang"):
        laid = load_model(path, pack=True, ggml=(arm, True))
        down = laid.weights.layers[0].ffn.experts.down_exps
        assert down.qtype == laid_type and down.cols is not None, (quant, arm)
        rows = load_model(path, pack=False)
        ctx = emulation_ctx("ggml", ggml=arm, n_threads=2)
        tokens = [3, 17, 5, 9, 11, 2, 8]
        got = forward(laid, SeqState.fresh(laid.config), tokens, ctx)[0]
        want = forward(rows, SeqState.fresh(rows.config), tokens, ctx)[0]
        assert np.array_equal(bits(got), bits(want)), (quant, arm)
    for arm, repack in (("arm64-i8mm", False), ("arm64-base", True)):  # a plain buffer: its 1-row vec_dot's
        laid = load_model(path, pack=True, ggml=(arm, repack))
        assert laid.weights.layers[0].ffn.experts.down_exps.cols is not None, (quant, arm, repack)
        ctx = dataclasses.replace(emulation_ctx("ggml", ggml=arm, n_threads=2), repack=repack)
        got = forward(laid, SeqState.fresh(laid.config), tokens[:5], ctx)[0]
        want = forward(rows, SeqState.fresh(rows.config), tokens[:5], ctx)[0]
        assert np.array_equal(bits(got), bits(want)), (quant, arm, repack)
    if quant == "q4_k_m":  # its LM head is Q6_K: the stored rows on clang 14's SVE build
        assert load_model(path, pack=True, ggml=("arm64-sve128-clang14", False)).weights.output.cols is None


def test_layout_is_refused_where_it_does_not_apply():
    rng = np.random.default_rng(44)
    w = weight_bytes(QT.Q4_K, 32, 256, rng)
    cols = columns.layout(w, QT.Q4_K)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    q5_0 = weight_bytes(QT.Q5_0, 32, 256, rng)
    assert not columns_arm.covers(QT.Q5_0, "arm64-i8mm", False)
    with pytest.raises(ValueError, match="column layout: Q5_0 has none"):
        columns.layout(q5_0, QT.Q5_0)
    q8_0 = weight_bytes(QT.Q8_0, 32, 256, rng)  # arm64-base repacks nothing: a layout there is a plain buffer's
    laid = columns.layout(q8_0, QT.Q8_0)
    assert np.array_equal(bits(mulmat.mul_mat(q8_0, QT.Q8_0, x, "arm64-base", repack=True, cols=laid)),
                          bits(mulmat.mul_mat(q8_0, QT.Q8_0, x, "arm64-base", repack=True)))
    with pytest.raises(ValueError, match="column layout of K=256 given for activations of K=512"):
        columns_arm.mul_mat_cols_arm(cols, np.zeros((1, 512), np.float32), "arm64-i8mm")
    with pytest.raises(ValueError, match="Q4_K repacked on arm64-base has no AArch64 kernel here"):
        columns_arm.mul_mat_cols_arm(cols, x, "arm64-base")  # it repacks nothing
    assert not columns_arm.covers(QT.Q8_0, "arm64-i8mm")  # its stored-row kernel reads the rows in place


@pytest.mark.deep
def test_interpreted_kernels_give_the_same_bits(tmp_path):
    """NUMBA_DISABLE_JIT=1: the AArch64 layout kernels as Python (the integer steps by their definitions, a whole
    tile's lanes loop included) give the compiled bits — a repacked Q4_K and a plain buffer's Q8_0, a tile and a tail."""
    rng = np.random.default_rng(47)
    cases = {}
    for qtype, path, repacked, K in ((QT.Q4_K, "arm64-i8mm", True, 256), (QT.Q8_0, "arm64-base", False, 96)):
        w = weight_bytes(qtype, 72, K, rng)
        x = _acts(qtype, rng, 5, K)
        cases[qtype.name] = (w, x, columns_arm.mul_mat_cols_arm(columns.layout(w, qtype), x, path, repacked))
    assert_interpreted(tmp_path, cases, "from kernels.ggml import columns, columns_arm; "
                       "a = {'Q4_K': ('arm64-i8mm', True), 'Q8_0': ('arm64-base', False)}; "
                       "np.savez('out.npz', **{n: columns_arm.mul_mat_cols_arm(columns.layout(z[n + '_0'], QT[n]), "
                       "z[n + '_1'], *a[n]) for n in a})", 900)


@pytest.mark.deep
@pytest.mark.parametrize("name,arm,repack", [("qwen35moe-k-q4_k_m.gguf", "arm64-i8mm", True),
                                             ("qwen35moe-k-q4_k_m.gguf", "arm64-base", True),
                                             ("qwen35moe-k-mxfp4_moe.gguf", "arm64-dotprod-clang", True),
                                             ("qwen35moe-k-mxfp4_moe.gguf", "arm64-i8mm", False)])
def test_converted_files_laid_out(name, arm, repack):
    """Files this project did not write (convert_hf_to_gguf.py + llama-quantize: golden/converted) laid out for an ARM
    path: the logits of a 9-token prompt then 1+3-shaped batches equal those of the stored rows bit for bit (which
    equal llama.cpp's under qemu: tests/test_ggml_e2e_arm64.py) — the layout, the dispatch and each row's recipe end
    to end (the gemm and gemv recipes swapped: it fails); a rounding that these small files never tell apart (MXFP4's
    fused or unfused step) is the op-level tests' to show."""
    import dataclasses

    from test_converted import CONVERTED

    from refimpl.model.ops import emulation_ctx
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward, load_model

    laid, rows = load_model(CONVERTED / name, pack=True, ggml=(arm, repack)), load_model(CONVERTED / name, pack=False)
    assert any(m.cols is not None for m in (laid.weights.output, laid.weights.layers[0].ffn.experts.down_exps))
    ctx = dataclasses.replace(emulation_ctx("ggml", ggml=arm, n_threads=2), repack=repack)
    tokens = [int(t) for t in np.random.default_rng(7).integers(1, rows.config.n_vocab, 17)]
    outs = []
    for m in (laid, rows):
        state, logits = SeqState.fresh(m.config), []
        for s, e in ((0, 9), (9, 13), (13, 17)):
            lg, _, state = forward(m, state, tokens[s:e], ctx)
            logits.append(lg)
        outs.append(np.concatenate(logits))
    assert np.array_equal(bits(outs[0]), bits(outs[1])), (name, arm, repack)
