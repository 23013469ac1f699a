"""The row-lane kernels (kernels/lanes*.py) give the plain path's numbers bit for bit, for every type.

The plain product is defined by ``matmul._matmul_rows``: each output the float64 sum, in increasing
column order, of the exact products of the row decoder's float32 weights with the activations. The
lane kernels compute the same sums 16 rows side by side (raw rows with gathers, or ``kernels.pack``'s
layout), with at most MAX_T activation rows per pass (the narrow path) or, from WIDE_FROM rows on, each
block decoded once into a float64 buffer (the wide path). Here, for every weight type:

* raw and packed, T = 1 … 5 (narrow), 9 and 13 (wide), normal and extreme scales: the same bits as
  ``_matmul_rows`` (two 16-row groups; the five rows of the tail take ``_matmul_rows`` itself);
* random scale bytes (inf / NaN scales): NaN in the same places, every other output the same bits;
* the instruction-set levels (kernels/lanes/ir.py): the generic twin (and AVX2 on an AVX-512
  host) equals the default level bit for bit, for the types with ISA-specific code;
* the float64 routes (Q4_K and Q5_K where their d/dmin exponents make the float32 weights exact, MXFP4
  and the IQ4 tables where no product overflows): blocks on both sides of each condition, the same bits.
"""

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT

import kernels
from kernels.lanes import pack as lanes
from kernels.lanes.ir import BLOCK, ISA, ISA_NAMES, LANE_TYPES, LANES, TARGET_ISA
from kernels.matmul import _matmul_rows_serial
from conftest import stored
from kernels.testing import random_rows

TYPES = kernels.WEIGHT_TYPES
IDS = [t.name for t in TYPES]
N, K = 37, 512  # two 16-row groups and a tail of 5 rows; two K-quant super-blocks, two wide-path spans


def rows_reference(w, qtype, x):
    """The plain numba path, row by row (``_matmul_rows``; its serial twin, which the products' tails of a
    few rows take too, so no type compiles a kernel for the reference alone: the twins differ only in which
    thread computes an output, tests/test_perf_invariants.py), as float32 (T, N)."""
    out = np.zeros((x.shape[0], w.shape[0]), dtype=np.float32)
    _matmul_rows_serial(qtype)(stored(w), x.astype(np.float64), out)
    return out


def assert_same_bits(got, ref, what, nan_ok=False):
    """Equal bit for bit; with ``nan_ok``, any NaN matches any NaN (fma propagates NaNs its own way)."""
    nan = np.isnan(ref) if nan_ok else np.zeros(ref.shape, bool)
    assert np.array_equal(np.isnan(got) & nan, nan), f"{what}: NaN in other places"
    bad = (got.view(np.uint32) != ref.view(np.uint32)) & ~nan
    assert not bad.any(), f"{what}: {bad.sum()} outputs differ, first at {np.argwhere(bad)[0]}"


def activations(rng, T, k=K):
    x = rng.standard_normal((T, k)).astype(np.float32)
    x[0, :5] = 0.0
    x[min(1, T - 1), 3] = np.float32(1e-30)
    return x


def test_every_weight_type_has_a_lane_kernel():
    assert set(LANE_TYPES) == set(TYPES)
    assert all(lanes.supported(t) for t in TYPES)


