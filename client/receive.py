"""The client's receive side: what nodes deliver, into subscription queues.

Holds :class:`Message` and :class:`SubState` (a subscription as the
application sees it: its queue and, once it ended, why) and the
:class:`Receiver`, which turns MSGS frames into queued messages:

- reliable streams, one per delivering node: drop duplicates, hold
  out-of-order messages, acknowledge cumulatively plus SACK ranges;
- producer de-duplication across nodes: after a failover a publisher resends
  to another member what the dead one may already have delivered, so a
  subscriber remembers the highest producer sequence it delivered (and the
  holes below it, since two members' streams are not ordered with each other);
- fire runs (MSGSRUN: one topic's payloads alone), queued whole to the topic's
  subscription (``on_run``);
- a bound on buffered messages: past ``max_buffered`` a reliable stream stops
  acknowledging (the node resends later) and fire messages are dropped;
- the fragments of messages larger than a datagram, put together by a
  :class:`~roost.client.parts.Reassembler` before any subscription sees them
  (a session's own: a subscription's deliveries all come to its session, from
  whichever member delivers them).

A module of its own because this is the per-message hot path of a subscriber
and the part with the subtlest invariants; the session only routes frames here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from functools import partial
from itertools import repeat
from typing import Any, NamedTuple, cast

from roost.client import parts, subjects, wire
from roost.client.config import ClientConfig
from roost.client.decoding import MSG_KEY, MSG_PAYLOAD, MSG_PRODUCER, MSG_SEQ, MSG_TAGS, MSG_TOPIC
from roost.client.holes import Holes
from roost.client.wire import PART_TAG

Addr = tuple[str, int]
SubKey = tuple[str, str | None]
MAX_HOLES = 65536  # per producer: sequences skipped by a jump that may still arrive
FIRE_WINDOW = 4096  # fire datagrams remembered to drop network duplicates
#: Producers whose sequences a receiver remembers; past it the one heard from least recently is
#: forgotten (a resend of its that was delivered before could come twice): spoofed MSGS naming
#: new producers must not grow the memory without end. (Recency is kept, at a dict move per
#: message, only once more than half of them are remembered.)
MAX_PRODUCERS = 65536


class Message(NamedTuple):
    topic: str
    key: str | None
    tags: dict[str, str] | None
    payload: bytes
    sequence: int | None  # per-subscriber sequence (reliable); None for fire

    # A request (client/api.py's Request, a Message with a __dict__) carries what answers it:
    # ``_reply_to`` and ``_responder``, given when it is made; a plain message has neither.

    @property
    def reply_to(self) -> str | None:
        """Where the answer to a request goes (client/api.py); None for a message that asks none."""
        return getattr(self, "_reply_to", None)

    def respond(self, payload: bytes | str, tags: dict[str, str] | None = None) -> Any:
        """Answer a request (a :class:`roost.client.api.Request`): in the async clients an
        awaitable, in the blocking client once the answer is sent. ValueError for a message
        that asks for none."""
        responder = getattr(self, "_responder", None)
        if responder is None:
            raise ValueError(f"this message on {self.topic!r} asks for no answer (it was not sent by request())")
        return responder(self, payload, tags)


#: A message's fields, those of :class:`Message`, in a plain tuple: how a subscription's queue
#: holds every message but the common one (below).
Fields = tuple[str, str | None, dict[str, str] | None, bytes, int | None]
#: A message's fields as the application gets them.
message_of: Callable[[Fields], Message] = partial(tuple.__new__, Message)  # type: ignore[assignment]


class SubState:
    """A subscription's receive side: its queue, and once it ended, why.

    The queue holds one item per message, oldest first, made a :class:`Message` only when the
    application takes it (:meth:`take`). The common message (the subscription's own topic, no
    key, no tags, delivered in order: ``Receiver._in_order``) is its payload alone, a ``bytes``,
    its sequence (None: fire) in ``seqs``, one entry per such item, in the same order; any other
    message is its :data:`Fields`.

    Why not a tuple (or a Message) each: Python's cyclic GC tracks every tuple from its creation
    until the first young collection it meets (a Message, a tuple subclass, for good), and a
    subscriber that queued thousands of messages at a time set one off every 700 of them, each
    examining the newest. Bytes and ints are never tracked, so a queue of payloads sets off no
    collection (the W1 subscriber's CPU 0.31-0.33 -> 0.29-0.30 s reliable, 0.28-0.29 ->
    0.25-0.28 fire, in interleaved runs: docs/performance.md).
    """

    __slots__ = ("topic", "mode", "confirmed", "reason", "queue", "seqs", "counted", "origins", "holding")

    def __init__(self, topic: str, mode: int, grouped: bool = False) -> None:
        self.topic = topic  # its filter: for a plain one, the topic of every message it gets
        self.mode = mode
        self.confirmed = False
        self.reason: str | None = None  # set once the subscription has ended
        self.queue: deque[Fields | bytes] = deque()
        self.seqs: deque[int | None] = deque()  # the sequence of each bytes item in ``queue``
        self.counted = True  # its queue counts towards Receiver.buffered
        # A queue group's subscription: per queued message, [node, stream, seq, (producer id,
        # seq)] of its delivery (seq None: fire), acknowledged only once the application takes
        # it; a large message's is the tuple of its fragments' origins
        self.origins: deque[Any] | None = deque() if grouped else None
        # (producer id, seq) of the reliable messages in ``queue`` -> their origin: a node that
        # carries them over to a new stream (we moved address) is heard, not obeyed twice
        self.holding: dict[tuple[bytes, int], list[Any]] = {}

    def take(self) -> Message:
        """The oldest message, out of the queue (the caller counts it: ``Receiver.consumed``).
        ``Subscription.__anext__`` has this written out."""
        return self._message(self.queue.popleft(), self.seqs.popleft)

    def messages(self) -> list[Message]:
        """What is queued, as the application will take it, without taking it."""
        seq = iter(self.seqs).__next__
        return [self._message(item, seq) for item in self.queue]

    def _message(self, item: Fields | bytes, seq: Callable[[], int | None]) -> Message:
        """A queued item's Message; ``seq`` gives the next of ``seqs``, called for a payload."""
        if item.__class__ is bytes:
            return message_of((self.topic, None, None, item, seq()))
        return message_of(cast(Fields, item))

    def clear(self) -> None:
        self.queue.clear()
        self.seqs.clear()


