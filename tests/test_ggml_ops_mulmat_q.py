"""kernels.ggml.mulmat for Q2_K, Q3_K (kernels.ggml.mulmat_k) and the legacy Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL
(kernels.ggml.mulmat_q), weights in a plain buffer (``Graph.tensor``, never the CPU_REPACK buffer), bit for bit
against both libggml builds.

Build dependence (disassembly of the libggml-cpu builds): only IQ4_NL's ``vec_dot`` odd-block tail differs, by GCC's
tuning rather than the ISA (``vmulss`` + ``vaddss`` tuned for AMD Zen: avx512, avx2-zen; ``vfmadd231ss`` with the
generic or an Intel tuning: avx2; kernels.ggml.tuning) — ``test_legacy_bit_exact`` asserts the tunings differ there. Everything else runs the same ``__AVX2__`` C code or the same tiled float formula in both builds
(``dpbusd`` vs ``maddubs`` + ``madd``: the same integers). Each test also asserts that a plausible wrong model
differs on its data: the portable C formula (``ggml_vec_dot_*_generic``: ``sumf += float(sumi)·d``), vec_dot's
formula on a tiled shape, tinyBLAS's formula where ggml takes vec_dot (mul_mat_id, IQ4_NL at T = 1).
"""

import numpy as np
import pytest
from ggml_graph import BUILDS, ZEN, build_info, on_build
from gguf import GGMLQuantizationType as QT
from test_ggml_ops_mulmat import acts, bits, check, g_mul_mat_id, weight_bytes

from kernels.ggml import mulmat_k, mulmat_q
from kernels.ggml.actquant import _q8_0_rows
from kernels.ggml.mulmat import kernel_for, mul_mat, mul_mat_id
from kernels.ggml.simd import simd
from kernels.ggml.vecmath import F16_TO_F32

pytestmark = pytest.mark.oracle

T_ALL = (1, 2, 3, 7, 8, 9, 16)
KQ23 = (QT.Q2_K, QT.Q3_K)
LEGACY = (QT.Q4_0, QT.Q5_0, QT.IQ4_NL, QT.Q4_1, QT.Q5_1)


def hard_acts(rng, k):
    """9 rows: a NaN that ``_mm256_max_ps`` skips (quantized to -128: the sign trick), x·127/amax on exact .5
    ties, ±inf, subnormals, a zero row, huge and tiny rows."""
    x = acts(rng, 9, k)
    x[0, 3] = np.nan
    x[3, :32] = np.arange(32, dtype=np.float32) - np.float32(15.5)
    x[3, 31] = 127.0
    x[4, 40 % k] = np.inf
    x[5, : min(k, 90)] = np.float32(1e-42)
    x[6] *= np.float32(1e30)
    x[7] *= np.float32(1e-30)
    return x


def generic_legacy(w, qtype, x):
    """The portable ``ggml_vec_dot_<q>_q8_{0,1}_generic``: ``sumf += float(sumi)·(x.d·y.d)`` (+ ``x.m·y.s``)
    block by block — a plausible model that is not what either build computes."""
    v, d, m = mulmat_q.decode(w, qtype)
    xq, xd, xs = _q8_0_rows(np.ascontiguousarray(x, np.float32), qtype in mulmat_q.Q8_1_ACT)
    out = np.zeros((x.shape[0], w.shape[0]), np.float32)
    for t in range(x.shape[0]):
        for r in range(w.shape[0]):
            acc = np.float32(0)
            for b in range(d.shape[1]):
                sumi = np.float32(np.dot(v[r, 32 * b:32 * b + 32].astype(np.int64), xq[t, 32 * b:32 * b + 32]))
                acc = np.float32(acc + sumi * np.float32(F16_TO_F32[d[r, b]] * xd[t, b]))
                if m is not None:
                    acc = np.float32(acc + F16_TO_F32[m[r, b]] * xs[t, b])
            out[t, r] = acc
    return out


# ---- Q2_K, Q3_K: vec_dot (T < 8) and the tiled kernel (T >= 8) ----------------------------------------