@pytest.mark.parametrize("scales", ["normal", "extreme"])
@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_lane_kernels_equal_plain_rows(qtype, scales):
    rng = np.random.default_rng([int(qtype), 7])
    w = random_rows(qtype, N, K, rng, scales=scales)
    packed = kernels.pack(w, qtype)
    assert isinstance(packed, kernels.PackedRows)
    x = activations(rng, 13)
    for T in (1, 2, 3, 4, 5, 9, 13):
        ref = rows_reference(w, qtype, x[:T])
        assert_same_bits(kernels.matmul(w, qtype, x[:T]), ref, f"lanes, T={T}")
        assert_same_bits(kernels.matmul(packed, qtype, x[:T]), ref, f"packed, T={T}")


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_lane_kernels_nan_scales(qtype):
    """Raw random bytes make inf/NaN scales (and, for the float types, values): NaN where the plain
    path has NaN (its sign and payload may differ), the same bits everywhere else."""
    rng = np.random.default_rng([int(qtype), 8])
    w = random_rows(qtype, 32, K, rng, scales="raw")
    if qtype in (QT.F32, QT.F16, QT.BF16):  # random_rows draws finite floats: use raw bit patterns
        w = rng.integers(0, 256, (32, np.ascontiguousarray(w).view(np.uint8).shape[1]), dtype=np.uint8)
    x = activations(rng, 9)
    for T in (1, 9):
        ref = rows_reference(w, qtype, x[:T])
        assert_same_bits(kernels.matmul(w, qtype, x[:T]), ref, f"lanes, T={T}", nan_ok=True)
        assert_same_bits(kernels.matmul(kernels.pack(w, qtype), qtype, x[:T]), ref, f"packed, T={T}", nan_ok=True)


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.Q6_K], ids=lambda q: q.name)
def test_codes_with_one_non_finite_scale(qtype):
    """Packed Q8_0 / Q6_K form a block's weights by ``_scaled_codes``, and raw Q6_K by ``_offset_codes64``,
    only where all the lanes' d are finite: one row's d set to inf (or NaN) sends that block of its group
    down the plain product — inf·q stays ±inf, not the NaN of the other route — and every other block
    and row keeps its bits."""
    rng = np.random.default_rng([int(qtype), 11])
    w = random_rows(qtype, 32, K, rng)
    wb = np.ascontiguousarray(w).view(np.uint8).reshape(32, -1)
    size, block = lanes.TYPE_SIZE[int(qtype)], BLOCK[int(qtype)]
    d_at = 0 if qtype == QT.Q8_0 else 208  # the f16 d of a block
    for row, blk, bits in ((3, 0, 0x7C00), (20, 1, 0xFC00), (9, K // block - 1, 0x7E00)):  # +inf, −inf, NaN
        at = blk * size
        wb[row, at + d_at : at + d_at + 2] = np.array([bits], np.uint16).view(np.uint8)
        if qtype == QT.Q8_0:
            wb[row, at + 2 : at + 34] = 1  # every code 1
        else:
            wb[row, at : at + 192] = [0x11] * 128 + [0] * 64  # every code q − 32 = −31
            wb[row, at + 192 : at + 208] = 1  # every sub-block scale 1
    p = kernels.pack(wb, qtype)
    x = np.abs(activations(rng, 9)) + np.float32(0.5)  # positive: an infinite d gives ±inf, not inf − inf
    for T in (1, 2, 4, 9):
        ref = rows_reference(wb, qtype, x[:T])
        assert np.isinf(ref[:, [3, 20]]).all() and np.isnan(ref[:, 9]).all() and np.isfinite(np.delete(ref, [3, 9, 20], 1)).all()
        for level in range(TARGET_ISA + 1):  # the generic level and AVX2 take the _scaled_codes branch
            got, got_raw = np.zeros((T, 32), np.float32), np.zeros((T, 32), np.float32)
            lanes.matmul_packed(p, x[:T].astype(np.float64), got, level)
            assert_same_bits(got, ref, f"packed, {ISA_NAMES[level]}, T={T}", nan_ok=True)
            assert lanes.matmul_lanes(stored(wb), qtype, x[:T].astype(np.float64), got_raw, level) == 32
            assert_same_bits(got_raw, ref, f"raw, {ISA_NAMES[level]}, T={T}", nan_ok=True)


#: Q4_K / Q5_K: block bytes, code bits, offset of qs (Q5_K's qh lies at 16 … 47).
K_QUANTS = {QT.Q4_K: (144, 4, 16), QT.Q5_K: (176, 5, 48)}


def k_quant_float64_admitted(qtype, d, dmin):
    """``lanes_exact64._k_quant_exact`` per block, in numpy: d, dmin finite and either zero or with float32
    exponents E such that max(E_d + 7 + code bits, E_m + 7) − min(E_d, E_m) ≤ 13."""
    bits = K_QUANTS[qtype][1]
    ed, em = ((np.asarray(v, np.float32).view(np.uint32) >> 23).astype(np.int64) & 0xFF for v in (d, dmin))
    fits = np.maximum(ed + 7 + bits, em + 7) - np.minimum(ed, em) <= 13
    return (ed != 255) & (em != 255) & (fits | (d == 0) | (dmin == 0))


def k_quant_exact_values(qtype, w):
    """Q4_K / Q5_K rows' weights d·sc·q − dmin·m in float64 (exact: ≤ 11 + 6 + 5 bits against the f16 dmin·m)."""
    size, _, qs_at = K_QUANTS[qtype]
    b = w.reshape(len(w), -1, size)
    d, dmin = (b[..., o : o + 2].copy().view(np.float16)[..., 0].astype(np.float64) for o in (0, 2))
    s = b[..., 4:16].astype(np.int64)
    sc = np.concatenate([s[..., 0:4] & 63, (s[..., 8:12] & 15) | ((s[..., 0:4] >> 6) << 4)], axis=-1)
    m = np.concatenate([s[..., 4:8] & 63, (s[..., 8:12] >> 4) | ((s[..., 4:8] >> 6) << 4)], axis=-1)
    qs = b[..., qs_at : qs_at + 128].reshape(len(w), -1, 4, 32).astype(np.int64)  # [row, block, c, l]
    q = np.stack([qs & 15, qs >> 4], axis=3)  # [row, block, c, high, l]: sub-block 2c + high
    if qtype == QT.Q5_K:  # the fifth bit: bit 2c + high of qh[l]
        qh = b[..., 16:48].astype(np.int64)[:, :, None, None, :]
        q = q | (((qh >> (2 * np.arange(4)[:, None, None] + np.arange(2)[:, None])) & 1) << 4)
    q = q.reshape(len(w), -1, 8, 32)
    v = (d[..., None] * sc)[..., None] * q - (dmin[..., None] * m)[..., None]
    return v.reshape(len(w), -1)


def k_quant_rows(rng, qtype, n, k, delta):
    """n Q4_K / Q5_K rows whose every block has E(dmin) − E(d) = ``delta`` (an int, or an array per row),
    full random f16 mantissas, random signs, random 6-bit sc, m and codes — with every extreme present
    (sc = m = 63, codes 0 and the largest) — so any rounding the float32 decoder does shows up in the sums."""
    size, _, qs_at = K_QUANTS[qtype]
    blocks = k // 256
    w = rng.integers(0, 256, (n, blocks, size), dtype=np.uint8)
    w[:, :, 4:16] = rng.choice([0xFF, 0x00, 0x3F, 0xC0], size=(n, blocks, 12), p=[0.25, 0.05, 0.05, 0.65]) | \
        rng.integers(0, 256, (n, blocks, 12), dtype=np.uint8)  # mostly large 6-bit sc and m
    w[:, 0, qs_at : qs_at + 8] = [0x00, 0xFF, 0x0F, 0xF0] * 2
    if qtype == QT.Q5_K:
        w[:, 0, 16:20] = [0x00, 0xFF, 0x55, 0xAA]
    e_d = rng.integers(-12, 4, (n, blocks))
    e_m = e_d + np.broadcast_to(np.asarray(delta).reshape(-1, 1), (n, blocks))
    mant = lambda: 1.0 + rng.integers(0, 1024, (n, blocks)) / 1024.0
    sign = lambda: rng.choice([-1.0, 1.0], (n, blocks), p=[0.2, 0.8])
    d = (sign() * mant() * 2.0 ** e_d).astype(np.float16)
    dmin = (sign() * mant() * 2.0 ** e_m).astype(np.float16)
    w[:, :, 0:2] = d[..., None].view(np.uint8)
    w[:, :, 2:4] = dmin[..., None].view(np.uint8)
    return w.reshape(n, -1), d.astype(np.float32), dmin.astype(np.float32)


#: Per type: the admitted exponent gaps, gaps outside the bound, and of those the ones whose groups round.
K_QUANT_GAPS = {QT.Q4_K: (range(-2, 7), (-3, 7, -4, 8), (-4, 8)), QT.Q5_K: (range(-1, 7), (-2, 7, -4, 8), (-4, 8))}


@pytest.mark.parametrize("qtype", list(K_QUANTS), ids=lambda q: q.name)
def test_k_quant_float64_route(qtype, monkeypatch):
    """Q4_K and Q5_K form their weights in float64 (``lanes_exact64._k_quant_chunk64``) where
    ``_k_quant_exact`` admits a block in all 16 lanes — exponent gaps E(dmin) − E(d) from −2 (Q5_K: −1) to
    6, zero d or dmin — and in float32 otherwise: the same bits as the row decoder either way, at every
    level, raw and packed, narrow and wide. The groups at gaps −4 and 8 (and one lane of a group otherwise
    admitted) make the float32 decoder round: the sums would differ if those blocks took the float64 route.
    Every product here runs on the serial kernels (whose block code the parallel ones share; serial equals
    parallel: tests/test_perf_invariants.py), so each level compiles the narrow and wide kernels once."""
    monkeypatch.setattr(lanes, "SERIAL_BELOW", 1 << 62)  # T = 4 and 9 would otherwise take the prange kernels
    size = K_QUANTS[qtype][0]
    admitted_gaps, outside, rounding = K_QUANT_GAPS[qtype]
    rng = np.random.default_rng([int(qtype), 14])
    k = 1024
    groups = [np.resize(np.repeat(list(admitted_gaps), 2), 16)] + [[g] * 16 for g in outside] + [[3] * 15 + [8]]
    parts = [k_quant_rows(rng, qtype, 16, k, np.array(gaps)) for gaps in groups]
    w = np.concatenate([p[0] for p in parts])
    d, dmin = np.concatenate([p[1] for p in parts]), np.concatenate([p[2] for p in parts])
    wv = w.reshape(len(w), -1, size)
    for row, blk, which in [(1, 0, "d"), (4, 1, "dmin"), (5, 2, "d"), (5, 3, "dmin")]:  # zeros in the admitted group
        wv[row, blk, 0:2 if which == "d" else 2:4] = 0
        (d if which == "d" else dmin)[row, blk] = 0.0
    admitted = k_quant_float64_admitted(qtype, d, dmin).reshape(len(groups), 16, -1).all(axis=1)
    assert admitted[0].all() and not admitted[1:].any()
    # The float32 decoder's weights are exact in the admitted group and round in the groups at the gaps in
    # ``rounding`` and in the last one (the others lie outside the bound, which allows for d and dmin of
    # opposite signs, but happen not to round here).
    from kernels.plain.dequant import dequantize

    rounded = dequantize(w, qtype).reshape(len(w), -1) != k_quant_exact_values(qtype, w)
    assert not rounded[:16].any()
    assert all(rounded[16 * g : 16 * g + 16].any() for g in [1 + outside.index(r) for r in rounding] + [len(groups) - 1])
    p = kernels.pack(w, qtype)
    x64 = activations(rng, 9, k).astype(np.float64)
    for T in (1, 2, 4, 9):
        ref = rows_reference(w, qtype, x64[:T].astype(np.float32))
        for level in range(TARGET_ISA + 1):
            got_raw, got_packed = np.zeros((T, len(w)), np.float32), np.zeros((T, len(w)), np.float32)
            lanes.matmul_lanes(stored(w), qtype, x64[:T], got_raw, level)
            lanes.matmul_packed(p, x64[:T], got_packed, level)
            assert_same_bits(got_raw, ref, f"raw, {ISA_NAMES[level]}, T={T}")
            assert_same_bits(got_packed, ref, f"packed, {ISA_NAMES[level]}, T={T}")


@pytest.mark.parametrize("qtype", [QT.Q8_0, QT.F16, QT.Q4_K], ids=lambda q: q.name)
def test_wide_path_with_a_partial_span(qtype):
    """K not a multiple of the wide path's 256-column span (Q8_0, F16: 288 = 256 + 32 columns), and a
    long batch (T = 11: passes of eight or four rows, then three)."""
    k = 288 if BLOCK[int(qtype)] <= 32 else 768
    rng = np.random.default_rng([int(qtype), 9])
    w = random_rows(qtype, 32, k, rng)
    x = activations(rng, 11, k)
    ref = rows_reference(w, qtype, x)
    assert_same_bits(kernels.matmul(w, qtype, x), ref, "lanes")
    assert_same_bits(kernels.matmul(kernels.pack(w, qtype), qtype, x), ref, "packed")


# The types whose emitters have ISA-specific code: the 16-entry table lookups (MXFP4, IQ4_XS; IQ4_NL
# shares IQ4_XS's), the int8 → float64 conversion of the packed codes and, below AVX-512, their
# ``_scaled_codes`` branch (Q6_K, Q8_0). Every type changes its vector width with the level (8 or, for
# one activation row at AVX2, 16 lanes below AVX-512), which these cover too.
ISA_TYPES = [QT.MXFP4, QT.IQ4_XS, QT.Q6_K, QT.Q8_0]


@pytest.mark.parametrize("qtype", ISA_TYPES, ids=lambda q: q.name)
def test_isa_levels_give_the_same_bits(qtype):
    """Every level this host can run (generic IR; AVX2; AVX-512) equals the default level bit for bit,
    raw and packed, narrow (and, for one type, wide). (On an ARM64 host only the generic level exists.)"""
    rng = np.random.default_rng([int(qtype), 10])
    w = random_rows(qtype, 32, K, rng, scales="extreme")
    wb = stored(w)
    p = kernels.pack(w, qtype)
    x64 = activations(rng, 9).astype(np.float64)
    for T in (1, 9) if qtype == QT.MXFP4 else (1,):  # the wide path decodes with the same emitters
        want_raw, want_packed = np.zeros((T, 32), np.float32), np.zeros((T, 32), np.float32)
        lanes.matmul_lanes(wb, qtype, x64[:T], want_raw, ISA)
        lanes.matmul_packed(p, x64[:T], want_packed, ISA)
        assert_same_bits(want_packed, want_raw, f"packed vs raw at {ISA_NAMES[ISA]}")
        for level in range(TARGET_ISA + 1):
            if level == ISA:
                continue
            got_raw, got_packed = np.zeros((T, 32), np.float32), np.zeros((T, 32), np.float32)
            assert lanes.matmul_lanes(wb, qtype, x64[:T], got_raw, level) == 32
            lanes.matmul_packed(p, x64[:T], got_packed, level)
            assert_same_bits(got_raw, want_raw, f"raw, {ISA_NAMES[level]}, T={T}")
            assert_same_bits(got_packed, want_packed, f"packed, {ISA_NAMES[level]}, T={T}")


def test_isa_variants_are_named_and_cached_apart():
    """A level other than the default is its own kernel, named after the level (numba caches it apart:
    the level is a value its closure captures)."""
    if ISA == 0:
        pytest.skip("the default level is the generic one")
    generic = lanes._matmul_lanes_serial(QT.Q8_0, 0, False)
    assert generic.py_func.__name__ == "matmul_lanes_serial_q8_0_generic"
    assert lanes._matmul_lanes_serial(QT.Q8_0, ISA, False).py_func.__name__ == "matmul_lanes_serial_q8_0"
    assert generic is not lanes._matmul_lanes_serial(QT.Q8_0, ISA, False)
    assert 0 in [c.cell_contents for c in generic.py_func.__closure__ if isinstance(c.cell_contents, int)]


def test_pack_keeps_what_it_cannot_pack():
    rng = np.random.default_rng(11)
    w = random_rows(QT.Q4_K, LANES - 1, K, rng)  # fewer rows than a group
    assert kernels.pack(w, QT.Q4_K) is w
    f = random_rows(QT.F16, 32, 40, rng)  # rows of 40 values: not whole 16-value blocks
    assert kernels.pack(f, QT.F16) is f
    x = activations(rng, 2, 40)
    assert_same_bits(kernels.matmul(f, QT.F16, x), rows_reference(f, QT.F16, x), "F16, K = 40")


# --------------------------------------------------------------------------------------------
# act_quant (--emulate): the lane kernels of kernels/lanes/act.py equal the scalar dots of kernels/ggml/actdots.py

ACT_TYPES = [QT.Q8_0, QT.MXFP4, QT.Q4_K, QT.Q5_K, QT.Q6_K]


def act_reference(w, qtype, x):
    """``actdots``' scalar kernels alone (the definition the lane kernels must equal)."""
    from kernels.ggml import actdots
    from kernels.ggml.actquant import _q8_0_rows, _q8_k_rows

    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    if kernels.layout(qtype).vec_dot_type == QT.Q8_0:
        qs, d, _ = _q8_0_rows(x, with_s=False)
        actdots._matmul_q8_0(int(qtype))(stored(w), qs, d, out)
    else:
        qs, d, bsums = _q8_k_rows(x)
        actdots._matmul_q8_k(int(qtype))(stored(w), qs, d, bsums, out)
    return out


@pytest.mark.parametrize("scales", ["normal", "extreme", "raw"])
@pytest.mark.parametrize("qtype", ACT_TYPES, ids=lambda q: q.name)
def test_act_quant_lane_kernels_equal_the_scalar_dots(qtype, scales):
    from kernels.lanes.act import ACT_LANE_TYPES

    assert int(qtype) in ACT_LANE_TYPES
    rng = np.random.default_rng([int(qtype), 12])
    w = random_rows(qtype, N, K, rng, scales=scales)
    x = activations(rng, 6)
    x[2] *= np.float32(1e-3)
    x[3, :256] = 0.0  # an all-zero Q8_K block (d = 0)
    packed = kernels.pack(w, qtype)
    assert isinstance(packed, kernels.PackedRows)
    for T in (1, 2, 3, 4, 6):
        ref = act_reference(w, qtype, x[:T])
        assert_same_bits(kernels.matmul(w, qtype, x[:T], act_quant=True), ref, f"T={T}", nan_ok=scales == "raw")
        assert_same_bits(kernels.matmul(packed, qtype, x[:T], act_quant=True), ref, f"packed, T={T}", nan_ok=scales == "raw")


def test_act_quant_isa_levels_give_the_same_bits():
    """MXFP4's value table is looked up with vpshufb on x86 and computed in generic IR: the same bits."""
    from kernels.ggml.actquant import _q8_0_rows
    from kernels.lanes.act import matmul_act_lanes

    rng = np.random.default_rng(13)
    w = stored(random_rows(QT.MXFP4, 32, K, rng, scales="extreme"))
    qs, d, _ = _q8_0_rows(activations(rng, 4), with_s=False)
    yx = np.zeros((4, 1), np.int16)
    want = np.zeros((4, 32), np.float32)
    matmul_act_lanes(w, QT.MXFP4, qs, d, yx, want, ISA)
    for level in range(TARGET_ISA + 1):
        got = np.zeros((4, 32), np.float32)
        assert matmul_act_lanes(w, QT.MXFP4, qs, d, yx, got, level) == 32
        assert_same_bits(got, want, ISA_NAMES[level])
