"""Injected faults (refimpl.faults): each rewrites exactly what its bug class says, the clean record
changes nothing, and ``run --inject`` switches them on with one-line errors for bad names."""

import json

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.drafts import MTPSource
from refimpl.errors import RefimplError
from refimpl.faults import FAULTS, NO_FAULTS, Faults, _round_bf16, parse_faults
from refimpl.generate import greedy
from refimpl.model import load_model
from refimpl.ops import Ctx
from refimpl.speculative import prefill, speculative_generate, step
from refimpl.state import DeltaNetState

PROMPT = [11, 42, 7, 300, 5]

pytestmark = pytest.mark.usefixtures("fixture_cache")


@pytest.fixture(scope="module")
def tiny(make_fixture):
    return load_model(make_fixture("tiny", "f32"))


def test_registry_is_complete_and_named_by_class():
    assert list(FAULTS) == [f.name for f in FAULTS.values()]
    assert {f.bug_class for f in FAULTS.values()} >= {"B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10",
                                                        "B13", "B14", "B16", "B17", "B19"}
    assert all(f.needs in ("", "speculative", "mtp") for f in FAULTS.values())
    assert [f.name for f in FAULTS.values() if f.blind] == ["mtp-same-h", "mtp-prenorm", "mtp-stale-kv", "mtp-norms-shifted"]


def test_the_clean_record_taps_nothing():
    x = np.arange(4.0)
    assert not NO_FAULTS and NO_FAULTS.tap("deltanet.state", x) is x
    f = Faults.of("state-bf16")
    assert f and f.tap("moe.shared_gate", x) is x  # a fault only rewrites its own point


def test_bf16_rounding_is_round_to_nearest_even():
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 2**-7 + 2**-8, 1.0 + 3 * 2**-9, -2.5e-3, 3.0e38], dtype=np.float32)
    got = _round_bf16(x)
    assert got[0] == 1.0 and got[1] == 1.0  # a tie rounds to the even mantissa
    assert got[2] == np.float32(1.0 + 2**-6)  # a tie on an odd mantissa rounds up
    assert got[3] == np.float32(1.0 + 2**-7)
    assert np.all(got.view(np.uint32) & 0xFFFF == 0)
    assert np.all(np.abs(got - x) <= np.abs(x) * 2**-8)


def _rollback_round(model, fault):
    """One MTP round on tiny (every draft rejected: rollback depth 3) with and without ``fault``."""
    src = MTPSource(model)
    s = prefill(model, src, PROMPT, n_rs_seq=3)
    r, clean = step(model, src, s, 3)
    _, faulty = step(model, src, s, 3, Ctx(faults=Faults.of(fault)))
    return s, r, clean, faulty


@pytest.mark.parametrize("fault, conv_from, ssm_from", [
    ("no-restore", "after", "after"), ("conv-kept", "after", "clean"), ("slot-plus-one", "+1", "+1"),
    ("slot-minus-one", "before", "before"),
])
def test_rollback_faults_restore_what_they_say(tiny, fault, conv_from, ssm_from):
    s, r, clean, faulty = _rollback_round(tiny, fault)
    assert r.drafts and r.rollback == 3 and r.n_accepted == 0  # tiny's head is never right: P+1 is the target
    from refimpl.model import forward

    _, _, after = forward(tiny, s.target, [s.history[-1]] + r.drafts)
    _, _, plus_one = forward(tiny, s.target, [s.history[-1], r.drafts[0]])
    states = {"after": after, "clean": clean.target, "+1": plus_one, "before": s.target}
    assert faulty.target.n_past == clean.target.n_past == s.target.n_past + 1
    for il, layer in enumerate(faulty.target.layers):
        if isinstance(layer, DeltaNetState):
            assert np.array_equal(layer.conv, states[conv_from].layers[il].conv)
            assert np.array_equal(layer.ssm, states[ssm_from].layers[il].ssm)
            assert not np.array_equal(layer.ssm, clean.target.layers[il].ssm) or ssm_from == "clean"
        else:  # the KV caches are truncated right in every variant
            assert np.array_equal(layer.pos, clean.target.layers[il].pos)


