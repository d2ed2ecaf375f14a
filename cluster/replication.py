"""What one node owes each peer: queued changes and pushes in flight (sans-IO).

Every local SUB/UNSUB becomes an entry (a ``Replicate`` action of the broker core) that is
queued for every peer and PUSHed over its link, a few frames in flight at a
time, each acknowledged by PUSHACK. While a peer is away its queue grows; on
reconnect what was in flight is sent again (merging is idempotent, so a
duplicate costs nothing). A queue that outgrows ``max_queue`` subscriptions is
dropped and marked: anti-entropy (digest comparison) repairs that peer.

Entries are numbered as they are added (``added``); ``acked_through`` is the
highest number the peer has acknowledged with everything before it. Pushes go
out in order and one link acknowledges them in order, so that is the number
of the last entry of the last acknowledged push. Partitioned mode holds a
CMDACK until the owners' queues have acknowledged the entries of its batch.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

Entry = Any  # [who, cver, host, port, home, [[topic, key, version], ...]]


def subs_in(entry: Entry) -> int:
    return len(entry[5]) or 1


def chunked(entries: Iterable[Entry], limit: int) -> Iterator[list[Entry]]:
    """Entries in lists of about ``limit`` subscriptions: the unit of a DUMP or
    DIFF frame and of a snapshot chunk (an entry is never split)."""
    batch: list[Entry] = []
    n = 0
    for e in entries:
        batch.append(e)
        n += subs_in(e)
        if n >= limit:
            yield batch
            batch, n = [], 0
    if batch:
        yield batch


class PeerQueue:
    def __init__(self, max_queue: int, chunk: int, window: int = 8) -> None:
        self.max_queue = max_queue
        self.chunk = chunk
        self.window = window
        self.pending: deque[Entry] = deque()
        self.pending_subs = 0
        self.inflight: dict[int, list[Entry]] = {}
        self.next_seq = 1
        self.overflowed = False
        # Our side of an anti-entropy repair: batches made from live state only
        # as the window opens (a large repair must not be built in one turn).
        self.repair: Iterator[list[Entry]] | None = None
        # Partitioned: partitions this peer newly owns, handed off to it the same way
        # (after the repair; an anti-entropy round does not replace it).
        self.handoff: Iterator[list[Entry]] | None = None
        self._handing: set[int] = set()  # push seqs in flight that are hand-off batches
        self.added = 0  # entries ever added (their numbers: 1..added)
        self.taken = 0  # entries taken from ``pending`` into pushes (requeued ones given back)
        self.acked_through = 0
        self._numbered: dict[int, tuple[int, int]] = {}  # push seq -> (entries from pending, last number)

    def __len__(self) -> int:
        """Subscriptions not yet acknowledged by the peer."""
        return self.pending_subs + sum(subs_in(e) for es in self.inflight.values() for e in es)

    def add(self, entries: list[Entry]) -> None:
        self.added += len(entries)
        if self.overflowed:
            self.taken = self.acked_through = self.added  # (see below)
            return
        for e in entries:
            self.pending.append(e)
            self.pending_subs += subs_in(e)
        if self.pending_subs > self.max_queue:
            self.pending.clear()
            self.pending_subs = 0
            self.taken = self.added  # (never acknowledged one by one: anti-entropy repairs)
            # Nothing dropped will be acknowledged: a CMDACK held for this peer would
            # wait for down_after; anti-entropy repairs it instead (review finding #8).
            self.acked_through = self.added
            self.overflowed = True
            self.repair = None  # (the next digest round repairs everything)

    def clear(self) -> None:
        """The peer left the cluster: nothing more goes to it, and a CMDACK held for it waits no
        longer."""
        self.pending.clear()
        self.pending_subs = 0
        self.inflight.clear()
        self._numbered.clear()
        self._handing.clear()
        self.repair = self.handoff = None
        self.taken = self.acked_through = self.added

    def add_repair(self, entries: Iterable[Entry]) -> None:
        """Push ``entries`` after what is queued, taken lazily; replaces a
        repair still in progress (the new one covers the current difference)."""
        if not self.overflowed:
            self.repair = chunked(entries, self.chunk)

    def add_handoff(self, entries: Iterable[Entry]) -> None:
        """Push ``entries`` (taken lazily) after the repair and any hand-off before."""
        more = chunked(entries, self.chunk)
        self.handoff = more if self.handoff is None else itertools.chain(self.handoff, more)

    def _unnumbered(self) -> list[Entry]:
        """The next batch of the repair, else of the hand-off ([] when both are done)."""
        if self.repair is not None:
            batch = next(self.repair, [])
            if batch:
                return batch
            self.repair = None
        if self.handoff is not None:
            batch = next(self.handoff, [])
            if batch:
                self._handing.add(self.next_seq)
                return batch
            self.handoff = None
        return []

    def next_push(self) -> tuple[int, list[Entry]] | None:
        """The next PUSH to send, if the window allows one."""
        if len(self.inflight) >= self.window:
            return None
        batch: list[Entry] = []
        seq = self.next_seq
        if self.pending:
            n = 0
            while self.pending and n < self.chunk:
                e = self.pending.popleft()
                k = subs_in(e)
                self.pending_subs -= k
                n += k
                batch.append(e)
            self.taken += len(batch)
            self._numbered[seq] = (len(batch), self.taken)
        else:
            batch = self._unnumbered()
            if not batch:
                return None
        self.next_seq += 1
        self.inflight[seq] = batch
        return seq, batch

    def acked(self, seq: int) -> None:
        self.inflight.pop(seq, None)
        self._handing.discard(seq)
        n = self._numbered.pop(seq, None)
        if n is not None and n[1] > self.acked_through:
            self.acked_through = n[1]

    def disconnected(self) -> None:
        """The link dropped: the changes in flight go back to the front, in order,
        and repair and hand-off batches in flight to the front of theirs
        (unnumbered: they hold no CMDACK)."""
        unnumbered = sorted(s for s in self.inflight if s not in self._numbered)
        repair = [self.inflight[s] for s in unnumbered if s not in self._handing]
        handing = [self.inflight[s] for s in unnumbered if s in self._handing]
        if repair:
            self.repair = itertools.chain(repair, self.repair or ())
        if handing:
            self.handoff = itertools.chain(handing, self.handoff or ())
        self._handing.clear()
        for seq in sorted(self._numbered, reverse=True):
            for e in reversed(self.inflight[seq]):
                self.pending.appendleft(e)
                self.pending_subs += subs_in(e)
        self.taken -= sum(k for k, _ in self._numbered.values())
        self._numbered.clear()
        self.inflight.clear()

    def repaired(self) -> None:
        """Anti-entropy brought the peer up to date after an overflow."""
        self.overflowed = False
