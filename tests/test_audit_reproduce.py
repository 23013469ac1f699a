"""``refimpl audit --emulate=ggml --draft N``: the oracle predicts llama.cpp's own stream for the engine's batch
schedule (refimpl.oracle.reproduce) and gates on byte identity with it (docs/validating-an-engine.md §3g).

The engine here is llama.cpp itself (tests/llama_spec.py: its draft-mtp loop with its defaults, on the
libggml llama-cpp-python loads): its draft-3 stream is "identical to llama.cpp's predicted draft-3 stream",
exit 0; the same stream with one token changed is "not reproduced", exit 1; without --emulate=ggml the
audit is what it was.
"""

from __future__ import annotations

import functools
import json

import pytest

from refimpl.cli import main
from refimpl.fixtures.builtin import TRAINED_PATH

pytestmark = pytest.mark.oracle

PROMPT = "And the LORD said unto Moses,"
N = 16


@functools.cache
def llama_draft3() -> tuple[list[int], list[int]]:
    """(prompt ids, llama.cpp's draft-3 stream of N tokens) with llama.cpp's defaults."""
    from llama_spec import llama_speculative
    from refimpl.tokenizer import Tokenizer

    ids = Tokenizer.from_gguf(TRAINED_PATH).encode(PROMPT)
    return ids, llama_speculative(TRAINED_PATH, ids, N, n_draft=3, defaults=True, n_threads=1).tokens


def write(tmp_path, name, tokens) -> str:
    ids, _ = llama_draft3()
    path = tmp_path / name
    path.write_text(json.dumps({"prompt_tokens": ids, "tokens": tokens}))
    return str(path)


def audit(capsys, *argv) -> tuple[int, str]:
    code = main(["audit", *argv])
    return code, capsys.readouterr().out


def test_llama_cpp_draft3_stream_is_identical_to_its_prediction(tmp_path, capsys):
    _, d3 = llama_draft3()
    path = write(tmp_path, "d3.json", d3)
    code, out = audit(capsys, str(TRAINED_PATH), path, "--emulate=ggml", "--draft", "3")
    assert code == 0, out
    assert "A: identical to llama.cpp's predicted draft-3 stream (16 tokens" in out
    assert out.rstrip().endswith("identical to llama.cpp's prediction → exit 0")
    code, out = audit(capsys, str(TRAINED_PATH), path, path, "--emulate=ggml", "--draft", "plain,3", "--json")
    rep = json.loads(out)
    assert code == rep["exit_code"] == 0 and rep["verdict"] == "identical"
    pred = rep["reproduce"]["predictions"]
    assert pred["A"]["schedule"] == "plain" and pred["B"]["schedule"] == "draft-3"
    assert pred["A"]["identical"] and pred["B"]["identical"] and pred["B"]["tokens"] == d3
    assert sum(r["drafted"] for r in pred["B"]["rounds"]) > 0  # the prediction ran 1+n verify batches


def test_one_changed_token_is_not_reproduced(tmp_path, capsys):
    _, d3 = llama_draft3()
    bad = list(d3)
    bad[5] = next(t for t in (1171, 1172) if t != d3[5])
    path = write(tmp_path, "bad.json", bad)
    code, out = audit(capsys, str(TRAINED_PATH), path, "--emulate=ggml", "--draft", "3")
    assert code == 1, out
    assert "first divergence at step 5" in out
    assert "  not reproduced: A differs from llama.cpp's predicted draft-3 stream at step 5" in out
    code, out = audit(capsys, str(TRAINED_PATH), path, "--emulate=ggml", "--draft", "3", "--json")
    rep = json.loads(out)
    assert code == rep["exit_code"] == rep["reproduce"]["exit_code"] == 1
    assert rep["divergence"]["reproduced"] is False
    assert rep["reproduce"]["predictions"]["A"]["first_difference"] == 5
    assert rep["reproduce"]["predictions"]["A"]["predicted_token"] == d3[5]


