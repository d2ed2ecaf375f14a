"""Producers: PUB frames in, de-duplicated by producer id and sequence, PUBACK out.

Theory of operation. Every binary PUB carries a producer id and the
consecutive sequences of its messages, starting at ``first``, plus
``floor``, the lowest sequence the producer has not seen acknowledged. The
node keeps one entry per producer (``ProducerState``), and
accepts only what lies above ``acked_seq``: a retry (the PUBACK was lost) or
an overlapping resend delivers just its new part. A node that never saw the
producer, or forgot it, starts at ``floor``. For reliable PUBs a gap above
the acknowledged point is refused (go-back-N keeps FIFO order); fire PUBs
accept gaps. The cumulative PUBACK is coalesced per (address, producer) and
sent by ``Delivery.flush`` at the end of the batch. An entry is forgotten after
``producer_timeout`` without a PUB.

In partitioned mode a message whose partition has another primary is
forwarded there (``_route_pub``); the client's library routes by the cluster
map, so the producer is sent a REDIRECT with our map, once per map epoch
(the entry remembers the epoch it was sent): a stream of publishes gives
one REDIRECT, not a stream of them, and a client that ignores it (text
clients cannot get one; an older library) is still served by forwarding.

The PUB loop is the hot path: one decode per datagram, one pack per message (not in fire), and
a datagram's messages of one topic and key (a publisher's batch, as a rule) fanned out as one
run (``_publish_run``: matched once, each subscriber given the run in one call). Any other
datagram is one ``Fanout.publish`` call per message, and so is every datagram while the node has a
filter subscription (wildcard, query or queue group, on any topic: each message's tags may
decide who gets it) or while a reliable subscriber's mailbox lacks room for the whole run.
A fire run goes further: a fire subscriber gets the PUB's array of messages as the datagram
carried it (``_as_sent``), merged with the next such batches (node/relay.py), so the node packs
nothing per message; a message is packed only for a reliable subscriber's mailbox, or for a
fire subscriber that already has single messages queued in this batch (they must go out
first, in order). A PUBRUN (a fire PUB of one topic's payloads alone: docs/protocol.md, "Runs")
is relayed so too, in a MSGSRUN (``_relay_run``), or else taken as a PUB's messages.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from roost.client import decoding, wire
from roost.client.decoding import MSG_KEY, MSG_PAYLOAD, MSG_TAGS, MSG_TOPIC
from roost.client.text import encode_text_msg
from roost.node.admission import Admission, host_key
from roost.node.config import NodeConfig
from roost.node.cookies import Addr
from roost.node.delivery import Delivery
from roost.node.fanout import Fanout
from roost.node.forwarding import Forwarding
from roost.node.outbox import TIMER_PRODUCER, Outbox
from roost.node.placement import Placement


class ProducerState:
    """What the node remembers of one producer."""

    __slots__ = ("acked", "host", "last_seen", "redirected")

    def __init__(self, last_seen: float, host: str) -> None:
        self.acked = 0  # the highest sequence accepted: everything up to it is taken
        self.last_seen = last_seen  # its last PUB (forgotten producer_timeout after it)
        self.host = host  # the source host it counts against (max_per_host, max_producers)
        self.redirected = 0  # partitioned mode: the map epoch it was last sent in a REDIRECT

    def __repr__(self) -> str:
        return f"ProducerState({self.acked}, {self.last_seen}, {self.host!r}, {self.redirected})"

    def fields(self) -> tuple[int, float, str, int]:
        return self.acked, self.last_seen, self.host, self.redirected


class Producers:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], outbox: Outbox, place: Placement, admission: Admission,
        delivery: Delivery, fanout: Fanout, forwarding: Forwarding,
    ) -> None:  # fmt: skip
        self.cfg = config
        self.metrics = metrics
        self.outbox = outbox
        self.place = place
        self.admission = admission
        self.delivery = delivery
        self.fanout = fanout
        self.forwarding = forwarding
        self.clients = fanout.clients
        self.index = fanout.index
        self.dirty = delivery.dirty
        self.pubacks = delivery.pubacks
        self.producers: dict[bytes, ProducerState] = {}
        self.producer_hosts: dict[str, dict[bytes, None]] = {}  # source host -> its producers, oldest first
        self.producer_share = Admission(config.max_producers)  # producers alone per host (the largest holder)
        self._producer_timers: set[bytes] = set()  # producers with a TIMER_PRODUCER armed
        # Reliable messages forwarded to a primary and not yet in its mailboxes: producer id ->
        # their sequences, in the order they were accepted (the first is the lowest). A PUBACK
        # never covers one (_ack_point): the client moves a topic to a new primary only once the
        # old route acknowledged it, so a message still in our forward queue must not be
        # acknowledged, or the next ones, sent straight to the new primary, overtake it (chaos
        # seed 3). ``_ack_to``: where the producer's PUBACKs go.
        self._unsettled: dict[bytes, dict[int, None]] = {}
        self._ack_to: dict[bytes, Addr] = {}

    def on_pub(self, addr: Addr, f: tuple[Any, ...], now: float, data: bytes) -> None:
        _, _, _, pid, first, floor, reliable, msgs = f
        self._on_batch(addr, pid, first, floor, reliable, msgs, now, data, f)

    def on_pubrun(self, addr: Addr, f: tuple[Any, ...], now: float) -> None:
        """A PUBRUN: a fire PUB of plain messages of one topic, its payloads alone."""
        _, _, _, pid, first, topic, payloads = f
        self._on_batch(addr, pid, first, first, False, payloads, now, b"", f, topic)

    def _on_batch(self, addr: Addr, pid: bytes, first: int, floor: int, reliable: bool, msgs: list[Any],
                  now: float, data: bytes, f: tuple[Any, ...], run_topic: str | None = None) -> None:  # fmt: skip
        """A PUB's messages (``msgs``), or with ``run_topic`` a PUBRUN's payloads: de-duplicated
        by producer sequence, then fanned out (or routed, partitioned). A PUBRUN's go to fire
        subscribers as a run where they can (``_relay_run``), else as a PUB's messages would."""
        st = self.producers.get(pid)
        if st is None:
            host = host_key(addr[0])
            self._admit_producer(host)
            st = self.producers[pid] = ProducerState(now, host)
            self.producer_hosts.setdefault(host, {})[pid] = None
            self.producer_share.add(host)
            if pid not in self._producer_timers:  # (an evicted producer's timer may still be armed)
                self._producer_timers.add(pid)
                self.outbox.timer(now + self.cfg.producer_timeout, TIMER_PRODUCER, pid)
        st.last_seen = now
        acked = st.acked
        if floor - 1 > acked:
            acked = floor - 1
        waiting = self._unsettled.get(pid)
        if waiting and next(iter(waiting)) < floor:  # (the producer has them acknowledged elsewhere)
            for s in [s for s in waiting if s < floor]:
                del waiting[s]
            if not waiting:
                del self._unsettled[pid]
        last = first + len(msgs) - 1
        if reliable and first > acked + 1:
            # An earlier batch is missing: keep FIFO by refusing this one; the
            # producer resends from the acknowledged point (go-back-N).
            self.metrics["pub_out_of_order"] += 1
            skip = len(msgs)
        else:
            # (at most the batch: a producer that went back below its own floor resends what
            # was acknowledged, and the counters below add what this batch holds, no more)
            skip = min(acked + 1 - first, len(msgs)) if acked >= first else 0
            if last > acked:
                acked = last
        st.acked = acked
        self.metrics["pub_duplicates"] += skip
        self.metrics["published"] += len(msgs) - skip
        publish = self.fanout.publish
        if run_topic is not None:
            if skip == len(msgs):
                return  # (a fire run seen already: nothing to route, no PUBACK)
            run = msgs[skip:] if skip else msgs
            if self.place.own is None and not self.index.filters and self._relay_run(run_topic, run):
                return
            msgs = [(run_topic, None, None, p) for p in msgs]
        if self.place.own is not None:
            if self._route_pub(pid, first + skip, reliable, msgs[skip:]) and st.redirected < self.place.map_epoch:
                st.redirected = self.place.map_epoch
                assert self.place.redirect_frame is not None
                self.metrics["redirects"] += 1
                self.outbox.send(addr, self.place.redirect_frame)
            if reliable:
                self._ack_to[pid] = addr
                self.pubacks[(addr, pid)] = self._ack_point(pid, acked)
            return
        if skip:
            msgs = msgs[skip:]
        packs: list[bytes] | None = None
        if reliable:
            packs = wire.pack_messages(msgs, pid, first + skip)
            self.pubacks[(addr, pid)] = acked
        if not msgs:
            return
        topic, key = msgs[0][MSG_TOPIC], msgs[0][MSG_KEY]
        if len(msgs) > 1 and not self.index.filters and all(m[0] == topic and m[1] == key for m in msgs):
            whole = None if reliable or skip or run_topic is not None else self._as_sent(data, f, msgs)
            if self._publish_run(msgs, packs, whole):
                return
        # (literal indices in the per-message loops: m[0] to m[3] are decoding.MSG_TOPIC, MSG_KEY, MSG_TAGS,
        # MSG_PAYLOAD; a constant index costs nothing, a module's name a lookup)
        for m, packed in zip(msgs, packs or wire.pack_messages(msgs), strict=True):
            publish(m[0], m[1], m[2], m[3], packed)

    @staticmethod
    def _as_sent(data: bytes, f: tuple[Any, ...], msgs: list[Any]) -> bytes | None:
        """A fire PUB's array of messages as ``data`` carries it, when its subscribers may get
        it so (``decoding.pub_messages_untrusted``): every message ``[topic, key, tags,
        payload]`` (a PUB's may also carry a producer id and sequence, which are not relayed).
        Relaying it spares the node a pack of each message and, per subscriber, a join of them
        (docs/performance.md). A MSGS around it fits in ``max_datagram``: the PUB did (a
        longer datagram is refused), and a PUB's other fields take more room than a MSGS's."""
        return decoding.pub_messages_untrusted(data, f) if set(map(len, msgs)) == {4} else None

    def _relay_run(self, topic: str, payloads: list[bytes]) -> bool:
        """A PUBRUN's payloads to the subscribers of ``topic``, when every one of them is a fire
        subscriber with nothing queued in this batch: each gets them in a MSGSRUN (merged with the
        next runs of the topic: node/relay.py), its body packed once whatever their number. It
        fits in ``max_datagram``: the PUBRUN did, its header is longer than a MSGSRUN's, and the
        payloads are packed in their shortest form. False, with nothing done, when a subscriber
        needs each message on its own (a reliable one's mailbox, a text client, a fire one with
        messages already queued, which must go first): the caller then takes the payloads as a
        PUB's messages."""
        subs = self.index.match(topic, None)
        if not subs:
            return True
        clients = self.clients
        for who, mode in subs.items():
            if mode or who.__class__ is not bytes or clients[who].fire:
                return False
        n, dirty = len(payloads), self.dirty
        head, body = wire.run_body(topic, payloads)
        matched = self.index.matched
        matched[topic] = matched.get(topic, 0) + n
        for who in subs:
            c = clients[who]
            c.fire_whole.append((body, n, head))
            if not c.dirty:
                c.dirty = True
                dirty.append(c)
        return True

    def _publish_run(self, msgs: list[Any], packs: list[bytes] | None, whole: bytes | None) -> bool:
        """``Fanout.publish`` of a run of messages of one topic and key (a publisher's datagram, as a
        rule) with no filters on the node to ask about each one's tags: the subscribers are
        matched once and each given the run in one call, the per-message work of the fan-out
        done per batch. False, with nothing done, when a reliable subscriber's mailbox lacks room
        for the run: then each message goes on its own (``Fanout.publish``), so that a mailbox fills
        and its subscription is cancelled at the message it would have been, and what follows
        is matched again (the client may have a fire subscription that still takes it).

        ``packs`` are the messages packed (None: packed here when a subscriber needs them);
        ``whole``, when not None, their array as the PUB carried it (``_as_sent``), which a fire
        subscriber with nothing else queued in this batch gets as it is, in a MSGS (node/relay.py)."""
        topic = msgs[0][MSG_TOPIC]
        subs = self.index.match(topic, msgs[0][MSG_KEY])
        if not subs:
            return True
        clients, dirty = self.clients, self.dirty
        n, size = len(msgs), 0
        if packs is None and (whole is None or any(subs.values())):
            packs = wire.pack_messages(msgs)
        if packs is not None:
            size = sum(map(len, packs))
            for who, mode in subs.items():
                if mode and who.__class__ is bytes:
                    mb = clients[who].mailbox
                    if mb is not None and not mb.fits(n, size):
                        return False
        matched = self.index.matched
        matched[topic] = matched.get(topic, 0) + n
        for who, mode in subs.items():
            if who.__class__ is not bytes:  # (a text client: one line per message)
                for m in msgs:
                    self.delivery.to_text(who, encode_text_msg(topic, m[MSG_PAYLOAD]))
                continue
            c = clients[who]
            if mode:
                mb = c.mailbox
                if mb is None:  # (skipped, as Fanout.publish skips it)
                    continue
                assert packs is not None
                mb.push_many(packs, size)
            elif whole is not None and not c.fire:
                c.fire_whole.append((whole, n, b""))
            else:
                if packs is None:
                    packs = wire.pack_messages(msgs)
                c.fire += packs
            if not c.dirty:
                c.dirty = True
                dirty.append(c)
        return True

    def _route_pub(self, pid: bytes, seq: int, reliable: bool, msgs: list[Any]) -> bool:
        """Partitioned mode: each message to its partition's primary, here or over a peer link;
        True when one went to another member (the producer should learn our map)."""
        forward_to = self.place.own.forward_to  # type: ignore[union-attr]
        unowned = self.place.own.unowned  # type: ignore[union-attr]
        misrouted = False
        publish, forward = self.fanout.publish, self.forwarding.forward
        for m in msgs:
            topic, key, tags, payload = m[MSG_TOPIC], m[MSG_KEY], m[MSG_TAGS], m[MSG_PAYLOAD]
            dest = forward_to(topic)
            if dest is None and unowned(topic):
                dest = ""  # (no live owner: kept unacknowledged until there is one; cluster/forwarding.py)
            if dest is not None:
                misrouted = True
                if reliable:
                    self._unsettled.setdefault(pid, {})[seq] = None
                forward(dest, [topic, key, tags, payload, pid if reliable else None, seq if reliable else None])
            elif reliable:
                publish(topic, key, tags, payload, wire.pack_delivery(topic, key, tags, payload, pid, seq))
            else:
                publish(topic, key, tags, payload, wire.pack_message(topic, key, tags, payload))
            seq += 1
        return misrouted

    def on_timer(self, pid: bytes, now: float) -> None:
        """Producer timer: forget the producer if it was silent long enough."""
        st = self.producers.get(pid)
        if st is None:
            self._producer_timers.discard(pid)
            return
        expires = st.last_seen + self.cfg.producer_timeout
        if expires > now:
            self.outbox.timer(expires, TIMER_PRODUCER, pid)
        else:
            self._producer_timers.discard(pid)
            self._forget_producer(pid)

    def _admit_producer(self, host: str) -> None:
        """Room for a new producer from ``host``, or WireError. A full table is a pool a few
        hosts may have emptied together: a host holding at least two fewer than the largest
        holder takes that one's oldest producer's place (node/admission.py), so the parties
        over their share lose out, not everyone. (That producer's next PUB starts again from
        its floor: only what it resends of what the node had acknowledged may come twice.)"""
        self.admission.check_host(host)  # (refused before it takes anyone's place)
        if len(self.producers) >= self.cfg.max_producers:
            victim = self.producer_share.largest(host)
            if victim is not None:
                self._forget_producer(next(iter(self.producer_hosts[victim])))
                self.metrics["producers_evicted"] += 1
        self.admission.admit(host, len(self.producers), self.cfg.max_producers, "producers", "max_producers")

    def _forget_producer(self, pid: bytes) -> None:
        st = self.producers.pop(pid)
        self._unsettled.pop(pid, None)
        self._ack_to.pop(pid, None)
        self.admission.release(st.host)
        self.producer_share.release(st.host)
        pids = self.producer_hosts[st.host]
        del pids[pid]
        if not pids:
            del self.producer_hosts[st.host]

    def _ack_point(self, pid: bytes, accepted: int) -> int:
        """What a PUBACK may cover: everything accepted, below the first forward unsettled."""
        waiting = self._unsettled.get(pid)
        return next(iter(waiting)) - 1 if waiting else accepted

    def settle(self, pid: bytes, seq: int) -> None:
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
            self.pubacks[(addr, pid)] = self._ack_point(pid, st.acked)
