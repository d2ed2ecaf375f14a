"""State dumps and repairs being streamed to peers, a few frames at a time (sans-IO).

A PULL is answered with the whole state (DUMP frames, then DUMPEND) and a
DIGEST with the registers of the buckets that differ (DIFF, then DIFFEND).
A million subscriptions must not stall a member, so the answer is produced
lazily: each turn of the member core emits FRAMES_PER_TURN frames per link
and the rest waits for later turns, with client traffic served in between.
A link whose runner has not yet sent what it was given (``LinkSent``) gets
nothing more until it drains: a slow peer holds back its own answer, never
the member's memory.
Answers on one link go out in the order they were asked for.

:class:`Dumps` is the member's component that answers (cluster/member.py routes PULL and DIGEST
frames to it and gives it a turn after every event); :class:`DumpStreams` holds the answers in
progress. A member that is not ready answers a PULL with ``DUMPEND -1`` ("not ready": pull from
someone else). ``PULL [partitions]`` (a join's gains) dumps those partitions only, and the puller
gets their later changes pushed too (cluster/joining.py, ``pending``). A DIGEST is compared
bucket by bucket with ours (in partitioned mode only the partitions both members own).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from roost.cluster.config import ClusterSettings
from roost.cluster.joining import Joining
from roost.cluster.links import Link, LinkTable
from roost.cluster.partitionmap import PartitionMap
from roost.cluster.peerwire import (
    PeerProtocolError,
    PeerType,
    check_digest_untrusted,
    check_partitions_untrusted,
    encode,
)  # fmt: skip
from roost.cluster.replication import chunked, subs_in
from roost.node.actions import Log
from roost.node.core import BrokerCore

# Frames produced per link per turn.
FRAMES_PER_TURN = 4


class _Stream:
    """One DUMP or DIFF answer in progress."""

    __slots__ = ("kind", "batches", "sent", "end")

    def __init__(self, kind: PeerType, batches: Iterator[list[Any]], end: Callable[[int], list[Any]]) -> None:
        self.kind = kind
        self.batches = batches
        self.sent = 0  # subscriptions sent so far (DUMPEND reports it)
        self.end = end


class DumpStreams:
    def __init__(self, chunk: int) -> None:
        self.chunk = chunk
        self.by_link: dict[int, deque[_Stream]] = {}

    def __bool__(self) -> bool:
        return bool(self.by_link)

    def start(self, lid: int, kind: PeerType, entries: Iterable[Any], end: Callable[[int], list[Any]]) -> None:
        """Answer on link ``lid`` with ``entries`` in ``kind`` frames, then ``end(sent)``."""
        self.by_link.setdefault(lid, deque()).append(_Stream(kind, chunked(entries, self.chunk), end))

    def drop(self, lid: int) -> None:
        self.by_link.pop(lid, None)

    def running(self, lid: int, kind: PeerType) -> bool:
        """Is an answer of this kind in progress on the link?"""
        return any(st.kind == kind for st in self.by_link.get(lid, ()))

    def ready(self, can_send: Callable[[int], bool]) -> bool:
        """Has some link with an answer in progress room to send?"""
        return any(can_send(lid) for lid in self.by_link)

    def turn(self, can_send: Callable[[int], bool]) -> Iterator[tuple[int, bytes]]:
        """(link, encoded frame) for a few frames of every answer in progress
        on a link with room. A generator: ``can_send`` is asked again before
        every frame, after the caller queued (and counted) the previous one."""
        for lid, streams in list(self.by_link.items()):
            st = streams[0]
            for _ in range(FRAMES_PER_TURN):
                if not can_send(lid):
                    break
                batch = next(st.batches, None)
                if batch is None:
                    streams.popleft()
                    if not streams and self.by_link.get(lid) is streams:
                        del self.by_link[lid]
                    yield lid, encode(st.end(st.sent))
                    break
                st.sent += sum(subs_in(e) for e in batch)
                yield lid, encode([st.kind, batch])


class Dumps:
    """The member's answers to PULL and DIGEST, streamed as their links drain (shared: the
    link table, the map, the roster work, the broker core, the action list)."""

    def __init__(self, s: ClusterSettings, broker: BrokerCore, maps: PartitionMap, joins: Joining, links: LinkTable,
                 actions: list[Any]) -> None:  # fmt: skip
        self.streams = DumpStreams(s.chunk_subscriptions)  # DUMP/DIFF answers in progress
        self.s = s
        self.broker = broker
        self.maps = maps
        self.joins = joins
        self.lt = links
        self._out = actions

    def drained(self, lid: int) -> bool:
        """May a dump stream send more on this link? (backpressure: cluster/links.py)"""
        return self.lt.drained(lid, self.s.max_frame)

    def due(self) -> bool:
        """Has an answer in progress room to send now?"""
        return bool(self.streams) and self.streams.ready(self.drained)

    def turn(self) -> None:
        """A few frames of every answer in progress, on each link with room."""
        if self.streams:
            for lid, data in self.streams.turn(self.drained):
                self.lt.frame(lid, data)

    def drop(self, lid: int) -> None:
        """The link closed: its answers are dropped."""
        self.streams.drop(lid)

    def pull(self, link: Link, f: list[Any], ready: bool) -> None:
        """``PULL`` (everything) or ``PULL [partitions]`` (these only)."""
        if self.streams.running(link.id, PeerType.DUMP):
            raise PeerProtocolError("PULL while a dump is in progress on this link")
        if not ready:
            self.lt.frame(link.id, encode([PeerType.DUMPEND, -1]))  # "not ready": pull from someone else
            return
        peer = link.peer
        out = self._out

        def served(sent: int) -> list[Any]:
            out.append(Log("info", "served_pull", {"peer": peer, "subscriptions": sent}))
            return [PeerType.DUMPEND, sent]

        parts = None  # (PULL [partitions]: these only; PULL: everything)
        if len(f) == 2:
            _, wanted = f
            parts = check_partitions_untrusted(wanted, len(self.broker.digest))
        if parts is not None:
            self.joins.note_pull(peer, parts)
        dump = self.broker.dump(parts, home=peer if parts is not None else None)
        self.streams.start(link.id, PeerType.DUMP, dump, served)

    def digest(self, link: Link, digest: Any) -> None:
        """``DIGEST``: our registers of the buckets that differ (DIFF frames), then DIFFEND."""
        if self.streams.running(link.id, PeerType.DIFF):
            raise PeerProtocolError("DIGEST while a DIFF is in progress on this link")
        ours = self.broker.digest
        theirs = check_digest_untrusted(digest, len(ours))
        assert link.peer is not None
        among = self.maps.shared(link.peer) if self.maps.partitioned else range(len(ours))
        differ = [i for i in among if ours[i] != theirs[i]]
        self.streams.start(link.id, PeerType.DIFF, self.broker.dump(set(differ)) if differ else iter(()),
                           lambda sent: [PeerType.DIFFEND, differ])  # fmt: skip
