"""Messages larger than one datagram: split by the publisher, put together by the subscriber.

Theory of operation. A reliable publish whose packed message does not fit one datagram (and
whose payload is at most ``max_payload``) becomes ``count`` fragment messages with
consecutive producer sequences: the same topic, key and tags, a slice of the payload each,
and one more tag, ``roost.part`` = ``"<id> <index> <count> <total>"`` (``id`` names the
message within its producer, ``total`` is the whole payload's length). To nodes and peers a
fragment is an ordinary message: it is matched, replicated, forwarded, retransmitted and
de-duplicated as one, and FIFO per producer keeps fragments in order on each stream. The one
place a node looks at the tag is a queue group's pick (node/delivery.py): every fragment of
one message goes to the same member, by rendezvous hashing on the id, so that choice needs no
state and is the same on every cluster member.

The subscriber (:class:`Reassembler`, fed by client/receive.py) keeps partial messages by
(producer id, id) until every index has arrived, in any order (a failover can interleave two
nodes' streams), then hands the whole message on once. Memory is bounded twice: a declared
``total`` above the client's ``max_payload`` is refused on sight, and partial messages
together hold at most ``reassembly_bytes``, each fragment charged ``FRAGMENT_COST`` bytes on
top of its payload (so empty ones count too): past that, the oldest partial is dropped. A
tag whose ``count`` is more than one fragment per ``MIN_FRAGMENT`` bytes of ``total`` does
not parse: a real fragment carries at least half of a datagram of at least 1,200 bytes. A
partial message that gets no new fragment for ``reassembly_timeout`` is dropped too (its
publisher died mid-message, or a fire subscription lost a fragment). Every drop is counted.

Fire publishes are never split: one datagram each, refused beyond it with the size error.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from roost.client import wire
from roost.client.wire import PART_TAG, ErrorCode, WireError

#: The ``roost.part`` value's longest possible tail after the id (index, count, total).
_TAIL_MAX = len(" 4294967295 4294967295 4294967295")
FRAGMENT_COST = 128  # bytes charged per fragment held, beyond its payload
MIN_FRAGMENT = 512  # payload bytes every fragment but the last carries, at least


def part_id(producer_id: bytes, first_seq: int) -> str:
    """A message's id among its producer's: unique per producer, and spread over the hash
    space by the producer id's first bytes (queue groups pick members by it)."""
    return f"{producer_id[:4].hex()}-{first_seq:x}"


