"""llama-perplexity's KL-divergence base files in refimpl, without llama.cpp: the row quantization against
an exact log-softmax, the layout, the chunking, the statistics against their definitions, and every
damaged file refused in one line (refimpl/oracle/kld_file.py, kld.py, kld_report.py). The same files
against the real llama-perplexity: tests/test_kld_llama.py; mutated files: tests/test_kld_fuzz.py."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest

from refimpl.oracle.kld_file import HEADER_BYTES, LOG_PROB_RANGE, Q_MAX, dequantize, quantize_rows, row_words

TEXT = Path(__file__).parent / "data" / "kjv-genesis-20.txt"  # KJV Genesis 20, a chapter held out of builtin:kjv's training
TINY = "builtin:tiny"  # F32, 512-token vocabulary
N_CTX = 16


def _exact_log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))


@pytest.mark.parametrize("n_vocab", [7, 512, 2048])
def test_a_row_decodes_to_the_log_softmax_within_half_a_step(n_vocab):
    """Each code is the exact log-probability, clamped at max - 16, to within half a quantization step (plus
    float32 rounding): perplexity.cpp:79-106. The header floats are the row's scale and clamped minimum; an
    odd vocabulary leaves one zero word of padding; a constant row has scale 0 and all codes 0."""
    rng = np.random.default_rng(n_vocab)
    logits = (rng.standard_normal((6, n_vocab)) * np.array([[0.1], [1], [3], [8], [20], [0]])).astype(np.float32)
    logits[1, :3] = logits[1].max()  # a tie at the top
    targets = rng.integers(0, n_vocab, len(logits))
    rows, nll = quantize_rows(logits, targets)
    assert rows.shape == (len(logits), row_words(n_vocab)) and rows.dtype == np.uint16
    scale, min_log_prob, decoded = dequantize(rows, n_vocab)
    exact = _exact_log_softmax(logits)
    floor = exact.max(axis=1, keepdims=True) - LOG_PROB_RANGE
    clamped = np.maximum(exact, floor)
    assert np.allclose(scale, (logits.max(1) - np.maximum(logits.min(1), logits.max(1) - 16)) / Q_MAX, rtol=1e-6, atol=0)
    assert np.allclose(min_log_prob, clamped.min(axis=1), rtol=0, atol=1e-5)
    err = np.abs(decoded - clamped)
    assert np.all(err <= scale[:, None] / 2 + 1e-5), err.max()
    assert np.all(rows[:, 4 : 4 + n_vocab][exact < floor - 1e-4] == 0)  # clamped entries: code 0
    assert np.all(rows[:, 4 + n_vocab :] == 0)  # the padding word of an odd vocabulary
    assert scale[-1] == 0 and np.all(rows[-1, 4:] == 0)  # the constant row
    assert np.allclose(nll, -exact[np.arange(len(logits)), targets], rtol=0, atol=1e-5)


def _base(tmp_path, model=TINY, n_ctx=N_CTX, chunks=None, name="base.kld") -> Path:
    from refimpl.cli import main

    out = tmp_path / name
    argv = ["logits", model, "--kld-base", str(out), "--text", str(TEXT), "--ctx", str(n_ctx)]
    assert main(argv + (["--chunks", str(chunks)] if chunks else [])) == 0
    return out


def test_the_file_layout_and_the_chunking(fixture_cache, tmp_path, capsys):
    """Header, tokens and rows where perplexity.cpp puts them: the corpus tokenized with one trailing newline
    dropped, n_chunk = tokens // n_ctx (or --chunks), n_ctx - 1 - n_ctx/2 rows of 2*((V+1)/2) + 4 words per
    chunk, each the quantized log-softmax of the oracle's logits at positions n_ctx/2 .. n_ctx-2 of a fresh
    sequence."""
    from refimpl.fixtures.builtin import resolve_model
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward, load_model
    from refimpl.tokenizer import Tokenizer

    path = _base(tmp_path, chunks=3)
    assert "Final estimate: PPL = " in capsys.readouterr().err
    model = load_model(resolve_model(TINY))
    tok = Tokenizer.from_gguf(model.file.gguf)
    ids = tok.encode(TEXT.read_text()[:-1])
    assert TEXT.read_text().endswith(".\n") and ids != tok.encode(TEXT.read_text())
    data = path.read_bytes()
    assert data[:8] == b"_logits_" and struct.unpack_from("<3i", data, 8) == (N_CTX, 512, 3)
    assert np.array_equal(np.frombuffer(data, "<i4", 3 * N_CTX, HEADER_BYTES), ids[: 3 * N_CTX])
    first, scored, nv = N_CTX // 2, N_CTX - 1 - N_CTX // 2, row_words(512)
    assert len(data) == HEADER_BYTES + 4 * 3 * N_CTX + 2 * 3 * scored * nv
    rows = np.frombuffer(data, "<u2", offset=HEADER_BYTES + 4 * 3 * N_CTX).reshape(3, scored, nv)
    for c in range(3):
        chunk = ids[c * N_CTX : (c + 1) * N_CTX]
        logits, _, _ = forward(model, SeqState.fresh(model.config), chunk)
        expected, _ = quantize_rows(logits[first : N_CTX - 1], np.asarray(chunk[first + 1 :]))
        assert np.array_equal(rows[c], expected), c


def test_the_oracle_against_its_own_base_is_zero_up_to_the_quantization(fixture_cache, tmp_path, capsys):
    """audit MODEL --kld-base (a base of MODEL): every position's top token agrees, and |KLD| at each
    position is at most the largest log-probability error of the file, half a step of 16/65535."""
    from refimpl.cli import main

    path = _base(tmp_path, chunks=15)  # 15 × 7 = 105 positions: llama-perplexity's summary needs 100
    capsys.readouterr()
    assert main(["audit", TINY, "--kld-base", str(path), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["n_chunk"] == 15 and rep["count"] == 15 * (N_CTX - 1 - N_CTX // 2) == len(rep["positions"])
    assert rep["same_top"] == 1 and rep["n_disagreements"] == 0 and rep["exit"] == 0
    assert max(abs(p["kld"]) for p in rep["positions"]) <= LOG_PROB_RANGE / Q_MAX
    assert abs(np.log(rep["ppl"] / rep["ppl_base"])) <= LOG_PROB_RANGE / Q_MAX
    assert main(["audit", TINY, "--kld-base", str(path)]) == 0
    text = capsys.readouterr().out
    for line in ("chunk             PPL", "Mean PPL(Q)                   :", "Mean    KLD:", "Same top p: 100.000 ±",
                 "worst positions by KL divergence", "result: top tokens agree, 0 wrong → exit 0"):
        assert line in text, line


def test_the_statistics_follow_their_definitions(fixture_cache, tmp_path, capsys):
    """Against another model's base (tiny q8_0's rows, tiny f32 as Q): per position, KLD = Σ p_base·(log p_base
    − log q) over p_base > e^-16, Δp = q(next) − p_base(next), same top = the argmaxes agree — computed here
    in float64 from the file and the oracle's logits; a disagreement far from a near-tie exits 1."""
    from refimpl.cli import main
    from refimpl.fixtures.builtin import resolve_model
    from refimpl.model.state import SeqState
    from refimpl.model.trunk import forward, load_model
    from refimpl.oracle.kld_file import read_kld_base

    path = _base(tmp_path, model="builtin:tiny/q4_k_m", chunks=12)
    capsys.readouterr()
    rc = main(["audit", TINY, "--kld-base", str(path), "--json"])
    rep = json.loads(capsys.readouterr().out)
    assert rc == rep["exit"] == int(rep["n_wrong"] > 0)
    base, model = read_kld_base(path, 512), load_model(resolve_model(TINY))
    first = N_CTX // 2
    for c in range(base.n_chunk):
        logits, _, _ = forward(model, SeqState.fresh(model.config), base.chunk_tokens(c))
        q = _exact_log_softmax(logits[first : N_CTX - 1])
        _, _, p_base = dequantize(np.asarray(base.rows[c]), 512)
        p_base = p_base.astype(np.float64)
        kept = p_base > -LOG_PROB_RANGE
        kld = np.where(kept, np.exp(p_base) * (p_base - q), 0).sum(axis=1)
        nxt = base.targets(c)
        got = rep["positions"][c * base.n_scored : (c + 1) * base.n_scored]
        assert np.allclose([p["kld"] for p in got], kld, rtol=1e-4, atol=1e-6)
        r = np.arange(len(nxt))
        assert np.allclose([p["p_diff"] for p in got], np.exp(q[r, nxt]) - np.exp(p_base[r, nxt]), atol=1e-6)
        assert [p["top"] for p in got] == list(q.argmax(1)) and [p["top_base"] for p in got] == list(p_base.argmax(1))
    klds = np.array([p["kld"] for p in rep["positions"]])
    assert rep["mean_kld"] == pytest.approx(klds.mean(), rel=1e-9)
    assert rep["mean_kld_uncertainty"] == pytest.approx(klds.std() / np.sqrt(len(klds) - 1), rel=1e-6)
    assert rep["mean_kld"] > 10 * LOG_PROB_RANGE / Q_MAX  # another model: far above the quantization floor (0.019 vs 2.4e-4)