def test_without_ggml_nothing_changes(tmp_path, capsys):
    _, d3 = llama_draft3()
    path = write(tmp_path, "d3.json", d3)
    code, out = audit(capsys, str(TRAINED_PATH), path, "--json")
    rep = json.loads(out)
    assert code == 0 and "reproduce" not in rep
    assert "prediction" not in audit(capsys, str(TRAINED_PATH), path)[1]
    assert main(["audit", str(TRAINED_PATH), path, "--draft", "3"]) == 2  # --draft needs --emulate=ggml
    assert "--draft predicts llama.cpp's own stream" in capsys.readouterr().err
    assert main(["audit", str(TRAINED_PATH), path, "--emulate=ggml", "--draft", "9"]) == 2
    assert main(["audit", str(TRAINED_PATH), path, "--emulate=ggml", "--draft", "1,3"]) == 2  # two values, one stream


def test_a_reproduced_wrong_token_passes_the_gate():
    """The gate is byte identity with the prediction: a wrong token llama.cpp's own batches compute exits 0,
    a stream that keeps the oracle's argmax where llama.cpp's batches flip exits 1."""
    from refimpl.oracle.reproduce import Prediction, Reproduction, Schedule

    same = Reproduction({"A": Prediction("A", Schedule(3), [1, 2, 3], [1, 2, 3])}, [(1, "divergence", True)])
    assert same.exit_code == 0 and same.reproduced(2, ["A"])
    off = Reproduction({"A": Prediction("A", Schedule(3), [1, 9, 3], [1, 2, 3])})
    assert off.exit_code == 1 and off.reproduced(0, ["A"]) and not off.reproduced(1, ["A"])
    short = Prediction("A", Schedule(0), [1, 2], [1, 2, 3])  # llama.cpp stops (end of generation), the engine goes on
    assert short.first_difference == 2 and not short.identical


def test_a_stream_pair_of_one_schedule_is_predicted_once(monkeypatch):
    """``audit A B --draft 3``: both streams ask llama.cpp's draft-3 stream of the same length, so it is computed once
    (at full size each prediction is minutes); a different length or schedule is its own prediction."""
    from types import SimpleNamespace

    import refimpl.oracle.reproduce as R
    from refimpl.oracle.stream_file import Stream as S

    calls = []

    def fake(model, prompt, label, stream, schedule, ctx, eog_ids=frozenset()):
        calls.append((schedule.name, len(stream)))
        return R.Prediction(label, schedule, [7] * len(stream), list(stream), [{"accepted": 1, "drafted": 3}])

    monkeypatch.setattr(R, "predict", fake)
    rep = SimpleNamespace(prompt=[1], events=[], streams=[S("A", "a", "json", [7, 7, 7]), S("B", "b", "json", [7, 8, 7]),
                                                            S("C", "c", "json", [7, 7])])
    out = R.reproduce(rep, None, SimpleNamespace(ggml="avx512"), R.parse_schedules("3", 3))
    assert calls == [("draft-3", 3), ("draft-3", 2)]
    a, b = out.predictions["A"], out.predictions["B"]
    assert (b.label, b.tokens, b.stream, b.rounds) == ("B", [7, 7, 7], [7, 8, 7], a.rounds) and b.first_difference == 1
    assert a.identical and b.rounds is not a.rounds and b.tokens is not a.tokens
    calls.clear()
    R.reproduce(rep, None, SimpleNamespace(ggml="avx512"), R.parse_schedules("0,3,3", 3))
    assert calls == [("plain", 3), ("draft-3", 3), ("draft-3", 2)]


