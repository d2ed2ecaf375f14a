"""The frames a member takes on its authenticated peer links, each handed to the component it concerns (sans-IO).

Every pair of members has two links, one dialled by each side (cluster/links.py). On a link a
peer dialled come its *requests*: PUSH (its changes; we merge and answer PUSHACK), HEARTBEAT
(its state for the failure detector; we answer BEAT), ROSTER, FORWARD/RELAY, PULL and DIGEST
(answered as the link drains, cluster/dumps.py), LOGFETCH, the quorum's RAFT and CONTROL; on the
admin's link, JOIN and LEAVE.
On a link we dialled come the *replies* to ours: BEAT, PUSHACK, FWDACK, DUMP/DUMPEND for our
PULL, DIFF/DIFFEND for our DIGEST, LOGDATA, and ROSTER. Any other frame, or one of the wrong
shape, is a protocol error: the member closes the link (:meth:`PeerFrames.refused` says why;
:meth:`PeerFrames.closed` forgets a closed link).
Before any of these, the handshake (cluster/links.py) authenticates the link. Every frame on a link we dialled
proves it alive (its deadline moves to ``down_after`` from now: the peer answers each HEARTBEAT
with a BEAT); every request moves the deadline of the peer's link to its idle timeout.

:class:`PeerFrames` holds no state of its own: it routes each frame to the component that owns
what it concerns, runs the broker core's answers through cluster/brokeractions.py, and returns
what the member must do next with its own state (its phase, the map, the roster being
committed, the PULL in progress) as a tuple of the step names below, in order; most frames
(PUSH, FORWARD, the acknowledgements) need none and return ``NOTHING``.
"""

from __future__ import annotations

import random
from typing import Any

from roost.client.wire import SEQ_LIMIT
from roost.cluster.brokeractions import BrokerActions
from roost.cluster.config import ClusterSettings
from roost.cluster.dialling import Dialling
from roost.cluster.dumps import Dumps
from roost.cluster.durable import DurableLogs
from roost.cluster.forwarding import Forwarding
from roost.cluster.joining import Joining
from roost.cluster.lifecycle import Lifecycle
from roost.cluster.links import Link, LinkTable
from roost.cluster.liveness import Liveness
from roost.cluster.membership import Membership
from roost.cluster.partitionmap import PartitionMap
from roost.cluster.peerwire import (
    ADMIN,
    NONCE_LEN,
    PeerProtocolError,
    PeerType,
    ShapeMismatch,
    check_entries_untrusted,
    encode,
)  # fmt: skip
from roost.cluster.replicator import Replicator
from roost.node.actions import Log
from roost.node.core import BrokerCore

# What the member does next (returned in order; several may come together)
ADMIN_REQUEST = "admin"  # the frame is an admin JOIN or LEAVE: MemberCore.admin_request
REMAP = "remap"  # our live view changed: compute the map again
CHECK_ROSTER = "check_roster"  # the latest roster is not committed: pull gains, report, commit
ROSTER_CHANGED = "roster_changed"  # a peer's ROSTER changed ours: learn its members, tell every peer
PULL_FAILED = "pull_failed"  # the peer we PULL from is not ready itself: pull from the next one
NEXT_PULL = "next_pull"  # a PULL ended: pull from the next peer (partitioned mode: each holds its own)
PULL_FINISHED = "pull_finished"  # the PULL ended: we hold the state
NOTHING: tuple[str, ...] = ()

_BEAT = encode([PeerType.BEAT])


