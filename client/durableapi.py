"""Durable mode in the client API: puts, durable subscriptions (get/commit) and plain log reads.

A component :class:`roost.client.api.ClientAPI` holds (its ``_durable``, to which its put, get,
read, position and commit delegate), async code over its client's connection
(client/connection.py) and the I/O primitives of its shell (client/shell.py). It only waits and
does file I/O: what a durable read or commit sends, when it sends it again and where to, and
what the application gets is the sans-IO core's (client/durableclient.py, which the simulator
drives too); the protocol is docs/durable.md's, the frames client/durablewire.py's, the put streams client/putter.py's.
"""

from __future__ import annotations

import datetime
from typing import Any, NamedTuple

from roost.client import durablewire
from roost.client.connection import Connection, NodeLost
from roost.client.durableclient import PAUSE, WELCOME, Ask, DurableClient, Reader, durable_id, no_map_here
from roost.client.receive import Message
from roost.client.shell import Shell

__all__ = ["DurableAPI", "LogRead", "durable_id"]


def _start(start: str | int | datetime.datetime) -> tuple[int, int]:
    if start == "earliest":
        return durablewire.START_EARLIEST, 0
    if start == "latest":
        return durablewire.START_LATEST, 0
    if isinstance(start, int) and not isinstance(start, bool) and start >= 0:
        return durablewire.START_OFFSET, start
    if isinstance(start, datetime.datetime):  # (naive: local time, as datetime.timestamp takes it)
        return durablewire.START_TIME, max(0, int(start.timestamp() * 1000))
    raise ValueError(f"start must be 'earliest', 'latest', an offset >= 0 or a datetime, not {start!r}")


class LogRead(NamedTuple):
    """What :meth:`ClientAPI.read` got: the topic's partition, its messages (``sequence`` is the log
    offset), the offset to read from next, the partition's first retained offset and its end (the
    commit: nothing at or past it can be read yet), and for each message the time its primary
    stored it (ms since the epoch: a reader's record time, as the Spark source's ``timestamp``)."""

    partition: int
    messages: list[Message]
    next: int
    first: int
    end: int
    times: list[int]


