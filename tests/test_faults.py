"""Injected faults (refimpl.inject.faults): each rewrites exactly what its bug class says, the clean record
changes nothing, and ``run --inject`` switches them on with one-line errors for bad names."""

import json

import numpy as np
import pytest

from refimpl.cli import main
from refimpl.decode.drafts import MTPSource
from refimpl.errors import RefimplError
from refimpl.inject.faults import FAULTS, NO_FAULTS, Faults, _round_bf16, parse_faults
from refimpl.decode.greedy import greedy
from refimpl.model.trunk import load_model
from refimpl.model.ops import Ctx
from refimpl.decode.speculative import prefill, speculative_generate, step
from refimpl.model.state import DeltaNetState

PROMPT = [11, 42, 7, 300, 5]

pytestmark = pytest.mark.usefixtures("fixture_cache")


@pytest.fixture(scope="module")
def tiny(make_fixture):
    return load_model(make_fixture("tiny", "f32"))


def test_registry_is_complete_and_named_by_class():
    assert list(FAULTS) == [f.name for f in FAULTS.values()]
    assert {f.bug_class for f in FAULTS.values()} >= {"B1", "B2", "B3", "B4", "B5", "B6", "B7", "B8", "B9", "B10",
                                                        "B11", "B12", "B13", "B14", "B15", "B16", "B17", "B19", "B20"}
    assert all(f.needs in ("", "speculative", "mtp") for f in FAULTS.values())
    assert [f.name for f in FAULTS.values() if f.blind] == ["mtp-same-h", "mtp-prenorm", "mtp-stale-kv", "mtp-norms-shifted"]


def test_the_clean_record_taps_nothing():
    x = np.arange(4.0)
    assert not NO_FAULTS and NO_FAULTS.tap("deltanet.state", x) is x
    f = Faults.of("state-bf16")
    assert f and f.tap("moe.shared_gate", x) is x  # a fault only rewrites its own point


def test_every_fault_acts_at_a_tap_point_ctx_cb_hands_to_the_record():
    """The model and the loop name their tap points in ``TAPS`` (Ctx.cb asks the fault record there);
    every fault acts at one of them (the tokenizer, without a Ctx, asks the record itself), and every
    tap point is there for a fault."""
    from refimpl.model.ops import TAPS

    points = {f.point for f in FAULTS.values()} | {"loop.finish"}  # state-leak also remembers at loop.finish
    assert points - TAPS == {"tokenizer.split"}
    assert TAPS <= points


def test_tap_points_reach_the_fault_record_never_the_trace(tiny):
    """One hook: ``Ctx.cb`` hands llama.cpp's names to the trace and the tap points to ``Ctx.faults`` —
    an MTP run reaches every tap point, a traced run records the same names with or without a fault
    on, none of them a tap point, and a fault changes what is recorded after its point only."""
    from refimpl.model.ops import TAPS, NoFaults
    from refimpl.oracle.trace import Recorder

    asked = set()

    class Noting(NoFaults):  # the clean record, noting which points it is asked about
        def tap(self, point, value, **info):
            asked.add(point)
            return value

    runs = {}
    for name, faults in (("clean", NO_FAULTS), ("noting", Noting()), ("faulty", Faults.of("ssm-norm-shifted"))):
        rec = Recorder()
        speculative_generate(tiny, PROMPT, 3, Ctx(trace=rec, faults=faults), source="mtp", n_draft=2)
        runs[name] = rec.arrays()
    assert asked == TAPS
    assert runs["clean"].keys() == runs["noting"].keys() == runs["faulty"].keys()
    assert not {k.rsplit("-", 1)[0] for k in runs["clean"]} & TAPS
    assert all(np.array_equal(runs["clean"][k], runs["noting"][k]) for k in runs["clean"])
    prompt = slice(0, len(PROMPT) - 1)  # the rows of the prompt batch, the first forward pass
    assert np.array_equal(runs["clean"]["attn_output_delta-0"][prompt], runs["faulty"]["attn_output_delta-0"][prompt])
    assert not np.array_equal(runs["clean"]["final_output-0"][prompt], runs["faulty"]["final_output-0"][prompt])  # after the point


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
    from refimpl.model.trunk import forward

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


