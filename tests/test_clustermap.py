"""client/clustermap.py: the map of partitioned mode. A member going down makes each of its
partitions' secondary the primary (it has the state) without moving any other partition; the
map's wire form is checked field by field when it comes from the network."""

from __future__ import annotations

import msgpack
import pytest

from roost.client import clustermap, ring
from roost.client.wire import WireError

FIVE = {f"n{i}": ((f"127.0.0.{i}", 7400 + i), (f"127.0.0.{i}", 7500 + i)) for i in range(1, 6)}


def full(epoch: int = 1, live: set[str] | None = None) -> clustermap.ClusterMap:
    return clustermap.compute(epoch, FIVE, set(FIVE) if live is None else live, 256, 2)


def test_with_every_member_live_the_map_is_the_placement():
    m = full()
    assert m.owners == ring.assign(list(FIVE), 256, 2)
    primary = m.primary("orders")
    assert primary is not None and primary == m.owners[ring.partition_of("orders", 256)][0]
    assert m.owns(primary, "orders") and not m.owns("n9", "orders")


@pytest.mark.parametrize("down", sorted(FIVE))
def test_a_member_down_promotes_its_secondaries_and_moves_nothing_else(down):
    before, after = full(), full(2, set(FIVE) - {down})
    for p, (old, new) in enumerate(zip(before.owners, after.owners, strict=True)):
        assert down not in new and len(new) == 2
        if old[0] == down:
            assert new[0] == old[1], p  # the secondary, which holds the state, serves
        elif down not in old:
            assert new == old, p  # partitions the member did not hold do not move
        else:
            assert new[0] == old[0], p  # a primary keeps serving; only its secondary is replaced
    assert full(3).owners == before.owners  # back up: the placement is what it was


def test_one_live_member_owns_everything_and_none_owns_nothing():
    assert all(o == ("n3",) for o in full(live={"n3"}).owners)
    assert full(live=set()).primary("orders") is None


@pytest.mark.parametrize("live", [set(FIVE), set(FIVE) - {"n2"}, {"n4"}, set()])
def test_the_map_round_trips_through_msgpack_and_knows_which_is_newer(live):
    """The wire form carries the view; the receiver computes the same owners the members did."""
    m = full(7, live)
    back = clustermap.decode_untrusted_map(msgpack.unpackb(msgpack.packb(clustermap.encode(m))))
    assert back == m
    assert back.newer_than(full(6)) and not back.newer_than(full(7)) and back.newer_than(None)


def test_the_wire_form_of_five_members_fits_a_welcome():
    """Small enough to ride in a WELCOME to a 256-byte HELLO (3x budget) with room to spare."""
    assert len(msgpack.packb(clustermap.encode(full(2**40)))) < 256


def _wire() -> list:
    return clustermap.encode(full(3))


@pytest.mark.parametrize(("mangle", "message"), [
    (lambda w: w[:4], "map has 4 fields"),
    (lambda w: [*w, []], "map has 6 fields"),
    (lambda w: [2, *w[1:]], "map version 2"),
    (lambda w: [True, *w[1:]], "map version True"),
    (lambda w: [w[0], -1, *w[2:]], "map epoch must be an unsigned"),
    (lambda w: [w[0], 2**64, *w[2:]], "map epoch must be an unsigned"),
    (lambda w: [*w[:2], 0, *w[3:]], "out of range"),
    (lambda w: [*w[:2], 65537, *w[3:]], "out of range"),
    (lambda w: [*w[:3], 9, w[4]], "out of range"),
    (lambda w: [*w[:3], "2", w[4]], "map replicas must be an unsigned"),
    (lambda w: [*w[:2], 65536, w[3], w[4]], "too big to place"),
    (lambda w: [*w[:4], []], "map has 0 members"),
    (lambda w: [*w[:4], "rows"], "map members must be an array"),
    (lambda w: [*w[:4], [w[4][0][:5], *w[4][1:]]], r"\[id, host, port, peer host, peer port, live\]"),
    (lambda w: [*w[:4], [[*w[4][0][:5], 1], *w[4][1:]]], "live"),
    (lambda w: [*w[:4], [["", *w[4][0][1:]], *w[4][1:]]], "map member id"),
    (lambda w: [*w[:4], [[*w[4][0][:1], "example.com", *w[4][0][2:]], *w[4][1:]]], "must be an IP address"),
    (lambda w: [*w[:4], [[*w[4][0][:3], "::g", *w[4][0][4:]], *w[4][1:]]], "map peer host must be an IP"),
    (lambda w: [*w[:4], [[*w[4][0][:2], 0, *w[4][0][3:]], *w[4][1:]]], "map member port must be 1..65535"),
    (lambda w: [*w[:4], [[*w[4][0][:4], 70000, w[4][0][5]], *w[4][1:]]], "map peer port must be 1..65535"),
    (lambda w: [*w[:4], [w[4][1], w[4][0], *w[4][2:]]], "not in sorted order"),
    (lambda w: [*w[:4], [w[4][0], w[4][0], *w[4][2:]]], "twice"),
    (lambda w: "map", "map must be an array"),
])  # fmt: skip
def test_a_malformed_map_is_refused_with_the_field_named(mangle, message):
    with pytest.raises(WireError, match=message):
        clustermap.decode_untrusted_map(mangle(_wire()))
