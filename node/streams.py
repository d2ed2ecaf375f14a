"""Streams: a client's mailbox follows its reliable subscriptions.

Theory of operation. A client has one mailbox (node/mailbox.py) while it holds a reliable
subscription: the registers (node/registers.py) tell ``follow`` of every version they install.
The first reliable subscription opens a mailbox, a new stream numbered from ``next_stream``,
which grows across incarnations (the shell passes wall-clock milliseconds) so clients can
ignore stale streams. The last one's end drops it, so the next subscription starts a fresh
stream at sequence 1; what the dropped mailbox held for queue groups goes to their other members
(node/queuegroups.py). A mailbox whose client another member gave up for lost, or whose
subscriptions a partitioned reset voided, is parked instead: a client alive behind a partition
that takes its subscriptions up again within ``subscriber_timeout`` gets its stream back where
it stopped. A client at a new address gets a new stream (``readdressed``): a receiver there waits
for a stream that starts at sequence 1, never for the middle of ours.
"""

from __future__ import annotations

from collections import Counter

from roost.client import wire
from roost.client.subjects import is_plain
from roost.node import versions
from roost.node.clients import ClientState
from roost.node.config import NodeConfig
from roost.node.delivery import Delivery
from roost.node.mailbox import Mailbox
from roost.node.queuegroups import QueueGroups

_LIVE_RELIABLE = versions.PRESENT | versions.RELIABLE


class Streams:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], delivery: Delivery, groups: QueueGroups, incarnation: int
    ) -> None:
        self.cfg = config
        self.metrics = metrics
        self.delivery = delivery
        self.groups = groups
        # Stream ids grow within an incarnation and across restarts (the shell
        # passes wall-clock milliseconds), so a client can ignore stale streams.
        self.next_stream = incarnation << 16
        self._park_ms = int(config.subscriber_timeout * 1000)
        self._no_restream = "no-restream" in config.breaks  # (sim/breaks.py)

    def _mailbox(self) -> Mailbox:
        self.next_stream += 1
        cfg = self.cfg
        return Mailbox(self.next_stream, cfg.mailbox_capacity, cfg.retransmit_timeout, cfg.retransmit_max,
                       cfg.mailbox_max_bytes)  # fmt: skip

    def follow(self, c: ClientState, tk: tuple[str, str | None], old: int, version: int, voiding: bool) -> None:
        """Register ``tk`` of ``c`` went from ``old`` to ``version``: keep the client's mailbox in
        step, one while it has a reliable subscription, none (so the next one starts a fresh
        stream at sequence 1) once the last one is gone (``voiding``: the registers are ending
        what a partitioned reset voided)."""
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
                    self.delivery.arm(c, mb)
                    self.metrics["mailboxes_resumed"] += 1
                    return
                if parked is not None:
                    self.groups.discarded(c, parked[0])
                c.mailbox = self._mailbox()
        elif (
            c.mailbox is not None
            and old & _LIVE_RELIABLE == _LIVE_RELIABLE
            and not any(v & _LIVE_RELIABLE == _LIVE_RELIABLE for v in c.subs.values())
        ):
            voided = voiding or version >> versions.FLAG_BITS == c.cver >> versions.FLAG_BITS
            # (a mailbox with a queue group's messages is not kept: the group's other members take
            # them now rather than when the park ends; a client alive behind a partition may then
            # get some of them twice: docs/guarantees.md, "Queue groups")
            if (((version >> 2) & 3 == versions.REASON_TIMED_OUT and not c.local) or voided) and not c.mailbox.queued:
                # Given up by another member (its home looked dead to it): kept a while,
                # in case the client lives behind a partition and takes it up again.
                # Voided by a reset (partitioned) whose renewal has not reached us yet
                # (it may come by another owner's map): kept for it (seed 6388). A void
                # another member wrote comes as a tombstone stamped with the reset's own
                # version, our client register's (seeds 215, 791, 5790, 9943).
                c.parked = (c.mailbox, versions.millis_of(version), c.session, c.addr)
            else:
                self.groups.discarded(c, c.mailbox)
            c.mailbox = None
        elif old & versions.PRESENT and not version & versions.PRESENT and c.mailbox is not None \
                and c.mailbox.queued and not is_plain(tk[0]):  # fmt: skip
            # A group subscription ended while the mailbox stays (the client has others): what
            # it holds for that group and the client has not acknowledged goes to the others.
            self.groups.leave_group(c, c.mailbox, wire.mark_id(tk[0], tk[1]))

    def readdressed(self, c: ClientState, carry: bool) -> None:
        """The client is at a new address (it told us, or another member
        did). A receiver there waits for a stream that starts at sequence 1,
        never for the middle of ours, so a new stream starts. The same
        session (a process that moved) gets what it had not acknowledged
        carried over, and drops what it already had by producer id and
        sequence; a new process (a restart reusing the client id) inherits
        nothing, not even the backlog. (Broken build "no-restream": the old
        stream goes on at the new address.)"""
        if self._no_restream:
            return
        c.parked = None  # (a stream is never taken up at another address)
        old = c.mailbox
        if old is None:
            return
        mb = c.mailbox = self._mailbox()
        if carry:
            for packed in old.buf[old.base :]:
                mb.push(packed)
            mb.queued = old.queued
        else:
            self.groups.discarded(c, old)
        self.metrics["streams_restarted"] += 1
        if len(mb):
            self.delivery.mark(c)