def split(
    topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes, ident: str, max_datagram: int
) -> list[bytes]:
    """The packed fragment messages of one large message, in order; WireError (too_large)
    when its topic, key and tags leave less than half of a datagram for payload."""
    own = dict(tags) if tags else {}
    if len(own) >= wire.MAX_TAGS:
        raise WireError(ErrorCode.TOO_LARGE, f"a message larger than one datagram is sent in parts and needs one tag "
                        f"({PART_TAG}) of its own: at most {wire.MAX_TAGS - 1} tags")  # fmt: skip
    own[PART_TAG] = ident + " " * _TAIL_MAX
    header = len(wire.pack_message(topic, key, own, b"")) + 5  # (bin32: 5 bytes of length)
    room = max_datagram - wire.MESSAGE_ROOM - header
    if room < max_datagram // 2:
        raise WireError(ErrorCode.TOO_LARGE, f"topic, key and tags take {header:,} bytes: a message larger than one "
                        f"datagram needs at least half of each ({max_datagram:,} bytes) for its payload")  # fmt: skip
    total = len(payload)
    count = -(-total // room)
    out = []
    view = memoryview(payload)
    for i in range(count):
        own[PART_TAG] = f"{ident} {i} {count} {total}"
        out.append(wire.pack_message(topic, key, own, bytes(view[i * room : (i + 1) * room])))
    return out


def parse_part_untrusted(value: Any) -> tuple[str, int, int, int] | None:
    """(id, index, count, total) of a ``roost.part`` tag, None if it is not a well-formed one
    (any publisher can set tags: a subscriber drops what does not parse, counted)."""
    if value.__class__ is not str:
        return None
    fields = value.split(" ")
    if len(fields) != 4 or not fields[0]:
        return None
    try:
        index, count, total = int(fields[1]), int(fields[2]), int(fields[3])
    except ValueError:
        return None
    if not 0 <= index < count <= total // MIN_FRAGMENT + 1:
        return None
    return fields[0], index, count, total


_NONE: list[Any] = []


class Partial:
    """One message being put together."""

    __slots__ = ("count", "total", "chunks", "size", "touched", "origins", "waiting", "payload")

    def __init__(self, count: int, total: int, now: float) -> None:
        self.count = count
        self.total = total
        self.chunks: dict[int, bytes] = {}
        self.size = 0
        self.touched = now
        self.origins: list[Any] = []  # the receive side's notes on its fragments (queue groups)
        self.waiting: list[Any] = []  # (and the queue-group subscriptions that wait for it)
        self.payload = b""  # once complete


class Reassembler:
    """Partial messages by (producer id, id), oldest first, within a byte bound."""

    def __init__(self, max_payload: int, max_bytes: int, timeout: float) -> None:
        self.max_payload = max_payload
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.partials: dict[tuple[bytes, str], Partial] = {}
        self.held = 0  # bytes in partial messages
        self.dropped = 0  # messages given up (over a bound, timed out, malformed fragments)

    def add(
        self, pid: bytes, part: tuple[str, int, int, int], chunk: bytes, origin: Any, now: float,
        waiting: list[Any] = _NONE,
    ) -> tuple[Partial | None, list[Partial]]:  # fmt: skip
        """Take one fragment (``origin``, ``waiting``: the caller's notes, kept with its message).
        Returns (the message once this fragment completes it, with its ``payload``, else None;
        the partial messages dropped, whose origins the caller releases, with a fragment refused
        among them). A fragment that contradicts its message's earlier ones, or declares a
        message over ``max_payload``, drops that message."""
        ident, index, count, total = part
        dropped: list[Partial] = []
        k = (pid, ident)
        p = self.partials.get(k)
        if total > self.max_payload or len(chunk) > total or (p is not None and (p.count, p.total) != (count, total)):
            self.dropped += 1
            if p is not None:
                dropped.append(self._forget(k))
            if origin is not None:
                refused = Partial(count, total, now)
                refused.origins.append(origin)
                dropped.append(refused)
            return None, dropped
        if p is None:
            p = self.partials[k] = Partial(count, total, now)
        else:
            self.partials[k] = self.partials.pop(k)  # (most recently touched last)
            p.touched = now
        if origin is not None:
            p.origins.append(origin)
        for w in waiting:
            if w not in p.waiting:
                p.waiting.append(w)
        if index in p.chunks:
            return None, dropped  # (a repeat: the stream or the producer check let it through)
        p.chunks[index] = chunk
        p.size += len(chunk) + FRAGMENT_COST
        self.held += len(chunk) + FRAGMENT_COST
        if len(p.chunks) == count:
            self._forget(k)
            p.payload = b"".join(p.chunks[i] for i in range(count))
            p.chunks = {}
            if len(p.payload) != total:
                self.dropped += 1
                dropped.append(p)
                return None, dropped
            return p, dropped
        while self.held > self.max_bytes and self.partials:
            oldest = next(iter(self.partials))
            self.dropped += 1
            dropped.append(self._forget(oldest))
        return None, dropped

    def expire(self, now: float) -> Iterator[Partial]:
        """Drop the partial messages that got no fragment for ``timeout``."""
        while self.partials:
            k, p = next(iter(self.partials.items()))
            if now - p.touched < self.timeout:
                return
            self.dropped += 1
            yield self._forget(k)

    def _forget(self, k: tuple[bytes, str]) -> Partial:
        p = self.partials.pop(k)
        self.held -= p.size
        return p