def test_the_percentile_is_llama_perplexitys():
    """perplexity.cpp:1930-1936: linear interpolation at fraction·(n-1); the median: the middle, or the mean of the two."""
    from refimpl.oracle.kld_report import median, percentile

    v = np.array([0, 1, 2, 10], dtype=np.float32)
    assert percentile(v, 0.5) == 1.5 and percentile(v, 0.9) == pytest.approx(7.6, rel=1e-6)
    assert percentile(v, 0) == 0 and percentile(v, 1) == 10 and median(v) == 1.5 and median(v[:3]) == 1


def test_bos_replaces_the_first_token_of_each_chunk_only_in_the_forward_pass():
    """perplexity.cpp:564-579: with a vocabulary that adds BOS the chunk is decoded with BOS first; the
    file keeps the corpus token (:523)."""
    from types import SimpleNamespace

    from refimpl.oracle.kld import _chunk_input

    chunk = np.array([5, 6, 7], dtype=np.int32)
    assert _chunk_input(chunk, SimpleNamespace(add_bos=True, bos_id=1)) == [1, 6, 7]
    assert _chunk_input(chunk, SimpleNamespace(add_bos=False, bos_id=1)) == [5, 6, 7]
    assert list(chunk) == [5, 6, 7]


# ---- bad input: one line, exit 2 ----------------------------------------------------------------------


