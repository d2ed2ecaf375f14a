"""The cluster map of partitioned mode (docs/cluster.md, "The map").

Theory of operation. Two memberships shape the map:

- the *placed* members: the configured ones (and, later, those joined and not left). Only a join
  or a leave changes them, and client/ring.py places the partitions on them;
- the *live* members: the placed ones this member's failure detector does not hold ``down``.

A partition's *preference list* is its placed owners (primary first) followed by every other
placed member in rendezvous order for that partition. Its owners in the map are the first
``replicas`` live members of that list. So a member going down changes no placement: its
partitions' secondaries become their primaries (they hold the state already) and the next live
member in the list becomes the new secondary, to be filled from the primary; when it comes back
the placement is what it was and the primaries move back once it is in sync.

Every member computes the map from what it knows (placed members, live set) with the same pure
functions, so two members with the same view have the same map. ``epoch`` orders maps: a member
raises it past every epoch it has seen when its own view changes, and adopts a higher one it hears
of; a client keeps the map of the highest epoch it has been given.

The wire form, in WELCOME and REDIRECT (docs/protocol.md, "The cluster map"), is a msgpack list
``[version, epoch, partitions, replicas, [[id, host, port, peer host, peer port, live], ...]]``:
the view, not the owners. Placement is deterministic, so the receiver computes the owners with
the same :func:`compute` the members use; the owner table (one entry per partition) would make
the map too big for a WELCOME within the 3x anti-amplification budget of a 256-byte HELLO.
:func:`decode_untrusted_map` checks every field of a map received from the network and bounds
the work of recomputing it (``MAX_WORK``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from roost.client import ring
from roost.client.wire import ErrorCode, WireError, _ip, _list, _node_id, _port, _uint

Addr = tuple[str, int]
MAP_VERSION = 1
MAX_PARTITIONS = 65536
MAX_MEMBERS = 1024
#: partitions x members a received map may ask us to place: computing the owners costs about
#: that many hashes (65,536 take ~0.1 s), and a map comes from the network.
MAX_WORK = 2**18


@dataclass(frozen=True)
class ClusterMap:
    epoch: int
    partitions: int
    replicas: int
    members: Mapping[str, tuple[Addr, Addr]]  # placed member -> (client address, peer address)
    live: frozenset[str]
    owners: tuple[tuple[str, ...], ...]  # partition -> live owners, primary first (may be empty)

    def partition(self, topic: str) -> int:
        return ring.partition_of(topic, self.partitions)

    def primary(self, topic: str) -> str | None:
        """The member a client sends a topic's PUB and SUB to; None when no owner is live."""
        owners = self.owners[self.partition(topic)]
        return owners[0] if owners else None

    def address(self, member: str) -> Addr:
        """The client (UDP) address of a member of the map."""
        return self.members[member][0]

    def owns(self, member: str, topic: str) -> bool:
        return member in self.owners[self.partition(topic)]

    def newer_than(self, other: ClusterMap | None) -> bool:
        return other is None or self.epoch > other.epoch


def preference(placed: tuple[tuple[str, ...], ...], members: Iterable[str], p: int) -> list[str]:
    """Partition p's placed owners, then every other member by rendezvous rank."""
    first = list(placed[p])
    return first + [m for m in ring.ranked(sorted(members), p) if m not in first]


def compute(
    epoch: int,
    members: Mapping[str, tuple[Addr, Addr]],
    live: Iterable[str],
    partitions: int,
    replicas: int,
    placement: str = ring.DEFAULT_PLACEMENT,
) -> ClusterMap:
    """The map of a view: placed `members` and the `live` ones among them."""
    ids = sorted(members)
    alive = frozenset(live) & frozenset(ids)
    placed = ring.assign(ids, partitions, replicas, placement)
    owners = tuple(tuple([m for m in preference(placed, ids, p) if m in alive][:replicas]) for p in range(partitions))
    return ClusterMap(epoch, partitions, replicas, dict(members), alive, owners)


def encode(cmap: ClusterMap) -> list[Any]:
    """The msgpack-ready wire form: the view (members in sorted order, with liveness); the
    receiver computes the owners from it (:func:`decode_untrusted_map`)."""
    ids = sorted(cmap.members)
    return [
        MAP_VERSION,
        cmap.epoch,
        cmap.partitions,
        cmap.replicas,
        [[m, *cmap.members[m][0], *cmap.members[m][1], m in cmap.live] for m in ids],
    ]


def decode_untrusted_map(v: Any) -> ClusterMap:
    """A map received from the network, every field checked, its owners computed as the members
    compute them; WireError names the first bad field."""
    f = _list(v, "map")
    if len(f) != 5:
        raise WireError(ErrorCode.MALFORMED, f"map has {len(f)} fields, expected 5")
    if f[0] != MAP_VERSION or f[0].__class__ is not int:
        raise WireError(ErrorCode.MALFORMED, f"map version {f[0]!r}, expected {MAP_VERSION}")
    epoch = _uint(f[1], "map epoch")
    partitions = _uint(f[2], "map partitions")
    replicas = _uint(f[3], "map replicas")
    if not 1 <= partitions <= MAX_PARTITIONS or not 1 <= replicas <= 8:
        raise WireError(ErrorCode.MALFORMED, f"map partitions {partitions} or replicas {replicas} out of range")
    rows = _list(f[4], "map members")
    if not 1 <= len(rows) <= MAX_MEMBERS:
        raise WireError(ErrorCode.MALFORMED, f"map has {len(rows)} members")
    if partitions * len(rows) > MAX_WORK:
        raise WireError(
            ErrorCode.MALFORMED, f"map of {partitions} partitions on {len(rows)} members is too big to place"
        )
    members: dict[str, tuple[Addr, Addr]] = {}
    live = set()
    for row in rows:
        r = _list(row, "map member")
        if len(r) != 6 or type(r[5]) is not bool:
            raise WireError(ErrorCode.MALFORMED, "map member must be [id, host, port, peer host, peer port, live]")
        mid = _node_id(r[0], "map member id")
        if mid in members:
            raise WireError(ErrorCode.MALFORMED, f"map member {mid!r} twice")
        members[mid] = (
            (_ip(r[1], "map member host"), _port(r[2], "map member port")),
            (_ip(r[3], "map peer host"), _port(r[4], "map peer port")),
        )
        if r[5]:
            live.add(mid)
    if sorted(members) != [str(x[0]) for x in rows]:
        raise WireError(ErrorCode.MALFORMED, "map members are not in sorted order")
    key = (epoch, partitions, replicas, tuple(members.items()), frozenset(live))
    cmap = _placed.get(key)
    if cmap is None:
        cmap = compute(epoch, members, live, partitions, replicas)
        if len(_placed) >= 16:
            del _placed[next(iter(_placed))]
        _placed[key] = cmap
    return cmap


# The last few maps decoded: every session of a client (and every client of the simulator) gets
# the same map from WELCOMEs and REDIRECTs again and again; placing it once is enough.
_placed: dict[tuple[Any, ...], ClusterMap] = {}