def test_validate_says_reproduced_or_not(tmp_path, capsys):
    """``refimpl validate --emulate=ggml``: a server answering with llama.cpp's draft-3 stream (its per-request
    n_max 3) is llama.cpp's prediction; one answering with a changed token is "not reproduced", exit 1."""
    from llama_spec import llama_speculative
    from test_validate import LLAMA_PROPS, PROMPT, _completion, fake_server

    d3 = llama_speculative(TRAINED_PATH, PROMPT, 6, n_draft=3, defaults=True, n_threads=1).tokens
    bad = [d3[0], 2047] + d3[2:]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"tokens": PROMPT}) + "\n")
    with fake_server({"/props": LLAMA_PROPS, "/completion": _completion(d3, 3)}) as good, \
            fake_server({"/props": LLAMA_PROPS, "/completion": _completion(bad, 3)}) as wrong:
        report = tmp_path / "report.json"
        rc = main(["validate", str(TRAINED_PATH), "--server", good, "--server", wrong, "--prompts", str(prompts), "-n", "6",
                   "--emulate=ggml", "--draft", "3", "--report", str(report)])
        out = capsys.readouterr().out
    assert rc == 1, out
    assert "not reproduced (step 1, server-draft-3)" in out
    assert out.splitlines()[-1] == ("result: 2 answers: 1 identical, 0 near-tie, 0 wrong, 1 not reproduced; "
                                    "probs outside bound: 0 → exit 1")
    doc = json.loads(report.read_text())
    assert [r["verdict"] for r in doc["results"]] == ["identical", "not reproduced"]
    assert doc["results"][0]["audit"]["reproduce"]["predictions"]["A draft 3"]["schedule"] == "server-draft-3"


#: 64 tokens of tests/data/kjv-genesis-20.txt (Genesis 20:14-16, "… And unto S"): a near-tie (margin 0.01 % of
#: max|logit|) that llama.cpp's batch shapes flip — one 64-row prompt batch (flash attention's tiled path)
#: computes 1587 'ime', the 63-row batch + 1+3 verify of the draft-mtp loop 1351 'ara' (docs/validating-an-engine.md §3g)
FLIP = [727, 1441, 44, 267, 1613, 277, 44, 267, 517, 115, 266, 118, 1249, 44, 267, 1542, 115, 266, 118, 1249, 44, 267,
        923, 338, 322, 1303, 44, 267, 1501, 271, 522, 333, 368, 1351, 104, 324, 976, 46, 298, 722, 1587, 328, 325, 391,
        44, 835, 44, 383, 497, 337, 500, 398, 58, 888, 690, 356, 495, 1639, 256, 398, 46, 298, 322, 368]
#: 80 tokens of the same text (Genesis 20:10-12, "… said unto Abraham, What sawest thou, … and she became my wife.
#: And"): on the AVX2 builds (both GCC tunings) the 80-row prompt batch computes 258 ' the', the 79-row batch + 1+3
#: verify 309 ' he' (found as FLIP was, on the avx2 path; FLIP flips on the AVX-512 build only)
FLIP_AVX2 = [391, 322, 1303, 44, 1054, 831, 388, 359, 44, 297, 359, 592, 846, 442, 858, 63, 298, 1303, 391, 44, 1450, 296, 1774,
             44, 368, 774, 433, 258, 1025, 268, 390, 337, 345, 287, 442, 740, 59, 267, 334, 395, 1770, 375, 319, 383, 976, 501,
             1719, 46, 298, 837, 2005, 2034, 519, 337, 383, 1867, 59, 519, 337, 258, 1119, 268, 383, 540, 44, 446, 345, 258,
             1119, 268, 383, 1121, 59, 267, 519, 2025, 383, 976, 46, 298]
#: the flip of each ISA's builds: (prompt, the one-batch prompt's token, the draft-3 loop's first token)
FLIPS = {16: (FLIP, 1587, 1351), 8: (FLIP_AVX2, 258, 309)}


def _flip() -> tuple[list[int], int, int]:
    """The flip of the libggml llama-cpp-python loads (its float lanes: AVX-512 or AVX2)."""
    from ggml_graph import build_info

    return FLIPS[build_info("native").lanes]