class PeerFrames:
    def __init__(self, me: str, secret: bytes, known: set[str], shape: str, rng: random.Random,
                 s: ClusterSettings, broker: BrokerCore, actions: BrokerActions, links: LinkTable,
                 membership: Membership, maps: PartitionMap, joins: Joining, replicator: Replicator,
                 forwarding: Forwarding, life: Lifecycle, liveness: Liveness, durable: DurableLogs, dumps: Dumps,
                 dialling: Dialling, out: list[Any]) -> None:  # fmt: skip
        self.id = me
        self.secret = secret
        self.known = known  # (the member's set of every member id it knows: who may dial us)
        self.shape = shape
        self.rng = rng
        self.s = s
        self.partitioned = s.mode == "partitioned"
        self.broker = broker
        self.actions = actions
        self.lt = links
        self.membership = membership
        self.maps = maps
        self.joins = joins
        self.replicator = replicator
        self.forwarding = forwarding
        self.life = life
        self.liveness = liveness
        self.durable = durable
        self.dumps = dumps
        self.dialling = dialling
        self._out = out

    def handshake(self, link: Link, f: list[Any], now: float, phase: str) -> None:
        """A frame on a link not yet up: the next step of the handshake (cluster/links.py)."""
        nonce = b"" if link.outbound else self.rng.randbytes(NONCE_LEN)
        reply = link.handshake(f, self.secret, self.id, self.known, nonce, self.shape)
        if reply:
            self.lt.frame(link.id, reply)
        if link.up:
            self._up(link, now, phase)

    def _up(self, link: Link, now: float, phase: str) -> None:
        """The link is authenticated: what goes on it first. On ours: a HEARTBEAT, our roster,
        what we owe the peer (forwards, pushes) and the PULL that waited for it; on the peer's:
        our roster to a member that left without hearing it, which we dial back while it drains
        (it hears who is alive and our map only in our heartbeats, even when we restarted since
        its leave: simulator seed 9384). Syncing too: its link stays up, so this is our only
        chance; a restarted member not dialling it back until ready never did, and the leaver,
        deaf to us for good, forwarded what it took to a member that refused it for ever, its
        PUBACKs withheld (simulator seeds 7615, 9384 --mode partitioned)."""
        link.decoder.max_frame = self.s.max_frame  # (full-size frames from now on)
        peer = link.peer
        assert peer is not None
        if not link.outbound:
            link.deadline = now + self.s.link_idle_timeout
            if self.maps.gone(peer):
                self.joins.send_roster(link.id)
                if self.lt.out[peer] is None and phase in ("syncing", "ready"):
                    self.dialling.dial_back(peer, now)
            return
        link.deadline = now + self.s.down_after  # (the peer answers our HEARTBEATs with BEATs)
        self.dialling.link_up(peer)
        self.lt.frame(link.id, self.joins.heartbeat(phase))
        self.joins.send_roster(link.id)
        self.joins.told.add(peer)
        self.forwarding.pump(peer)
        self.replicator.link_up(peer, now)
        if self.life.pull_peer == peer and not self.life.pull_sent:
            self.life.send_pull()

    def refused(self, link: Link, exc: Exception) -> str | None:
        """What a link sent raised ``exc``: logged; returns why the member closes the link, or
        None to leave it open."""
        if isinstance(exc, ShapeMismatch):
            # Logged as an error for the operator, and nothing more: the shape and REFUSED come before
            # authentication, so acting on them would let anyone who reaches the peer port stop a
            # member (review, 2026-11-24), and which of the two configs is wrong cannot be told here.
            self._log("error", "peer_refused", peer=link.peer, remote=link.remote or None, reason=str(exc)[:300])
            if link.outbound:
                return "[cluster] shape differs"
            # (the dialler learns why; it closes the link, or the handshake deadline does: a Close
            # now could cut the answer)
            self.lt.frame(link.id, encode([PeerType.REFUSED, str(exc)[:300]]))
            return None
        if isinstance(exc, PeerProtocolError):
            self._log("warning", "peer_refused" if not link.up else "peer_protocol_error",
                      peer=link.peer, remote=link.remote or None, reason=str(exc)[:200])  # fmt: skip
            return str(exc)[:200]
        self._log("error", "peer_error", peer=link.peer, reason=repr(exc)[:200])
        return "error"

    def closed(self, link: Link, why: str, now: float) -> bool:
        """A link closed (at either end): it is forgotten with its answers in progress. Returns
        whether it was our dialled link to its peer: then what was in flight goes again on the
        next one, dialled in a while (cluster/dialling.py)."""
        self.lt.links.pop(link.id, None)
        self.dumps.drop(link.id)
        peer = link.peer
        if not link.outbound or peer is None or self.lt.out.get(peer) != link.id:
            return False
        self.lt.out[peer] = None
        self.replicator.disconnected(peer)
        self.forwarding.queues[peer].disconnected()
        self.dialling.dropped(peer, link.up, self.maps.gone(peer), why, now)
        return True

    def _log(self, level: str, event: str, **fields: Any) -> None:
        self._out.append(Log(level, event, fields))

    def request(self, link: Link, f: list[Any], now: float, phase: str) -> tuple[str, ...]:
        """A frame on a link the peer dialled."""
        link.deadline = now + self.s.link_idle_timeout
        if link.peer == ADMIN:
            return (ADMIN_REQUEST,)  # (roost cluster join/leave, authenticated like a peer)
        kind, n = f[0], len(f)
        if kind == PeerType.PUSH and n == 3:
            _, seq, entries = f
            self.actions.absorb(self.broker.merge(check_entries_untrusted(entries), now), now, phase)
            self.lt.frame(link.id, encode([PeerType.PUSHACK, seq]))
        elif kind == PeerType.LOGFETCH:
            assert link.peer is not None
            self.durable.on_logfetch(link.peer, link.id, f, now, phase == "ready")
        elif kind == PeerType.RAFT:
            assert link.peer is not None
            self.durable.on_raft(link.peer, f, now)
        elif kind == PeerType.CONTROL:
            assert link.peer is not None
            self.durable.on_control(link.peer, f, now)
        elif kind == PeerType.HEARTBEAT and n == 7:
            return self._heartbeat(link, f, now)
        elif kind == PeerType.ROSTER and n == 2:
            _, roster = f
            if self.joins.roster_frame(roster):
                return (ROSTER_CHANGED,)
        elif kind == PeerType.FORWARD and n == 3:
            _, fid, msgs = f
            actions, ack = self.forwarding.received(link.id, fid, msgs, now)
            self.actions.absorb(actions, now, phase)
            if ack is not None:
                self.lt.frame(link.id, ack)
        elif kind == PeerType.RELAY and n == 2:
            _, sends = f
            self.forwarding.relayed(sends)
        elif kind == PeerType.PULL and (n == 1 or n == 2):
            self.dumps.pull(link, f, phase == "ready")
        elif kind == PeerType.DIGEST and n == 2:
            self.dumps.digest(link, f[1])
        else:
            raise PeerProtocolError(f"unexpected frame type {kind}")
        return NOTHING

    def _heartbeat(self, link: Link, f: list[Any], now: float) -> tuple[str, ...]:
        """A peer's state for the failure detector (cluster/membership.py); answered with a BEAT."""
        _, state, subs, clients, epoch, synced, committed = f
        if state not in ("syncing", "ready") or epoch.__class__ is not int or not 0 <= epoch < 2**62 \
                or any(v.__class__ is not int or not 0 <= v < SEQ_LIMIT for v in (subs, clients)) \
                or any(v.__class__ is not int or not 0 <= v < 2**64 for v in (synced, committed)):  # fmt: skip
            raise PeerProtocolError("malformed HEARTBEAT")
        peer = link.peer
        assert peer is not None
        self.lt.frame(link.id, _BEAT)  # (the dialler's proof that its link works)
        view = self.membership.peers[peer]
        reported, was_synced = view.reported, view.synced
        ch = self.membership.heard(peer, now, state, subs, clients, synced, committed)
        if ch:
            self._log("info", "peer_state", peer=peer, old=ch[0], new=ch[1])
            self.liveness.heard(peer)
        remap = False
        if self.partitioned:
            self.maps.heard_epoch(epoch)
            self.maps.unreached.discard(peer)
            remap = bool(ch) or reported != state
        # (a map computed again leaves the roster as it is: this may be decided first)
        check = (ch or reported != state or was_synced != synced) and self.joins.committed != self.joins.roster.digest()
        if remap:
            return (REMAP, CHECK_ROSTER) if check else (REMAP,)
        return (CHECK_ROSTER,) if check else NOTHING

    def reply(self, link: Link, f: list[Any], now: float, phase: str) -> tuple[str, ...]:
        """A frame on a link we dialled: answers to our requests. Any frame proves the link
        alive (the peer answers every HEARTBEAT there with a BEAT), so one silent for
        ``down_after`` is dead one way or another (half-open TCP, a one-way partition, a cut
        TCP has not noticed) and the member closes it and dials again."""
        link.deadline = now + self.s.down_after
        kind, n = f[0], len(f)
        peer = link.peer
        assert peer is not None
        if kind == PeerType.BEAT and n == 1:
            pass  # (the deadline above is what it is for)
        elif kind == PeerType.ROSTER and n == 2:
            _, roster = f
            if self.joins.roster_frame(roster):  # (we left: a member that no longer dials us says so)
                return (ROSTER_CHANGED,)
        elif kind == PeerType.PUSHACK and n == 2:
            _, seq = f
            self.replicator.acked(peer, seq)
        elif kind == PeerType.FWDACK and n == 3:
            _, fid, refused = f
            delivered = self.forwarding.acked(peer, fid, refused)
            if delivered:
                self.actions.absorb(self.broker.settle_forwards(delivered, now), now, phase)
            self.forwarding.pump(peer)
        elif kind == PeerType.LOGDATA:
            self.durable.on_logdata(peer, f, now, phase == "ready")
        elif kind == PeerType.DIFF and n == 2:
            _, entries = f
            self.actions.absorb(self.broker.merge(check_entries_untrusted(entries), now), now, phase)
        elif kind == PeerType.DIFFEND and n == 2:
            _, buckets = f
            self.replicator.diffend(peer, buckets, now)
        elif kind == PeerType.DUMP and n == 2 and self.life.pulling(peer):
            _, dumped = f
            entries = check_entries_untrusted(dumped)
            self.actions.absorb(self.broker.merge(entries, now), now, phase)
            self.life.dumped(entries)
        elif kind == PeerType.DUMPEND and n == 2 and self.life.pulling(peer):
            _, sent = f
            if sent == -1:  # ("not ready")
                return (PULL_FAILED,)
            self.life.pulled(peer)
            self.replicator.synced(peer, now)
            # (partitioned: each peer holds only its own partitions: ask them all)
            return (NEXT_PULL,) if self.partitioned else (PULL_FINISHED,)
        else:
            raise PeerProtocolError(f"unexpected frame type {kind} on outbound link")
        return NOTHING
