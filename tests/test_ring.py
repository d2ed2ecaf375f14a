"""client/ring.py: where partitions live in partitioned mode. Every member and client must
compute the same owners from the same membership, the load must stay near the average, and a
join or a leave must move about 1/N of the partitions."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

from roost.client import ring
from tests.clusterkit import ROOT

FIVE = [f"n{i}" for i in range(1, 6)]


def test_a_topic_s_partition_is_part_of_the_protocol():
    """Clients compute it too (mmh3 x86 32-bit, seed 0, unsigned, of the UTF-8 bytes, mod P):
    these values must never change, or old clients would route to the wrong member."""
    assert [ring.partition_of(t, 256) for t in ("orders", "prices", "", "é")] == [137, 76, 0, 135]
    assert ring.partition_of("orders", 1) == 0


@pytest.mark.parametrize("placement", ring.PLACEMENTS)
@pytest.mark.parametrize("n", [1, 2, 3, 5, 8])
def test_every_partition_has_distinct_owners_whatever_the_order_members_are_given_in(placement, n):
    ids = [f"m{i}" for i in range(n)]
    a = ring.assign(ids, 64, 2, placement)
    assert a == ring.assign(list(reversed(ids)), 64, 2, placement)
    assert len(a) == 64
    assert all(len(owners) == min(2, n) == len(set(owners)) and set(owners) <= set(ids) for owners in a)


def test_the_assignment_is_the_same_in_every_process():
    """No dependence on Python's per-process string hashing (PYTHONHASHSEED)."""
    code = "from roost.client import ring; print(ring.assign(['n1','n2','n3','n4','n5'], 256))"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1 and outs.pop().strip() == repr(ring.assign(FIVE, 256))


@pytest.mark.parametrize("n", range(1, 13))
def test_bounded_placement_keeps_every_member_within_the_cap(n):
    ids = [f"n{i}" for i in range(1, n + 1)]
    prim, held = ring.loads(ring.assign(ids, 256, 2), ids)
    cap = math.ceil(ring.DEFAULT_LOAD * 256 / n)
    assert max(prim.values()) <= cap and sum(prim.values()) == 256
    assert max(held.values()) <= cap * min(2, n) and sum(held.values()) == 256 * min(2, n)


def test_a_sixth_member_joining_moves_about_a_sixth():
    """docs/cluster.md promises it: at most 1.25 x P/6 partitions move to the new member."""
    before, after = ring.assign(FIVE, 256), ring.assign([*FIVE, "n6"], 256)
    primaries, copies = ring.moved(before, after)
    assert primaries <= 1.25 * 256 / 6 and copies <= 1.25 * 2 * 256 / 6
    assert copies >= sum(1 for owners in after if "n6" in owners)  # (everything n6 holds was streamed to it)


@pytest.mark.parametrize("leaver", FIVE)
def test_a_member_leaving_moves_about_its_share(leaver):
    before = ring.assign(FIVE, 256)
    prim, held = ring.loads(before, FIVE)
    primaries, copies = ring.moved(before, ring.assign([m for m in FIVE if m != leaver], 256))
    assert primaries <= 1.25 * prim[leaver] and copies <= 1.25 * held[leaver]


def test_moved_counts_primary_changes_and_new_copies():
    before = (("a", "b"), ("b", "c"))
    assert ring.moved(before, before) == (0, 0)
    assert ring.moved(before, (("b", "a"), ("b", "d"))) == (1, 1)  # a promotion streams nothing


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="placement must be one of ring, rendezvous, bounded"):
        ring.assign(FIVE, 8, 2, "random")
    with pytest.raises(ValueError, match="at least 1"):
        ring.assign(FIVE, 0)
    assert ring.assign([], 4) == ((), (), (), ())


def test_the_balance_script_prints_a_row_per_placement_and_size():
    r = subprocess.run(
        [sys.executable, "scripts/ring_balance.py", "--members", "5", "6"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows = [line for line in r.stdout.splitlines() if line.startswith("| ") and "|---" not in line]
    assert len(rows) == 1 + 3 * 2 + 3  # header, 3 placements x 2 sizes, 3 worst rows