def _damaged(data: bytes, how: str) -> bytes:
    n_ctx, n_vocab, n_chunk = struct.unpack_from("<3i", data, 8)
    rows_at = HEADER_BYTES + 4 * n_ctx * n_chunk
    put = lambda at, fmt, *v: data[:at] + struct.pack(fmt, *v) + data[at + struct.calcsize(fmt):]  # noqa: E731
    return {
        "empty": b"",
        "half magic": data[:5],
        "truncated header": data[:14],
        "truncated tokens": data[: HEADER_BYTES + 10],
        "truncated rows": data[:-3],
        "trailing bytes": data + b"\0\0",
        "wrong magic": b"_logitz_" + data[8:],
        "a GGUF": b"GGUF" + data[4:],
        "n_vocab 2048": put(12, "<i", 2048),
        "n_ctx 0": put(8, "<i", 0),
        "n_ctx -1": put(8, "<i", -1),
        "n_ctx 2^31-1": put(8, "<i", 2**31 - 1),
        "n_chunk 0": put(16, "<i", 0),
        "n_chunk -5": put(16, "<i", -5),
        "n_chunk 2^31-1": put(16, "<i", 2**31 - 1),
        "token -1": put(HEADER_BYTES + 8, "<i", -1),
        "token 512": put(HEADER_BYTES + 4 * (n_ctx + 3), "<i", n_vocab),
        "scale NaN": put(rows_at, "<f", float("nan")),
        "scale -1": put(rows_at, "<f", -1.0),
        "min_log_prob +inf": put(rows_at + 4, "<f", float("inf")),
    }[how]


