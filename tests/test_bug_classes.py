"""docs/bug-classes.md's table, measured: every stream-visible fault is flagged by the audit within 64
tokens on the history-dependent models (the trained `kjv`, the random `tiny`) but the pinned near-tie
cases, the clean loop never is, the trained head's acceptance shows the stream-blind MTP classes, and the page holds exactly the
tables these measurements give (refimpl.inject.fault_table)."""

from pathlib import Path

import pytest

from refimpl.inject import fault_table as T
from refimpl.inject.faults import FAULTS

TABLE = {n: FAULTS[n] for n in T.TABLE_FAULTS}

PAGE = Path(__file__).resolve().parent.parent / "docs" / "bug-classes.md"

# Stream-visible on tiny, yet only ever a near-tie there (docs/bug-classes.md, "Reading it"):
# pinned, so that a change in either direction updates the page.
NEAR_TIE_ONLY_ON_TINY = {"rope-full-width"}
# Stream-visible on kjv, yet only a near-tie there with its 64 tokens of "And it came to pass": the stale
# state after an accepting n-gram verify moves the stream at step 27 to the oracle's runner-up inside
# the 5 % band, and no later token leaves it (docs/bug-classes.md, "Reading it"); flagged on tiny.
NEAR_TIE_ONLY_ON_KJV = {"plain-step-stale"}
# Stream-blind and acceptance-blind on kjv: its output_norm weights vary by 5 % around their mean, so
# hnorm(h) and hnorm(output_norm(h)) nearly agree (docs/bug-classes.md, "Reading it").
ACCEPTANCE_BLIND_ON_KJV = {"mtp-prenorm"}
# The classes whose stream must be flagged on a confident, history-dependent model (all but
# state-bf16, which changes no stream in 64 tokens on any model here).
STREAM_VISIBLE = {"no-restore", "conv-kept", "slot-plus-one", "slot-minus-one", "plain-step-stale", "accept-unverified",
                  "accept-stochastic", "state-leak", "prefill-as-verify", "verify-row-late", "vk-pairing", "qg-split-flat",
                  "conv-post-silu", "conv-drop-newest", "ssm-norm-shifted", "topk-no-renorm", "shexp-ungated"}
# Reached only when a draft is accepted (rows ≥ 1 of a verify batch): never on tiny, whose head is never right.
NEEDS_AN_ACCEPTED_DRAFT = {"verify-row-late"}
# Unchanged on all three models, for a reason of the model, not of the audit (docs/bug-classes.md):
# replay-rollback only corrupts recurrent layers *after* an attention layer, and all three put their
# one attention layer last (test_replay_rollback_is_flagged_with_a_recurrent_layer_after_attention);
# plain-state-f16 is the benign control of B11: float16 state rounding never flips a token here.
UNCHANGED_EVERYWHERE = {"replay-rollback", "plain-state-f16", "state-bf16"}

pytestmark = pytest.mark.usefixtures("fixture_cache")


@pytest.fixture(scope="module")
def cells():
    import numba

    numba.set_num_threads(1)
    return {(c.model, c.fault): c for c in T.measure_all()}


def test_the_clean_loop_is_never_flagged(cells):
    from refimpl.fixtures.builtin import resolve_model
    from refimpl.inject.faults import Faults
    from refimpl.model.trunk import load_model

    for name, case in T.MODELS.items():
        c = cells[(name, "(clean loop)")]
        assert (c.changed, c.verdict, c.exit_code) == (False, "clean", 0)
        model = load_model(resolve_model(case.spec))
        for scenario in set(T.SCENARIOS.values()):  # the other sources and settings the table uses
            tokens, _ = T.run(model, case, Faults(), scenario)
            assert T.audit_stream(model, case.prompt, tokens).exit_code == 0, (name, scenario)


def test_every_stream_visible_fault_is_flagged_on_the_trained_model(cells):
    for name, f in TABLE.items():
        c = cells[("kjv", name)]
        if f.blind:
            assert not c.changed and c.exit_code == 0, name
        elif name in NEAR_TIE_ONLY_ON_KJV:
            assert c.changed and c.verdict == "near-tie" and c.exit_code == 0, name
        elif c.changed:
            assert c.exit_code == 1 and c.first_wrong is not None and c.first_wrong < T.N_PREDICT, name
    assert {n for n in TABLE if cells[("kjv", n)].flagged} == (STREAM_VISIBLE - NEAR_TIE_ONLY_ON_KJV) | {"rope-full-width"}
    for model in T.MODELS:
        assert not any(cells[(model, n)].changed for n in UNCHANGED_EVERYWHERE), model