class DurableAPI:
    """A client's durable mode (see the module), over the client's connection and shell."""

    def __init__(self, conn: Connection, shell: Shell) -> None:
        self.conn, self.shell = conn, shell
        self.core = DurableClient(conn.config)  # (the offsets read to, per durable subscription)

    async def put(self, topic: str, payload: bytes | str, key: str | None = None,
                  tags: dict[str, str] | None = None, *, wait: bool = False,
                  timeout: float | None = None) -> tuple[int, int]:  # fmt: skip
        """(ClientAPI.put's)"""
        c, sh = self.conn, self.shell
        c.check_open()
        if isinstance(payload, str):
            payload = payload.encode()
        r = c.router
        deadline = c.deadline(timeout, zero=not wait)  # (0 cannot wait for the acknowledgement)
        if not await self._need_map(deadline):
            raise TimeoutError(f"no cluster map from the node within {timeout} s: not put")
        if r.put_window_full(topic):
            sh.kick()
            if not await sh.until(lambda: not r.put_window_full(topic) or r.lost, deadline):
                raise TimeoutError(f"no room in the put window within {timeout} s: not put")
            if r.lost:
                raise NodeLost("node lost: not put")
        p, seq = r.put(topic, key, tags, payload)
        sh.kick()
        if wait:
            if not await sh.until(lambda: r.putter.streams[p].acked >= seq or r.lost, deadline):
                why = r.putter.refusal(p)
                raise TimeoutError(f"not acknowledged within {timeout} s{why} (it stays queued and is retried)")
            if r.putter.streams[p].acked < seq:
                raise NodeLost("node lost before acknowledging the put")
        return p, seq

    async def get(self, topic: str, durable: str, count: int = 1, *,
                  start: str | int | datetime.datetime = "earliest", timeout: float | None = None,
                  client: str = "default") -> list[Message]:  # fmt: skip
        """(ClientAPI.get's)"""
        c, sh = self.conn, self.shell
        deadline = c.deadline(timeout)
        kind, at = _start(start)
        r = c.router
        out: list[Message] = []
        if not await self._need_map(deadline):
            return out  # (as when the primary does not answer in time)
        assert r.cmap is not None
        key = (client, durable, topic)
        # (the first get of this process: what an earlier one committed is not repeated)
        first = self.core.read_to.get(key)
        if first is None and c.offsets is not None:
            first = c.offsets.load(client, durable, topic)
        rd = self.core.reader(r, client, durable, topic, r.cmap.partition(topic), start=(kind, at), nxt=first)
        while len(out) < count:
            rd.get(count - len(out), sh.now())
            if not await self._drive(rd, deadline):
                break
            out += [Message(t, k, tags, payload, offset) for offset, _ms, t, k, tags, payload in rd.take()]
            if rd.at_end and len(out) < count:  # (scanned to the commit: wait for more)
                await sh.sleep_until(min(deadline, sh.now() + c.config.pub_retry))  # (ask again)
                if sh.now() >= deadline:
                    break
        return out

    async def read(self, topic: str, offset: int = 0, count: int = 1000, *,
                   timeout: float | None = 10.0) -> LogRead:  # fmt: skip
        """(ClientAPI.read's)"""
        if offset < 0 or count < 1:
            raise ValueError("read needs offset >= 0 and count >= 1")
        c, sh = self.conn, self.shell
        deadline = c.deadline(timeout)
        r = c.router
        if not await self._need_map(deadline):
            raise NodeLost(f"no cluster map from the node within {timeout} s: nothing read of {topic!r}")
        assert r.cmap is not None
        p = r.cmap.partition(topic)
        ask = self.core.read(r, topic, p, offset, count, sh.now())
        f = await self._ask(ask, deadline)
        if f is None:
            raise NodeLost(f"no answer from the primary of partition {p} of {topic!r}")
        msgs = [Message(t, k, tags, payload, o) for o, _ms, t, k, tags, payload in f[6]]
        return LogRead(p, msgs, max(f[4], offset), f[7], f[8], [rec[1] for rec in f[6]])

    def position(self, topic: str, durable: str, *, client: str = "default") -> int | None:
        """(ClientAPI.position's)"""
        return self.core.read_to.get((client, durable, topic))

    async def commit(self, topic: str, durable: str, *, client: str = "default",
                     timeout: float | None = 10.0) -> bool:  # fmt: skip
        """(ClientAPI.commit's)"""
        c, sh = self.conn, self.shell
        deadline = c.deadline(timeout)
        r = c.router
        key = (client, durable, topic)
        if key not in self.core.read_to:  # (nothing read: nothing to commit, no map needed)
            return True
        if not await self._need_map(deadline):
            return False  # (as when the owners do not answer in time)
        assert r.cmap is not None
        # (made after the wait: a get that ended meanwhile counts)
        rd = self.core.reader(r, client, durable, topic, r.cmap.partition(topic))
        if c.offsets is not None:  # (first on our disk: a crash before the cluster hears it repeats nothing)
            await sh.in_thread(c.offsets.save, client, durable, topic, rd.nxt)
        rd.commit(sh.now())
        return await self._drive(rd, deadline) and rd.committed

    async def _need_map(self, deadline: float) -> bool:
        """Wait for the node's cluster map (a client's first durable call comes before it, or
        right after the WELCOME). The caller's timeout bounds this wait as it does the call's
        others, as Kafka's ``max.block.ms`` bounds a send's wait for metadata: False if the
        call's ``deadline`` passed first while the map may still come (each call then ends as
        it does when no answer came in time); NodeLost if ``node_timeout`` passed, the node
        was lost, or at once when the node welcomed us and announced no map (no partitioned
        cluster there: a single node or a replicated cluster)."""
        c, sh = self.conn, self.shell
        r = c.router
        if r.cmap is None:
            sh.kick()
            limit = sh.now() + c.config.node_timeout
            await sh.until(lambda: r.cmap is not None or r.lost or no_map_here(r.first), min(deadline, limit))
            if r.cmap is None:
                if r.lost:
                    raise NodeLost("node lost before its cluster map came")
                if not no_map_here(r.first) and deadline < limit:
                    return False
                raise NodeLost("no cluster map from the node: durable topics need a partitioned cluster")
        return True

    async def _drive(self, rd: Reader, deadline: float) -> bool:
        """Drive the reader's round until it ends (True) or the deadline passes (False)."""
        while rd.ask is not None:
            if await self._ask(rd.ask, deadline, rd) is None:
                return False
        return True

    async def _ask(self, ask: Ask, deadline: float, rd: Reader | None = None) -> tuple[Any, ...] | None:
        """Step ``ask`` (through ``rd``'s round when given) until it is answered OK, or the
        deadline (None): send what it queued at once, wait for its answer or its next step."""
        sh = self.shell
        while (now := sh.now()) < deadline:
            sent = rd.step(now) if rd is not None else ask.step(now)
            if sent or ask.state == WELCOME:  # (a session the router opened for it needs its I/O loop)
                sh.kick()
            if ask.done:
                return ask.answer
            if ask.lost:
                raise NodeLost("node lost")
            if ask.state == PAUSE:  # (refused, or no answer: not the leader yet)
                await sh.sleep_until(min(deadline, ask.next_deadline()))
            else:
                await sh.until(ask.ready, min(deadline, ask.next_deadline()))
        return None
