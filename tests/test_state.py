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
