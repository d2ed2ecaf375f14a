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
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from roost.cluster.peerwire import PeerType, encode
from roost.cluster.replication import chunked, subs_in

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