@pytest.mark.parametrize("qtype", KQ23, ids=[q.name for q in KQ23])
@pytest.mark.parametrize("build", BUILDS)
def test_kquant23_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2720, int(qtype)])
    cases = []
    for n, k, ts in ((13, 256, T_ALL), (40, 1024, (1, 7, 8, 16)), (35, 512, (9, 70))):
        w = weight_bytes(qtype, n, k, rng)
        for t in ts:
            for nth in (1, 2):
                cases.append((w, int(qtype), k, acts(rng, t, k), nth))
    x = hard_acts(rng, 256)
    for t in (3, 9):  # extreme fp16 scales (subnormal, ±65504, 0); random bytes (NaN payloads / inf scales)
        cases.append((weight_bytes(qtype, 16, 256, rng, "extreme"), int(qtype), 256, x[:t], 2))
        cases.append((weight_bytes(qtype, 16, 256, rng, "raw"), int(qtype), 256, x[:t], 1))
    got = check(build, cases, lambda w, q, x: mul_mat(w, q, x, path))
    assert kernel_for(qtype, path, 7, 40, 1024) == "vec_dot" and kernel_for(qtype, path, 8, 40, 1024) == "tiled"
    # can fail: vec_dot's formula on a tiled shape, and the tiled formula on a vec_dot shape, give other bits
    i = next(i for i, c in enumerate(cases) if c[3].shape[0] == 70)
    assert (bits(mulmat_k.mul_mat_k(cases[i][0], qtype, cases[i][3], path, tiled=False)) != bits(got[i])).any()
    i = next(i for i, c in enumerate(cases) if c[3].shape[0] == 7 and c[2] == 1024)
    assert (bits(mulmat_k.mul_mat_k(cases[i][0], qtype, cases[i][3], path, tiled=True)) != bits(got[i])).any()


# ---- Q4_0, Q5_0, IQ4_NL (Q8_0 activations; tinyBLAS_Q0_AVX at T >= 2), Q4_1, Q5_1 (Q8_1; vec_dot) --------


@pytest.mark.parametrize("qtype", LEGACY, ids=[q.name for q in LEGACY])
@pytest.mark.parametrize("build", BUILDS)
def test_legacy_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2721, int(qtype)])
    cases = []
    # N % 4 != 0 and N < 4 change tinyBLAS's tiles (gemm4xN / gemmMx4 / gemm<RM, RN> leftovers); 3, 5, 9
    # blocks: IQ4_NL vec_dot's odd tail
    for n, k in ((16, 256), (13, 96), (36, 64), (3, 160), (7, 288)):
        w = weight_bytes(qtype, n, k, rng)
        w.reshape(n, -1, mulmat_q.BLOCK_BYTES[qtype])[0, :, -16:] = np.uint8(0)  # most negative values
        for t in T_ALL:
            for nth in (1, 2) if t in (1, 2, 9) else (1 + t % 2,):
                cases.append((w, int(qtype), k, acts(rng, t, k), nth))
    x = hard_acts(rng, 96)
    for t in (1, 2, 5, 9):  # extreme fp16 scales; random bytes (NaN payloads / inf in d and m)
        cases.append((weight_bytes(qtype, 12, 96, rng, "extreme"), int(qtype), 96, x[:t], 1))
        cases.append((weight_bytes(qtype, 12, 96, rng, "raw"), int(qtype), 96, x[:t], 2))
    got = check(build, cases, lambda w, q, x: mul_mat(w, q, x, path))
    sgemm = qtype in mulmat_q.SGEMM_TYPES
    if qtype in (QT.Q4_0, QT.IQ4_NL):  # 13 rows: llama.cpp's default CPU_REPACK buffer leaves them plain
        c, y = next((c, y) for c, y in zip(cases, got) if c[0].shape[0] == 13 and c[3].shape[0] == 9)
        assert np.array_equal(bits(mul_mat(c[0], qtype, c[3], path, repack=True)), bits(y))
    assert kernel_for(qtype, path, 1, 16, 256) == "vec_dot"
    assert kernel_for(qtype, path, 2, 13, 96) == ("sgemm" if sgemm else "vec_dot")
    # can fail: the portable C formula differs on the ordinary cases
    assert any((bits(generic_legacy(c[0], qtype, c[3])) != bits(y)).any() for c, y in zip(cases[:40], got))
    if qtype == QT.IQ4_NL:
        other = "avx2" if simd(path).split_chains else "avx2-zen"  # the other GCC tuning (kernels.ggml.tuning)
        t1 = [(c, y) for c, y in zip(cases, got) if c[3].shape[0] == 1 and c[2] in (96, 160, 288)]
        assert any((bits(mul_mat(c[0], qtype, c[3], other)) != bits(y)).any() for c, y in t1)  # the odd tail
        # vec_dot (block pairs) is not tinyBLAS (one accumulator) at T = 1
        assert any((bits(mulmat_q.mul_mat_q(c[0], qtype, c[3], path, True)) != bits(y)).any() for c, y in t1)