def test_conv_faults_store_the_rows_they_say(tiny):
    """B15: after a batch from a fresh state, layer 0's window holds the last Kc−1 inputs; with
    conv-drop-newest the Kc−1 before the newest; with conv-post-silu (a batch of ≥ 2 tokens) the last
    Kc−1 post-conv SiLU rows instead of the inputs."""
    from refimpl.model.trunk import forward
    from refimpl.model.state import SeqState
    from refimpl.oracle.trace import Recorder

    rec = Recorder({"linear_attn_qkv_mixed-0", "conv_output_silu-0"})
    fresh = SeqState.fresh(tiny.config)
    _, _, clean = forward(tiny, fresh, PROMPT, Ctx(trace=rec))
    qkv, y = rec.arrays()["linear_attn_qkv_mixed-0"], rec.arrays()["conv_output_silu-0"]  # [T, C]
    Kc1 = clean.layers[0].conv.shape[0]  # Kc − 1
    _, _, drop = forward(tiny, fresh, PROMPT, Ctx(faults=Faults.of("conv-drop-newest")))
    _, _, post = forward(tiny, fresh, PROMPT, Ctx(faults=Faults.of("conv-post-silu")))
    _, _, one = forward(tiny, fresh, PROMPT[:1], Ctx(faults=Faults.of("conv-post-silu")))
    assert np.array_equal(clean.layers[0].conv, qkv[-Kc1:])
    assert np.array_equal(drop.layers[0].conv, qkv[-Kc1 - 1 : -1])
    assert np.array_equal(post.layers[0].conv, y[-Kc1:])
    assert np.array_equal(one.layers[0].conv, forward(tiny, fresh, PROMPT[:1])[2].layers[0].conv)  # one token: untouched


def test_verify_row_late_judges_row_i_by_row_i_plus_one():
    from refimpl.inject.faults import _verify_row_late

    logits = np.eye(5, dtype=np.float32)[[4, 1, 2, 3]]  # rows' argmax: 4, 1, 2, 3
    targets = [4, 1, 2, 3]
    assert _verify_row_late(targets[:2], {}, drafts=[9], logits=logits[:2]) == [4, 1]  # one draft: untouched
    assert _verify_row_late(targets, {}, drafts=[9, 9, 9], logits=logits) == [4, 2, 3, 3]


def test_plain_state_f16_rounds_one_token_decodes_only():
    f, x = Faults.of("plain-state-f16"), np.array([1.0 + 2**-12, 3.0e-8], dtype=np.float32)
    assert np.array_equal(f.tap("deltanet.state", x, n_tokens=4), x)
    assert np.array_equal(f.tap("deltanet.state", x, n_tokens=1), x.astype(np.float16).astype(np.float32))


def test_replay_rollback_replays_the_kept_tokens_through_empty_attention(tiny):
    """B12 on tiny (its attention layer is the last): the layers before any attention layer see the
    same hiddens in the replay, so the recurrent state equals the clean rollback's up to float
    noise of the different batch split, while positions and KV caches are the clean ones."""
    s, r, clean, faulty = _rollback_round(tiny, "replay-rollback")
    assert faulty.target.n_past == clean.target.n_past
    for a, b in zip(faulty.target.layers, clean.target.layers):
        if isinstance(a, DeltaNetState):
            np.testing.assert_array_equal(a.ssm, b.ssm)  # the batch split never changes a bit (test_trunk)
        else:
            assert np.array_equal(a.k, b.k) and np.array_equal(a.pos, b.pos)


def test_pretok_gpt2_splits_with_the_generic_regex():
    from refimpl.tokenizer.split import split_gpt2, split_qwen35

    f, text = Faults.of("pretok-gpt2"), "said,Let 1611\n\nAnd it's"
    assert f.tap("tokenizer.split", split_qwen35(text), text=text) == split_gpt2(text)
    assert split_gpt2(text) == ["said", ",", "Let", " 1611", "\n", "\n", "And", " it", "'s"]
    assert split_qwen35(text) == ["said", ",Let", " ", "1", "6", "1", "1", "\n\n", "And", " it", "'s"]


def test_trunk_faults_change_plain_greedy(tiny):
    clean = greedy(tiny, PROMPT, 12)
    for name in ("vk-pairing", "ssm-norm-shifted", "shexp-ungated", "qg-split-flat", "conv-post-silu", "conv-drop-newest"):
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
