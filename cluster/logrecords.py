"""What the records of a durable partition log mean, and the state they add up to (sans-IO).

Theory of operation (docs/durable.md)
-------------------------------------
A record body is msgpack ``[epoch, kind, ...]``, the epoch that of the leader
that wrote it:

* ``MESSAGE`` ``[topic, key, tags, payload, producer id, producer sequence]``;
* ``CURSOR`` ``[client id, subscription name, next offset]``: a durable
  subscription acknowledged everything before the offset;
* ``EPOCH`` ``[]``: a leader begins; the log itself says where each epoch starts.

Bodies come from our own disk and from peers, so they are decoded as untrusted
(``decode_untrusted_body``). ``State`` is what the records through some offset
say: each producer's last sequence (the idempotent producer) and each cursor,
with the offset of the cursor's newest record (retention must not delete the
only record of a live cursor: the primary writes such a cursor again first).

``LogScan`` reads a log at start-up one chunk at a time, so that a large log
costs a bounded amount of memory: it keeps the state of every record, the
epochs and only the newest ``keep`` records themselves (the cache a
``PartitionLog`` starts with). It is pure: the runner feeds it what it reads.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgpack

from roost.node.segmentlog import Record

MESSAGE, CURSOR, EPOCH = 0, 1, 2


class LogFormatError(ValueError):
    """A record body that is not one of ours (from a peer or a damaged file)."""


def decode_untrusted_body(body: bytes) -> list[Any]:
    try:
        b = msgpack.unpackb(body, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several types for bad input
        raise LogFormatError(f"undecodable record body: {exc}") from None
    ok = isinstance(b, list) and len(b) >= 2 and isinstance(b[0], int) and b[0] >= 1
    if ok and b[1] == MESSAGE:
        ok = len(b) == 8 and isinstance(b[2], str) and isinstance(b[6], bytes) and isinstance(b[7], int)
    elif ok and b[1] == CURSOR:
        ok = len(b) == 5 and isinstance(b[2], bytes) and isinstance(b[3], str) and isinstance(b[4], int)
    elif ok:
        ok = b[1] == EPOCH and len(b) == 2
    if not ok:
        raise LogFormatError("a record body of unknown shape")
    return b  # type: ignore[no-any-return]


def message_body(epoch: int, m: list[Any], pid: bytes, seq: int) -> bytes:
    return msgpack.packb([epoch, MESSAGE, m[0], m[1], m[2], m[3], pid, seq], use_bin_type=True)  # type: ignore[no-any-return]


def cursor_body(epoch: int, cid: bytes, name: str, offset: int) -> bytes:
    return msgpack.packb([epoch, CURSOR, cid, name, offset], use_bin_type=True)  # type: ignore[no-any-return]


@dataclass
class State:
    """What the records through some offset say: producers' last (sequence, offset), cursors
    (key -> next offset) and where each cursor's newest record is."""

    producers: dict[bytes, tuple[int, int]] = field(default_factory=dict)
    cursors: dict[tuple[bytes, str], int] = field(default_factory=dict)
    cursor_at: dict[tuple[bytes, str], int] = field(default_factory=dict)

    def apply(self, offset: int, b: list[Any]) -> None:
        if b[1] == MESSAGE:
            self.producers[b[6]] = (b[7], offset)
        elif b[1] == CURSOR:
            key = (b[2], b[3])
            if b[4] >= self.cursors.get(key, -1):  # (the same value again: a copy made for retention)
                self.cursors[key] = b[4]
                self.cursor_at[key] = offset

    def copy(self) -> State:
        return State(dict(self.producers), dict(self.cursors), dict(self.cursor_at))


class Held(Protocol):
    """What holds records in memory and what they add up to: a log read at start-up (``LogScan``)
    and an owner's live log (``PartitionLog``) take each record the same way (``take``)."""

    epochs: list[tuple[int, int]]  # (leader epoch, its first offset), ascending
    tail: deque[tuple[Record, list[Any]]]
    state: State
    end: int
    last_ms: int


def take(h: Held, r: Record, b: list[Any]) -> None:
    """``h`` takes the record ``r`` (decoded: ``b``) at its end."""
    if not h.epochs or b[0] > h.epochs[-1][0]:
        h.epochs.append((b[0], r.offset))
    h.tail.append((r, b))
    h.state.apply(r.offset, b)
    h.end = r.offset + 1
    if r.time_ms > h.last_ms:
        h.last_ms = r.time_ms


def last_epoch_of(epochs: list[tuple[int, int]]) -> int:
    return epochs[-1][0] if epochs else 0


def end_for_epoch(epochs: list[tuple[int, int]], log_end: int, epoch: int) -> int:
    """Where ``epoch`` ended in a log of ``epochs`` ending at ``log_end``: the first offset of the
    next higher epoch."""
    for e, first in epochs:
        if e > epoch:
            return first
    return log_end


def diverges(epochs: list[tuple[int, int]], log_end: int, end: int, last_epoch: int) -> int | None:
    """The offset a fetcher at ``end`` with ``last_epoch`` must truncate to, or None, against a log
    of ``epochs`` ending at ``log_end``. An epoch this log never had is divergent whatever its
    end: the answer is then at or past ``end``, and the fetcher cuts all of that epoch
    (PartitionLog._copy; simulator seed 9). One older than every epoch held here: 0, and the
    fetcher resets to our start."""
    if last_epoch == 0:  # (no records: nothing to cut)
        return None
    if epochs and last_epoch < epochs[0][0]:
        # (older than every epoch held here: where it ended went with retention or a reset, and
        # the fetcher may hold a never-committed record below our first; it begins again at our
        # start, as ``PartitionLog._copy`` does with a cut to 0; second review)
        return 0 if end > 0 else None
    cut = end_for_epoch(epochs, log_end, last_epoch)
    if end > cut:
        return cut
    if epochs and last_epoch > epochs[0][0] and all(e != last_epoch for e, _ in epochs):
        return max(cut, end)
    return None


class LogScan:
    """A log read at start-up, chunk by chunk: everything a ``PartitionLog`` needs to begin."""

    def __init__(self, start: int, keep: int, commit: int = 0, seen: int = 0) -> None:
        self.start = self.end = start
        self.keep = keep
        self.commit = commit  # the log's commit checkpoint (``Checkpoint``): at most the true commit
        self.seen = seen  # (unused by the core since leaders are the quorum's: kept for the shells)
        self.epochs: list[tuple[int, int]] = []  # (leader epoch, its first offset), ascending
        self.state = State()  # every record's
        self.base = State()  # the records no longer in ``tail``
        self.base_at = start
        self.tail: deque[tuple[Record, list[Any]]] = deque()
        self.last_ms = 0

    @classmethod
    def of(cls, start: int, records: list[Record], keep: int = 1 << 62, commit: int = 0, seen: int = 0) -> LogScan:
        scan = cls(start, keep, commit, seen)
        scan.feed(records)
        return scan

    def feed(self, records: list[Record]) -> None:
        """The next records of the log, in order. Raises LogFormatError for a body not ours."""
        for r in records:
            take(self, r, decode_untrusted_body(r.body))
            if len(self.tail) > self.keep:
                old, ob = self.tail.popleft()
                self.base.apply(old.offset, ob)
                self.base_at = old.offset + 1

    @property
    def records(self) -> int:
        return self.end - self.start
