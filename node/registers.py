"""The replicated state of a node: every client's registers, and the index they feed.

Theory of operation. Each subscription (client, topic, key) is a
last-writer-wins register whose value is one int, its version
(node/versions.py): hybrid logical clock, writer index and flags (present,
reliable, and for tombstones the reason). Each client also has one register
for its (address, home node) pair, ``cver``. A local change (``write``)
takes a fresh version from the HLC; a replicated one (``merge``) is installed
only if it is newer. Both go through ``_set``, the one place that changes a
register, so the subscription index, the counters and the digest always
follow the registers. Newer-wins per register makes a merge commutative,
associative and idempotent: replicas converge whatever order, repetition or
grouping of entries they see.

A single node (``replicating=False``) keeps no tombstones and no digest: an
unsubscribe just removes the register.

In a cluster, local writes are collected per client (``mark_changed``) and
leave as one ``Replicate`` action at the end of the entry point. The digest
is ``DIGEST_BUCKETS`` 64-bit XOR sums of (key hash, version) mixes, updated
incrementally by ``_set``; anti-entropy compares digests and ships only the
buckets that differ (``dump(buckets)``). Tombstones are kept for
``tombstone_horizon`` seconds so a late "subscribed" cannot win over an
unsubscribe, then collected; a tombstone older than the horizon that arrives
from a replica which has not collected it yet stays dead. When a member dies,
the survivors tombstone the subscriptions of the clients it was home to
(``expire_home``); a client still talking to its home re-asserts them.

The client table (``clients``) and the subscription index (``index``) are read by the other
components of the broker core (node/core.py hands the same two to each); this one is their only
writer. Each version installed is passed on to node/streams.py (a client's mailbox follows its
reliable registers), and ``merge`` returns the text subscriptions whose leases start again
(node/textproto.py), so that this component depends on no component above it.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

import mmh3

from roost.client.wire import Reason
from roost.node import versions
from roost.node.admission import Admission, host_key
from roost.node.budgets import SubscriptionBudgets
from roost.node.clients import ClientState
from roost.node.config import NodeConfig
from roost.node.cookies import Addr
from roost.node.delivery import Delivery
from roost.node.outbox import TIMER_LIVENESS, Outbox
from roost.node.ownership import Ownership
from roost.node.placement import Placement
from roost.node.queuegroups import QueueGroups
from roost.node.streams import Streams
from roost.node.subscriptions import SubscriptionIndex
from roost.node.versions import REASON_OUT_OF_CAPACITY, REASON_TIMED_OUT, REASON_UNSUBSCRIBED

# Replica digests: registers hash into this many buckets; anti-entropy compares
# bucket digests (XOR of (key hash, version) mixes) and ships differing buckets.
DIGEST_BUCKETS = 256
# Replicated versions may be at most this far ahead of our clock (seconds).
MAX_CLOCK_SKEW = 60.0

_M64 = (1 << 64) - 1
_CVER_SALT = 0x5BD1E9955BD1E995  # partitioned mode: a register's share also covers its client's cver


def _key_hash(who: Any, tk: tuple[str, str | None] | None) -> tuple[int, int]:
    """(bucket, 64-bit hash) of a register: a subscription, or the client's own."""
    raw = who if who.__class__ is bytes else f"{who[0]}|{who[1]}".encode()
    if tk is not None:
        raw += b"\0" + tk[0].encode() + b"\0" + (tk[1] or "").encode() + (b"\1" if tk[1] is None else b"")
    h = mmh3.hash64(raw, signed=False)[0]
    return h & (DIGEST_BUCKETS - 1), h


def _mix(h: int, version: int) -> int:
    """A register's share of its bucket digest; 0 for "absent". ``h`` is already
    a uniform 64-bit key hash; odd multipliers spread the version over all bits."""
    return 0 if version == 0 else ((h * 0x9E3779B97F4A7C15) ^ (version * 0xC2B2AE3D27D4EB4F)) & _M64


