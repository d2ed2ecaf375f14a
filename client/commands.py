"""Ordered SUB/UNSUB command batches (:class:`CommandBatches`), Ray's
PubsubCommandBatch.

Commands queue in the order the application issued them and go out in
batches, one batch in flight at a time, retried unchanged every ``cmd_retry``
until the CMDACK for exactly that batch arrives. A batch is named by
``(session, batch)``: the session is fixed for the life of the client process
(the shells pass its start in Unix ms) and batch ids count from 1 within it,
so a node can tell a retry (answer again, apply nothing) from a newer batch
(apply) and a restarted process reusing its client id (a higher session) from
a late datagram of the old one (a lower session).

A module of its own because the batching and its identity rules are the part
of the protocol the node must agree with; what the results mean for a
subscription is the session's business.
"""

from __future__ import annotations

from roost.client import wire

Addr = tuple[str, int]
Cmd = tuple[int, str, str | None, int]  # (op, topic, key, mode)
MAX_BATCH = 256  # commands per CMDS datagram


class CommandBatches:
    def __init__(self, session: int, retry: float) -> None:
        self.session = session
        self.retry = retry
        self.next_batch = 1
        self.queued: list[Cmd] = []
        self.inflight: tuple[int, list[Cmd]] | None = None  # (batch id, its commands)
        self.inflight_at = 0.0  # when the batch in flight is sent again

    def add(self, cmd: Cmd) -> None:
        self.queued.append(cmd)

    @property
    def idle(self) -> bool:
        return self.inflight is None and not self.queued

    def start(self, cid: bytes, cookie: bytes, now: float) -> bytes | None:
        """The CMDS datagram of a new batch, if none is in flight and commands wait."""
        if self.inflight is not None or not self.queued:
            return None
        batch, self.queued = self.queued[:MAX_BATCH], self.queued[MAX_BATCH:]
        self.inflight = (self.next_batch, batch)
        self.next_batch += 1
        return self._datagram(cid, cookie, now)

    def due(self, cid: bytes, cookie: bytes, now: float) -> bytes | None:
        """The batch in flight again, once its CMDACK is overdue."""
        if self.inflight is None or now < self.inflight_at:
            return None
        return self._datagram(cid, cookie, now)

    def _datagram(self, cid: bytes, cookie: bytes, now: float) -> bytes:
        assert self.inflight is not None
        self.inflight_at = now + self.retry
        batch, cmds = self.inflight
        return wire.encode_cmds(cid, cookie, self.session, batch, cmds)

    def acked(self, session: int, batch: int, results: int) -> list[Cmd] | None:
        """The commands a CMDACK with ``results`` results answers, or None if it is not for the
        batch in flight (a late answer to a retry, meant for an earlier process, or not one
        result per command: not a node's answer, and taking it would lose the commands
        without one)."""
        if self.inflight is None or session != self.session or batch != self.inflight[0] \
                or results != len(self.inflight[1]):  # fmt: skip
            return None
        cmds = self.inflight[1]
        self.inflight = None
        return cmds

    def requeue(self, then: list[Cmd]) -> None:
        """Failover: the batch in flight, then ``then``, go first to the new node
        (commands are idempotent, so repeating one that was applied is harmless)."""
        front = then if self.inflight is None else self.inflight[1] + then
        self.inflight = None
        self.queued = front + self.queued

    def deadline(self) -> float | None:
        return None if self.inflight is None else self.inflight_at