class RecvStream:
    """Reliable receive state for the messages one node delivers to us."""

    __slots__ = ("stream", "expected", "ooo", "need_ack", "unconsumed")

    def __init__(self) -> None:
        self.stream = 0
        self.expected = 1
        self.ooo: dict[int, tuple[Any, ...]] = {}
        self.need_ack = False
        # Queue-group messages received and not yet taken by the application, in order (seq ->
        # how many of our subscriptions hold it): the ACK stops below the first of them
        self.unconsumed: dict[int, int] = {}


class Receiver:
    def __init__(self, subs: dict[SubKey, SubState], events: list[tuple[Any, ...]], config: ClientConfig) -> None:
        """``subs`` and ``events`` are the session's own (shared, never rebound):
        a message is queued only for subscriptions in force right now."""
        self.subs = subs
        self.events = events
        self.cfg = config
        self.streams: dict[Addr, RecvStream] = {}  # one sequence space per delivering node
        self.seen: dict[bytes, int] = {}  # producer id -> highest sequence delivered
        self.holes: dict[bytes, Holes] = {}  # producer id -> sequences below it not yet seen
        # producer id -> [the first sequence heard from it, those below it delivered since,
        # the highest of them forgotten (bounded memory): it and all below count as seen]
        self.early: dict[bytes, list[Any]] = {}
        # (source, number) of the last FIRE_WINDOW fire datagrams, oldest first
        self.fire_seen: dict[tuple[Addr, int], None] = {}
        self.buffered = 0
        self.held = False  # in-order messages wait in ``ooo`` for buffer room
        self.duplicates = 0
        # Subscriptions to filters that are not bare topics (wildcards, queries), by filter:
        # a message passes each filter it matches (client/subjects.py)
        self.trie = subjects.PatternTrie()
        self.filter_refs: dict[str, int] = {}
        self.marked: dict[bytes, SubKey] = {}  # our queue-group subscriptions by mark id (wire.mark_id)
        self.parts = parts.Reassembler(config.max_payload, config.reassembly_bytes, config.reassembly_timeout)
        self.now = 0.0  # set by the session before each batch of datagrams
        # (a deliberately broken build, sim/breaks.py: no de-duplication by producer id and sequence)
        self.no_dedup = "no-dedup" in config.breaks

    def detach(self, st: SubState, release: bool = True) -> None:
        """An ended subscription's queue no longer counts as buffered; what is
        in it stays readable by the application. A queue group's messages not taken
        are acknowledged (``release``), or later by :meth:`release`."""
        if st.counted:
            st.counted = False
            self.buffered -= len(st.queue)
        if release:
            self.release(st)

    def release(self, st: SubState) -> None:
        """Acknowledge what a group subscription that ended held and the application did not take."""
        while st.origins:
            self._taken(st.origins.popleft())
        st.origins = None
        st.holding = {}
        for p in self.parts.partials.values():  # (large messages it waited for: the node handed them on)
            if st in p.waiting:
                p.waiting.remove(st)
                if not p.waiting:
                    self._taken(tuple(p.origins))
                    p.origins = []

    def _taken(self, origin: Any) -> None:
        """One message was taken (or given up): the ACK may move past it. A large message's
        origin is the tuple of its fragments'."""
        if origin.__class__ is tuple:
            for one in origin:
                self._taken(one)
            return
        src, stream, seq = origin[0], origin[1], origin[2]
        rs = self.streams.get(src)
        if seq is None or rs is None or rs.stream != stream:
            return
        n = rs.unconsumed.get(seq, 0)
        if n > 1:
            rs.unconsumed[seq] = n - 1
        elif n:
            del rs.unconsumed[seq]
            rs.need_ack = True

    def consumed(self, st: SubState, n: int = 1) -> None:
        """The application took ``n`` messages (the first) from ``st``'s queue."""
        if st.origins:
            for _ in range(min(n, len(st.origins))):
                origin = st.origins.popleft()
                for cell in origin if origin.__class__ is tuple else (origin,):
                    if cell[3] is not None:
                        st.holding.pop(cell[3], None)
                self._taken(origin)
        if st.counted:
            self.buffered -= n
            if self.held and self.buffered < self.cfg.max_buffered:
                self.held = False
                self._drain_held()

    def _drain_held(self) -> None:
        """Room again: deliver what waited in order behind a full buffer."""
        limit = self.cfg.max_buffered
        for src, rs in self.streams.items():
            while rs.expected in rs.ooo:
                if self.buffered >= limit:
                    self.held = True
                    return
                self._deliver(rs.ooo.pop(rs.expected), rs.expected, src, rs.stream)
                rs.expected += 1
                rs.need_ack = True

    def _seen_fire(self, src: Addr, number: int, count: int) -> bool:
        """A numbered fire datagram (MSGS or MSGSRUN) already taken: one the network duplicated
        is dropped whole (number 0: unnumbered, never dropped)."""
        if number:
            seen = self.fire_seen
            if (src, number) in seen:
                self.duplicates += count
                return True
            seen[(src, number)] = None
            if len(seen) > FIRE_WINDOW:
                del seen[next(iter(seen))]
        return False

    def on_run(self, src: Addr, number: int, topic: str, payloads: list[bytes]) -> None:
        """A MSGSRUN: fire messages of one topic, no key, no tags. With the topic's subscription
        in force, no filter subscriptions and room for them all, queued in two calls (the
        payloads, and as many sequences None: see SubState); else each as a MSGS's message."""
        if self._seen_fire(src, number, len(payloads)):
            return
        n = len(payloads)
        whole = self.subs.get((topic, None))
        if whole is not None and whole.reason is None and not self.trie.size and \
                self.buffered + n <= self.cfg.max_buffered:  # fmt: skip
            whole.queue.extend(payloads)
            whole.seqs.extend(repeat(None, n))
            self.buffered += n
            return
        self.on_msgs(src, 0, 0, [(topic, None, None, p) for p in payloads])

    def on_msgs(self, src: Addr, stream: int, first: int, msgs: list[tuple[Any, ...]]) -> None:
        if stream == 0:
            if self._seen_fire(src, first, len(msgs)):
                return
            if not self.trie.size and self.buffered + len(msgs) <= self.cfg.max_buffered:
                self._in_order(src, 0, None, msgs)
                return
            for m in msgs:
                if self.buffered >= self.cfg.max_buffered:
                    self.events.append(("fire_dropped", 1))
                    continue
                self._deliver(m, None, src, 0)
            return
        rs = self.streams.get(src)
        if rs is None:
            rs = self.streams[src] = RecvStream()
        if stream < rs.stream:
            return  # a datagram from a stream the node has abandoned
        if stream > rs.stream:
            rs.stream, rs.expected = stream, 1
            rs.ooo.clear()
            rs.unconsumed.clear()
        rs.need_ack = True
        seq = first
        limit = self.cfg.max_buffered
        if seq == rs.expected and not rs.ooo and not self.trie.size and self.buffered + len(msgs) <= limit:
            self._in_order(src, stream, seq, msgs)
            rs.expected = seq + len(msgs)
            return
        for m in msgs:
            if seq == rs.expected and self.buffered < limit:
                self._deliver(m, seq, src, stream)
                rs.expected += 1
                while rs.expected in rs.ooo and self.buffered < limit:
                    self._deliver(rs.ooo.pop(rs.expected), rs.expected, src, rs.stream)
                    rs.expected += 1
                if rs.expected in rs.ooo:
                    self.held = True
            elif seq == rs.expected:
                break  # buffer full: not acknowledged, the node resends later
            elif seq < rs.expected or seq in rs.ooo:
                self.duplicates += 1
            elif len(rs.ooo) < self.cfg.pub_window * 4:
                rs.ooo[seq] = m
            seq += 1

    def _in_order(self, src: Addr, stream: int, seq: int | None, msgs: list[tuple[Any, ...]]) -> None:
        """``_deliver`` of a whole datagram that comes in order (``seq`` None: fire), with room
        for all of it and no filter subscriptions: the hot path, one loop with the lookups
        hoisted. A message of another shape (key, tags, parts, queue marks) or a producer
        sequence that does not follow the last one goes through ``_deliver``/``_duplicate``.

        A run of one producer's consecutive sequences is checked against the last one here,
        ``seen`` written once at the end of the run (``pid``, ``high``: the run's producer and
        its last sequence); it is written before anything else reads it."""
        subs, seen = self.subs, self.seen
        plain = 4 if seq is None else 6
        topic: Any = None
        whole: SubState | None = None
        queue: Any = None  # (whole's queue.append and seqs.append)
        seqs: Any = None
        delivered = 0
        pid: Any = None
        high = 0
        # (literal indices in this loop, the hot one: m[0] to m[5] are decoding.MSG_TOPIC, MSG_KEY, MSG_TAGS,
        # MSG_PAYLOAD, MSG_PRODUCER, MSG_SEQ; a constant index costs nothing, a module's name a lookup)
        for m in msgs:
            if m[1] is not None or m[2] is not None or len(m) != plain:
                if pid is not None:
                    seen[pid], pid = high, None
                self._deliver(m, seq, src, stream)
            else:
                if m[0] != topic:
                    topic = m[0]
                    whole = subs.get((topic, None))
                    if whole is not None and whole.reason is not None:
                        whole = None
                    if whole is not None:
                        queue, seqs = whole.queue.append, whole.seqs.append
                if whole is not None:
                    if seq is not None:
                        pseq = m[5]
                        if pseq == high + 1 and m[4] == pid:
                            high = pseq
                        else:
                            if pid is not None:
                                seen[pid] = high
                            pid = m[4]
                            last = seen.get(pid, 0)
                            if last and pseq == last + 1:  # (what _duplicate does for the next sequence)
                                high = pseq
                                if len(seen) > MAX_PRODUCERS // 2:
                                    del seen[pid]  # (to the end when written: the least recently heard go first)
                            else:
                                one, pid = pid, None
                                if self._duplicate(one, pseq):
                                    seq += 1
                                    continue
                    queue(m[3])  # (the common message: its payload, its sequence in seqs: see SubState)
                    seqs(seq)
                    delivered += 1
            if seq is not None:
                seq += 1
        if pid is not None:
            seen[pid] = high
        self.buffered += delivered

    def track(self, text: str, change: int) -> None:
        """A subscription to a filter that is not a bare topic came (+1) or went (-1):
        the filters in the trie are those with a subscription, whatever its key."""
        n = self.filter_refs.get(text, 0) + change
        if n > 0:
            if text not in self.filter_refs:
                self.trie.add(subjects.parse_filter_untrusted(text))
            self.filter_refs[text] = n
        elif text in self.filter_refs:
            del self.filter_refs[text]
            self.trie.remove(subjects.parse_filter_untrusted(text))

    def _targets(self, m: tuple[Any, ...]) -> list[SubState]:
        """The subscriptions in force that a message passes (wildcards, queries): slow path.
        A queue group's subscription gets only what the node picked us for (the marks)."""
        topic, key, subs = m[MSG_TOPIC], m[MSG_KEY], self.subs
        out = []
        for st in (subs.get((topic, None)), subs.get((topic, key)) if key is not None else None):
            if st is not None and st.reason is None:
                out.append(st)
        for text in self.trie.match(topic.split(".")):
            f = subjects.parse_filter_untrusted(text)
            if f.queue is not None or (f.query is not None and not f.query.matches(m[MSG_TAGS])):
                continue
            for k in (None, key) if key is not None else (None,):
                st = subs.get((text, k))
                if st is not None and st.reason is None:
                    out.append(st)
        return out

    def _deliver(self, m: tuple[Any, ...], seq: int | None, src: Addr, stream: int) -> None:
        if self.no_dedup:
            m = m[:4]  # (broken: the message loses its producer id and sequence)
        topic, key = m[MSG_TOPIC], m[MSG_KEY]
        n = len(m)
        if m[MSG_TAGS] is not None and PART_TAG in m[MSG_TAGS]:
            self._deliver_part(m, seq, src, stream)
            return
        if n == 5 or n == 7:  # picked for a queue group (docs/protocol.md, "Queue groups")
            self._deliver_marked(m, seq, src, stream)
            return
        if self.trie.size:
            targets = self._targets(m)
            if not targets:
                return
            if n == 6 and self._duplicate(m[MSG_PRODUCER], m[MSG_SEQ]):
                return
            msg = (topic, key, m[MSG_TAGS], m[MSG_PAYLOAD], seq)
            for st in targets:
                st.queue.append(msg)
                self.buffered += 1
            return
        whole = self.subs.get((topic, None))
        if whole is not None and whole.reason is not None:
            whole = None
        keyed = self.subs.get((topic, key)) if key is not None else None
        if keyed is not None and keyed.reason is not None:
            keyed = None
        if whole is None and keyed is None:
            return  # no subscription in force: not seen by the application, so not "seen" below
        if n == 6 and self._duplicate(m[MSG_PRODUCER], m[MSG_SEQ]):
            return
        fields: Fields = (topic, key, m[MSG_TAGS], m[MSG_PAYLOAD], seq)
        for one in (whole, keyed):
            if one is not None:
                one.queue.append(fields)
                self.buffered += 1

    def _grouped(self, marks: list[bytes]) -> list[SubState]:
        """Our group subscriptions in force that the node picked us for."""
        out = []
        for mark in marks:
            sk = self.marked.get(mark)
            st = self.subs.get(sk) if sk is not None else None
            if st is not None and st.reason is None and st.origins is not None:
                out.append(st)
        return out

    def _deliver_part(self, m: tuple[Any, ...], seq: int | None, src: Addr, stream: int) -> None:
        """A fragment of a large message (client/parts.py): held until its message is whole,
        which then goes to the subscriptions in force that its last fragment passes. Every
        fragment is de-duplicated as a message of its own; a queue group's fragments are
        acknowledged only once the whole message is taken, or given up."""
        n = len(m)
        targets, grouped = self._recipients(m, seq, src, stream)
        if not targets and not grouped:
            return
        part = parts.parse_part_untrusted(m[MSG_TAGS][PART_TAG]) if n == 6 or n == 7 else None
        if part is None:  # (fire-published, or a tag some publisher made up)
            self.parts.dropped += 1
            return
        origin = None
        if grouped and seq is not None:
            origin = [src, stream, seq, (m[MSG_PRODUCER], m[MSG_SEQ])]
            self._unconsumed(src, seq)
        done, dropped = self.parts.add(m[MSG_PRODUCER], part, m[MSG_PAYLOAD], origin, self.now, grouped)
        for p in dropped:
            self._taken(tuple(p.origins))
        if done is None:
            return
        tags = {k: v for k, v in m[MSG_TAGS].items() if k != PART_TAG} or None
        msg: Fields = (m[MSG_TOPIC], m[MSG_KEY], tags, done.payload, seq)
        for st in targets:
            self._give(st, msg, None)
        held = done.origins
        if not grouped:
            self._taken(tuple(held))
            return
        for cell in held:  # (each fragment: held once per subscription that holds the message)
            ors = self.streams.get(cell[0])
            if ors is not None and ors.stream == cell[1] and cell[2] in ors.unconsumed:
                ors.unconsumed[cell[2]] += len(grouped) - 1
        for i, st in enumerate(grouped):
            self._give(st, msg, tuple(held if i == 0 else [list(c) for c in held]))

    def _recipients(
        self, m: tuple[Any, ...], seq: int | None, src: Addr, stream: int
    ) -> tuple[list[SubState], list[SubState]]:
        """Of a marked message or a fragment: (the subscriptions in force it passes, unless its
        producer sequence was seen; the group subscriptions the node picked us for that do not
        hold it already, ``_carried``). No producer de-duplication for the second: the group's
        members do not see each other's sequences."""
        n = len(m)
        targets = self._targets(m)
        grouped = self._grouped(m[-1]) if n == 5 or n == 7 else []
        if grouped and n == 7:
            grouped = self._carried(grouped, (m[MSG_PRODUCER], m[MSG_SEQ]), src, stream, seq)
        if targets and (n == 6 or n == 7) and self._duplicate(m[MSG_PRODUCER], m[MSG_SEQ]):
            targets = []  # (our other subscriptions had it: e.g. a group's copy handed on from another member)
        return targets, grouped

    def _give(self, st: SubState, msg: Fields, origin: Any) -> None:
        """Queue a message for a subscription; a queue group's with its ``origin`` (one cell, or
        a large message's tuple of cells), remembered by (producer id, seq) while held."""
        st.queue.append(msg)
        self.buffered += 1
        if origin is not None:
            assert st.origins is not None
            st.origins.append(origin)
            for cell in origin if origin.__class__ is tuple else (origin,):
                if cell[3] is not None:
                    st.holding[cell[3]] = cell

    def _unconsumed(self, src: Addr, seq: int) -> None:
        """One more subscription holds the message ``seq`` of ``src``'s stream untaken."""
        rs = self.streams.get(src)
        if rs is not None:
            rs.unconsumed[seq] = rs.unconsumed.get(seq, 0) + 1

    def _carried(
        self, grouped: list[SubState], ident: tuple[bytes, int], src: Addr, stream: int, seq: int | None
    ) -> list[SubState]:
        """Those of ``grouped`` that do not hold the message (or fragment) ``ident`` already. One
        that does had it carried over to a new stream (we moved address): it is not queued
        again, and taking it acknowledges it on the new stream."""
        fresh = []
        for st in grouped:
            cell = st.holding.get(ident)
            if cell is None:
                fresh.append(st)
                continue
            cell[0], cell[1], cell[2] = src, stream, seq
            if seq is not None:
                self._unconsumed(src, seq)
        return fresh

    def expire_parts(self, now: float) -> None:
        """Give up large messages that waited too long for a part."""
        for p in self.parts.expire(now):
            self._taken(tuple(p.origins))

    def _deliver_marked(self, m: tuple[Any, ...], seq: int | None, src: Addr, stream: int) -> None:
        """A message the node picked us for in one or more queue groups: to those subscriptions
        (acknowledged once the application takes it) and to any other we have that it passes."""
        targets, grouped = self._recipients(m, seq, src, stream)
        if not targets and not grouped:
            return
        msg: Fields = (m[MSG_TOPIC], m[MSG_KEY], m[MSG_TAGS], m[MSG_PAYLOAD], seq)
        for st in targets:
            self._give(st, msg, None)
        ident = (m[MSG_PRODUCER], m[MSG_SEQ]) if len(m) == 7 else None
        for st in grouped:
            self._give(st, msg, [src, stream, seq, ident])
            if seq is not None:
                self._unconsumed(src, seq)

    def _duplicate(self, pid: bytes, pseq: int) -> bool:
        """Reliable messages name their producer: a resend after failover that
        the failed node had already delivered is dropped here. Two members'
        streams are not ordered with each other, so sequences skipped by a jump
        are remembered and still accepted later; below the first sequence heard
        from a producer nothing was seen, so such a message is new (another
        member had it first) and only its repeats are duplicates (``early``)."""
        high = self.seen.get(pid, 0)
        if pseq <= high:
            holes = self.holes.get(pid)
            if holes is not None and holes.take(pseq):
                return False
            early = self.early.get(pid)
            if early is None or pseq >= early[0] or pseq <= early[2] or pseq in early[1]:
                self.duplicates += 1
                return True
            early[1].add(pseq)
            if len(early[1]) > MAX_HOLES:  # (bounded: the oldest are forgotten, and all below
                early[2] = min(early[1])  # them count as seen: a miss, never a duplicate)
                early[1].discard(early[2])
            return False
        if not high:
            if len(self.seen) >= MAX_PRODUCERS:
                gone = next(iter(self.seen))
                del self.seen[gone]
                self.holes.pop(gone, None)
                self.early.pop(gone, None)
            if pseq > 1:
                self.early[pid] = [pseq, set(), 0]
        elif pseq > high + 1:
            holes = self.holes.get(pid)
            if holes is None:
                holes = self.holes[pid] = Holes()
            holes.add(max(high + 1, pseq - MAX_HOLES), pseq - 1, MAX_HOLES)  # (the oldest go)
        if high and len(self.seen) > MAX_PRODUCERS // 2:
            del self.seen[pid]  # (to the end: the least recently heard stay first, to go first)
        self.seen[pid] = pseq
        return False

    def acks(
        self, cid: bytes, node: Addr, cookie: bytes | None, cookies: dict[Addr, bytes], out: list[tuple[Addr, bytes]]
    ) -> list[Addr] | None:
        """Append one ACK per stream that received something since the last one, with the cookie
        of the member it goes to (``cookie``: our ``node``'s); return the members whose ACK waits
        for a cookie (client/membercookies.py), or None."""
        waiting: list[Addr] | None = None
        for src, rs in self.streams.items():
            if rs.need_ack:
                ck = cookie if src == node else cookies.get(src)
                if ck is None:
                    waiting = [*(waiting or ()), src]
                    continue
                rs.need_ack = False
                sack = _ranges(sorted(rs.ooo))
                processed = rs.expected - 1
                if rs.unconsumed:
                    # Up to the first queue-group message the application has not taken; what we
                    # hold beyond it is SACKed, so the node does not send it again, but stays in
                    # its mailbox, for another member of the group should we die.
                    first = next(iter(rs.unconsumed))
                    if first <= processed:
                        sack = [[first, processed], *sack][:64]
                        processed = first - 1
                out.append((src, wire.encode_ack(cid, ck, rs.stream, processed, sack)))
        return waiting


def _ranges(seqs: list[int]) -> list[list[int]]:
    """[3,4,5,9] -> [[3,5],[9,9]]: SACK ranges, at most 64 of them."""
    out: list[list[int]] = []
    for s in seqs:
        if out and s == out[-1][1] + 1:
            out[-1][1] = s
        else:
            if len(out) == 64:
                break
            out.append([s, s])
    return out
