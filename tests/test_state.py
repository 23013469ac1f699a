"""Recurrent-state snapshots and rollback: draft → reject → rollback → replay == never drafted."""

import numpy as np
import pytest

from refimpl.model.trunk import forward, load_model
from refimpl.model.state import DeltaNetState, KVCache, RollbackError, SeqState, rollback


@pytest.fixture(scope="module")
def tiny(make_fixture):
    return load_model(make_fixture("tiny", "f32"))


def _assert_same_state(a: SeqState, b: SeqState):
    assert a.n_past == b.n_past
    for x, y in zip(a.layers, b.layers):
        if isinstance(x, KVCache):
            assert np.array_equal(x.k, y.k) and np.array_equal(x.v, y.v) and np.array_equal(x.pos, y.pos)
        else:
            assert isinstance(y, DeltaNetState)
            assert np.array_equal(x.conv, y.conv) and np.array_equal(x.ssm, y.ssm)


PROMPT = [11, 42, 7, 300, 5, 99]


@pytest.mark.parametrize("n_verify, r", [(4, 1), (4, 3), (2, 1), (9, 8), (4, 0)], ids=lambda v: str(v))
def test_rollback_equals_never_having_drafted(tiny, n_verify, r):
    base = SeqState.fresh(tiny.config, n_rs_seq=8)
    _, _, st = forward(tiny, base, PROMPT)
    drafts = [int(t) for t in np.random.default_rng(n_verify).integers(0, 390, size=n_verify)]
    _, _, after = forward(tiny, st, drafts)  # a verify batch
    rolled = rollback(after, r)
    kept = drafts[: n_verify - r]
    _, _, reference = forward(tiny, st, kept) if kept else (None, None, st)
    _assert_same_state(rolled, reference)
    # and replaying a different continuation gives exactly what a never-drafted sequence gives
    cont = [3, 4, 5]
    l1, h1, s1 = forward(tiny, rolled, cont)
    l2, h2, s2 = forward(tiny, reference, cont)
    assert np.array_equal(l1, l2) and np.array_equal(h1, h2)
    _assert_same_state(s1, s2)


def test_rollback_across_batches_within_the_ring(tiny):
    st = SeqState.fresh(tiny.config, n_rs_seq=3)
    _, _, st1 = forward(tiny, st, PROMPT[:4])
    _, _, st2 = forward(tiny, st1, [8])
    _, _, st3 = forward(tiny, st2, [9])
    _assert_same_state(rollback(st3, 2), st1)


def test_ring_is_bounded_and_accounted(tiny):
    st = SeqState.fresh(tiny.config, n_rs_seq=3)
    _, _, st = forward(tiny, st, PROMPT)
    assert len(st.snapshots) == 3
    assert [s.n_past for s in st.snapshots] == [3, 4, 5]
    assert st.snapshot_nbytes() == 3 * st.recurrent_nbytes()
    _, _, st = forward(tiny, SeqState.fresh(tiny.config), PROMPT)
    assert st.snapshots == ()


def test_rollback_deeper_than_the_ring_is_rejected(tiny):
    _, _, st = forward(tiny, SeqState.fresh(tiny.config, n_rs_seq=2), PROMPT)
    with pytest.raises(RollbackError, match=r"rollback of 3 positions exceeds the snapshot ring \(n_rs_seq = 2\)"):
        rollback(st, 3)
    with pytest.raises(RollbackError, match="cannot roll back 7 positions"):
        rollback(st, 7)


def test_only_one_rollback_per_snapshot(tiny):
    """After a rollback the ring holds only older positions: rolling back again further is allowed
    only as far as those go."""
    _, _, st = forward(tiny, SeqState.fresh(tiny.config, n_rs_seq=3), PROMPT)
    once = rollback(st, 2)
    assert [s.n_past for s in once.snapshots] == [3]
    _assert_same_state(rollback(once, 1), rollback(st, 3))
    with pytest.raises(RollbackError, match="no snapshot"):
        rollback(once, 2)


# ---- read-only state: an in-place update raises instead of corrupting a snapshot ---------------------------


