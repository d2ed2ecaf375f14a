"""Holes (client/holes.py): skipped producer sequences kept as ranges, against a plain set."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.client.holes import Holes


def test_take_splits_a_range_and_each_sequence_is_taken_once():
    h = Holes()
    h.add(10, 14, limit=100)
    assert h.take(12) and not h.take(12)
    assert (h.ranges(), len(h)) == ([(10, 11), (13, 14)], 4)
    assert h.take(10) and h.take(14) and h.take(11) and h.take(13)
    assert (h.ranges(), len(h)) == ([], 0)
    assert not h.take(9) and not h.take(15)


def test_the_oldest_are_trimmed_to_the_limit_part_of_a_range_too():
    h = Holes()
    h.add(1, 3, limit=5)
    h.add(5, 7, limit=5)  # 6 held: 1 goes
    assert (h.ranges(), len(h)) == ([(2, 3), (5, 7)], 5)
    h.add(100, 104, limit=5)  # only the newest range is left
    assert (h.ranges(), len(h)) == ([(100, 104)], 5)
    assert 1 not in h and 5 not in h and 100 in h


def test_a_range_below_the_highest_held_is_refused():
    h = Holes()
    h.add(10, 20, limit=100)
    with pytest.raises(ValueError, match="not above"):
        h.add(15, 30, limit=100)
    assert h.ranges() == [(10, 20)]


def test_trimmed_ranges_are_dropped_from_the_lists_now_and_then():
    """Many one-sequence holes (a producer alternating between two topics, one of them ours):
    trimming moves a pointer, and the lists are compacted once it passes half of them."""
    h = Holes()
    for k in range(10_000):
        h.add(2 * k + 1, 2 * k + 1, limit=2000)
        assert len(h.starts) <= 2 * 2000 + 1024
    assert len(h) == 2000 and h.ranges()[0] == (2 * 8000 + 1, 2 * 8000 + 1)
    assert h.take(19_999) and not h.take(15_999) and len(h) == 1999


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.integers(0, 40)), max_size=80),
       st.integers(1, 60))  # fmt: skip
def test_holes_behave_as_the_newest_limit_sequences_of_a_set(ops, limit):
    """Jumps (a gap above the highest held) and takes, checked against a set of the same
    sequences from which the oldest beyond ``limit`` are dropped; the lists are compacted as
    soon as 2 ranges were trimmed (so that compaction happens in these short runs)."""
    from unittest import mock

    from roost.client import holes

    with mock.patch.object(holes, "COMPACT_AFTER", 2):
        _against_a_set(ops, limit)


def _against_a_set(ops, limit):
    h, model, top = Holes(), set(), 0
    for jump, a, b in ops:
        if jump:
            first = top + 1 + a % 5
            last = first + b % 20
            h.add(first, last, limit)
            model |= set(range(first, last + 1))
            while len(model) > limit:
                model.discard(min(model))
            top = last
        else:
            seq = a * 3 + b % 3
            assert h.take(seq) == (seq in model)
            model.discard(seq)
        assert len(h) == len(model) == sum(b - a + 1 for a, b in h.ranges())
        assert all((s in h) == (s in model) for s in range(top + 3))
