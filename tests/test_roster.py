"""cluster/roster.py: the membership beyond the config, merged like registers; and its snapshot."""

from __future__ import annotations

import itertools

import pytest

from roost.cluster.roster import Entry, Roster, RosterError, decode_untrusted_roster
from roost.cluster.snapshot import decode_untrusted_snapshot, snapshot_chunks

BASE = {f"n{i}": (("127.0.0.1", 7400 + i), ("127.0.0.1", 7500 + i)) for i in range(1, 4)}


def test_joins_and_leaves_change_the_members_and_merge_in_any_order_to_the_same_roster():
    a = Roster(BASE)
    a.propose_join("n4", ("127.0.0.1", 7404), ("127.0.0.1", 7504))
    a.propose_leave("n2")
    assert list(a.members()) == ["n1", "n3", "n4"] and a.index_of("n4") == 3 and a.left("n2")
    entries = decode_untrusted_roster(a.encode())
    digests = set()
    for order in itertools.permutations(entries):
        b = Roster(BASE)
        assert b.merge(list(order))
        assert not b.merge(list(order))  # idempotent
        digests.add(b.digest())
    assert digests == {a.digest()} and a.digest() != Roster(BASE).digest()


def test_a_join_taking_a_member_id_or_address_and_the_last_leave_are_refused():
    r = Roster(BASE)
    with pytest.raises(RosterError, match="already a member"):
        r.propose_join("n1", ("127.0.0.1", 1), ("127.0.0.1", 2))
    with pytest.raises(RosterError, match="taken by n2"):
        r.propose_join("n9", ("127.0.0.1", 7502), ("127.0.0.1", 2))
    r.propose_leave("n1")
    r.propose_leave("n2")
    with pytest.raises(RosterError, match="last member"):
        r.propose_leave("n3")
    assert r.entries.keys() == {"n1", "n2"}  # (the refusal changed nothing)


def test_a_member_that_left_and_joins_again_keeps_its_index_and_a_newer_version_wins():
    r = Roster(BASE)
    r.propose_join("n4", ("127.0.0.1", 7404), ("127.0.0.1", 7504))
    r.propose_leave("n4")
    e = r.propose_join("n4", ("127.0.0.1", 7405), ("127.0.0.1", 7505))
    assert e.index == 3 and e.version == 3 and r.members()["n4"] == (("127.0.0.1", 7405), ("127.0.0.1", 7505))
    old = Roster(BASE)
    old.merge([("n4", Entry(1, True, 3, ("127.0.0.1", 7404), ("127.0.0.1", 7504)))])
    assert old.merge(decode_untrusted_roster(r.encode())) and old.digest() == r.digest()


@pytest.mark.parametrize(("bad", "why"), [
    ("x", "a list"), ([["n1", 1, True, 0, "127.0.0.1", 1]], "entry must be"),
    ([["n 1", 1, True, 0, "127.0.0.1", 1, "127.0.0.1", 2]], "id"),
    ([["n1", 0, True, 0, "127.0.0.1", 1, "127.0.0.1", 2]], "malformed"),
    ([["n1", 1, 1, 0, "127.0.0.1", 1, "127.0.0.1", 2]], "malformed"),
    ([["n1", 1, True, 256, "127.0.0.1", 1, "127.0.0.1", 2]], "malformed"),
    ([["n1", 1, True, 0, "no-ip", 1, "127.0.0.1", 2]], "host"),
    ([["n1", 1, True, 0, "127.0.0.1", 70000, "127.0.0.1", 2]], "port"),
])  # fmt: skip
def test_a_malformed_roster_is_refused_with_the_field_named(bad, why):
    with pytest.raises(RosterError, match=why):
        decode_untrusted_roster(bad)


def test_the_roster_survives_in_the_snapshot_and_a_bad_one_refuses_the_file():
    r = Roster(BASE)
    r.propose_join("n4", ("127.0.0.1", 7404), ("127.0.0.1", 7504))
    data = b"".join(snapshot_chunks("n1", 1.0e9, [], 10, r.encode()))
    _, chunks, roster = decode_untrusted_snapshot(data)
    assert chunks == [] and roster == decode_untrusted_roster(r.encode())
    bad = b"".join(snapshot_chunks("n1", 1.0e9, [], 10, [["n4", -1, True, 0, "127.0.0.1", 1, "127.0.0.1", 2]]))
    with pytest.raises(ValueError, match="bad roster"):
        decode_untrusted_snapshot(bad)
