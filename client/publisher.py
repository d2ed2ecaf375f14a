"""The client's publishing side (:class:`Publisher`).

Two producers per client, each with its own sequence space from 1: one for
reliable publishes, one for fire. Reliable messages stay in a window
(``pub_window``) until a cumulative PUBACK covers them; when no PUBACK comes
within ``pub_retry`` (doubling up to ``pub_retry_max``) everything in flight
is sent again (go-back-N: the node refuses a batch that would leave a gap, so
resending from the acknowledged point is what gets FIFO order back). Fire
messages are sent once. Both are packed into as few PUB datagrams as
``max_datagram`` allows; a node that takes runs (its WELCOME says so) gets a
stretch of fire messages of one topic, no key, no tags, as PUBRUN datagrams
instead, the topic once and then the payloads (docs/protocol.md, "Runs").
A reliable message too large for one datagram goes as consecutive fragment
messages (client/parts.py), each one sequence.

A module of its own because it shares nothing with the receive side or the
command batches but the node address and the cookie, which the session passes
in when it is time to send.
"""

from __future__ import annotations

from collections import deque
from itertools import islice

from roost.client import parts, wire
from roost.client.config import ClientConfig
from roost.client.wire import ErrorCode, WireError

Addr = tuple[str, int]


class Publisher:
    def __init__(self, producer_id: bytes, fire_producer_id: bytes, config: ClientConfig) -> None:
        self.cfg = config
        self._max_datagram = config.max_datagram
        self.max_payload = config.max_payload  # (and this one)
        self.max_parts = 1024  # parts of one message: a quarter of the node's send_window (WELCOME)
        self.pid = producer_id
        self.fire_pid = fire_producer_id
        self.next_seq = 1
        self.fire_seq = 1
        self.acked = 0
        # Reliable publishes in flight, packed: unacked[i] has sequence acked + 1 + i (a PUBACK
        # is cumulative, and a message's parts take consecutive sequences).
        self.unacked: deque[bytes] = deque()
        self.unacked_bytes = 0
        self.unsent_from = 1  # first reliable sequence not sent to the current node
        self.fire_pending: list[bytes] = []
        # Fire messages of one topic, no key, no tags, payloads of at most RUN_PAYLOAD_MAX: sent as
        # PUBRUN (the topic once, then the payloads). It grows only while fire_pending is empty,
        # so it is older than anything there, and is sent first.
        self.run: list[bytes] = []
        self.run_topic: str | None = None
        self.runs = False  # the node takes PUBRUN (its WELCOME said so: the session sets it)
        self.rto = config.pub_retry
        self.retry_at: float | None = None
        self.room = self.max_datagram - wire.MESSAGE_ROOM  # (a packed message larger goes in parts)

    @property
    def max_datagram(self) -> int:
        return self._max_datagram

    @max_datagram.setter
    def max_datagram(self, size: int) -> None:
        """The session lowers it to the node's (WELCOME)."""
        self._max_datagram = size
        self.room = size - wire.MESSAGE_ROOM

    def publish(self, topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes, reliable: bool) -> int:
        """Queue a message; returns its producer sequence (0 for fire)."""
        if key is None and tags is None and payload.__class__ is bytes:
            if not reliable and len(payload) <= wire.RUN_PAYLOAD_MAX and not self.fire_pending and self.runs:
                if topic != self.run_topic and not self.run and self._fits_run(topic):
                    self.run_topic = topic
                if topic == self.run_topic:
                    self.run.append(payload)
                    return 0
            packed = wire.pack_plain(topic, payload)
        else:
            wire.check_topic(topic)
            if key is not None:
                wire.check_key(key)
            if tags is not None:
                wire.check_tags(tags)
                if wire.PART_TAG in tags:
                    raise WireError(ErrorCode.BAD_TAGS, f"the tag {wire.PART_TAG} is reserved: it marks the parts of a "
                                    "large message")  # fmt: skip
            packed = wire.pack_message(topic, key, tags, payload)
        if len(packed) > self.room:
            return self._publish_large(topic, key, tags, payload, packed, reliable)
        if not reliable:
            self.fire_pending.append(packed)
            return 0
        seq = self.next_seq
        self.next_seq = seq + 1
        self.unacked.append(packed)
        self.unacked_bytes += len(packed)
        return seq

    def _fits_run(self, topic: str) -> bool:
        """``topic`` is valid (WireError if not) and a PUBRUN of it has room for a payload of
        ``RUN_PAYLOAD_MAX`` (only a tiny ``max_datagram`` and a long topic leave less)."""
        return wire.pubrun_room(self.max_datagram, wire.check_topic(topic)) >= wire.RUN_PAYLOAD_MAX + 2

    def _publish_large(
        self, topic: str, key: str | None, tags: dict[str, str] | None, payload: bytes, packed: bytes, reliable: bool
    ) -> int:
        """A message over one datagram: refused in fire mode and over ``max_payload``, else
        queued as its fragments (client/parts.py); returns the last one's sequence."""
        mp = self.max_payload
        if not reliable:
            try:
                wire.check_fits(len(packed), self.max_datagram)
            except WireError as exc:
                raise WireError(exc.code, f"{exc.text}; fire publishes are one datagram each, a reliable one "
                                f"of up to max_payload ({mp:,} bytes) is sent in parts") from None  # fmt: skip
        if len(payload) > mp:
            raise WireError(ErrorCode.TOO_LARGE,
                            f"payload of {len(payload):,} bytes is over max_payload ({mp:,} bytes: "
                            f"the node's [limits] max_payload or the client's ClientConfig.max_payload, whichever "
                            f"is lower)")  # fmt: skip
        ident = parts.part_id(self.pid, self.next_seq)
        fragments = parts.split(topic, key, tags, payload, ident, self.max_datagram)
        if len(fragments) > self.max_parts:
            raise WireError(ErrorCode.TOO_LARGE,
                            f"payload of {len(payload):,} bytes would take {len(fragments):,} parts at "
                            f"max_datagram {self.max_datagram:,}: at most {self.max_parts:,} (a quarter of the node's "
                            f"[limits] send_window, so that a queue group's member can hold them); raise "
                            f"max_datagram (the node's and ClientConfig's) or send_window")  # fmt: skip
        self.unacked.extend(fragments)
        self.unacked_bytes += sum(map(len, fragments))
        self.next_seq += len(fragments)
        return self.next_seq - 1

    @property
    def fire_unsent(self) -> int:
        """Fire messages queued and not sent yet (packed, or in the run)."""
        return len(self.fire_pending) + len(self.run)

    @property
    def window_full(self) -> bool:
        """No room for another reliable publish: ``pub_window`` messages or ``pub_window_bytes``
        in flight (a window of messages alone lets large ones overrun the node's socket buffer,
        and a loss resends the whole window)."""
        q = self.unacked
        return len(q) >= self.cfg.pub_window or (self.unacked_bytes >= self.cfg.pub_window_bytes and bool(q))

    def on_puback(self, pid: bytes, acked: int, now: float) -> bool:
        """Drop what the node acknowledged; False if the PUBACK told us nothing new."""
        if pid != self.pid or acked <= self.acked:
            return False
        acked = min(acked, self.next_seq - 1)  # a node cannot acknowledge what we never sent
        q = self.unacked
        popleft, done = q.popleft, 0
        for _ in range(acked - self.acked):
            done += len(popleft())
        self.unacked_bytes -= done
        self.acked = acked
        # The node may acknowledge what we queued but never sent: it has those sequences of this
        # producer id already (a retried Spark task publishing the same rows under it).
        if self.unsent_from <= acked:
            self.unsent_from = acked + 1
        self.rto = self.cfg.pub_retry
        self.retry_at = now + self.rto if q and self.unsent_from > acked + 1 else None
        return True

    def tick(self, now: float) -> int:
        """Go back N when the PUBACK is overdue; returns how many will be resent (0: none)."""
        if self.retry_at is None or now < self.retry_at or not self.unacked:
            return 0
        self.unsent_from = self.acked + 1
        self.rto = min(self.rto * 2, self.cfg.pub_retry_max)
        self.retry_at = now + self.rto
        return len(self.unacked)

    def rewind(self) -> None:
        """A new node: everything unacknowledged goes to it (its producer
        sequence keeps it from being delivered twice)."""
        if self.unacked:
            self.unsent_from = self.acked + 1
        self.rto = self.cfg.pub_retry

    def emit(self, node: Addr, cid: bytes, cookie: bytes, now: float, out: list[tuple[Addr, bytes]]) -> None:
        """Append PUB datagrams for everything not yet sent to ``node``."""
        if self.run:
            self._emit_run(out, node, cid, cookie)
        if self.fire_pending:
            self.fire_seq = self._pack(out, node, cid, cookie, self.fire_pid, self.fire_seq, self.fire_seq, False,
                                       self.fire_pending)  # fmt: skip
            self.fire_pending = []
        q = self.unacked
        if q and self.unsent_from < self.next_seq:
            start = self.unsent_from - self.acked - 1
            todo = list(q) if start == 0 else list(islice(q, start, None))
            self._pack(out, node, cid, cookie, self.pid, self.unsent_from, self.acked + 1, True, todo)
            self.unsent_from = self.next_seq
            if self.retry_at is None:
                self.retry_at = now + self.rto

    def _emit_run(self, out: list[tuple[Addr, bytes]], node: Addr, cid: bytes, cookie: bytes) -> None:
        """PUBRUN datagrams of the run; or its messages packed, in front of ``fire_pending``,
        when no longer than what waits there (a publisher that mixes topics: one PUB, not a
        PUBRUN and a PUB), or when the node no longer takes runs or ``max_datagram`` fell below
        what a run needs since it began (the session failed over to a node of an earlier
        build, or a WELCOME lowered it)."""
        topic, run = self.run_topic, self.run
        assert topic is not None
        room = wire.pubrun_room(self.max_datagram, topic)
        if not self.runs or room < wire.RUN_PAYLOAD_MAX + 2 or len(run) <= len(self.fire_pending):
            self.fire_pending[:0] = [wire.pack_plain(topic, p) for p in run]
            self.run = []
            return
        seq, n = self.fire_seq, len(run)
        for start, end in wire.runs(run, room, extra=2):  # (each payload's bin 8 head: 2 bytes)
            out.append((node, wire.encode_pubrun(cid, cookie, self.fire_pid, seq, topic,
                                                 run if start == 0 and end == n else run[start:end])))  # fmt: skip
            seq += end - start
        self.fire_seq = seq
        self.run = []

    def _pack(
        self, out: list[tuple[Addr, bytes]], node: Addr, cid: bytes, cookie: bytes,
        pid: bytes, first: int, floor: int, reliable: bool, packed: list[bytes],
    ) -> int:  # fmt: skip
        """PUB datagrams for consecutive sequences from ``first``; returns the next one."""
        budget = self.max_datagram - wire.FRAME_OVERHEAD - 2 * wire.ID_LEN - wire.COOKIE_LEN
        n = len(packed)
        for start, end in wire.runs(packed, budget):
            out.append((node, wire.encode_pub(cid, cookie, pid, first, floor, reliable,
                                              packed if start == 0 and end == n else packed[start:end])))  # fmt: skip
            first += end - start
            if not reliable:
                floor = first
        return first
