"""The node's record of one subscriber: :class:`ClientState`.

A subscriber is a binary client (keyed by its client id, ``bytes``) or a
text-protocol source address (keyed by that address, a tuple); the hot path
tells them apart by the key's type. One record serves three purposes:

- the replica of the client's state: its subscriptions are versioned
  registers (node/versions.py), tombstones included, plus the register of
  its (address, home) pair (``cver``), so in a cluster every member holds
  the same records (node/registers.py);
- delivery state, local to the node that serves the client: the reliable
  mailbox, the fire messages queued by the current batch, cancellations not
  yet confirmed (node/delivery.py);
- the command session, local to the node the client talks to: which client
  session its batches belong to and the answers of its last few batches
  (node/sessions.py).

``__slots__`` because a node holds one of these per subscriber.
"""

from __future__ import annotations

import math
from typing import Any

from roost.client import wire
from roost.node import versions
from roost.node.cookies import Addr
from roost.node.mailbox import Mailbox
from roost.node.relay import Whole

#: Answers of this many most recent command batches are kept per client, so a
#: retried batch gets its own answer (bounded: a client has one batch in flight).
REMEMBERED_BATCHES = 8


class ClientState:
    __slots__ = (
        "cid", "addr", "home", "cver", "local", "subs", "live", "last_seen", "heard", "mailbox", "parked", "fire",
        "fire_whole", "dirty", "session", "last_batch", "answers", "cancelled", "changed", "counted", "sdigest",
        "redirected", "since", "credit", "charged",
    )  # fmt: skip

    def __init__(self, cid: Any, addr: Addr, home: str, now: float) -> None:
        self.cid = cid
        self.addr = addr
        self.home = home  # the node this client talks to (liveness is its job)
        self.cver = 0  # version of the (addr, home) register
        self.local = False  # home is this node: PING/timeout handled here
        self.subs: dict[tuple[str, str | None], int] = {}  # -> version (tombstones too)
        self.live = 0  # subscriptions present (not tombstones)
        self.last_seen = now
        self.since = now  # when this node made the record (/connz shows the age)
        # A text client's anti-reflection budget: the bytes this node may still send it,
        # ``text_amplification`` times what it sent (node/textproto.py).
        self.credit = 0.0
        # The source host its subscriptions are charged to (max_subscriptions_per_host,
        # max_filter_bytes_per_host), fixed while it holds any: "" when not charged here.
        self.charged: str | None = None
        self.heard = -math.inf  # when the client itself last sent this node a datagram
        self.mailbox: Mailbox | None = None
        # The mailbox of subscriptions another member timed out, with the time (Unix ms) of
        # that tombstone, the session and the address then: the client may still be alive
        # behind a partition (node/delivery.py).
        self.parked: tuple[Mailbox, int, int, Addr] | None = None
        self.fire: list[bytes] = []
        # Fire datagrams' messages relayed whole (node/relay.py), to go out before ``fire``
        # (queued only while ``fire`` is empty, so their order is the order they came in:
        # node/producers.py)
        self.fire_whole: list[Whole] = []
        self.dirty = False  # queued for this batch's flush
        # Command session: -1 until this node applies a batch of the client
        # (a record made by replication knows no session).
        self.session = -1
        self.last_batch = -1  # highest batch applied in ``session``
        self.answers: dict[int, bytes] = {}  # batch -> its CMDACK, for the last REMEMBERED_BATCHES
        # Cancellations the client has not confirmed yet (by UNSUB or SUB);
        # repeated in every PONG so a lost CANCEL datagram cannot hide one.
        self.cancelled: dict[tuple[str, str | None], str] = {}
        self.changed: dict[tuple[str, str | None], None] | None = None  # not yet replicated
        self.counted: str | None = None  # source host this record counts against (max_per_host)
        self.sdigest: int | None = None  # wire.subs_digest of modes(), computed when a PING asks
        self.redirected = 0  # partitioned mode: the map epoch last sent to the client in a REDIRECT

    def subs_digest(self) -> int:
        if self.sdigest is None:
            self.sdigest = wire.subs_digest((t, k, m) for (t, k), m in self.modes().items())
        return self.sdigest

    def modes(self) -> dict[tuple[str, str | None], int]:
        """The subscriptions in force, with their delivery modes."""
        return {tk: v & versions.RELIABLE for tk, v in self.subs.items() if v & versions.PRESENT}
