"""The client's latency policy, sans-IO: when a caller makes the I/O loop's turn itself.

Theory of operation (docs/architecture.md, "One client, three shells"; docs/performance.md)
------------------------------------------------------------------------------------------
A shell's I/O loop makes a session's turns (drain its socket, feed the router, fire its timers,
send what it produced: client/connection.py's ``Connection.exchange``). Batching lives there:
what API calls queue while the loop is busy goes out together at its next turn. But on a path that carries little,
a hop through the loop (wake its task or callback, schedule it) is most of a message's latency.
Three rules cut it where no batching is lost, the same for every shell; :class:`TurnPolicy`
makes their decisions from the router and the loop's clock (``now``), and the shells do the I/O:

* Quiet path (``turn_here``): one session, nothing sent or received for ``idle_gap``, at most
  ``idle_burst`` reliable publishes in flight. Then an API call that queued something makes
  the loop's turn itself, in the caller, so the datagram leaves before the call returns; so do
  the next calls of a burst, up to ``idle_burst``, each within ``idle_gap`` of the one before.
  What comes after them, while the path stays busy, waits for the loop and shares its
  datagrams.
* Sparse path (``drives``): a wait that lasted ``idle_gap`` or more makes the next wait
  (``next()``, ``flush()``, a request...) one that handles the socket itself, so the turn that
  brings what it waits for is its own (the trio shell parks its loop's task meanwhile). A busy
  subscriber's waits are short, and it keeps its loop.
* Held sends (``holds``): a turn made for a waiting caller, which received datagrams after
  which the caller's condition holds, keeps what it would send (a message's ACK among it) for
  the loop's next turn, so the application has its message first.

``turned`` hears of every turn that sent or received something (the path is busy) and
counts the turns that received datagrams by who made them (``came``: the loop, a caller on a
quiet path, a waiting caller), which is how tests see which task took a datagram.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from roost.client.config import ClientConfig
from roost.client.router import Router

#: Who made a turn (``TurnPolicy.came``'s keys)
LOOP, CALLER, WAITER = "loop", "caller", "waiter"


class TurnPolicy:
    """The quiet path, its bursts, the sparse path and held sends (see the module)."""

    __slots__ = ("cfg", "busy_at", "sparse", "burst", "burst_at", "came")

    def __init__(self, config: ClientConfig) -> None:
        self.cfg = config
        self.busy_at = -math.inf  # when a turn last sent or received something
        self.sparse = False  # the last wait lasted idle_gap or more: the next drives the socket
        # The turns made here since the path was last quiet, and when the last was: a burst goes
        # on while each comes within idle_gap of the one before (none yet: spent)
        self.burst, self.burst_at = 0, -math.inf
        self.came = {LOOP: 0, CALLER: 0, WAITER: 0}  # turns that received datagrams, by who made them

    def turned(self, came: int, now: float, by: str = LOOP) -> None:
        """A turn (by the loop, a caller or a waiter) received ``came`` datagrams or sent
        something: the path is busy. (The shells tell only of such turns.)"""
        self.busy_at = now
        if came:
            self.came[by] += 1

    def turn_here(self, r: Router, now: float) -> bool:
        """An API call queued something, and the loop waits on its one session's socket: should
        the caller make the loop's turn itself? Yes on a quiet path or within its burst (which
        this counts); no on a busy path, with more than ``idle_burst`` reliable publishes in
        flight, or with more than one session (the loops' batching is worth more there)."""
        burst = self.cfg.idle_burst
        if len(r.sessions) != 1 or r.last_seq - r.acked > burst:
            return False
        if now - self.busy_at >= self.cfg.idle_gap:
            self.burst = 0  # (quiet: a burst begins)
        elif self.burst >= burst or now - self.burst_at >= self.cfg.idle_gap:
            return False  # (spent, or the path is busy with other traffic since its last turn)
        self.burst += 1
        self.burst_at = now
        return True

    def drives(self) -> bool:
        """Should a wait that begins now handle the socket itself (the path is sparse)?"""
        return self.sparse

    def waited(self, start: float, now: float) -> None:
        """A wait that began at ``start`` ended: the path is sparse if it lasted ``idle_gap`` or more."""
        self.sparse = now - start >= self.cfg.idle_gap

    @staticmethod
    def holds(cond: Callable[[], bool]) -> Callable[[], bool]:
        """The ``hold`` of a waiter's turns (``Connection.exchange``): after datagrams came, keep
        the turn's sends for the next turn when ``cond`` holds. An exception of ``cond``'s is
        not the turn's failing (it reaches the caller from its own look at ``cond``): no hold."""

        def hold() -> bool:
            try:
                return cond()
            except Exception:
                return False

        return hold