def test_the_trained_head_s_acceptance_shows_the_blind_mtp_classes(cells):
    clean = cells[("kjv", "(clean loop)")].accepted
    for name, f in TABLE.items():
        if f.blind:
            c = cells[("kjv", name)]
            if name in ACCEPTANCE_BLIND_ON_KJV:
                assert c.accepted == clean and c.extra["rounds: counts"].endswith("→ 0"), (name, c.accepted)
            else:  # the acceptance moves (up or down), and the round audit sees it from the counts alone
                assert c.accepted != clean, (name, c.accepted, clean)
                assert c.extra["rounds: counts"].endswith("→ 1"), (name, c.extra)


def test_every_stream_visible_fault_is_flagged_on_tiny(cells):
    for name, f in TABLE.items():
        c = cells[("tiny", name)]
        if f.blind:
            assert not c.changed and c.exit_code == 0, name  # the head never decides a token
        elif name in NEAR_TIE_ONLY_ON_TINY:
            assert c.changed and c.verdict == "near-tie" and c.exit_code == 0, name
        elif c.changed:
            assert c.exit_code == 1 and c.first_wrong is not None and c.first_wrong < T.N_PREDICT, name
    assert {n for n in TABLE if cells[("tiny", n)].flagged} == STREAM_VISIBLE - NEEDS_AN_ACCEPTED_DRAFT


def test_the_round_audit_catches_the_blind_classes_from_draft_ids(cells):
    for name in T.MODELS:
        clean = cells[(name, "(clean loop)")].extra
        assert clean["rounds: ids"].startswith("match, 0/0") and clean["rounds: ids"].endswith("→ 0"), (name, clean)
        assert clean["rounds: counts"].startswith("match, 0/0"), (name, clean)
    for name, f in TABLE.items():
        if f.blind:
            c = cells[("tiny", name)]
            assert c.extra["rounds: ids"].endswith("→ 1"), (name, c.extra)  # at least one round wrong
            assert c.extra["rounds: counts"].startswith("match"), (name, c.extra)  # tiny's head is never right


def test_predictable_only_sees_accept_logic(cells):
    changed = {n for n in TABLE if cells[("predictable", n)].changed}
    assert changed == {"accept-unverified", "verify-row-late"}  # its next token is a function of the current one only
    c = cells[("predictable", "accept-unverified")]
    assert c.exit_code == 1 and c.accepted[0] / c.accepted[1] > c.accepted_clean[0] / c.accepted_clean[1]


def test_the_page_holds_the_measured_table(cells):
    text = PAGE.read_text(encoding="utf-8")
    assert T.table_in(text) == T.markdown(list(cells.values())), \
        "docs/bug-classes.md is stale: python -m refimpl.inject.fault_table --write docs/bug-classes.md"


def test_replay_rollback_is_flagged_with_a_recurrent_layer_after_attention(tmp_path, monkeypatch):
    """B12 corrupts the delta-net layers that follow an attention layer; tiny's widths with 8 trunk
    layers (GDN ×3, attention, GDN ×3, attention) have three."""
    import dataclasses

    from refimpl.fixtures import presets, write_fixture
    from refimpl.model.trunk import load_model

    monkeypatch.setitem(presets.PRESETS, "tiny8", dataclasses.replace(presets.PRESETS["tiny"], name="tiny8", n_layer=8))
    path = write_fixture(tmp_path / "tiny8.gguf", preset="tiny8", quant="f32")
    case = T.Case(str(path), T.MODELS["tiny"].prompt, T.MODELS["tiny"].earlier)
    model = load_model(path)
    clean = T.measure(model, "tiny8", case, None)
    c = T.measure(model, "tiny8", case, "replay-rollback")
    assert (clean.changed, clean.exit_code) == (False, 0)
    assert c.changed and c.exit_code == 1 and c.first_wrong < T.N_PREDICT


def test_a_stream_from_another_pre_tokenizer_is_refused_not_audited(tmp_path, capsys):
    """B20: with --inject pretok-gpt2 the run's prompt ids differ from the oracle's tokenization of
    the same text; the audit says where and exits 1 instead of judging a shifted stream."""
    import json

    from refimpl.cli import main

    text = "In the beginning.\n\nAnd God said,Let there be light"
    for name, inject in (("clean", []), ("gpt2", ["--inject", "pretok-gpt2"])):
        assert main(["run", "builtin:kjv", "-p", text, "-n", "4", "--json", *inject]) == 0
        (tmp_path / f"{name}.json").write_text(capsys.readouterr().out)
    assert main(["audit", "builtin:kjv", str(tmp_path / "clean.json"), "--prompt", text]) == 0
    capsys.readouterr()
    assert main(["audit", "builtin:kjv", str(tmp_path / "gpt2.json"), "--prompt", text, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["verdict"] == "prompt differs"
    assert out["prompts"][0]["index"] == 5  # "." then "\n", "\n" (gpt2) against ".\n\n" (qwen35)
    assert json.loads((tmp_path / "gpt2.json").read_text())["prompt_tokens"] != json.loads((tmp_path / "clean.json").read_text())["prompt_tokens"]