class Registers:
    def __init__(
        self, config: NodeConfig, metrics: Counter[str], outbox: Outbox, place: Placement,
        clients: dict[Any, ClientState], index: SubscriptionIndex, admission: Admission, client_share: Admission,
        delivery: Delivery, streams: Streams, groups: QueueGroups, node_idx: int, wall_offset: float,
        replicating: bool, tombstone_horizon: float,
    ) -> None:  # fmt: skip
        """``clients`` and ``index`` are the tables the other components read; this is the one
        that writes them (``_set``). ``streams`` is told of every version installed (a client's
        mailbox follows its reliable registers); ``groups`` takes what a parked mailbox held for
        queue groups when its time is over."""
        self.cfg = config
        self.node_id = config.id
        self.metrics = metrics
        self.outbox = outbox
        self.place = place
        self.admission = admission
        self.client_share = client_share  # binary client records alone, per host
        self.delivery = delivery
        self.streams = streams
        self.groups = groups
        self.node_idx = node_idx
        self.wall_offset = wall_offset  # core time + offset = Unix time (HLC, cookies)
        self.hlc = versions.HybridClock()
        self.index = index
        self.clients = clients
        self.text_subs = 0  # text-protocol subscriptions in force (max_text_subscribers)
        self.budgets = SubscriptionBudgets(config, metrics, outbox.log)  # charged in _set
        self.replicating = replicating
        self.tombstone_horizon = tombstone_horizon
        self.expire_skipped = 0  # clients the last expire_home left alone: heard from lately
        self.digest = [0] * DIGEST_BUCKETS
        self.lost_at: dict[int, float] = {}  # partition -> when the map last took it from us (reindex)
        self._voiding = False  # inside _void_older (node/streams.py parks the mailbox)
        # Registers changed (local writes and merges), ever: a snapshot is due
        # when this moved since the last one.
        self.changes = 0
        self.changed: list[ClientState] = []  # clients with local writes not yet replicated
        # Deliberately broken builds (sim/breaks.py): tombstones are not merged; resets void nothing.
        self._no_tombstones = "no-tombstones" in config.breaks
        self._no_void = "no-void" in config.breaks

    @property
    def own(self) -> Ownership | None:
        """Partitioned mode (node/ownership.py): the index holds owned partitions only, and the
        digest has one bucket per partition; None in replicated mode and on a single node."""
        return self.place.own

    # ------------------------------------------------------------ records

    def new_client(self, cid: Any, addr: Addr, now: float) -> ClientState:
        """A record for a client that talks to this node (its home)."""
        c = self.clients[cid] = ClientState(cid, addr, self.node_id, now)
        c.local = True
        self.set_cver(c, self.version(now, True, 0))
        if cid.__class__ is bytes:
            self.outbox.timer(now + self.cfg.subscriber_timeout, TIMER_LIVENESS, cid)
        self.mark_changed(c, None)
        return c

    def forget_client(self, c: ClientState) -> None:
        """Free the record, and its admission count."""
        self.clients.pop(c.cid, None)
        self.uncount(c)

    def count(self, c: ClientState, host: str) -> None:
        """``c`` counts against ``host`` here from now on, whatever the limits (a client this
        member adopts or gets back is not refused), and its registers are charged to it."""
        self.admission.add(host)
        self.client_share.add(host)
        c.counted = host
        self.budgets.rehome(c, host)

    def uncount(self, c: ClientState) -> None:
        """``c`` no longer counts against the host that admitted it here (``max_per_host``, its
        share of ``max_clients``): it is gone, or its home is elsewhere now."""
        if c.counted is not None:
            self.admission.release(c.counted)
            self.client_share.release(c.counted)
            c.counted = None

    # ------------------------------------------------------------ writes

    def version(self, now: float, present: bool, mode: int, reason: int = 0) -> int:
        hlc = self.hlc.now(now + self.wall_offset)
        return versions.make(hlc, self.node_idx, present, mode) | (reason << 2)

    def write(
        self, c: ClientState, tk: tuple[str, str | None], present: bool, mode: int, now: float,
        reason: int = 0,
    ) -> None:  # fmt: skip
        """A local change of one subscription: a new version, applied and queued."""
        self._set(c, tk, self.version(now, present, mode, reason))
        self.mark_changed(c, tk)

    def set_cver(self, c: ClientState, cver: int) -> None:
        """Install a version of the client's (address, home) register.

        The register counts in the digest only while the client has
        subscription registers: an empty record is local bookkeeping that one
        replica may already have collected and another (its home) keeps.
        """
        if self.replicating and c.subs:
            if self.place.own is None:
                self._digest_client(c)
                c.cver = cver
                self._digest_client(c)
                return
            # Partitioned: the client register has no partition of its own; each of
            # its subscription registers' shares covers it instead (see _share).
            old, c.cver = c.cver, cver
            digest = self.digest
            for tk in c.subs:
                b, h = self.bucket(c.cid, tk)
                digest[b] ^= _mix(h ^ _CVER_SALT, old) ^ _mix(h ^ _CVER_SALT, cver)
        else:
            c.cver = cver

    def bucket(self, who: Any, tk: tuple[str, str | None]) -> tuple[int, int]:
        """(digest bucket, 64-bit hash) of a subscription register: in partitioned
        mode the bucket is the partition of its topic."""
        b, h = _key_hash(who, tk)
        own = self.place.own
        return (b if own is None else own.partition(tk[0])), h

    def share(self, h: int, version: int, cver: int) -> int:
        """A subscription register's share of its bucket digest."""
        if self.place.own is None or version == 0:
            return _mix(h, version)
        return _mix(h, version) ^ _mix(h ^ _CVER_SALT, cver)

    def reset_cver(self, c: ClientState, now: float, dropped: bool = False) -> None:
        """A new version of the client register that voids every subscription
        register older than it (flag RELIABLE on a client register; PRESENT off:
        the client was dropped). The home writes one when the client starts a new
        session, syncs or times out; in partitioned mode each partition's primary
        ends what it holds of the client that the home may not know of (_merge)."""
        self.set_cver(c, self.version(now, not dropped, versions.RELIABLE))
        self.mark_changed(c, None)

    def _digest_client(self, c: ClientState) -> None:
        """Toggle the client register's share in its bucket digest (replicated mode)."""
        if self.place.own is not None:
            return
        b, h = _key_hash(c.cid, None)
        self.digest[b] ^= _mix(h, c.cver)

    def mark_changed(self, c: ClientState, tk: tuple[str, str | None] | None) -> None:
        if not self.replicating:
            return
        if c.changed is None:
            c.changed = {}  # (a dict: insertion order, where a set's order follows hash(None))
            self.changed.append(c)
        if tk is not None:
            c.changed[tk] = None

    def _set(self, c: ClientState, tk: tuple[str, str | None], version: int) -> None:
        """Install a version (newer than what we hold); update index, counts and digest, and
        the client's mailbox (node/streams.py)."""
        key_tk = tk
        self.changes += 1
        c.sdigest = None
        old = c.subs.get(tk, 0)
        topic, key = tk
        own = self.place.own
        was, now_in = old & versions.PRESENT, version & versions.PRESENT
        if now_in:
            if own is None or own.owned[own.partition(topic)]:
                topic = self.index.add(topic, key, c.cid, version & versions.RELIABLE)
                tk = (topic, key)
            if not was:
                c.live += 1
                if c.cid.__class__ is not bytes:
                    self.text_subs += 1
        elif was:
            self.index.remove(topic, key, c.cid)
            c.live -= 1
            if c.cid.__class__ is not bytes:
                self.text_subs -= 1
                if c.live == 0:
                    c.local = False  # nothing to watch any more: GC may take the record
        if self.replicating and not c.subs:
            self._digest_client(c)  # the first register: the client's own counts now
        if self.replicating or now_in:
            c.subs[tk] = version
        else:
            c.subs.pop(tk, None)  # a single node needs no tombstones
        # (budgets: a subscription in force more or less, a tombstone more or less)
        tomb = (self.replicating and not now_in) - (old != 0 and not was)
        if now_in != was or tomb:
            self.budgets.charge(c, topic, (1 if now_in else 0) - (1 if was else 0), tomb, self.node_id)
        if not self.replicating and not c.subs and c.cid.__class__ is not bytes:
            self.forget_client(c)  # a text address with nothing left
        if self.replicating:
            b, h = self.bucket(c.cid, tk)
            self.digest[b] ^= self.share(h, old, c.cver) ^ self.share(h, version, c.cver)
        self.streams.follow(c, key_tk, old, version, self._voiding)

    def sub_budget(
        self, live: int, host: str | None, nbytes: int, now: float, text: int = -1, revives: bool = False
    ) -> tuple[int, str]:
        """node/budgets.py: may one more subscription come (ErrorCode.OK, "") or what refuses it
        (``text``: the text subscriptions in force, for a text one; ``revives``: it replaces a
        tombstone of its own)."""
        return self.budgets.check(live, host, nbytes, self.index.count, now, self.delivery.mailboxes_bytes, text,
                                  revives)  # fmt: skip

    # ------------------------------------------------------------ replication

    def take_changes(self) -> list[list[Any]]:
        """Replication entries for every local change since the last call."""
        out = []
        for c in self.changed:
            tks = c.changed or ()
            c.changed = None
            out.append(self._entry(c, [(tk, c.subs[tk]) for tk in tks]))
        self.changed.clear()
        return out

    def _entry(self, c: ClientState, subs: Any) -> list[Any]:
        """``[who, cver, host, port, home, [[topic, key, version], ...], session]``: the
        client register (address, home, command session) and subscription registers."""
        who = c.cid if c.cid.__class__ is bytes else list(c.cid)
        return [who, c.cver, c.addr[0], c.addr[1], c.home, [[t, k, v] for (t, k), v in subs], max(c.session, 0)]

    def merge(self, entries: list[Any], now: float) -> list[tuple[Addr, str]]:
        """Apply replicated entries (already validated): newer versions win. Returns the text
        subscriptions of clients whose home we are that came back (a snapshot, a PULL): their
        leases (node/textproto.py) start again. (Broken build "no-tombstones": the tombstones
        in the entries are dropped, so deletions do not replicate.)"""
        if self._no_tombstones:
            entries = [(*e[:5], [s for s in e[5] if versions.is_present(s[2])], e[6]) for e in entries]
        texts: list[tuple[Addr, str]] = []
        clients = self.clients
        observe = self.hlc.observe
        wall = now + self.wall_offset
        # A version from further ahead than MAX_CLOCK_SKEW is refused: it would
        # drag every clock forward (and soon overflow 64 bits).
        too_new = versions.upper_bound(wall + MAX_CLOCK_SKEW)
        # Tombstones older than the horizon are gone here; one arriving from a
        # replica that has not collected it yet must not come back to life.
        expired = versions.upper_bound(wall - self.tombstone_horizon) if self.tombstone_horizon < math.inf else 0
        own = self.place.own
        for who, cver, host, port, home, subs, session in entries:
            if cver > too_new or any(v > too_new for _, _, v in subs):
                self.metrics["merge_refused_future"] += 1
                continue
            c = clients.get(who)
            if own is not None and home != self.node_id and not subs and c is None:
                # Partitioned: a client register alone, of a client we hold nothing of. (A record
                # we have, maybe as the client's old home, must learn where the client went:
                # review finding, simulator seed 1128.) Registers of partitions we do not own
                # are kept, unindexed: a hand-off may reach us before our map gives us the
                # partition, and is acknowledged (review finding, seed 30154); reindex takes
                # them up, and collect_tombstones drops those of partitions we never gained.
                continue
            if c is None:
                if cver < expired and all(not v & versions.PRESENT and v < expired for _, _, v in subs):
                    continue
                # (an entry of recent tombstones only is kept: forgetting it
                # would let an older "subscribed" version win later)
                c = clients[who] = ClientState(who, (host, port), home, now)
            reset = reclaim = False
            talks_to_us = c.local and who.__class__ is bytes and now - c.last_seen < self.cfg.subscriber_timeout
            if cver > c.cver and own is not None and not cver & versions.PRESENT and home != self.node_id \
                    and talks_to_us:  # fmt: skip
                # Partitioned: an old home gave the client up (a drop), but it talks to us,
                # its home now: we take it back with a newer client register and renew its
                # subscriptions below, newer than the tombstones the drop makes elsewhere
                # (replicated mode re-asserts the same way; review finding #2).
                observe(cver)
                self.set_cver(c, self.version(now, True, 0))
                self.mark_changed(c, None)
                self.metrics["reclaimed"] += 1
                reclaim = True
            elif cver > c.cver:
                observe(cver)
                self.set_cver(c, cver)
                reset = own is not None and bool(cver & versions.RELIABLE)
                if c.addr != (host, port):
                    c.addr = (host, port)
                    self.streams.readdressed(c, carry=session == c.session)
                if own is not None and home != c.home and home != self.node_id and c.subs:
                    # Partitioned: the client's new home gets what we hold of it, so
                    # that its copy is whole (its PONGs say whether it is known).
                    for tk in c.subs:
                        self.mark_changed(c, tk)
                c.home = home
                if session > c.session:
                    # The client's process started a new session at its home:
                    # batches of the old one are stale here too from now on.
                    # (Partitioned: and what the old one subscribed ends, also
                    # where its new home did not know of it.)
                    if own is not None and c.session > 0:
                        reset = True
                    c.session, c.last_batch = session, -1
                    c.answers.clear()
                was_local = c.local
                c.local = home == self.node_id
                if not c.local and (c.counted is not None or c.charged):  # (its new home counts it)
                    self.uncount(c)  # (a client dropped here, living elsewhere now, too)
                    self.budgets.rehome(c, "")
                if c.local and not was_local and who.__class__ is bytes:
                    c.last_seen = now
                    self.outbox.timer(now + self.cfg.subscriber_timeout, TIMER_LIVENESS, who)
                    if c.counted is None:  # (our own client, back from a snapshot or a peer's copy)
                        self.count(c, host_key(host))
                elif c.local and not was_local:  # (a text address: charged to its host here now)
                    self.budgets.rehome(c, host_key(who[0]))
                    for (topic, _), v in c.subs.items():
                        if v & versions.PRESENT:
                            texts.append((who, topic))
            for topic, key, v in subs:
                tk = (topic, key)
                old = c.subs.get(tk, 0)
                # (a tombstone past the horizon still ends an older version we hold: else a stale
                # "subscribed" outlives it here and comes back everywhere once the others collect
                # theirs; simulator seeds 218, 257, 1854 with --mode partitioned)
                if v > old and (v & versions.PRESENT or v >= expired or old):
                    observe(v)
                    self._set(c, tk, v)
                    if c.local and v & versions.PRESENT and who.__class__ is not bytes:
                        texts.append((who, topic))
                    if c.local and not v & versions.PRESENT:
                        reason = (v >> 2) & 3
                        if reason == REASON_OUT_OF_CAPACITY:
                            c.cancelled[tk] = Reason.OUT_OF_CAPACITY  # repeat it in PONG
                        elif (
                            reason == REASON_TIMED_OUT
                            and old & versions.PRESENT
                            and now - c.last_seen < self.cfg.subscriber_timeout
                        ):
                            # Another member gave this client up for lost, but it
                            # talks to us: its subscription stands (a newer write).
                            self.write(c, tk, True, old & versions.RELIABLE, now)
                            self.metrics["reasserted"] += 1
            if reset:  # (after the entry's own registers: those it renews are newer than the reset)
                self._void_older(c, cver, now)
            elif reclaim:
                for tk, v in list(c.subs.items()):
                    if v & versions.PRESENT and v < cver:
                        self.write(c, tk, True, v & versions.RELIABLE, now)
                        self.metrics["reasserted"] += 1
        return texts

    def _void_older(self, c: ClientState, cver: int, now: float) -> None:
        """Partitioned: the client's home reset it (``_reset_cver``); end what we hold
        of the client that is older than the reset (the home may not know of it).

        The tombstone's version is the reset's own clock and writer (flags: absent,
        the reason), not a fresh one: every member that learns of the reset writes
        the same tombstone, and a subscription the client renewed after the reset
        (a SYNC renews its whole set right after it) is newer and wins wherever the
        two meet, even at a member that saw the reset but not the renewal (review
        finding #7; simulator seed 652, 5 members). (Broken build "no-void": nothing ends.)"""
        if self._no_void:
            return
        reason = REASON_UNSUBSCRIBED if cver & versions.PRESENT else REASON_TIMED_OUT
        stamp = (cver >> versions.FLAG_BITS << versions.FLAG_BITS) | (reason << 2)
        self._voiding = True
        try:
            for tk, v in list(c.subs.items()):
                if v & versions.PRESENT and v < cver:
                    self._set(c, tk, stamp | (v & versions.RELIABLE))
                    self.mark_changed(c, tk)
                    self.metrics["voided_by_reset"] += 1
        finally:
            self._voiding = False

    def set_ownership(self, own: Ownership) -> None:
        """Partitioned mode, from the start (before any register): one digest bucket per partition."""
        self.place.own = own
        self.digest = [0] * (own.partitions + 1)  # (and the spanning partition: wildcards)

    def reindex(self, gained: set[int], lost: set[int], now: float | None = None) -> None:
        """The map changed: index the registers of partitions gained, unindex those lost."""
        own = self.place.own
        if own is None or not (gained or lost):
            return
        for p in gained:
            self.lost_at.pop(p, None)
        for p in lost:
            self.lost_at[p] = self.outbox.now if now is None else now
        index = self.index
        for c in self.clients.values():
            for (topic, key), v in c.subs.items():
                if v & versions.PRESENT:
                    p = own.partition(topic)
                    if p in gained:
                        index.add(topic, key, c.cid, v & versions.RELIABLE)
                    elif p in lost:
                        index.remove(topic, key, c.cid)

    def dump(self, buckets: set[int] | None = None, home: str | None = None, ours: bool = False) -> Any:
        """Every client's entry (or only the registers in ``buckets``). ``home``
        (partitioned: a member's PULL) adds every register of the clients whose
        home that member is: their sessions need them all, and a restarted home
        has only what its snapshot held (simulator seed 427, 5 members). ``ours``:
        only the clients whose home we are (a restarted member's hand-off)."""
        part = self.place.own.partition if self.place.own is not None else None
        for c in list(self.clients.values()):
            if ours and not c.local:
                continue
            if buckets is None or (home is not None and c.home == home and c.cid.__class__ is bytes):
                yield self._entry(c, c.subs.items())
            elif part is not None:  # (partitioned: the bucket is the topic's partition, no key hash)
                if subs := [(tk, v) for tk, v in c.subs.items() if part(tk[0]) in buckets]:
                    yield self._entry(c, subs)
            else:
                subs = [(tk, v) for tk, v in c.subs.items() if _key_hash(c.cid, tk)[0] in buckets]
                if subs or _key_hash(c.cid, None)[0] in buckets:
                    yield self._entry(c, subs)

    def expire_home(self, home: str, now: float) -> None:
        """Tombstone the subscriptions of binary clients whose home node is gone.

        Their clients either moved to another node already (and re-subscribed
        there, which changed ``home``) or are gone too. A client that talked to
        this node within ``subscriber_timeout`` (an ACK of our stream, say) is
        alive: it moved to a member whose news has not reached us yet (a
        partition), so its subscriptions, and what we hold for it, stay.
        """
        n = 0
        alive_since = now - self.cfg.subscriber_timeout
        self.expire_skipped = 0
        own = self.place.own
        for c in list(self.clients.values()):
            if c.home == home and c.cid.__class__ is bytes and c.live and c.heard >= alive_since:
                self.expire_skipped += 1  # (the member asks again later: it may die yet)
            elif c.home == home and c.cid.__class__ is bytes and c.live:
                for tk, v in list(c.subs.items()):
                    # (partitioned: each partition's primary expires its own registers)
                    if v & versions.PRESENT and (own is None or own.primaries[own.partition(tk[0])] == own.me):
                        self.write(c, tk, False, v & versions.RELIABLE, now, REASON_TIMED_OUT)
                        n += 1
        if n:
            self.outbox.log("info", "expired_home", home=home, subscriptions=n)

    def collect_tombstones(self, now: float) -> None:
        """Forget tombstones older than ``tombstone_horizon``, and empty records."""
        if self.tombstone_horizon == math.inf:
            return
        limit_ms = int((now + self.wall_offset - self.tombstone_horizon) * 1000)
        park_limit_ms = int((now + self.wall_offset - self.cfg.subscriber_timeout) * 1000)
        gone = 0
        own = self.place.own
        for cid, c in list(self.clients.items()):
            if c.parked is not None and c.parked[1] < park_limit_ms:
                parked, c.parked = c.parked, None  # (a mailbox kept for a client given up: its time is over)
                self.groups.discarded(c, parked[0])
            # (not while the client's mailbox here owes it messages, for at most tombstone_horizon
            # after the map took the partition from us: a live reliable register keeps the mailbox,
            # which the client's last unsubscribe here would drop; seeds 791, 5790, 9943)
            owing = c.mailbox is not None and len(c.mailbox) > 0
            for tk, v in list(c.subs.items()):
                # Partitioned: registers of a partition this member no longer owns go too
                # (kept until now in case the partition came straight back).
                p = own.partition(tk[0]) if own is not None else 0
                foreign = own is not None and not c.local and not own.owned[p] \
                    and not (owing and now - self.lost_at.get(p, now) < self.tombstone_horizon)  # fmt: skip
                if foreign or (not v & versions.PRESENT and versions.millis_of(v) < limit_ms):
                    b, h = self.bucket(cid, tk)
                    self.digest[b] ^= self.share(h, v, c.cver)
                    del c.subs[tk]
                    gone += 1
                    if v & versions.PRESENT:
                        c.live -= 1
                        self.budgets.charge(c, tk[0], -1, 0, self.node_id)
                        if cid.__class__ is not bytes:
                            self.text_subs -= 1
                    else:
                        self.budgets.charge(c, tk[0], 0, -1, self.node_id)
                    if not c.subs:
                        self._digest_client(c)  # no registers left: its own stops counting
            if not c.subs and not c.local and versions.millis_of(c.cver) < limit_ms \
                    and (c.mailbox is None or not len(c.mailbox)):  # (what it still owes goes on)  # fmt: skip
                self.forget_client(c)
        if gone:
            self.metrics["tombstones_collected"] += gone
            self.outbox.log("info", "tombstones_collected", count=gone)