def test_accept_unverified_takes_the_first_draft_unchecked(tiny):
    out, st = speculative_generate(tiny, PROMPT, 8, Ctx(faults=Faults.of("accept-unverified")), source="mtp", n_draft=3)
    clean, st0 = speculative_generate(tiny, PROMPT, 8, source="mtp", n_draft=3)
    assert st0.n_accepted == 0 and st.n_accepted > 0  # tiny's head is never right, yet drafts are "accepted"
    assert out[0] != clean[0] and st.rows[0].kind == "draft"


def test_state_leak_needs_a_previous_sequence(tiny):
    faults = Faults.of("state-leak")
    clean = greedy(tiny, PROMPT, 12)
    first, _ = speculative_generate(tiny, PROMPT, 12, Ctx(faults=faults), source="mtp", n_draft=3)
    assert first == clean  # nothing to leak yet
    speculative_generate(tiny, [3, 4, 5, 6], 8, Ctx(faults=faults), source="mtp", n_draft=3)
    second, _ = speculative_generate(tiny, PROMPT, 12, Ctx(faults=faults), source="mtp", n_draft=3)
    assert second != clean


def test_trunk_faults_change_plain_greedy(tiny):
    clean = greedy(tiny, PROMPT, 12)
    for name in ("vk-pairing", "ssm-norm-shifted", "shexp-ungated", "qg-split-flat"):
        assert greedy(tiny, PROMPT, 12, Ctx(faults=Faults.of(name))) != clean, name


def test_mtp_faults_change_drafts_never_tokens(tiny):
    clean, _ = speculative_generate(tiny, PROMPT, 10, source="mtp", n_draft=3)
    for name in ("mtp-same-h", "mtp-prenorm", "mtp-stale-kv", "mtp-norms-shifted"):
        out, _ = speculative_generate(tiny, PROMPT, 10, Ctx(faults=Faults.of(name)), source="mtp", n_draft=3)
        assert out == clean, name


def test_parse_faults():
    assert parse_faults(["no-restore,conv-kept", "state-bf16"], "mtp").names == {"no-restore", "conv-kept", "state-bf16"}
    assert parse_faults(None, None) == NO_FAULTS
    with pytest.raises(RefimplError, match="unknown fault 'nope' \\(valid: no-restore, "):
        parse_faults(["nope"], "mtp")
    with pytest.raises(RefimplError, match="add --mtp or --ngram"):
        parse_faults(["slot-plus-one"], None)
    with pytest.raises(RefimplError, match="add --mtp"):
        parse_faults(["mtp-prenorm"], "ngram")
    assert parse_faults(["vk-pairing"], None).names == {"vk-pairing"}


def test_run_inject(make_fixture, capsys):
    path = str(make_fixture("tiny", "f32"))
    argv = ["run", path, "--tokens", ",".join(map(str, PROMPT)), "-n", "6", "--mtp", "--json"]
    assert main(argv) == 0
    clean = json.loads(capsys.readouterr().out)
    assert main(argv + ["--inject", "no-restore"]) == 0
    out, err = capsys.readouterr()
    faulty = json.loads(out)
    assert faulty["faults"] == ["no-restore"] and "faults" not in clean
    assert faulty["tokens"][0] == clean["tokens"][0] and faulty["tokens"] != clean["tokens"]
    assert "injected fault no-restore (B1:" in err
    for extra, msg in [(["--inject", "bogus"], "unknown fault 'bogus' (valid: "), (["--inject", "mtp-same-h", "--ngram"], None)]:
        args = argv + extra if msg else ["run", path, "-n", "2", "--ngram"] + extra
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert "\n" not in err and err.startswith("refimpl: error: ") and (msg is None or msg in err), err


def test_inject_is_hidden_from_help(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    assert "--inject" not in capsys.readouterr().out
