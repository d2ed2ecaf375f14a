"""The trio client library: :class:`Client` and :class:`Subscription`.

A thin shell around :class:`client.router.Router`, which routes publishes and
subscriptions to the sessions of a partitioned cluster's primaries (one
session, like a plain :class:`client.session.ClientSession`, when the cluster
sends no map). Per session: one UDP socket (its own source port, so MSGS for a
session's client id reach that session alone) and one background task that
drains it, feeds the router, fires the session's timers and sends what it
produces. API calls change the router and wake those tasks; awaiting callers
sleep on a single "something changed" event.

    async with Client(("127.0.0.1", 7400)) as c:
        async with c.subscribe("prices", mode="reliable") as sub:
            await c.publish("prices", b"42")
            msg = await sub.next()
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import math
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any, NamedTuple

import trio

from roost.client import durablewire
from roost.client.offsets import OffsetFile
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession, Message, SubState
from roost.client.udp import drain
from roost.client.wire import MODE_NAMES, Reason, T

Addr = tuple[str, int]

__all__ = ["Client", "ClientConfig", "LogRead", "Message", "NodeLost", "Subscription"]


class NodeLost(ConnectionError):
    """The node did not answer within ``node_timeout``."""


def _addr(node: Addr | str) -> Addr:
    if isinstance(node, str):
        host, _, port = node.rpartition(":")
        return (host or "127.0.0.1", int(port))
    return node


def durable_id(client: str) -> bytes:
    """The 16-byte id of a durable subscriber named ``client``: the same in every process."""
    return hashlib.blake2b(client.encode(), digest_size=16, person=b"roost.durable").digest()


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


def _mode(mode: str) -> int:
    try:
        return MODE_NAMES[mode]
    except KeyError:
        raise ValueError(f"mode must be one of {', '.join(MODE_NAMES)}, not {mode!r}") from None


class LogRead(NamedTuple):
    """What :meth:`Client.read` got: the topic's partition, its messages (``sequence`` is the log
    offset), the offset to read from next, the partition's first retained offset and its end (the
    commit: nothing at or past it can be read yet), and for each message the time its primary
    stored it (ms since the epoch: a reader's record time, as the Spark source's ``timestamp``)."""

    partition: int
    messages: list[Message]
    next: int
    first: int
    end: int
    times: list[int]


class Client:
    def __init__(
        self,
        node: Addr | str = ("127.0.0.1", 7400),
        *,
        members: Sequence[Addr | str] | None = None,
        client_id: bytes | None = None,
        config: ClientConfig | None = None,
        producer_id: bytes | None = None,
        offsets_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``node`` is the node to talk to first; ``members`` (optional) the other
        nodes to fail over to; the cluster map in WELCOME adds the rest.
        ``producer_id`` (16 bytes, default random) names this client's reliable
        publishes: a client that publishes the same sequence of messages again
        under the same producer id (a retried Spark task) has them delivered once.
        ``offsets_dir``: where durable readers record what they committed before
        the cluster hears it (client/offsets.py): no repeats after a crash there."""
        if producer_id is not None and len(producer_id) != 16:
            raise ValueError(f"producer_id must be 16 bytes, not {len(producer_id)}")
        self.node: Addr = _addr(node)
        self.config = config or ClientConfig()
        self.client_id = client_id or os.urandom(16)
        self.router = Router(
            self.client_id, producer_id or os.urandom(16), os.urandom(16), self.config, trio.current_time(),
            node=self.node, members=[_addr(m) for m in members or []],
            session=int(time.time() * 1000),
        )  # fmt: skip
        self._socks: dict[int, socket.socket] = {}  # id(session) -> its socket
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        self._wait_scopes: dict[int, trio.CancelScope] = {}
        self._since_yield = 0
        self._closed = False
        self.send_errors = 0
        self.session_errors = 0  # datagrams the session failed on (a bug; the client carries on)
        self.last_session_error: Exception | None = None
        self._read_to: dict[tuple[str, str, str], int] = {}  # durable (client, name, topic) -> offset read to
        self._offsets = OffsetFile(offsets_dir) if offsets_dir is not None else None

    @property
    def session(self) -> ClientSession:
        """The first session: the user's client id, talking to ``node`` (the only one
        unless a partitioned cluster sent its map)."""
        return self.router.first

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Client:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        try:
            self._spawn()
            await self._until(lambda: self.session.connected or self.session.lost)
            if not self.session.connected:
                tried = ", ".join(f"{h}:{p}" for h, p in self.session.candidates)
                raise NodeLost(f"no answer from node {tried}")
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None and self.session.connected:
            with trio.move_on_after(self.config.node_timeout):
                await self.flush()
        await self._shutdown()

    async def _shutdown(self) -> None:
        """Stop the I/O tasks; the caller's own exception, if any, propagates unwrapped."""
        self._closed = True
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            await self._nursery_cm.__aexit__(None, None, None)
        finally:
            for sock in self._socks.values():
                sock.close()

    def _spawn(self) -> None:
        """A socket and an I/O task for every session the router opened since we last looked."""
        if self._nursery is None or self._closed:
            return
        for s in self.router.sessions:
            if id(s) in self._socks:
                continue
            family = socket.AF_INET6 if ":" in s.node[0] else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
            sock.setblocking(False)
            sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
            self._socks[id(s)] = sock
            self._nursery.start_soon(self._run, s, sock)

    # ------------------------------------------------------------ the I/O loop

    async def _run(self, s: ClientSession, sock: socket.socket) -> None:
        r, key = self.router, id(s)
        while True:
            batch = drain(sock, 65536)
            now = trio.current_time()
            if batch:
                self._handle(s, batch, now)
            deadline = min(s.next_deadline(), r.put_deadline())
            if now >= deadline:
                r.tick(s, now)
            if len(r.sessions) > len(self._socks):
                self._spawn()  # (the router opened a session here: a put for a new primary)
            out = s.outgoing(now)
            self._send(sock, out)
            if batch or s.events or out:
                s.events.clear()
                self._wake()
            if batch:
                await trio.lowlevel.checkpoint()
                continue
            with trio.CancelScope(deadline=min(s.next_deadline(), r.put_deadline())) as scope:
                self._wait_scopes[key] = scope
                await trio.lowlevel.wait_readable(sock)
            self._wait_scopes.pop(key, None)

    def _handle(self, s: ClientSession, batch: list[tuple[bytes, Addr]], now: float) -> None:
        """Feed the session; whatever arrives, the I/O task must live on.

        The session validates every frame and ignores what it cannot use, so an
        exception here is a bug the datagrams found. Anyone who can send from a
        node's address could trigger it again and again, so it must not take
        the client down: the rest of the batch is lost as UDP may lose it, and
        the protocols' retries repair that.
        """
        try:
            self.router.handle_datagrams(s, batch, now)
        except Exception as exc:
            self.session_errors += 1
            self.last_session_error = exc

    def _send(self, sock: socket.socket, datagrams: list[tuple[Addr, bytes]]) -> None:
        for addr, d in datagrams:
            try:
                sock.sendto(d, addr)
            except (OSError, OverflowError, TypeError, ValueError):
                # Unreachable, refused, or an address the socket cannot use
                # (another family; a cluster map is validated, but a member
                # list from the application is not): UDP gives no promise,
                # the session's retries and failover cover it.
                self.send_errors += 1

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def _kick(self) -> None:
        """Make the I/O loops flush now instead of at their next deadline (and start the
        loop of any session the router just opened)."""
        self._spawn()
        for scope in self._wait_scopes.values():
            scope.cancel()

    async def _until(self, cond: Any, deadline: float = math.inf) -> bool:
        with trio.move_on_at(deadline):
            while not cond():
                if self._closed:
                    raise trio.ClosedResourceError("client is closed")
                await self._changed.wait()
            return True
        return False

    # ------------------------------------------------------------ publishing

    async def publish(
        self,
        topic: str,
        payload: bytes | str,
        key: str | None = None,
        tags: dict[str, str] | None = None,
        *,
        mode: str = "reliable",
        wait: bool = False,
    ) -> int:
        """Publish one message; returns its producer sequence (0 for fire).

        ``reliable`` publishes are retried until the node acknowledges them;
        ``wait=True`` returns only after that PUBACK. With a full window of
        unacknowledged publishes this waits for room (backpressure).
        """
        if isinstance(payload, str):
            payload = payload.encode()
        reliable = _mode(mode) == MODE_NAMES["reliable"]
        r = self.router
        if reliable and r.window_full(topic):
            self._kick()
            await self._until(lambda: not r.window_full(topic))
        seq = r.publish(topic, key, tags, payload, reliable)
        self._since_yield += 1
        if wait and reliable:
            self._kick()
            await self._until(lambda: r.acked >= seq or r.lost)
            if r.acked < seq:
                raise NodeLost("node lost before acknowledging the publish")
        elif self._since_yield >= 64:
            self._since_yield = 0
            self._kick()
            await trio.lowlevel.checkpoint()
        else:
            self._kick()
        return seq

    async def put(self, topic: str, payload: bytes | str, key: str | None = None,
                  tags: dict[str, str] | None = None, *, wait: bool = False) -> tuple[int, int]:  # fmt: skip
        """Publish one message durably (docs/durable.md): stored in the log of its topic's
        partition on both owners before it is acknowledged. Returns (partition, sequence);
        ``wait=True`` returns only after the acknowledgement. Needs a partitioned cluster."""
        if isinstance(payload, str):
            payload = payload.encode()
        r = self.router
        await self._need_map()
        if r.put_window_full(topic):
            self._kick()
            await self._until(lambda: not r.put_window_full(topic))
        p, seq = r.put(topic, key, tags, payload)
        self._kick()
        if wait:
            await self._until(lambda: r.putter.streams[p].acked >= seq or r.lost)
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
        r = self.router
        await self._need_map()
        assert r.cmap is not None
        p = r.cmap.partition(topic)
        kind, at = _start(start)
        did = durable_id(client)
        deadline = trio.current_time() + timeout if timeout is not None else math.inf
        out: list[Message] = []
        key = (client, durable, topic)
        nxt = self._read_to.get(key)
        if nxt is None:  # (the first get of this process: what an earlier one committed is not repeated)
            nxt = self._offsets.load(client, durable, topic) if self._offsets is not None else 0
        while len(out) < count:
            ask = functools.partial(_get_frame, did, durable, topic, p, kind, at, count - len(out), nxt)
            f = await self._durable_ask(topic, T.RECORDS, durable, p, deadline, ask)
            if f is None:
                break
            for offset, _ms, t, k, tags, payload in f[6]:
                if offset >= nxt:  # (a record given before and not committed yet comes again: dropped)
                    out.append(Message(t, k, tags, payload, offset))
            nxt = max(nxt, f[4])
            self._read_to[key] = nxt
            if not f[6] and len(out) < count and f[4] >= f[8]:  # (scanned to the commit: wait for more)
                with trio.move_on_at(deadline):
                    await trio.sleep(self.config.pub_retry)  # (nothing new yet: ask again)
                if trio.current_time() >= deadline:
                    break
        return out

    async def read(self, topic: str, offset: int = 0, count: int = 1000, *, timeout: float = 10.0) -> LogRead:
        """Read committed messages of ``topic`` from log offset ``offset`` (up to ``count``), without a
        durable subscription: for readers that keep their own offsets (the Spark source). Raises
        NodeLost when the partition's primary does not answer within ``timeout``."""
        if offset < 0 or count < 1:
            raise ValueError("read needs offset >= 0 and count >= 1")
        r = self.router
        await self._need_map()
        assert r.cmap is not None
        p = r.cmap.partition(topic)
        ask = functools.partial(_get_frame, b"\0" * 16, "", topic, p, 0, 0, count, offset)
        f = await self._durable_ask(topic, T.RECORDS, "", p, trio.current_time() + timeout, ask)
        if f is None:
            raise NodeLost(f"no answer from the primary of partition {p} of {topic!r}")
        msgs = [Message(t, k, tags, payload, o) for o, _ms, t, k, tags, payload in f[6]]
        return LogRead(p, msgs, max(f[4], offset), f[7], f[8], [r[1] for r in f[6]])

    def position(self, topic: str, durable: str, *, client: str = "default") -> int | None:
        """The offset :meth:`commit` would move the cursor of (``client``, ``durable``) on ``topic``
        to: past everything :meth:`get` returned in this process (None before its first answer).
        An application that records what it processed (docs/durable.md) logs this with the commit."""
        return self._read_to.get((client, durable, topic))

    async def commit(self, topic: str, durable: str, *, client: str = "default", timeout: float = 10.0) -> bool:
        """Move the cursor of durable subscription (``client``, ``durable``) past everything
        :meth:`get` returned; True once that is on disk on the partition's owners."""
        r = self.router
        await self._need_map()
        assert r.cmap is not None
        p = r.cmap.partition(topic)
        nxt = self._read_to.get((client, durable, topic))
        if nxt is None:
            return True
        did = durable_id(client)
        if self._offsets is not None:  # (first on our disk: a crash before the cluster hears it repeats nothing)
            await trio.to_thread.run_sync(self._offsets.save, client, durable, topic, nxt)
        f = await self._durable_ask(topic, T.COMMITTED, durable, p, trio.current_time() + timeout,
                                    lambda s: durablewire.encode_commit(s.cid, s.cookie, did, durable, topic, p, nxt))
        return f is not None and f[3] >= nxt

    async def _need_map(self) -> None:
        r = self.router
        if r.cmap is None:
            self._kick()
            await self._until(lambda: r.cmap is not None or r.lost, trio.current_time() + self.config.node_timeout)
            if r.cmap is None:
                raise NodeLost("no cluster map from the node: durable publishes need a partitioned cluster")

    async def _durable_ask(self, topic: str, want: Any, name: str, p: int, deadline: float,
                           make: Any) -> tuple[Any, ...] | None:  # fmt: skip
        """Send a durable request to the partition's primary until its answer comes (OK), or
        the deadline; it goes again (maybe to another primary) on a time-out or a refusal."""
        r = self.router
        while trio.current_time() < deadline:
            s = r.durable_session_for(topic)
            if s.cookie is None:
                self._kick()
                await self._until(lambda s=s: s.cookie is not None or r.lost, min(deadline, trio.current_time() + 1))
                if r.lost:
                    raise NodeLost("node lost")
                continue
            s.durable_replies.clear()
            s.queue_raw([make(s)])
            self._kick()

            def answered(s: ClientSession = s) -> bool:
                return any(f[0] is want and f[1] == name and f[2] == p for f in s.durable_replies)

            await self._until(answered, min(deadline, trio.current_time() + self.config.pub_retry * 5))
            got = next((f for f in s.durable_replies if f[0] is want and f[1] == name and f[2] == p), None)
            if got is not None and got[5 if want is T.RECORDS else 4] == 0:  # (status OK)
                return got
            with trio.move_on_at(deadline):
                await trio.sleep(self.config.pub_retry)  # (refused: not the leader yet, or busy)
        return None

    async def flush(self, timeout: float = math.inf) -> bool:
        """Wait until every reliable publish, every durable put and every command so far is
        acknowledged, on every session."""
        r = self.router
        self._kick()
        marks = r.flush_marks()
        puts = r.putter.marks()

        def done() -> bool:
            return r.lost or (r.flushed(marks) and r.putter.flushed(puts))

        return await self._until(done, trio.current_time() + timeout) and not r.lost

    async def status(self, timeout: float = 3.0) -> dict[str, Any]:
        """The status map of the node this client was given (what ``roost status`` prints)."""
        s = self.session
        s.last_status = None
        s.status_request()
        self._kick()
        if not await self._until(lambda: s.last_status is not None, trio.current_time() + timeout):
            raise NodeLost("no STATUS reply from the node")
        assert s.last_status is not None
        return s.last_status

    # ------------------------------------------------------------ subscribing

    def subscribe(self, topic: str, key: str | None = None, mode: str = "reliable") -> Subscription:
        return Subscription(self, topic, key, _mode(mode))


