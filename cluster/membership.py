"""Failure detection between members (sans-IO): heartbeats in, states out.

Each member sends a HEARTBEAT on its links every ``heartbeat_interval``. A
peer heard from recently has the state it reports (``syncing`` or ``ready``);
one silent for ``suspect_after`` is ``suspect``; for ``down_after``, ``down``.
A peer never heard from since this node started is ``unknown`` until
``down_after`` has passed.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PeerView:
    id: str
    state: str = "unknown"
    last_heard: float = 0.0
    reported: str = "unknown"
    subscriptions: int = 0
    clients: int = 0
    down_since: float | None = None
    synced: int = 0  # the roster digest it reports holding its partitions of (cluster/joining.py)
    committed: int = 0  # the roster digest its map is computed from


class Membership:
    def __init__(self, peers: list[str], suspect_after: float, down_after: float, now: float) -> None:
        self.suspect_after = suspect_after
        self.down_after = down_after
        self.started = now
        self.peers = {p: PeerView(p, last_heard=now) for p in peers}

    def add(self, peer: str, now: float) -> None:
        """A member that joined: unknown until heard, like any peer at start."""
        self.peers.setdefault(peer, PeerView(peer, last_heard=now))

    def heard(self, peer: str, now: float, state: str, subscriptions: int, clients: int,
              synced: int = 0, committed: int = 0) -> tuple[str, str] | None:  # fmt: skip
        """A heartbeat arrived; returns (old, new) if the peer's state changed."""
        v = self.peers[peer]
        v.last_heard = now
        v.reported = state
        v.synced = synced
        v.committed = committed
        v.subscriptions = subscriptions
        v.clients = clients
        v.down_since = None
        return self._set(v, state)

    def credit(self, seconds: float, now: float) -> None:
        """We could not listen for ``seconds`` (a local pause): no peer's silence counts them."""
        for v in self.peers.values():
            v.last_heard = min(now, v.last_heard + seconds)

    def tick(self, now: float) -> list[tuple[str, str, str]]:
        """(peer, old, new) for every state change timers caused."""
        changes = []
        for v in self.peers.values():
            silent = now - v.last_heard
            if silent >= self.down_after:
                new = "down"
            elif silent >= self.suspect_after and v.state != "unknown":
                new = "suspect"
            else:
                continue
            if new == "down" and v.down_since is None:
                v.down_since = now
            ch = self._set(v, new)
            if ch:
                changes.append((v.id, *ch))
        return changes

    def _set(self, v: PeerView, new: str) -> tuple[str, str] | None:
        if v.state == new:
            return None
        old, v.state = v.state, new
        return old, new

    def down_for(self, peer: str, now: float) -> float:
        v = self.peers[peer]
        return 0.0 if v.down_since is None else now - v.down_since
