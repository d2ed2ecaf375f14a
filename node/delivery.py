"""Fan-out and delivery: from a published message to MSGS datagrams, and their repair.

Theory of operation. ``_publish`` looks the message up in the subscription
index and, per subscriber, appends the packed message to the client's
mailbox (reliable) or fire list, and queues the client in ``_dirty`` once.
Nothing is sent per message: at the end of the entry point ``_flush`` takes
each dirty client's new messages (as many as its send window allows) and
``_emit`` packs them into as few MSGS datagrams as ``max_datagram`` allows;
PUBACKs are coalesced the same way, one per (address, producer) per batch.
Text subscribers get their ``MSG`` datagram at once (one per message, as
FASTPUSS does). A fire publisher's datagram relayed whole (node/producers.py)
waits in the client's ``fire_whole`` and goes out before its fire list, the
batches of one kind merged as far as ``max_datagram`` allows (node/relay.py).

A client has one mailbox while it has a reliable subscription (``_set``
below); each mailbox is a new stream, numbered from ``_next_stream``, which
grows across incarnations so clients can ignore stale streams. A mailbox
that would overflow cancels every reliable subscription of its client
(``out_of_capacity``). Lost datagrams are repaired from the mailbox:
selective ACKs resend the holes at once, and one RTO timer per mailbox
resends everything unacknowledged with back-off (node/mailbox.py).
"""

from __future__ import annotations

import hashlib
from collections import deque
from collections.abc import Container
from typing import Any

import msgpack

from roost.client import wire
from roost.client.subjects import is_plain
from roost.client.text import encode_text_msg
from roost.client.wire import Mode, Reason
from roost.node import relay, versions
from roost.node.actions import Send
from roost.node.base import TIMER_RTO, fmt
from roost.node.clients import ClientState
from roost.node.config import NodeConfig
from roost.node.cookies import Addr
from roost.node.mailbox import Mailbox
from roost.node.registers import REASON_OUT_OF_CAPACITY, REASON_TIMED_OUT, Registers
from roost.node.relay import Whole
from roost.node.subscriptions import FilterSubs

_LIVE_RELIABLE = versions.PRESENT | versions.RELIABLE
_NOBODY: frozenset[Any] = frozenset()  # (a queue pick that excludes no one)
_NO_GROUP: tuple[FilterSubs | None, None] = (None, None)
#: Forwarded reliable messages remembered by (producer id, sequence) to drop a resend, at most
#: (well over what a sender can have in flight to us when its link drops: 8 frames of 256 per
#: peer), and for at most producer_timeout (as a member forgets a silent producer).
FORWARDS_REMEMBERED = 1 << 18  # (about 2.6 s of forwards at 100,000 msgs/s: past a link's resend)
FORWARD_MEMORY_MIN = 5.0  # s: forgetting a younger one is counted (forward_memory_short)


