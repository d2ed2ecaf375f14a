"""A member's view of its peers' liveness (sans-IO): the failure detector's verdicts acted on,
our own pauses kept out of them, and the clients of members dead for good expired.

Theory of operation (docs/cluster.md, "Failure detection")
-----------------------------------------------------------
cluster/membership.py turns heartbeats into peer states. Here a state change closes the link
to a peer gone ``down`` (it may be a dead TCP connection), drops what it had pulled from us
(``pending``), moves the map in partitioned mode and re-checks a roster not yet committed. A
peer down longer than ``subscriber_timeout`` takes its clients' subscriptions with it.

A pause of our own loop (a long core call, SIGSTOP, a VM pause) is no silence of our peers:
what they sent meanwhile is unread in the kernel, so ``_paused`` credits their silence and our
link deadlines with it (Cassandra's failure detector ignores a local pause the same way).

This is a mixin of :class:`cluster.member.MemberCore`, which owns the state.
"""

from __future__ import annotations

from roost.cluster.memberparts import MemberParts


class Liveness(MemberParts):
    def _paused(self, stood: float) -> None:
        """Our loop stood still (a long core call, SIGSTOP, a VM pause, a slow snapshot
        read): what peers sent meanwhile waits unread in the kernel, so their silence
        and our links' deadlines are credited with the pause, as Cassandra's failure
        detector ignores a local pause. Without it one stall past ``down_after`` takes
        every peer down at once and remaps to owning everything, which stalls again."""
        self.membership.credit(stood, self.now)
        for link in self.links.values():
            link.deadline += stood
        self.pull_deadline += stood
        self.held = [(until + stood, waits, confirm) for until, waits, confirm in self.held]  # (PUSHACKs unread)
        self.durable.paused(self.now)
        if self.phase in ("syncing", "ready"):  # (starting: no peer is watched yet; credited quietly)
            self._log("warning", "local_pause", seconds=round(stood + self.s.heartbeat_interval, 3))

    def _watch_peers(self, now: float) -> None:
        changes = self.membership.tick(now)
        for peer, old, new in changes:
            self._log("warning" if new == "down" else "info", "peer_state", peer=peer, old=old, new=new)
            lid = self.out[peer]
            if new == "down" and lid is not None:
                self._close(self.links[lid], "peer down")  # it may be a dead TCP connection
        for peer, _old, new in changes:
            if new == "down":
                self.pending.pop(peer, None)
        if changes and self.partitioned:
            self._remap()
        if self.committed != self.roster.digest():  # (and gains whose pull failed are pulled again)
            self._check_roster()
        if self.ready:
            self._expire_lost_homes(now)

    def _expire_lost_homes(self, now: float) -> None:
        """A member down for longer than subscriber_timeout takes its clients'
        subscriptions with it; one surviving member (the lowest ready id)
        writes the tombstones, which replicate like any change."""
        if self._gone(self.id):  # (leaving, we may not hear the members that stopped dialling us)
            return
        ready = [self.id] + [p for p, v in self.membership.peers.items() if v.state == "ready"]
        if min(ready) != self.id and not self.partitioned:  # (partitioned: each primary its own)
            return
        for peer in self.peers:
            if peer not in self._expired and self.membership.down_for(peer, now) > self.cfg.subscriber_timeout \
                    and now >= self._expire_again.get(peer, 0.0):  # fmt: skip
                self._absorb(self.broker.expire_home(peer, now))
                if self.broker.expire_skipped:  # clients alive elsewhere: look again in a while
                    self._expire_again[peer] = now + self.cfg.subscriber_timeout / 2
                else:
                    self._expired.add(peer)