def test_iq4_nl_on_the_avx2_build_tuned_for_zen():
    """IQ4_NL's odd tail on the AVX2 build GCC tuned for AMD Zen (avx2-zen: split, where the avx2 build fuses)."""
    test_legacy_bit_exact(ZEN, QT.IQ4_NL)


@pytest.mark.parametrize("build", BUILDS)
def test_q4_1_nan_scales_meet(build):
    """Q4_1 with a NaN ``m`` (payload A, into ``summs``) and a NaN ``d`` (payload B, into ``acc``) in one row:
    ``vaddss`` of ``hsum_float_8(acc) + summs`` keeps its first source's NaN, B."""
    path = build_info(build).path
    w = np.zeros((1, 60), np.uint8)  # 3 blocks of (d, m, qs[16])
    blk = w.reshape(1, 3, 20)
    blk[0, :, 4:] = 0x97
    blk[0, :, :4] = np.array([[0x3C00, 0x7E01], [0xFFFD, 0], [0x3C00, 0x3800]], np.uint16).view(np.uint8)
    x = np.random.default_rng(2723).standard_normal((1, 96)).astype(np.float32)
    (y,) = check(build, [(w, int(QT.Q4_1), 96, x, 1)], lambda w, q, x: mul_mat(w, q, x, path))
    assert bits(y)[0, 0] == 0xFFFFA000  # fp16 0xFFFD as float32: d's NaN, not m's (0x7FC02000)


# ---- mul_mat_id -----------------------------------------------------------------------------------------

ID_TYPES = KQ23 + LEGACY


@pytest.mark.parametrize("qtype", ID_TYPES, ids=[q.name for q in ID_TYPES])
@pytest.mark.parametrize("build", BUILDS)
def test_mul_mat_id_q_bit_exact(build, qtype):
    path = build_info(build).path
    rng = np.random.default_rng([2722, int(qtype)])
    E, K, T, n_used = 4, 256, 12, 3
    for N in (16, 13):
        w = np.stack([weight_bytes(qtype, N, K, rng) for _ in range(E)])
        # distinct experts per token; expert 0 in slot 0 of all 12 tokens (K-quants: the tiled kernel, >= 8 rows)
        ids = np.array([[0, *rng.permutation([1, 2, 3])[:2]] for _ in range(T)], np.int32)
        ids[:3, 1], ids[:3, 2] = 3, rng.choice([1, 2], 3)  # expert 3 first in slot 1
        for n_x in (1, n_used):  # one activation row shared by all slots (gate/up) or one per slot (down)
            x = acts(rng, T * n_x, K).reshape(T, n_x, K)
            for nth in (1, 2):
                got = on_build(build, g_mul_mat_id, w, int(qtype), K, x, ids, nth)
                want = mul_mat_id(w, qtype, x, ids, path)
                assert np.array_equal(bits(got), bits(want)), (N, n_x, nth)
    # can fail: expert 0's 12 rows through the other kernel (tinyBLAS / vec_dot formula) give other bits
    rows = x[:, 0]  # (12, K): slot 0 of every token is expert 0
    if qtype in KQ23:
        wrong = mulmat_k.mul_mat_k(w[0], qtype, rows, path, tiled=False)
    elif qtype == QT.IQ4_NL:
        wrong = mulmat_q.mul_mat_q(w[0], qtype, rows, path, True)
    else:
        wrong = generic_legacy(w[0], qtype, rows)
    assert (bits(wrong) != bits(got[:, 0])).any()