class Subscription:
    """An async context manager and async iterator of :class:`Message`.

    Iteration ends when the subscription ends; :attr:`error` then says why
    (``out_of_capacity``, ``node_lost``, ``timed_out``, ``refused: ...``), or is
    None after a plain unsubscribe.
    """

    def __init__(self, client: Client, topic: str, key: str | None, mode: int) -> None:
        self.client = client
        self.topic = topic
        self.key = key
        self.mode = mode
        self._st: SubState | None = None
        self._session: ClientSession | None = None  # the session it was made on (client/router.py)

    async def __aenter__(self) -> Subscription:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.client._closed:
            await self.unsubscribe()

    async def start(self) -> None:
        """Subscribe and wait until the node confirms (or refuses)."""
        c = self.client
        self._session, self._st = c.router.subscribe(self.topic, self.key, self.mode)
        st = self._st
        c._kick()
        await c._until(lambda: st.confirmed or st.reason is not None)

    async def unsubscribe(self) -> None:
        st = self._st
        if st is not None and st.reason is None:
            self.client.router.unsubscribe(self.topic, self.key)
            self.client._kick()

    @property
    def reason(self) -> str | None:
        """Why the subscription ended, or None while it is active."""
        return self._st.reason if self._st else None

    @property
    def error(self) -> str | None:
        """Like ``reason`` but None for a plain unsubscribe (Tendermint's Err())."""
        r = self.reason
        return None if r == Reason.UNSUBSCRIBED else r

    @property
    def active(self) -> bool:
        return self._st is not None and self._st.confirmed and self._st.reason is None

    async def next(self) -> Message:
        st, s = self._st, self._session
        assert st is not None and s is not None, "use 'async with' or await start() first"
        c = self.client
        if not st.queue:
            await c._until(lambda: bool(st.queue) or st.reason is not None)
            if not st.queue:
                raise StopAsyncIteration
        s.consumed(st)
        c._since_yield += 1
        if c._since_yield >= 64:  # let the I/O loop run during long bursts
            c._since_yield = 0
            await trio.lowlevel.checkpoint()
        return st.queue.popleft()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        return await self.next()