def test_a_real_flip_is_predicted(tmp_path, capsys):
    """llama.cpp's own draft-3 loop flips the first token of the native build's flip (FLIPS) against its one-batch
    prompt; the prediction says which schedule computes which token, and the gate follows the schedule given."""
    import numpy as np

    from llama_spec import llama_speculative
    from llama_trace import llama_trace

    from refimpl.tokenizer import Tokenizer

    prompt, plain, drafted = _flip()
    piece = Tokenizer.from_gguf(TRAINED_PATH).decode
    one_batch = llama_trace(TRAINED_PATH, prompt, (), n_threads=1, n_batch=512, n_ubatch=512, type_k="f16",
                            type_v="f16", flash_attn="on")["logits"][-1]
    d3 = llama_speculative(TRAINED_PATH, prompt, 8, n_draft=3, defaults=True, n_threads=1).tokens
    assert int(np.argmax(one_batch)) == plain and d3[0] == drafted
    path = tmp_path / "d3.json"
    path.write_text(json.dumps({"prompt_tokens": prompt, "tokens": d3}))
    code, out = audit(capsys, str(TRAINED_PATH), str(path), "--emulate=ggml", "--draft", "3")
    assert code == 0, out
    assert "  verdict: near-tie" in out and "  reproduced: llama.cpp's 1+3 verify computes this token" in out
    code, out = audit(capsys, str(TRAINED_PATH), str(path), "--emulate=ggml")  # plain decode: not what it computes
    assert code == 1 and (f"  not reproduced: A differs from llama.cpp's predicted plain stream at step 0 (A has {drafted} "
                          f"{piece([drafted])!r}, llama.cpp's prompt batch computes {plain} {piece([plain])!r})") in out, out


def test_llama_server_prompt_batches():
    """llama-server cuts a recurrent model's prompt 4 + n_ubatch and 4 tokens before its end (checkpoints)."""
    from refimpl.oracle.reproduce import parse_schedules, server_prompt_batches

    assert server_prompt_batches(64) == [60, 4] and server_prompt_batches(3) == [3] and server_prompt_batches(4) == [4]
    assert server_prompt_batches(600) == [84, 512, 4] and server_prompt_batches(5000, n_ubatch=512)[:3] == [2048, 2048, 388]
    assert [s.name for s in parse_schedules("plain,server:3", 2)] == ["plain", "server-draft-3"]
    assert [s.name for s in parse_schedules("server:0", 2)] == ["server-plain"] * 2


def test_schedule_replays_the_engines_own_rounds(tmp_path, capsys):
    """``--schedule FILE``: the engine's logged rounds (here llama.cpp's own draft-3 loop on the native build's flip,
    whose first token flips against the one-batch prompt) are rebuilt as llama.cpp's verify batches: the prediction is the stream,
    round for round (accepted and drafted counts, draft ids), and the flip is reproduced by the 1+3 verify."""
    from llama_spec import llama_speculative

    prompt = _flip()[0]
    run = llama_speculative(TRAINED_PATH, prompt, 8, n_draft=3, defaults=True, n_threads=1)
    rounds = [{"accepted": len(r["ids"]) - 1, "drafted": len(r["drafts"]), "drafts": list(r["drafts"])} for r in run.rounds]
    log = tmp_path / "engine.json"
    log.write_text(json.dumps({"prompt_tokens": prompt, "tokens": run.tokens, "rounds": rounds}))
    code, out = audit(capsys, str(TRAINED_PATH), str(log), "--emulate=ggml", "--schedule", str(log), "--json")
    rep = json.loads(out)
    pred = rep["reproduce"]["predictions"]["A"]
    assert code == 0 and pred["identical"] and pred["schedule"] == "rounds-of-engine.json", out
    assert pred["rounds"][: len(rounds)] == rounds  # the same verify batches, accepted as llama.cpp accepted them
    assert rep["divergence"] is None or rep["divergence"]["reproduced"]
    code, out = audit(capsys, str(TRAINED_PATH), str(log), "--emulate=ggml", "--schedule", str(log))
    assert code == 0 and "A: identical to llama.cpp's predicted rounds-of-engine.json stream" in out
    assert "reproduced: llama.cpp's 1+3 verify computes this token" in out