MESSAGES = {"empty": "truncated header", "half magic": "truncated header", "truncated header": "truncated header",
            "truncated tokens": "truncated", "truncated rows": "truncated", "trailing bytes": "trailing bytes",
            "wrong magic": "not a llama-perplexity KL-divergence base file", "a GGUF": "not a llama-perplexity",
            "n_vocab 2048": "vocabulary of 2048 tokens, the model has 512", "n_ctx 0": "scores no position",
            "n_ctx -1": "scores no position", "n_ctx 2^31-1": "truncated", "n_chunk 0": "no chunk",
            "n_chunk -5": "no chunk", "n_chunk 2^31-1": "truncated", "token -1": "outside the vocabulary [0, 512)",
            "token 512": "is 512, outside the vocabulary", "scale NaN": "is not a row llama.cpp writes",
            "scale -1": "is not a row llama.cpp writes", "min_log_prob +inf": "is not a row llama.cpp writes"}


@pytest.fixture(scope="module")
def small_base(fixture_cache, tmp_path_factory) -> bytes:
    return _base(tmp_path_factory.mktemp("kld"), chunks=2).read_bytes()


def _one_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines()
           if not line.startswith(("refimpl: compil", "refimpl:   [", "refimpl: no model given"))]
    assert len(err) == 1 and err[0].startswith("refimpl: error: "), err
    return err[0]


@pytest.mark.parametrize("how", list(MESSAGES))
def test_a_damaged_base_file_is_refused_in_one_line(small_base, tmp_path, capsys, how):
    from refimpl.cli import main

    path = tmp_path / "bad.kld"
    path.write_bytes(_damaged(small_base, how))
    capsys.readouterr()
    assert main(["audit", TINY, "--kld-base", str(path)]) == 2
    assert MESSAGES[how] in _one_error(capsys)


@pytest.mark.parametrize("argv, message", [
    (["audit", TINY, "--kld-base", "missing.kld"], "--kld-base missing.kld: no such file"),
    (["audit", TINY, "--kld-base", "."], "is a directory"),
    (["audit", TINY, "s.json", "--kld-base", "b.kld"], "--kld-base takes no STREAM"),
    (["audit", "s.json", "--kld-base", "b.kld"], "needs a MODEL"),
    (["audit", TINY, "--kld-base", "b.kld", "--prompt", "x"], "--prompt does not go with --kld-base"),
    (["audit", TINY, "--kld-base", "b.kld", "--jobs", "2"], "--jobs does not go with --kld-base"),
    (["audit", TINY, "--kld-base", "b.kld", "--threshold", "0"], "--threshold must be in (0, 1)"),
    (["logits", TINY, "--kld-base", "o.kld"], "--kld-base needs --text FILE"),
    (["logits", TINY, "--kld-base", "o.kld", "--text", "t.txt", "--tokens", "1"], "--tokens does not go with --kld-base"),
    (["logits", TINY, "--text", "t.txt", "--tokens", "1", "--out", "o.npy"], "--text goes with --kld-base"),
    (["logits", TINY, "--ctx", "64", "--tokens", "1", "--out", "o.npy"], "--ctx goes with --kld-base"),
    (["logits", TINY, "--kld-base", "o.kld", "--text", "missing.txt"], "--text missing.txt: no such file"),
    (["logits", TINY, "--kld-base", "o.kld", "--text", "t.txt", "--ctx", "2"], "n_ctx must be at least 3"),
    (["logits", TINY, "--kld-base", "o.kld", "--text", "t.txt", "--chunks", "0"], "--chunks 0: at least one chunk"),
    (["logits", TINY, "--kld-base", "o.kld", "--text", "t.txt", "--ctx", "4096"], "tokens; a context of 4096 needs at least 8192"),
    (["logits", TINY, "--kld-base", "o.kld", "--text", "latin1.txt", "--ctx", "4"], "not UTF-8 text"),
    (["logits", TINY, "--kld-base", ".", "--text", "t.txt"], "cannot write --kld-base .: it is a directory"),
])
def test_bad_flags_and_files_are_refused_in_one_line(small_base, tmp_path, capsys, monkeypatch, argv, message):
    from refimpl.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.json").write_text("[1, 2]")
    (tmp_path / "b.kld").write_bytes(small_base)
    (tmp_path / "t.txt").write_bytes(TEXT.read_bytes())
    (tmp_path / "latin1.txt").write_bytes("caf\xe9 au lait, caf\xe9 noir".encode("latin-1"))
    capsys.readouterr()
    assert main(argv) == 2
    assert message in _one_error(capsys)
    assert not (tmp_path / "o.kld").exists() and not (tmp_path / "o.npy").exists()