class Delivery(Registers):
    producers: dict[bytes, list[Any]]  # pid -> [acked_seq, last_seen, host, redirected epoch]; built by BrokerCore

    def __init__(
        self, config: NodeConfig, node_idx: int, wall_offset: float, replicating: bool,
        tombstone_horizon: float, incarnation: int,
    ) -> None:  # fmt: skip
        super().__init__(config, node_idx, wall_offset, replicating, tombstone_horizon)
        # Stream ids grow within an incarnation and across restarts (the shell
        # passes wall-clock milliseconds), so a client can ignore stale streams.
        self._next_stream = incarnation << 16
        # Fire datagrams are numbered per member incarnation (MSGS first_seq of stream 0), so a
        # client drops one the network duplicated; a restarted member numbers far above.
        self._next_fire = incarnation << 16
        self._dirty: list[ClientState] = []  # clients with messages queued by this batch
        self._pubacks: dict[tuple[Addr, bytes], int] = {}  # -> cumulative seq, sent by _flush
        # Partitioned mode: messages for other primaries, and text datagrams for other homes.
        self._forwards: dict[str, list[list[Any]]] = {}
        self._relays: dict[str, list[list[Any]]] = {}
        # Reliable messages forwarded to a primary and not yet in its mailboxes: producer id ->
        # their sequences, in the order they were accepted (the first is the lowest). A PUBACK
        # never covers one (_ack_point): the client moves a topic to a new primary only once the
        # old route acknowledged it, so a message still in our forward queue must not be
        # acknowledged, or the next ones, sent straight to the new primary, overtake it (chaos
        # seed 3). ``_ack_to``: where the producer's PUBACKs go.
        self._unsettled: dict[bytes, dict[int, None]] = {}
        self._ack_to: dict[bytes, Addr] = {}
        # Forwarded reliable messages this member published, by (producer id, sequence), and
        # when, oldest first: a sender whose link dropped before our FWDACK came back sends them
        # again, and publishing one twice would hand it, late, to a subscriber whose
        # subscription reached us in between, after newer messages of its producer (simulator
        # seeds 5317, 7386).
        self._fwd_seen: set[tuple[bytes, int]] = set()
        self._fwd_order: deque[tuple[float, bytes, int]] = deque()
        self._budget = config.max_datagram - wire.MSGS_HEADER_MAX
        self._park_ms = int(config.subscriber_timeout * 1000)

    def _set(self, c: ClientState, tk: tuple[str, str | None], version: int) -> None:
        """Install a register version, then keep the client's mailbox in step:
        one while it has a reliable subscription, none (so the next one starts
        a fresh stream at sequence 1) once the last one is gone."""
        old = c.subs.get(tk, 0)
        super()._set(c, tk, version)
        if version & _LIVE_RELIABLE == _LIVE_RELIABLE:
            if c.mailbox is None and c.cid.__class__ is bytes:
                parked, c.parked = c.parked, None
                if (parked is not None and versions.millis_of(version) - parked[1] < self._park_ms
                        and parked[2] == c.session and parked[3] == c.addr):  # fmt: skip
                    # Back within subscriber_timeout of being given up, the same process
                    # at the same address: it was alive after all, and its stream goes on
                    # where it stopped.
                    mb = c.mailbox = parked[0]
                    mb.armed = False
                    self._arm(c, mb)
                    self.metrics["mailboxes_resumed"] += 1
                    return
                if parked is not None:
                    self._discarded(c, parked[0])
                self._next_stream += 1
                c.mailbox = Mailbox(
                    self._next_stream, self.cfg.mailbox_capacity,
                    self.cfg.retransmit_timeout, self.cfg.retransmit_max, self.cfg.mailbox_max_bytes,
                )  # fmt: skip
        elif (
            c.mailbox is not None
            and old & _LIVE_RELIABLE == _LIVE_RELIABLE
            and not any(v & _LIVE_RELIABLE == _LIVE_RELIABLE for v in c.subs.values())
        ):
            voided = self._voiding or version >> versions.FLAG_BITS == c.cver >> versions.FLAG_BITS
            # (a mailbox with a queue group's messages is not kept: the group's other members take
            # them now rather than when the park ends; a client alive behind a partition may then
            # get some of them twice: docs/guarantees.md, "Queue groups")
            if (((version >> 2) & 3 == REASON_TIMED_OUT and not c.local) or voided) and not c.mailbox.queued:
                # Given up by another member (its home looked dead to it): kept a while,
                # in case the client lives behind a partition and takes it up again.
                # Voided by a reset (partitioned) whose renewal has not reached us yet
                # (it may come by another owner's map): kept for it (seed 6388). A void
                # another member wrote comes as a tombstone stamped with the reset's own
                # version, our client register's (seeds 215, 791, 5790, 9943).
                c.parked = (c.mailbox, versions.millis_of(version), c.session, c.addr)
            else:
                self._discarded(c, c.mailbox)
            c.mailbox = None
        elif old & versions.PRESENT and not version & versions.PRESENT and c.mailbox is not None \
                and c.mailbox.queued and not is_plain(tk[0]):  # fmt: skip
            # A group subscription ended while the mailbox stays (the client has others): what
            # it holds for that group and the client has not acknowledged goes to the others.
            self._leave_group(c, c.mailbox, wire.mark_id(tk[0], tk[1]))

    def _readdressed(self, c: ClientState, carry: bool) -> None:
        """The client is at a new address (it told us, or another member
        did). A receiver there waits for a stream that starts at sequence 1,
        never for the middle of ours, so a new stream starts. The same
        session (a process that moved) gets what it had not acknowledged
        carried over, and drops what it already had by producer id and
        sequence; a new process (a restart reusing the client id) inherits
        nothing, not even the backlog."""
        c.parked = None  # (a stream is never taken up at another address)
        old = c.mailbox
        if old is None:
            return
        self._next_stream += 1
        mb = c.mailbox = Mailbox(
            self._next_stream, self.cfg.mailbox_capacity,
            self.cfg.retransmit_timeout, self.cfg.retransmit_max, self.cfg.mailbox_max_bytes,
        )  # fmt: skip
        if carry:
            for packed in old.buf[old.base :]:
                mb.push(packed)
            mb.queued = old.queued
        else:
            self._discarded(c, old)
        self.metrics["streams_restarted"] += 1
        if len(mb) and not c.dirty:
            c.dirty = True
            self._dirty.append(c)

    # ------------------------------------------------------------ fan-out

    def _publish(
        self,
        topic: str,
        key: str | None,
        tags: dict[str, str] | None,
        payload: bytes,
        packed: bytes | None,
    ) -> None:
        """Queue one message for every subscriber that matches (hot path)."""
        subs = self.index.match(topic, key)
        if subs:  # (what /subsz shows: one dict update per message, not per subscriber)
            matched = self.index.matched
            matched[topic] = matched.get(topic, 0) + 1
        if self.index.filters:
            subs, picks = self._filtered(topic, key, tags, subs)
            if picks:
                if packed is None:
                    packed = wire.pack_message(topic, key, tags, payload)
                self._give_picked(picks, packed)
        if not subs:
            return
        clients = self.clients
        text_msg = None
        full: list[ClientState] | None = None
        for who, mode in subs.items():
            if who.__class__ is bytes:
                c = clients[who]
                if packed is None:
                    packed = wire.pack_message(topic, key, tags, payload)
                if mode:
                    mb = c.mailbox
                    if mb is None or not mb.push(packed):
                        # cancelling changes ``subs``: do it after the loop
                        full = [c] if full is None else [*full, c]
                        continue
                else:
                    c.fire.append(packed)
                if not c.dirty:
                    c.dirty = True
                    self._dirty.append(c)
            else:
                if text_msg is None:
                    text_msg = encode_text_msg(topic, payload)
                self._to_text(who, text_msg)
        if full is not None:
            for c in full:
                if c.mailbox is not None:
                    self._overflow(c)

    def _to_text(self, who: Addr, text_msg: bytes) -> None:
        """A message to a text client (its MSG line), sent by the member it sent its SUB to:
        a text client hears only that one (`nc -u` connects its socket), and that member
        holds its anti-reflection budget (``text_budget``)."""
        c = self.clients[who]
        if c.home == self.node_id:
            if self.text_budget(c, len(text_msg)):
                self._out.append(Send(who, text_msg))
        else:
            self._relays.setdefault(c.home, []).append([who[0], who[1], text_msg])
        self.metrics["delivered"] += 1

    def text_budget(self, c: ClientState, n: int) -> bool:
        """May ``n`` more bytes go to text client ``c``? Spends them from its credit (a text
        source address is never validated: node/textproto.py), or counts a drop."""
        if not self.cfg.text_amplification:
            return True
        if c.credit < n:
            self.metrics["dropped_text_budget"] += 1
            return False
        c.credit -= n
        return True

    def _filtered(
        self, topic: str, key: str | None, tags: dict[str, str] | None, subs: dict[Any, int] | None
    ) -> tuple[dict[Any, int] | None, dict[Any, list[Any]] | None]:
        """Add the subscribers of wildcard and query filters the message passes (each once,
        in its strongest mode) to those of its bare topic; of a queue group, one member,
        which is told so. Returns (the others, ``picks``: subscriber -> [mode, the mark ids
        of the group subscriptions it was picked for]); a subscriber is in one of the two,
        not both. Every fragment of one large message goes to the same member (``_pick``)."""
        found = self.index.matching_filters(topic, tags)
        if not found:
            return subs, None
        merged = dict(subs) if subs else {}
        picks: dict[Any, list[Any]] | None = None
        part = tags.get(wire.PART_TAG) if tags else None
        for fs in found:
            if fs.keys.get(None) or (key is not None and fs.keys.get(key)):
                fs.matched += 1  # (as for a bare topic: a message some subscriber of the filter takes)
            for k in (None, key) if key is not None else (None,):
                group = fs.keys.get(k)
                if not group:
                    continue
                if fs.filter.queue is None:
                    for who, mode in group.items():
                        if mode > merged.get(who, -1):
                            merged[who] = mode
                    continue
                who = self._pick(fs, k, group, _NOBODY, part)
                if who is None:
                    continue
                if picks is None:
                    picks = {}
                pick = picks.get(who)
                if pick is not None and len(pick[1]) >= wire.MAX_MARKS:
                    # (picked for as many groups of this message as one copy can say: another member)
                    crowded = {w for w, p in picks.items() if len(p[1]) >= wire.MAX_MARKS}
                    who = self._pick(fs, k, group, crowded, part)
                    if who is None:
                        self.metrics["queue_undeliverable"] += 1
                        continue
                    pick = picks.get(who)
                if pick is None:
                    picks[who] = [group[who], [fs.marks[k]]]
                else:
                    pick[0] = max(pick[0], group[who])
                    pick[1].append(fs.marks[k])
        if picks:
            for who, pick in picks.items():  # (one copy each: the marked one, in the stronger mode)
                mode = merged.pop(who, -1)
                if mode > pick[0]:
                    pick[0] = mode
        return merged, picks

    def _give_picked(self, picks: dict[Any, list[Any]], packed: bytes) -> None:
        """The queue groups' copies of a message, marked for the members picked."""
        for who, (mode, marks) in picks.items():
            c = self.clients[who]
            mine = wire.mark_delivery(packed, marks)
            if not mode:
                c.fire.append(mine)
            elif c.mailbox is not None and c.mailbox.push(mine):
                c.mailbox.queued = True
            else:
                # (full: another member takes it, and this one is cancelled)
                self._requeue_one([*msgpack.unpackb(packed), marks], who)
                if c.mailbox is not None:
                    self._overflow(c)
                continue
            if not c.dirty:
                c.dirty = True
                self._dirty.append(c)

    def _pick(
        self, fs: FilterSubs, k: str | None, group: dict[Any, int], exclude: Container[Any], part: str | None
    ) -> Any:
        """The member of a queue group that gets the next message: round robin over the
        group but ``exclude``, passing over members whose mailbox already holds ``send_window``
        messages (a slow or paused consumer) while another has room; None if there is nobody.
        A fragment of a large message (``part``: its ``roost.part`` tag) goes where its id
        hashes highest with the member (rendezvous hashing): every fragment to one member,
        also from another cluster member after a failover, with no state to keep."""
        if part is not None:
            return self._pick_part(group, exclude, part)
        members = fs.members.get(k)
        if members is None:  # (kept until the group changes: not a copy per message)
            members = fs.members[k] = list(group)
        n = len(members)
        start = fs.turn % n
        fs.turn += 1
        window = self.cfg.send_window
        clients = self.clients
        best, best_load = None, 1 << 62
        for i in range(n):
            who = members[(start + i) - n if start + i >= n else start + i]
            c = clients.get(who)
            if c is None or who in exclude:
                continue
            if not group[who]:
                return who  # (a fire member: no mailbox to weigh)
            mb = c.mailbox
            if mb is None:
                continue  # (being dropped)
            load = len(mb)
            if load < window:
                return who
            if load < best_load:
                best, best_load = who, load
        return best

    def _pick_part(self, group: dict[Any, int], exclude: Container[Any], part: str) -> Any:
        ident = part.split(" ", 1)[0].encode()
        clients = self.clients
        best, best_score = None, b""
        for who, mode in group.items():
            c = clients.get(who)
            if c is None or who in exclude or (mode and c.mailbox is None):
                continue
            name = who if who.__class__ is bytes else repr(who).encode()
            score = hashlib.blake2b(name, digest_size=8, key=ident[:64]).digest()
            if score > best_score:
                best, best_score = who, score
        return best

    def _discarded(self, c: ClientState, mailbox: Mailbox) -> None:
        """A mailbox is dropped (its client timed out, overflowed, left, moved to a new process)
        with messages it never acknowledged: each a queue group picked this client for goes to
        another member of that group (docs/guarantees.md, "Queue groups")."""
        if not mailbox.queued:
            return
        for packed in mailbox.buf[mailbox.base :]:
            if packed[0] == 0x95 or packed[0] == 0x97:  # (a message with queue marks: 5 or 7 elements)
                self._requeue_one(msgpack.unpackb(packed), c.cid)

    def _leave_group(self, c: ClientState, mailbox: Mailbox, mark: bytes) -> None:
        """Hand on what the mailbox holds for one group the client left, and take that group's
        mark off those messages here (the client drops them; a later discard must not hand
        them on again)."""
        buf = mailbox.buf
        for i in range(mailbox.base, len(buf)):
            packed = buf[i]
            if packed[0] != 0x95 and packed[0] != 0x97:
                continue
            m = msgpack.unpackb(packed)
            if mark not in m[-1]:
                continue
            self._requeue_one(m, c.cid, only=mark)
            rest = [x for x in m[-1] if x != mark]
            base = wire.pack(m[:-1])
            buf[i] = wire.mark_delivery(base, rest) if rest else base
            mailbox.nbytes += len(buf[i]) - len(packed)
            if i - mailbox.base < mailbox.sent - mailbox.acked:  # (sent: in flight)
                mailbox.inflight += len(buf[i]) - len(packed)

    def _requeue_one(self, m: list[Any], exclude: Any, only: bytes | None = None) -> None:
        """Give a marked message (unpacked, its marks last) to other members of its groups
        (``only``: of that one group, by mark id)."""
        marks = m[-1]
        base = wire.pack(m[:-1])
        pseq = m[5] if len(m) == 7 else None
        tags = m[2]
        part = tags.get(wire.PART_TAG) if tags else None
        groups = self.index.groups
        for mark in marks:
            if only is not None and mark != only:
                continue
            fs, k = groups.get(mark, _NO_GROUP)
            group = fs.keys.get(k) if fs is not None else None
            tried = {exclude}
            while True:  # (a member whose mailbox is full is passed over for the next)
                who = self._pick(fs, k, group, tried, part) if fs is not None and group else None
                c = self.clients.get(who) if who is not None else None
                if c is None:
                    break
                mine = wire.mark_delivery(base, [mark])
                mb = c.mailbox
                if mb is None:
                    c.fire.append(mine)
                elif mb.push(mine):
                    mb.queued = True
                else:
                    tried.add(who)
                    continue
                break
            if c is None:
                self.metrics["queue_undeliverable"] += 1
                self._log("warning", "queue_undeliverable", filter=fs.filter.text if fs else mark, topic=m[0],
                          seq=pseq)  # fmt: skip
                continue
            self.metrics["queue_redelivered"] += 1
            if not c.dirty:
                c.dirty = True
                self._dirty.append(c)

    def _sub_budget(
        self, live: int, host: str | None, nbytes: int, now: float, text: int = -1, revives: bool = False
    ) -> tuple[int, str]:
        """node/budgets.py: may one more subscription come (ErrorCode.OK, "") or what refuses it
        (``text``: the text subscriptions in force, for a text one; ``revives``: it replaces a
        tombstone of its own)."""
        return self.budgets.check(live, host, nbytes, self.index.count, now, self._mailboxes_bytes, text, revives)

    def _mailboxes_bytes(self) -> dict[str, int]:
        """The bytes the mailboxes hold, per host that admitted their client ("": none here)."""
        held: dict[str, int] = {}
        for c in self.clients.values():
            mb = c.mailbox
            if mb is not None and mb.nbytes:
                host = c.counted or ""
                held[host] = held.get(host, 0) + mb.nbytes
        return held

    def _forward(self, member: str, msg: list[Any]) -> None:
        self._forwards.setdefault(member, []).append(msg)
        self.metrics["forwarded_out"] += 1

    def _ack_point(self, pid: bytes, accepted: int) -> int:
        """What a PUBACK may cover: everything accepted, below the first forward unsettled."""
        waiting = self._unsettled.get(pid)
        return next(iter(waiting)) - 1 if waiting else accepted

    def _settle(self, pid: bytes, seq: int) -> None:
        """A forwarded message reached a primary's mailboxes (or was given up): acknowledge
        what no longer waits for it."""
        waiting = self._unsettled.get(pid)
        if waiting is None or seq not in waiting:
            return
        del waiting[seq]
        if not waiting:
            del self._unsettled[pid]
        st = self.producers.get(pid)
        addr = self._ack_to.get(pid)
        if st is not None and addr is not None:
            self._pubacks[(addr, pid)] = self._ack_point(pid, st[0])

    def _deliver_forwarded(self, msgs: list[Any], ours: bool) -> list[int]:
        """Messages another member forwarded to us, or (``ours``) our own to route
        again after the map changed. Ours go to the primary of the new map (or
        are delivered here if that is us). Another
        member's are delivered here if we own the partition (its primary or, when
        the maps differ for a moment, its secondary); with no owner live in our map
        (a leaver cut off) ours wait unacknowledged (``Forward`` to "", routed
        again at the next map change), and a peer's are refused; the others are
        refused, by
        index, and stay with the sender until its map or ours changes: a member
        takes responsibility (FWDACK) only for what it delivered, so no message
        rests with a member that is neither its acceptor nor its owner (review
        finding #6)."""
        own = self.own
        if own is None:
            self.metrics["forward_unexpected"] += len(msgs)
            return list(range(len(msgs)))
        refused = []
        self._forget_forwards(self._now)
        for i, m in enumerate(msgs):
            topic, key, tags, payload, pid, seq = m
            dest = own.forward_to(topic)
            if dest is None and own.unowned(topic):  # (a leaver that hears no owner: not here either)
                dest = ""
            if dest is not None and ours:
                self._forward(dest, m)
            elif (dest is None or own.owns(topic)) and dest != "":
                if pid is not None and (pid, seq) in self._fwd_seen:
                    # A resend of one we published (its sender's link dropped before our FWDACK
                    # came back): delivered already, and acknowledged again as such.
                    self.metrics["forward_duplicates"] += 1
                else:
                    if pid is not None:
                        self._remember_forward(pid, seq)
                    packed = (wire.pack_message(topic, key, tags, payload) if pid is None
                              else wire.pack_delivery(topic, key, tags, payload, pid, seq))  # fmt: skip
                    self._publish(topic, key, tags, payload, packed)
                    self.metrics["forwarded_in" if not ours else "rerouted_here"] += 1
                if ours and pid is not None:
                    self._settle(pid, seq)
            else:
                refused.append(i)
                self.metrics["forward_refused"] += 1
        return refused

    def _remember_forward(self, pid: bytes, seq: int) -> None:
        self._fwd_seen.add((pid, seq))
        self._fwd_order.append((self._now, pid, seq))

    def _forget_forwards(self, now: float) -> None:
        """Forget the oldest forwarded messages: beyond FORWARDS_REMEMBERED or producer_timeout."""
        order, seen = self._fwd_order, self._fwd_seen
        horizon = now - self.cfg.producer_timeout
        while order and (len(order) >= FORWARDS_REMEMBERED or order[0][0] <= horizon):
            at, pid, seq = order.popleft()
            seen.discard((pid, seq))
            if at > now - FORWARD_MEMORY_MIN:  # (a resend after this could be published twice)
                self.metrics["forward_memory_short"] += 1

    def _overflow(self, c: ClientState) -> None:
        """Mailbox full: cancel every reliable subscription of this client."""
        self.metrics["cancelled_out_of_capacity"] += 1
        now = self._now
        for tk, v in list(c.subs.items()):
            if v & _LIVE_RELIABLE == _LIVE_RELIABLE:
                self._write(c, tk, False, Mode.RELIABLE, now, REASON_OUT_OF_CAPACITY)
                c.cancelled[tk] = Reason.OUT_OF_CAPACITY
                self._send(c.addr, wire.encode_cancel(tk[0], tk[1], Reason.OUT_OF_CAPACITY))
        c.mailbox = None
        self._log("warning", "out_of_capacity", client=c.cid.hex(), addr=fmt(c.addr))

    # ------------------------------------------------------------ acknowledgement and repair

    def _on_ack(self, c: ClientState, stream: int, max_seq: int, sack: list[tuple[int, int]], now: float) -> None:
        mb = c.mailbox
        if mb is None or stream != mb.stream_id:
            self.metrics["ack_stale"] += 1
            return
        mb.on_ack(max_seq, sack, now)
        self._arm(c, mb)
        if sack:
            self._resend(c, mb, mb.fast_retransmit(now))
        if len(mb) > mb.sent - mb.acked and not c.dirty:
            c.dirty = True
            self._dirty.append(c)

    def _arm(self, c: ClientState, mb: Mailbox) -> None:
        """Keep one timer entry per mailbox; it re-arms itself when it fires early."""
        if mb.rto_at is not None and not mb.armed:
            mb.armed = True
            self._timer(mb.rto_at, TIMER_RTO, c.cid)

    def _on_rto(self, cid: bytes, now: float) -> None:
        c = self.clients.get(cid)
        if c is None or c.mailbox is None:
            return
        mb = c.mailbox
        mb.armed = False
        if mb.rto_at is None:
            return
        if mb.rto_at <= now:
            self._resend(c, mb, mb.on_timeout(now))
        self._arm(c, mb)

    def _resend(self, c: ClientState, mb: Mailbox, runs: list[tuple[int, list[bytes]]]) -> None:
        for first, entries in runs:
            self.metrics["retransmitted"] += len(entries)
            self._emit(c.addr, mb.stream_id, first, entries)

    # ------------------------------------------------------------ coalesced output

    def _flush(self, now: float) -> None:
        """Send everything queued by this batch, coalesced per destination: the deliveries first,
        then the PUBACKs (a datagram on loopback wakes its receiver, which may take this core
        from us: the subscribers wait for theirs, a publisher's window rarely waits for its)."""
        window = self.cfg.send_window
        for c in self._dirty:
            c.dirty = False
            if c.fire_whole:
                self._emit_whole(c.addr, c.fire_whole)
                c.fire_whole = []
            if c.fire:
                self._emit(c.addr, 0, 0, c.fire)
                c.fire = []
            mb = c.mailbox
            if mb is not None:
                first, entries = mb.take_new(window, now, self.cfg.send_window_bytes)
                if entries:
                    self._emit(c.addr, mb.stream_id, first, entries)
                    self._arm(c, mb)
        self._dirty.clear()
        for (addr, pid), acked in self._pubacks.items():
            self._send(addr, wire.encode_puback(pid, acked))
        self._pubacks.clear()

    def _fire_number(self) -> int:
        self._next_fire += 1
        return self._next_fire

    def _emit_whole(self, addr: Addr, whole: list[Whole]) -> None:
        """The fire datagrams of the batches relayed whole (``ClientState.fire_whole``: a PUB's
        array of messages as it came, a PUBRUN's run), consecutive ones merged (node/relay.py)."""
        self._out += [Send(addr, d) for d in relay.datagrams(whole, self._budget, self._fire_number)]
        self.metrics["delivered"] += sum(n for _, n, _ in whole)

    def _emit(self, addr: Addr, stream: int, first: int, entries: list[bytes]) -> None:
        """MSGS datagrams for a run of messages, each up to max_datagram."""
        out = self._out
        encode = wire.encode_msgs
        seq = first
        n = len(entries)
        for start, end in wire.runs(entries, self._budget):
            run = entries if start == 0 and end == n else entries[start:end]
            out.append(Send(addr, encode(stream, seq if stream else self._fire_number(), run)))
            if stream:
                seq += end - start
        self.metrics["delivered"] += n
