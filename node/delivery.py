"""Delivery: mailboxes and fire lists out as MSGS datagrams, PUBACKs, and their repair.

Theory of operation. The fan-out (node/fanout.py, node/producers.py) appends each
subscriber's messages to its client's mailbox (reliable) or fire list and queues the client in
``dirty`` once. Nothing is sent per message: at the end of the entry point ``flush`` takes each
dirty client's new messages (as many as its send window allows) and ``emit`` packs them into as
few MSGS datagrams as ``max_datagram`` allows; PUBACKs are coalesced the same way, one per
(address, producer) per batch (``pubacks``). Text subscribers get their ``MSG`` datagram at once
(one per message, as FASTPUSS does), within their credit (``text_budget``), from their home
member (``relays``: partitioned mode, the text datagrams for other homes). A fire publisher's
datagram relayed whole (node/producers.py) waits in the client's ``fire_whole`` and goes out
before its fire list, the batches of one kind merged as far as ``max_datagram`` allows
(node/relay.py).

Lost datagrams are repaired from the mailbox (node/mailbox.py): selective ACKs resend the holes
at once, and one RTO timer per mailbox resends everything unacknowledged with back-off. Fire
datagrams are numbered per member incarnation (MSGS first_seq of stream 0), so a client drops
one the network duplicated; a restarted member numbers far above.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from roost.client import wire
from roost.node import relay
from roost.node.actions import Send
from roost.node.clients import ClientState
from roost.node.config import NodeConfig
from roost.node.cookies import Addr
from roost.node.mailbox import Mailbox
from roost.node.outbox import TIMER_RTO, Outbox
from roost.node.relay import Whole


class Delivery:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], outbox: Outbox, clients: dict[Any, ClientState],
        incarnation: int,
    ) -> None:  # fmt: skip
        self.cfg = config
        self.metrics = metrics
        self.outbox = outbox
        self.out = outbox.out
        self.clients = clients
        self.node_id = config.id
        self.next_fire = incarnation << 16
        self.dirty: list[ClientState] = []  # clients with messages queued by this batch
        self.pubacks: dict[tuple[Addr, bytes], int] = {}  # -> cumulative seq, sent by flush
        self.relays: dict[str, list[list[Any]]] = {}  # partitioned: text datagrams for other homes
        self.budget = config.max_datagram - wire.MSGS_HEADER_MAX

    def mark(self, c: ClientState) -> None:
        """``c`` has something new to send: it goes out at the end of the batch."""
        if not c.dirty:
            c.dirty = True
            self.dirty.append(c)

    # ------------------------------------------------------------ text subscribers

    def to_text(self, who: Addr, text_msg: bytes) -> None:
        """A message to a text client (its MSG line), sent by the member it sent its SUB to:
        a text client hears only that one (`nc -u` connects its socket), and that member
        holds its anti-reflection budget (``text_budget``)."""
        c = self.clients[who]
        if c.home == self.node_id:
            if self.text_budget(c, len(text_msg)):
                self.out.append(Send(who, text_msg))
        else:
            self.relays.setdefault(c.home, []).append([who[0], who[1], text_msg])
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

    def mailboxes_bytes(self) -> dict[str, int]:
        """The bytes the mailboxes hold, per host that admitted their client ("": none here)."""
        held: dict[str, int] = {}
        for c in self.clients.values():
            mb = c.mailbox
            if mb is not None and mb.nbytes:
                host = c.counted or ""
                held[host] = held.get(host, 0) + mb.nbytes
        return held

    # ------------------------------------------------------------ acknowledgement and repair

    def on_ack(self, c: ClientState, stream: int, max_seq: int, sack: list[tuple[int, int]], now: float) -> None:
        mb = c.mailbox
        if mb is None or stream != mb.stream_id:
            self.metrics["ack_stale"] += 1
            return
        mb.on_ack(max_seq, sack, now)
        self.arm(c, mb)
        if sack:
            self._resend(c, mb, mb.fast_retransmit(now))
        if len(mb) > mb.sent - mb.acked and not c.dirty:
            c.dirty = True
            self.dirty.append(c)

    def arm(self, c: ClientState, mb: Mailbox) -> None:
        """Keep one timer entry per mailbox; it re-arms itself when it fires early."""
        if mb.rto_at is not None and not mb.armed:
            mb.armed = True
            self.outbox.timer(mb.rto_at, TIMER_RTO, c.cid)

    def on_rto(self, cid: bytes, now: float) -> None:
        c = self.clients.get(cid)
        if c is None or c.mailbox is None:
            return
        mb = c.mailbox
        mb.armed = False
        if mb.rto_at is None:
            return
        if mb.rto_at <= now:
            self._resend(c, mb, mb.on_timeout(now))
        self.arm(c, mb)

    def _resend(self, c: ClientState, mb: Mailbox, runs: list[tuple[int, list[bytes]]]) -> None:
        for first, entries in runs:
            self.metrics["retransmitted"] += len(entries)
            self._emit(c.addr, mb.stream_id, first, entries)

    # ------------------------------------------------------------ coalesced output

    def flush(self, now: float) -> None:
        """Send everything queued by this batch, coalesced per destination: the deliveries first,
        then the PUBACKs (a datagram on loopback wakes its receiver, which may take this core
        from us: the subscribers wait for theirs, a publisher's window rarely waits for its)."""
        window = self.cfg.send_window
        for c in self.dirty:
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
                    self.arm(c, mb)
        self.dirty.clear()
        out = self.out
        for (addr, pid), acked in self.pubacks.items():
            out.append(Send(addr, wire.encode_puback(pid, acked)))
        self.pubacks.clear()

    def _fire_number(self) -> int:
        self.next_fire += 1
        return self.next_fire

    def _emit_whole(self, addr: Addr, whole: list[Whole]) -> None:
        """The fire datagrams of the batches relayed whole (``ClientState.fire_whole``: a PUB's
        array of messages as it came, a PUBRUN's run), consecutive ones merged (node/relay.py)."""
        out = self.out
        out += [Send(addr, d) for d in relay.datagrams(whole, self.budget, self._fire_number)]
        self.metrics["delivered"] += sum(n for _, n, _ in whole)

    def _emit(self, addr: Addr, stream: int, first: int, entries: list[bytes]) -> None:
        """MSGS datagrams for a run of messages, each up to max_datagram."""
        out = self.out
        encode = wire.encode_msgs
        seq = first
        n = len(entries)
        for start, end in wire.runs(entries, self.budget):
            run = entries if start == 0 and end == n else entries[start:end]
            out.append(Send(addr, encode(stream, seq if stream else self._fire_number(), run)))
            if stream:
                seq += end - start
        self.metrics["delivered"] += n
