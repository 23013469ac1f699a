"""``--threshold auto`` (refimpl.oracle.calibrate): the spread samples and the threshold as the module docstring
defines them, every fallback to the fixed τ said in one line, the engine's own margin at a departure, and the
fault direction — every speculative-loop fault of refimpl/inject that the fixed rule calls wrong on the trained
model is still called wrong with ``auto``, its answer carrying the faulty engine's own log-probs
(refimpl.inject.answer). The noise direction against the real llama-server is tests/test_calibrate_server.py."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.oracle import calibrate as C
from refimpl.oracle.audit import judge
from refimpl.oracle.responses import StepProbs

pytestmark = pytest.mark.usefixtures("fixture_cache")


def _logsoftmax(row: np.ndarray) -> np.ndarray:
    r = row.astype(np.float64)
    return r - (r.max() + math.log(np.exp(r - r.max()).sum()))


def test_a_spread_sample_is_the_move_of_a_logit_gap_in_units_of_max_logit():
    row = np.array([4.0, 3.0, 1.0, -2.0, 0.5], np.float32)  # max|logit| 4
    lp = _logsoftmax(row)
    # the engine: token 0 (the oracle's argmax) and ids 1, 2 — id 1's logit 0.2 higher, every log-prob shifted by
    # 0.7 (a normalizer change cancels); the placeholder 0.0 of the chosen token is not used
    sp = StepProbs(float(lp[0] - 0.7), ((0, float(lp[0] - 0.7)), (1, float(lp[1] + 0.2 - 0.7)), (2, float(lp[2] - 0.7))))
    s = C.Samples(has_probs=True)
    C.add_samples(s, sp, 0, row)
    assert s.n_steps == 1 and np.allclose(sorted(s.x), [0.0, 0.2 / 4])
    C.add_samples(s, StepProbs(0.0, ()), 0, row)  # draft-mtp's placeholder: nothing to compare
    C.add_samples(s, None, 0, row)
    assert s.n_steps == 1 and len(s.x) == 2
    # without the chosen token's log-prob the reference is the engine's best named entry
    t = C.Samples(has_probs=True)
    C.add_samples(t, StepProbs(None, ((1, float(lp[1])), (2, float(lp[2] + 0.4)))), 0, row)
    assert np.allclose(t.x, [0.4 / 4])


def test_the_threshold_is_factor_times_the_quantile_with_a_floor():
    rng = np.random.default_rng(0)
    x = list(rng.uniform(0.0, 0.03, 500))
    cal = C.calibrate(C.Samples(x, 125, True), 0.05)
    q = float(np.quantile(x, C.QUANTILE, method="higher"))
    assert cal.calibrated and cal.spread == q and cal.tau == C.FACTOR * q and cal.n_samples == 500 and cal.n_steps == 125
    assert q in x and cal.spread_max == max(x)
    small = C.calibrate(C.Samples([v / 10 for v in x], 125, True), 0.05)
    assert small.calibrated and small.tau == 0.05  # never tighter than the fixed rule
    assert "below the floor 5%" in C.calibration_line("A", small)
    line = C.calibration_line("A", cal)
    assert line.startswith(f"threshold auto (A): {100 * cal.tau:.2f}% of max|logit| from {C.FACTOR:g} × the 99th percentile")
    assert "of 500 log-prob gaps over 125 steps of the stream" in line
    assert cal.as_json()["quantile"] == 0.99 and cal.as_json()["n_samples"] == 500


@pytest.mark.parametrize("samples, why", [
    (C.Samples([], 0, False), "the stream carries no log-probs"),
    (C.Samples([0.01] * 39, 10, True), "39 log-prob gaps in the stream, fewer than the 40 needed"),
    (C.Samples([0.01] * 100, 25, True, outside=1), "outside the probs: bound"),
    (C.Samples([0.06] * 100, 25, True), "is above the 25% ceiling"),
])
def test_not_calibrated_is_the_fixed_threshold_and_says_why(samples, why):
    cal = C.calibrate(samples, 0.05)
    assert not cal.calibrated and cal.tau == 0.05 and why in cal.why_fixed
    line = C.calibration_line("A", cal)
    assert line.startswith("threshold auto (A): the fixed 5% of max|logit|: ") and "\n" not in line


def test_the_engine_margin_and_its_bound():
    row = np.array([4.0, 3.7, 1.0, -2.0, 0.5], np.float32)
    pos = judge(row, (1, 0), 0.05)
    cal = C.Calibration(0.10, 0.05)
    # the engine prefers its token 1 over the oracle's 0 by 0.1: the gap moved 0.3 + 0.1
    e = C.engine_margin(cal, StepProbs(-0.6, ((1, -0.6), (0, -0.7))), 1, pos)
    assert not e.bound and math.isclose(e.engine_margin, 0.1) and math.isclose(e.moved, pos.deficit(1) + 0.1, rel_tol=1e-6)
    assert e.close and math.isclose(e.limit, 0.4)  # the oracle's margin 0.3 ≤ 10 % of 4
    # the oracle's token is not in the engine's top-k: its log-prob is at most the smallest named one
    e = C.engine_margin(cal, StepProbs(-0.6, ((1, -0.6), (2, -1.9))), 1, pos)
    assert e.bound and math.isclose(e.engine_margin, 1.3)
    e = C.engine_margin(cal, None, 1, pos)  # no log-probs at that step: the oracle's margin alone
    assert e.engine_margin is None and e.moved is None and e.close
    assert not C.engine_margin(C.Calibration(0.05, 0.05), None, 1, pos).close  # 0.3 > 5 % of 4


def test_auto_is_refused_where_there_is_no_engine_log_prob_to_calibrate_on(tmp_path, capsys):
    golden = Path(__file__).resolve().parent.parent / "golden" / "kjv-q8_0.jsonl"  # the committed golden file
    stream = tmp_path / "s.json"
    stream.write_text("[1, 2, 3]")
    assert main(["audit", str(golden), str(stream), "--prompt-tokens", "11,42,7", "--threshold", "auto"]) == 2
    err = capsys.readouterr().err
    assert "--threshold auto calibrates on the engine's log-probs" in err and len(err.strip().splitlines()) == 1
    assert main(["audit", "builtin:tiny", str(stream), "--prompt-tokens", "11,42,7", "--threshold", "often"]) == 2
    assert "expected a fraction in (0, 1) or 'auto', got 'often'" in capsys.readouterr().err


# ---- the fault direction: the injected loop faults, answered with their own log-probs ----------------------

# The speculative-loop classes of refimpl/inject the fixed rule calls wrong on kjv within 64 tokens
# (docs/bug-classes.md): rollback (B1–B3), accept logic (B10), state between sequences (B5), the prompt taken for a
# verify batch (B13), a verify row read late (B11).
LOOP_FAULTS = ["no-restore", "conv-kept", "slot-plus-one", "slot-minus-one", "accept-unverified", "accept-stochastic",
               "state-leak", "prefill-as-verify", "verify-row-late"]


@pytest.fixture(scope="module")
def kjv():
    import numba

    from refimpl.fixtures.builtin import resolve_model
    from refimpl.model.trunk import load_model

    numba.set_num_threads(1)
    return load_model(resolve_model("builtin:kjv"))


@pytest.mark.parametrize("fault", LOOP_FAULTS)
def test_a_fault_is_still_wrong_with_auto(kjv, fault, tmp_path, capsys):
    from refimpl.inject import fault_table as T
    from refimpl.inject.answer import faulty_answer
    from refimpl.inject.faults import Faults
    from refimpl.oracle.audit import Stream, audit
    from refimpl.oracle.responses import read_response

    case = T.MODELS["kjv"]
    ans = faulty_answer(lambda rec: T.run(kjv, case, rec, T.SCENARIOS.get(fault, T.DEFAULT)), Faults.of(fault), case.prompt)
    ids, prompt, info = read_response(json.dumps(ans), "answer")
    assert prompt == case.prompt and info.probs is not None and len(info.probs) == len(ids)
    stream = Stream("A", "answer", "response", ids, prompt, response=info)
    fixed = audit(kjv, case.prompt, stream)
    auto = audit(kjv, case.prompt, stream, auto=True)
    assert fixed.n_wrong >= 1  # the premise: the fixed rule catches it
    cal = auto.calibration["A"]
    assert auto.n_wrong >= 1 and auto.exit_code == 1, (fault, cal)
    # the same tokens called wrong: the faulty engine's log-probs excuse none of them
    assert [f.step for f in auto.events if not f.benign] == [f.step for f in fixed.events if not f.benign]
    assert cal.tau <= C.CEILING
    # the CLI says the same, with the calibration in one line and in --json
    path = tmp_path / "answer.json"
    path.write_text(json.dumps(ans))
    assert main(["audit", "builtin:kjv", str(path), "--threshold", "auto"]) == 1
    out = capsys.readouterr().out
    assert "near-tie threshold auto (floor 5%)" in out and "threshold auto (A): " in out
    assert main(["audit", "builtin:kjv", str(path), "--threshold", "auto", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["threshold_auto"] is True and doc["calibration"]["A"]["tau"] == cal.tau
    assert doc["calibration"]["A"]["quantile"] == C.QUANTILE and doc["calibration"]["A"]["n_samples"] == cal.n_samples


def test_a_stream_without_log_probs_keeps_the_fixed_threshold_and_says_so(tmp_path, capsys):
    stream = tmp_path / "ids.json"
    stream.write_text(json.dumps({"tokens": [7, 8, 9, 10], "prompt_tokens": [11, 42, 7]}))
    code_fixed = main(["audit", "builtin:tiny", str(stream)])
    fixed = capsys.readouterr().out
    assert main(["audit", "builtin:tiny", str(stream), "--threshold", "auto"]) == code_fixed
    out = capsys.readouterr().out
    assert "  threshold auto (A): the fixed 5% of max|logit|: the stream carries no log-probs" in out.splitlines()
    assert fixed.splitlines()[-1] == out.splitlines()[-1]  # the same verdicts


def test_two_answers_each_judged_by_its_own_threshold(kjv, tmp_path, capsys):
    from refimpl.inject import fault_table as T
    from refimpl.inject.answer import faulty_answer
    from refimpl.inject.faults import Faults

    case = T.MODELS["kjv"]
    paths = []
    for name, faults in (("clean", Faults()), ("bad", Faults.of("no-restore"))):
        ans = faulty_answer(lambda rec: T.run(kjv, case, rec), faults, case.prompt)
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(ans))
    assert main(["audit", "builtin:kjv", *map(str, paths), "--threshold", "auto", "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    cal = doc["calibration"]
    # the clean loop's log-probs are the oracle's own: calibrated, at the floor; the faulty one's are not used
    assert cal["A"]["calibrated"] and cal["A"]["tau"] == 0.05 and cal["A"]["spread"] == 0.0
    assert not cal["B"]["calibrated"] and "outside the probs: bound" in cal["B"]["fixed_because"]
    assert doc["verdict"] == "B wrong" and set(doc["divergence"]["engine"]) == {"B"}
    assert any(f["kind"] == "wrong" and f["where"] == "B" for f in doc["findings"])