def _arrays(state: SeqState):
    """Every array a SeqState holds: its layers' and its snapshots'."""
    for layer in state.layers + tuple(s for snap in state.snapshots for s in snap.layers):
        if isinstance(layer, KVCache):
            yield from (layer.k, layer.v, layer.pos)
        elif layer is not None:
            yield from (layer.conv, layer.ssm)


def test_state_arrays_are_read_only(tiny):
    """Fresh, after a prompt, after a verify batch, after a rollback: no array of the state or of its
    snapshot ring can be written."""
    st = SeqState.fresh(tiny.config, n_rs_seq=4)
    _, _, after_prompt = forward(tiny, st, PROMPT)
    _, _, after_verify = forward(tiny, after_prompt, [3, 4, 5, 6])
    for s in (st, after_prompt, after_verify, rollback(after_verify, 2)):
        arrays = list(_arrays(s))
        assert arrays and not any(a.flags.writeable for a in arrays)


def test_in_place_update_raises_and_rollback_still_restores_exactly(tiny):
    """``M *= decay`` on a live state's or a snapshot's delta-rule matrix, a conv write and a KV write all
    raise; afterwards the state is unchanged and a rollback restores exactly what a never-drafted
    sequence holds."""
    _, _, st = forward(tiny, SeqState.fresh(tiny.config, n_rs_seq=4), PROMPT)
    _, _, after = forward(tiny, st, [3, 4, 5, 6])
    il_rec = next(il for il, s in enumerate(after.layers) if isinstance(s, DeltaNetState))
    il_att = next(il for il, s in enumerate(after.layers) if isinstance(s, KVCache))
    snap = after.snapshots[-2].layers[il_rec]
    kept = [a.copy() for a in _arrays(after)]

    with pytest.raises(ValueError, match="read-only"):
        after.layers[il_rec].ssm *= 0.5  # the live state
    with pytest.raises(ValueError, match="read-only"):
        snap.ssm *= 0.5  # a snapshot in the ring
    with pytest.raises(ValueError, match="read-only"):
        snap.conv[-1] = 0.0
    with pytest.raises(ValueError, match="read-only"):
        after.layers[il_att].k[-1] = 0.0  # a KV write
    with pytest.raises(ValueError, match="read-only"):
        np.copyto(after.layers[il_att].v, 0.0)
    with pytest.raises(ValueError, match="read-only"):
        np.multiply(after.layers[il_rec].ssm, 2.0, out=after.layers[il_rec].ssm)
    assert all(np.array_equal(a, b) for a, b in zip(kept, _arrays(after)))

    _, _, reference = forward(tiny, st, [3, 4])
    _assert_same_state(rollback(after, 2), reference)


def test_records_take_arrays_without_a_copy():
    """The record holds the very array it was given (no copy), made read-only."""
    conv, ssm = np.zeros((3, 8), np.float32), np.ones((2, 4, 4), np.float32)
    d = DeltaNetState(conv=conv, ssm=ssm)
    assert d.conv is conv and d.ssm is ssm and not ssm.flags.writeable
    kv = KVCache.empty(2, 4).append(np.ones((1, 2, 4)), np.ones((1, 2, 4)), [0])
    assert not (kv.k.flags.writeable or kv.v.flags.writeable or kv.pos.flags.writeable)
    assert not any(a.flags.writeable for a in (kv.truncate(1).k, kv.truncate(0).pos))


def test_mtp_draft_state_is_read_only(make_fixture):
    """The MTP drafter's memory (its KV cache, pending_h, verify_h) is read-only as well."""
    from refimpl.decode.drafts import DraftRequest, MTPSource

    model = load_model(make_fixture("tiny", "f32"))
    src = MTPSource(model)
    _, h, _ = forward(model, SeqState.fresh(model.config), PROMPT)
    s = src.process(src.start(), PROMPT, h)
    _, s = src.draft(s, DraftRequest(tuple(PROMPT) + (7,), 2))
    for a in (s.pending_h, s.verify_h, s.mtp.kv.k, s.mtp.kv.v, s.mtp.kv.pos):
        assert not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        s.pending_h[0] = 1.0