def test_schedule_from_an_ngram_telemetry_csv(tmp_path, capsys):
    """A telemetry CSV of n-gram drafts (``refimpl run --ngram --csv``, spec=ngram): the rounds are read whoever
    drafted, and the replay verifies the same batches (its rounds equal the CSV's); bad schedules are refused in
    one line."""
    from refimpl.oracle.stream_file import read_stream

    csv = tmp_path / "ngram.csv"
    prompt = "And God said, Let there be light: and there was light. And God said, Let there be"
    assert main(["run", "--emulate=ggml", "--ngram", "--draft", "3", "-n", "12", "--prompt", prompt, "--csv", str(csv),
                 str(TRAINED_PATH)]) == 0
    capsys.readouterr()
    logged = read_stream(csv, "A", None, any_source=True).rounds.rounds
    assert any(r.drafts for r in logged)  # the n-gram source drafted
    code, out = audit(capsys, str(TRAINED_PATH), str(csv), "--prompt", prompt, "--emulate=ggml", "--schedule",
                      str(csv), "--json")
    pred = json.loads(out)["reproduce"]["predictions"]["A"]
    assert code == 0 and pred["identical"], out
    assert [(r["accepted"], tuple(r["drafts"])) for r in pred["rounds"]] == [(r.accepted, r.drafts) for r in logged]
    assert main(["audit", str(TRAINED_PATH), str(csv), "--prompt", prompt, "--schedule", str(csv)]) == 2
    assert "--schedule predicts llama.cpp's own stream" in capsys.readouterr().err  # needs --emulate=ggml
    plain = tmp_path / "plain.json"
    plain.write_text(json.dumps({"tokens": [1, 2]}))
    assert main(["audit", str(TRAINED_PATH), str(csv), "--prompt", prompt, "--emulate=ggml", "--schedule", str(plain)]) == 2
    err = capsys.readouterr().err
    assert f"--schedule {plain}: no rounds in it" in err and "Traceback" not in err
    assert main(["audit", str(TRAINED_PATH), str(csv), "--prompt", prompt, "--emulate=ggml", "--schedule",
                 f"{csv},{csv}"]) == 2  # two files, one stream
    assert "--schedule: one file for every stream or one per stream" in capsys.readouterr().err


def test_prediction_on_the_avx2_build(tmp_path, capsys, monkeypatch):
    """The same gate on the AVX2-only libggml (LLAMA_CPP_LIB_PATH): llama.cpp's draft-3 stream computed there is
    identical to the prediction refimpl makes on that build's path, round for round."""
    from ggml_graph import build_info
    from llama_spec import llama_speculative
    from refimpl.tokenizer import Tokenizer

    info = build_info("avx2")
    monkeypatch.setenv("LLAMA_CPP_LIB_PATH", str(info.lib_dir))
    ids = Tokenizer.from_gguf(TRAINED_PATH).encode(PROMPT)
    run = llama_speculative(TRAINED_PATH, ids, N, n_draft=3, defaults=True, n_threads=1)
    rounds = [{"accepted": len(r["ids"]) - 1, "drafted": len(r["drafts"]), "drafts": list(r["drafts"])} for r in run.rounds]
    path = tmp_path / "d3-avx2.json"
    path.write_text(json.dumps({"prompt_tokens": ids, "tokens": run.tokens, "rounds": rounds}))
    code, out = audit(capsys, str(TRAINED_PATH), str(path), "--emulate=ggml", "--draft", "3", "--json")
    pred = json.loads(out)["reproduce"]["predictions"]["A"]
    assert code == 0 and pred["identical"], out
    assert pred["rounds"][: len(rounds)] == rounds
