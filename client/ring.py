"""Partitions and their owners, for partitioned mode (docs/cluster.md, "The ring").

Theory of operation. A topic belongs to partition ``mmh3(topic) mod P``; P is fixed for the life
of a cluster. Each partition has ``replicas`` owners, the first its primary and the next its
secondary. Owners are a pure function of (members, P, replicas): every member that knows the
same membership computes the same assignment, so the cluster map is computed, never agreed on.

Three placements are implemented, because the choice is measured (scripts/ring_balance.py):

- ``ring``: a consistent-hash ring with virtual nodes: each member owns ``vnodes`` points
  ``mmh3("member#i")``; a partition's point is ``mmh3("partition:p")`` and its owners are the
  first distinct members clockwise (Dynamo, Cassandra).
- ``rendezvous``: highest random weight: each partition ranks the members by
  ``mmh3("p:member")`` and takes the first ``replicas`` (Thaler and Ravishankar).
- ``bounded``: rendezvous with bounded loads: the same ranking, but a member already holding
  ``ceil(load * P / N)`` partitions at a replica level is passed over (Mirrokni, Thorup,
  Zadimoghaddam, "Consistent hashing with bounded loads"). The most loaded member stays within
  ``load`` of the average, and a join or a leave still moves about 1/N of the partitions.

Pure functions only (no clock, no randomness beyond the hash): the member core, the client
library and the simulator all call them.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence

import mmh3


def partition_of(topic: str, partitions: int) -> int:
    """The partition of a topic: mmh3 (32-bit, seed 0, unsigned) of its UTF-8 bytes, mod P."""
    return mmh3.hash(topic.encode(), 0, signed=False) % partitions


__all__ = ["DEFAULT_PLACEMENT", "PLACEMENTS", "Assignment", "assign", "loads", "moved", "partition_of", "ranked"]

PLACEMENTS = ("ring", "rendezvous", "bounded")
DEFAULT_PLACEMENT = "bounded"
DEFAULT_VNODES = 128
DEFAULT_LOAD = 1.1  # bounded: the most loaded member holds at most this times the average (rounded up)

Assignment = tuple[tuple[str, ...], ...]  # partition -> owners, primary first


def _h(text: str) -> int:
    return int(mmh3.hash(text.encode(), 0, signed=False))


def assign(
    members: Sequence[str],
    partitions: int,
    replicas: int = 2,
    placement: str = DEFAULT_PLACEMENT,
    vnodes: int = DEFAULT_VNODES,
    load: float = DEFAULT_LOAD,
) -> Assignment:
    """The owners of every partition (min(replicas, len(members)) each, primary first). The
    order of `members` does not matter; an empty membership owns nothing."""
    if partitions < 1 or replicas < 1:
        raise ValueError("partitions and replicas must be at least 1")
    ids = sorted(set(members))
    k = min(replicas, len(ids))
    if k == 0:
        return tuple(() for _ in range(partitions))
    if placement == "ring":
        return _ring(ids, partitions, k, vnodes)
    if placement == "rendezvous":
        return tuple(tuple(ranked(ids, p)[:k]) for p in range(partitions))
    if placement == "bounded":
        return _bounded(ids, partitions, k, load)
    raise ValueError(f"placement must be one of {', '.join(PLACEMENTS)}, not {placement!r}")


def ranked(ids: list[str], p: int) -> list[str]:
    """Members by decreasing rendezvous weight for partition p (ties, if any, by id)."""
    return sorted(ids, key=lambda m: (-_h(f"{p}:{m}"), m))


def _ring(ids: list[str], partitions: int, k: int, vnodes: int) -> Assignment:
    points = sorted((_h(f"{m}#{i}"), m) for m in ids for i in range(vnodes))
    keys = [pt for pt, _ in points]
    out = []
    for p in range(partitions):
        i = bisect_right(keys, _h(f"partition:{p}"))
        owners: list[str] = []
        for j in range(len(points)):
            m = points[(i + j) % len(points)][1]
            if m not in owners:
                owners.append(m)
                if len(owners) == k:
                    break
        out.append(tuple(owners))
    return tuple(out)


def _bounded(ids: list[str], partitions: int, k: int, load: float) -> Assignment:
    """Replica level by level, partitions in order: the best-ranked member that is not already
    an owner of the partition and is under the level's cap."""
    cap = math.ceil(load * partitions / len(ids))
    order = [ranked(ids, p) for p in range(partitions)]
    owners: list[list[str]] = [[] for _ in range(partitions)]
    for _ in range(k):
        held = dict.fromkeys(ids, 0)
        for p in range(partitions):
            for m in order[p]:
                if m not in owners[p] and held[m] < cap:
                    owners[p].append(m)
                    held[m] += 1
                    break
    return tuple(tuple(o) for o in owners)


def moved(before: Assignment, after: Assignment) -> tuple[int, int]:
    """What a membership change costs: (primaries that changed member, partition copies placed
    on a member that did not hold the partition before: the state that must be streamed)."""
    primaries = sum(1 for a, b in zip(before, after, strict=True) if (a[:1] != b[:1]))
    copies = sum(len(set(b) - set(a)) for a, b in zip(before, after, strict=True))
    return primaries, copies


def loads(assignment: Assignment, members: Sequence[str]) -> tuple[dict[str, int], dict[str, int]]:
    """Per member: (partitions it is primary of, partitions it holds a copy of)."""
    prim = dict.fromkeys(members, 0)
    held = dict.fromkeys(members, 0)
    for owners in assignment:
        if owners:
            prim[owners[0]] += 1
        for m in owners:
            held[m] += 1
    return prim, held
