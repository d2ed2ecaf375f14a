"""Durable mode in the client API: puts, durable subscriptions (get/commit) and plain log reads.

A mixin of :class:`roost.client.api.ClientAPI` over the shell primitives of
:class:`roost.client.clientbase.ClientBase`; the protocol is docs/durable.md's, the frames
client/durablewire.py's, the put streams client/putter.py's.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
from typing import Any, NamedTuple

from roost.client import durablewire
from roost.client.clientbase import ClientBase, NodeLost
from roost.client.receive import Message
from roost.client.router import Router
from roost.client.session import ClientSession
from roost.client.wire import FrameType


def durable_id(client: str) -> bytes:
    """The 16-byte id of a durable subscriber named ``client``: the same in every process."""
    return hashlib.blake2b(client.encode(), digest_size=16, person=b"roost.durable").digest()


def _no_map_here(s: ClientSession) -> bool:
    """The node welcomed this session and announced no cluster map: not a partitioned cluster
    (a partitioned member installs its map before it serves clients, and its WELCOME carries
    the map or, when that does not fit, its epoch)."""
    return s.cookie is not None and not s.announced


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


def _get_frame(did: bytes, name: str, topic: str, p: int, kind: int, at: int, most: int, since: int,
               s: ClientSession) -> bytes:  # fmt: skip
    return durablewire.encode_get(s.cid, s.cookie or b"", did, name, topic, p, kind, at, most, since)


def _welcomed(s: ClientSession, r: Router) -> bool:
    return s.cookie is not None or r.lost


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


class DurableAPI(ClientBase):
    async def put(self, topic: str, payload: bytes | str, key: str | None = None,
                  tags: dict[str, str] | None = None, *, wait: bool = False,
                  timeout: float | None = None) -> tuple[int, int]:  # fmt: skip
        """Publish one message durably (docs/durable.md): stored in the log of its topic's
        partition on both owners before it is acknowledged. Returns (partition, sequence);
        ``wait=True`` returns only after the acknowledgement. Needs a partitioned cluster.
        ``timeout`` bounds the waits, as for :meth:`publish`."""
        self._check_open()
        if isinstance(payload, str):
            payload = payload.encode()
        r = self.router
        deadline = self._deadline(timeout, zero=not wait)  # (0 cannot wait for the acknowledgement)
        if not await self._need_map(deadline):
            raise TimeoutError(f"no cluster map from the node within {timeout} s: not put")
        if r.put_window_full(topic):
            self._kick()
            if not await self._until(lambda: not r.put_window_full(topic) or r.lost, deadline):
                raise TimeoutError(f"no room in the put window within {timeout} s: not put")
            if r.lost:
                raise NodeLost("node lost: not put")
        p, seq = r.put(topic, key, tags, payload)
        self._kick()
        if wait:
            if not await self._until(lambda: r.putter.streams[p].acked >= seq or r.lost, deadline):
                raise TimeoutError(f"not acknowledged within {timeout} s (it stays queued and is retried)")
            if r.putter.streams[p].acked < seq:
                raise NodeLost("node lost before acknowledging the put")
        return p, seq

    async def get(self, topic: str, durable: str, count: int = 1, *,
                  start: str | int | datetime.datetime = "earliest", timeout: float | None = None,
                  client: str = "default") -> list[Message]:  # fmt: skip
        """Read up to ``count`` messages of ``topic`` from durable subscription ``durable`` (docs/durable.md).

        The subscription, named by (``client``, ``durable``), lives on the cluster: its cursor is
        the first offset not yet committed; it is made at ``start`` ("earliest", "latest", an
        offset, or a datetime: the first message stored at or after it) the first time.
        Messages come with their log offset as ``sequence``, each once per call; call
        :meth:`commit` once they are processed, or the next reader gets them again.
        Waits up to ``timeout`` (None: until ``count`` came) for messages to arrive."""
        deadline = self._deadline(timeout)
        kind, at = _start(start)
        r = self.router
        out: list[Message] = []
        if not await self._need_map(deadline):
            return out  # (as when the primary does not answer in time)
        assert r.cmap is not None
        p = r.cmap.partition(topic)
        did = durable_id(client)
        key = (client, durable, topic)
        nxt = self._read_to.get(key)
        if nxt is None:  # (the first get of this process: what an earlier one committed is not repeated)
            nxt = self._offsets.load(client, durable, topic) if self._offsets is not None else 0
        while len(out) < count:
            ask = functools.partial(_get_frame, did, durable, topic, p, kind, at, count - len(out), nxt)
            f = await self._durable_ask(topic, FrameType.RECORDS, durable, p, deadline, ask)
            if f is None:
                break
            for offset, _ms, t, k, tags, payload in f[6]:
                if offset >= nxt:  # (a record given before and not committed yet comes again: dropped)
                    out.append(Message(t, k, tags, payload, offset))
            nxt = max(nxt, f[4])
            self._read_to[key] = nxt
            if not f[6] and len(out) < count and f[4] >= f[8]:  # (scanned to the commit: wait for more)
                await self._sleep_until(min(deadline, self._now() + self.config.pub_retry))  # (ask again)
                if self._now() >= deadline:
                    break
        return out

    async def read(self, topic: str, offset: int = 0, count: int = 1000, *,
                   timeout: float | None = 10.0) -> LogRead:  # fmt: skip
        """Read committed messages of ``topic`` from log offset ``offset`` (up to ``count``), without a
        durable subscription: for readers that keep their own offsets (the Spark source). Raises
        NodeLost when the partition's primary does not answer within ``timeout``."""
        if offset < 0 or count < 1:
            raise ValueError("read needs offset >= 0 and count >= 1")
        deadline = self._deadline(timeout)
        r = self.router
        if not await self._need_map(deadline):
            raise NodeLost(f"no cluster map from the node within {timeout} s: nothing read of {topic!r}")
        assert r.cmap is not None
        p = r.cmap.partition(topic)
        ask = functools.partial(_get_frame, b"\0" * 16, "", topic, p, 0, 0, count, offset)
        f = await self._durable_ask(topic, FrameType.RECORDS, "", p, deadline, ask)
        if f is None:
            raise NodeLost(f"no answer from the primary of partition {p} of {topic!r}")
        msgs = [Message(t, k, tags, payload, o) for o, _ms, t, k, tags, payload in f[6]]
        return LogRead(p, msgs, max(f[4], offset), f[7], f[8], [r[1] for r in f[6]])

    def position(self, topic: str, durable: str, *, client: str = "default") -> int | None:
        """The offset :meth:`commit` would move the cursor of (``client``, ``durable``) on ``topic``
        to: past everything :meth:`get` returned in this process (None before its first answer).
        An application that records what it processed (docs/durable.md) logs this with the commit."""
        return self._read_to.get((client, durable, topic))

    async def commit(self, topic: str, durable: str, *, client: str = "default",
                     timeout: float | None = 10.0) -> bool:  # fmt: skip
        """Move the cursor of durable subscription (``client``, ``durable``) past everything
        :meth:`get` returned; True once that is on disk on the partition's owners."""
        deadline = self._deadline(timeout)
        r = self.router
        if (client, durable, topic) not in self._read_to:  # (nothing read: nothing to commit, no map needed)
            return True
        if not await self._need_map(deadline):
            return False  # (as when the owners do not answer in time)
        assert r.cmap is not None
        p = r.cmap.partition(topic)
        nxt = self._read_to[(client, durable, topic)]  # (after the wait: a get that ended meanwhile counts)
        did = durable_id(client)
        if self._offsets is not None:  # (first on our disk: a crash before the cluster hears it repeats nothing)
            await self._in_thread(self._offsets.save, client, durable, topic, nxt)
        f = await self._durable_ask(
            topic,
            FrameType.COMMITTED,
            durable,
            p,
            deadline,
            lambda s: durablewire.encode_commit(s.cid, s.cookie, did, durable, topic, p, nxt),
        )
        return f is not None and f[3] >= nxt

    async def _need_map(self, deadline: float) -> bool:
        """Wait for the node's cluster map (a client's first durable call comes before it, or
        right after the WELCOME). The caller's timeout bounds this wait as it does the call's
        others, as Kafka's ``max.block.ms`` bounds a send's wait for metadata: False if the
        call's ``deadline`` passed first while the map may still come (each call then ends as
        it does when no answer came in time); NodeLost if ``node_timeout`` passed, the node
        was lost, or at once when the node welcomed us and announced no map (no partitioned
        cluster there: a single node or a replicated cluster)."""
        r = self.router
        if r.cmap is None:
            self._kick()
            limit = self._now() + self.config.node_timeout
            await self._until(lambda: r.cmap is not None or r.lost or _no_map_here(r.first), min(deadline, limit))
            if r.cmap is None:
                if r.lost:
                    raise NodeLost("node lost before its cluster map came")
                if not _no_map_here(r.first) and deadline < limit:
                    return False
                raise NodeLost("no cluster map from the node: durable topics need a partitioned cluster")
        return True

    async def _durable_ask(self, topic: str, want: Any, name: str, p: int, deadline: float,
                           make: Any) -> tuple[Any, ...] | None:  # fmt: skip
        """Send a durable request to the partition's primary until its answer comes (OK), or
        the deadline; it goes again (maybe to another primary) on a time-out or a refusal."""
        r = self.router
        while self._now() < deadline:
            s = r.durable_session_for(topic)
            if s.cookie is None:
                self._kick()
                await self._until(functools.partial(_welcomed, s, r), min(deadline, self._now() + 1))
                if r.lost:
                    raise NodeLost("node lost")
                continue
            s.durable_replies.clear()
            s.queue_raw([make(s)])
            self._kick()

            def answered(s: ClientSession = s) -> bool:
                return any(f[0] is want and f[1] == name and f[2] == p for f in s.durable_replies)

            await self._until(answered, min(deadline, self._now() + self.config.pub_retry * 5))
            got = next((f for f in s.durable_replies if f[0] is want and f[1] == name and f[2] == p), None)
            if got is not None and got[5 if want is FrameType.RECORDS else 4] == 0:  # (status OK)
                return got
            await self._sleep_until(min(deadline, self._now() + self.config.pub_retry))  # (refused: not leader yet)
        return None
