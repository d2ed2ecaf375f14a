"""The client API, written once for every shell: publish, subscribe, durable logs, request/reply.

The protocol lives in the sans-IO :class:`roost.client.router.Router` and its sessions. What a
user calls (``publish``, ``subscribe``, ``get``, ``request``...) is the same for trio and
asyncio: change the router, wake the I/O, wait until some condition on the router holds. So
:class:`ClientAPI` holds those methods as plain ``async def`` code over eight primitives that a
shell provides for its event loop:

- ``_now()``: the loop's clock (the sessions' ``now``);
- ``_until(cond, deadline)``: wait until ``cond()`` holds (re-checked whenever the I/O changed
  something) or the deadline passes;
- ``_kick()``: make the I/O send what the router queued now, not at its next deadline;
- ``_sleep_until(deadline)``, ``_checkpoint()``: the loop's sleep and yield;
- ``_in_thread(fn, *args)``: blocking file I/O (a durable reader's offsets file);
- ``_resolve(host, port)``: the loop's ``getaddrinfo``;
- ``_open()``, ``_spawn()``, ``_background(fn)``, ``_shutdown()``: the shell's task group, one
  socket and I/O task per session, a task that lives as long as the client, and the end.

The trio shell (client/library.py) and the asyncio shell (client/aio.py) are those primitives
and an I/O loop each; the blocking client (client/blocking.py) runs the asyncio one in a thread.

Request/reply is built on plain subscriptions, as in NATS: each client subscribes (reliably) to
its own inbox topic ``_INBOX.<client id>`` on its first request, and a request is a reliable
publish with two tags, ``roost.reply_to`` (the inbox) and ``roost.request`` (the request's
number). A subscriber sees such a message as a :class:`Request`, and ``respond`` publishes the
answer to the inbox with the same number. Replies for requests that timed out are dropped.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from types import TracebackType
from typing import Any, NamedTuple, Self

from roost.client import addresses, durablewire, wire
from roost.client.addresses import Addr, NodeSpec
from roost.client.offsets import OffsetFile
from roost.client.receive import Message, SubState
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession
from roost.client.wire import MODE_NAMES, Reason, T

REPLY_TO = "roost.reply_to"
REQUEST_ID = "roost.request"
RELIABLE = MODE_NAMES["reliable"]

__all__ = ["ClientAPI", "ClientClosed", "LogRead", "Message", "NodeLost", "Request", "Subscription"]


class NodeLost(ConnectionError):
    """No node answered within ``node_timeout`` (or none could be resolved)."""


class ClientClosed(ConnectionError):
    """A call waited on a client that was closed meanwhile."""


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


def _welcomed(s: ClientSession, r: Router) -> bool:
    return s.cookie is not None or r.lost


def _mode(mode: str) -> int:
    try:
        return MODE_NAMES[mode]
    except KeyError:
        raise ValueError(f"mode must be one of {', '.join(MODE_NAMES)}, not {mode!r}") from None


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


class Request(Message):
    """A message that asks for an answer (it came from :meth:`ClientAPI.request`).

    ``respond`` publishes the answer to the requester's inbox; in the async clients it returns
    an awaitable, in the blocking client it returns once the answer is sent."""

    _answer: Callable[[Request, bytes | str, dict[str, str] | None], Any]

    @property
    def reply_to(self) -> str:
        return (self.tags or {})[REPLY_TO]  # (a Request is made only when the tag is there)

    def respond(self, payload: bytes | str, tags: dict[str, str] | None = None) -> Any:
        return self._answer(self, payload, tags)


class ClientAPI:
    """Everything a client does, over the primitives its shell provides (see the module)."""

    def __init__(
        self,
        node: NodeSpec = None,
        *,
        members: NodeSpec = None,
        client_id: bytes | None = None,
        config: ClientConfig | None = None,
        producer_id: bytes | None = None,
        offsets_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        """``node``: the node to talk to first, as ``"host:port"``, ``(host, port)``, or a list of
        them (``"h1:7400,h2:7400"``) tried in turn; None means ``ROOST_NODES`` or 127.0.0.1:7400.
        Host names are resolved when the client connects and again when it fails over.
        ``members`` (optional): more nodes to fail over to; the cluster map in WELCOME adds the
        rest. ``producer_id`` (16 bytes, default random) names this client's reliable publishes:
        a client that publishes the same sequence of messages again under the same producer id
        (a retried Spark task) has them delivered once. ``offsets_dir``: where durable readers
        record what they committed before the cluster hears it (client/offsets.py): no repeats
        after a crash there."""
        if producer_id is not None and len(producer_id) != 16:
            raise ValueError(f"producer_id must be 16 bytes, not {len(producer_id)}")
        self._names = addresses.parse_nodes(node)
        self._names += [a for a in (addresses.parse_nodes(members) if members else []) if a not in self._names]
        self.node: Addr = self._names[0]  # (the resolved address once connected)
        self.config = config or ClientConfig()
        self.client_id = client_id or os.urandom(16)
        self.producer_id = producer_id or os.urandom(16)
        self._router: Router | None = None
        self._since_yield = 0
        self._closed = False
        self._error: BaseException | None = None  # what stopped the I/O, if it failed
        self._resolving = False
        self._resolve_after = 0.0
        self._literal = all(addresses.is_literal(h) for h, _ in self._names)  # (nothing to look up again)
        self.send_errors = 0
        self.session_errors = 0  # datagrams the session failed on (a bug; the client carries on)
        self.last_session_error: Exception | None = None
        self.callback_errors = 0  # exceptions raised by subscription callbacks (the client carries on)
        self.last_callback_error: BaseException | None = None
        self._read_to: dict[tuple[str, str, str], int] = {}  # durable (client, name, topic) -> offset read to
        self._offsets = OffsetFile(offsets_dir) if offsets_dir is not None else None
        self._inbox: Subscription | None = None
        self._requests = 0
        self._replies: dict[str, Message | None] = {}  # request number -> its reply, while awaited

    # ------------------------------------------------------------ the shell's primitives

    def _now(self) -> float:
        raise NotImplementedError

    async def _until(self, cond: Callable[[], bool], deadline: float = math.inf) -> bool:
        raise NotImplementedError

    def _kick(self) -> None:
        raise NotImplementedError

    async def _sleep_until(self, deadline: float) -> None:
        raise NotImplementedError

    async def _checkpoint(self) -> None:
        raise NotImplementedError

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        raise NotImplementedError

    async def _resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    async def _open(self) -> None:
        raise NotImplementedError

    def _spawn(self) -> None:
        raise NotImplementedError

    def _background(self, fn: Callable[[], Any]) -> None:
        raise NotImplementedError

    async def _shutdown(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------ lifecycle

    @property
    def router(self) -> Router:
        if self._router is None:
            raise RuntimeError("the client is not connected: use 'async with Client(...)' first")
        return self._router

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> ClientClosed:
        if self._error is not None:
            return ClientClosed(f"the client's I/O failed: {self._error!r}")
        return ClientClosed("the client is closed")

    def _fail(self, exc: BaseException) -> None:
        """The I/O hit an error it cannot carry on from (a socket that broke): the client ends,
        and every call waiting on it raises ClientClosed instead of waiting for ever."""
        if self._error is None:
            self._error = exc
        self._closed = True

    @property
    def session(self) -> ClientSession:
        """The first session: the user's client id, talking to ``node`` (the only one
        unless a partitioned cluster sent its map)."""
        return self.router.first

    async def __aenter__(self) -> Self:
        await self._open()
        try:
            await self._connect()
        except BaseException:
            await self._shutdown()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if et is None and self._router is not None and self.session.connected:
            await self.flush(timeout=self.config.node_timeout)
        await self._shutdown()

    async def _connect(self) -> None:
        addrs: list[Addr] = []
        why: list[str] = []
        for host, port in self._names:
            for a in await self._addresses(host, port, why):
                if a not in addrs:
                    addrs.append(a)
        if not addrs:
            raise NodeLost(f"cannot resolve {addresses.show(self._names)}: {'; '.join(why)}")
        self.node = addrs[0]
        self._router = Router(
            self.client_id, self.producer_id, os.urandom(16), self.config, self._now(),
            node=addrs[0], members=addrs[1:], session=int(time.time() * 1000),
        )  # fmt: skip
        self._spawn()
        await self._until(lambda: self.session.connected or self.session.lost)
        if not self.session.connected:
            raise NodeLost(f"no answer from node {addresses.show(self.session.candidates)}")

    async def _addresses(self, host: str, port: int, why: list[str]) -> list[Addr]:
        if addresses.is_literal(host):
            return [(host, port)]
        try:
            return addresses.ordered(await self._resolve(host, port))
        except (OSError, UnicodeError) as exc:  # (UnicodeError: a label IDNA cannot encode)
            why.append(f"{host}: {getattr(exc, 'strerror', None) or exc}")
            return []

    def _noticed(self, s: ClientSession, now: float) -> None:
        """Every I/O turn: once the user's session misses a PONG (and when it fails over), look its
        node names up again, at most once per ``node_timeout``: a container that moved has a new
        address under the same name, and the session can only fail over to addresses it has."""
        if self._resolving or now < self._resolve_after or s is not self.router.first or self._literal:
            return
        if now - s.last_heard < s.ping_interval * 1.5 and not any(e[0] == "node_silent" for e in s.events):
            return
        self._resolving = True
        self._resolve_after = now + self.config.node_timeout
        self._background(functools.partial(self._reresolve, s))

    async def _reresolve(self, s: ClientSession) -> None:
        try:
            for host, port in self._names:
                if not addresses.is_literal(host):
                    s.add_candidates(await self._addresses(host, port, []))
        finally:
            self._resolving = False

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
        timeout: float | None = None,
    ) -> int:
        """Publish one message; returns its producer sequence (0 for fire).

        ``reliable`` publishes are retried until the node acknowledges them;
        ``wait=True`` returns only after that PUBACK. With a full window of
        unacknowledged publishes this waits for room (backpressure). ``timeout``
        bounds those waits: TimeoutError while waiting for room means the message
        was not published; with ``wait=True`` after it, that it is queued (and
        retried) but not acknowledged yet.
        """
        self._check_open()
        if isinstance(payload, str):
            payload = payload.encode()
        reliable = _mode(mode) == RELIABLE
        r = self.router
        deadline = math.inf if timeout is None else self._now() + timeout
        if reliable and r.window_full(topic):
            self._kick()
            if not await self._until(lambda: not r.window_full(topic), deadline):
                raise TimeoutError(f"no room in the publish window within {timeout} s: not published")
        seq = r.publish(topic, key, tags, payload, reliable)
        self._since_yield += 1
        self._kick()
        if wait and reliable:
            if not await self._until(lambda: r.acked >= seq or r.lost, deadline):
                raise TimeoutError(f"not acknowledged within {timeout} s (it stays queued and is retried)")
            if r.acked < seq:
                raise NodeLost("node lost before acknowledging the publish")
        elif self._since_yield >= 64:
            self._since_yield = 0
            await self._checkpoint()
        return seq

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
        deadline = math.inf if timeout is None else self._now() + timeout
        await self._need_map()
        if r.put_window_full(topic):
            self._kick()
            if not await self._until(lambda: not r.put_window_full(topic), deadline):
                raise TimeoutError(f"no room in the put window within {timeout} s: not put")
        p, seq = r.put(topic, key, tags, payload)
        self._kick()
        if wait:
            if not await self._until(lambda: r.putter.streams[p].acked >= seq or r.lost, deadline):
                raise TimeoutError(f"not acknowledged within {timeout} s (it stays queued and is retried)")
            if r.putter.streams[p].acked < seq:
                raise NodeLost("node lost before acknowledging the put")
        return p, seq

    async def flush(self, timeout: float = math.inf) -> bool:
        """Wait until every reliable publish, every durable put and every command so far is
        acknowledged, on every session."""
        r = self.router
        self._kick()
        marks = r.flush_marks()
        puts = r.putter.marks()

        def done() -> bool:
            return r.lost or (r.flushed(marks) and r.putter.flushed(puts))

        return await self._until(done, self._now() + timeout) and not r.lost

    async def status(self, timeout: float = 3.0) -> dict[str, Any]:
        """The status map of the node this client was given (what ``roost status`` prints)."""
        s = self.session
        s.last_status = None
        s.status_request()
        self._kick()
        if not await self._until(lambda: s.last_status is not None, self._now() + timeout):
            raise NodeLost("no STATUS reply from the node")
        assert s.last_status is not None
        return s.last_status

    # ------------------------------------------------------------ durable logs

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
        deadline = self._now() + timeout if timeout is not None else math.inf
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
                await self._sleep_until(min(deadline, self._now() + self.config.pub_retry))  # (ask again)
                if self._now() >= deadline:
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
        f = await self._durable_ask(topic, T.RECORDS, "", p, self._now() + timeout, ask)
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
            await self._in_thread(self._offsets.save, client, durable, topic, nxt)
        f = await self._durable_ask(topic, T.COMMITTED, durable, p, self._now() + timeout,
                                    lambda s: durablewire.encode_commit(s.cid, s.cookie, did, durable, topic, p, nxt))
        return f is not None and f[3] >= nxt

    async def _need_map(self) -> None:
        r = self.router
        if r.cmap is None:
            self._kick()
            await self._until(lambda: r.cmap is not None or r.lost, self._now() + self.config.node_timeout)
            if r.cmap is None:
                raise NodeLost("no cluster map from the node: durable publishes need a partitioned cluster")

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
            if got is not None and got[5 if want is T.RECORDS else 4] == 0:  # (status OK)
                return got
            await self._sleep_until(min(deadline, self._now() + self.config.pub_retry))  # (refused: not leader yet)
        return None

    # ------------------------------------------------------------ subscribing

    def subscribe(self, topic: str, key: str | None = None, mode: str = "reliable", *,
                  callback: Callable[[Message], Any] | None = None) -> Subscription:  # fmt: skip
        """A subscription to use with ``async with`` and ``async for msg in sub``. With
        ``callback`` (a function or a coroutine function of the message), a task of the client
        calls it for each message instead; what it raises is counted in ``callback_errors``."""
        return Subscription(self, topic, key, _mode(mode), callback)

    # ------------------------------------------------------------ request/reply

    async def request(self, topic: str, payload: bytes | str, *, timeout: float = 5.0, key: str | None = None,
                      tags: dict[str, str] | None = None) -> Message:  # fmt: skip
        """Publish a request on ``topic`` and wait for the first reply (a subscriber's
        ``msg.respond(...)``); raises TimeoutError after ``timeout`` seconds without one."""
        self._check_open()
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, not {timeout!r}")
        deadline = self._now() + timeout
        inbox = await self._open_inbox(deadline)
        self._requests += 1
        rid = str(self._requests)
        self._replies[rid] = None
        try:
            await self.publish(topic, payload, key, {**(tags or {}), REPLY_TO: inbox.topic, REQUEST_ID: rid})
            if not await self._until(lambda: self._replied(rid, inbox), deadline):
                raise TimeoutError(f"no reply to the request on {topic!r} within {timeout} s")
            reply = self._replies[rid]
            if reply is None:
                raise NodeLost(f"the reply inbox ended: {inbox.reason}")
            return reply
        finally:
            del self._replies[rid]

    async def _open_inbox(self, deadline: float) -> Subscription:
        if self._inbox is None or self._inbox.reason is not None:
            self._inbox = Subscription(self, f"_INBOX.{self.client_id.hex()}", None, RELIABLE, None)
            self._inbox.begin()
        inbox = self._inbox
        if not await inbox.confirmation(deadline):
            raise TimeoutError("the reply inbox was not confirmed in time")
        if inbox.reason is not None:
            raise NodeLost(f"the reply inbox was refused: {inbox.reason}")
        return inbox

    def _replied(self, rid: str, inbox: Subscription) -> bool:
        """Move what reached the inbox to the requests that wait for it (late replies are dropped)."""
        st, s = inbox.state, inbox.session
        while st.queue:
            msg = st.queue.popleft()
            s.consumed(st)
            n = (msg.tags or {}).get(REQUEST_ID)
            if n in self._replies and self._replies[n] is None:
                self._replies[n] = msg
        return self._replies[rid] is not None or st.reason is not None

    def _answer(self, req: Request, payload: bytes | str, tags: dict[str, str] | None,
                timeout: float | None = None) -> Any:  # fmt: skip
        return self.publish(req.reply_to, payload, None, {**(tags or {}), REQUEST_ID: (req.tags or {})[REQUEST_ID]},
                            timeout=timeout)  # fmt: skip

    def _as_request(self, msg: Message) -> Message:
        """A Request, if its reply topic is one we could answer on (anyone may send the tags)."""
        try:
            wire.check_topic((msg.tags or {})[REPLY_TO])
        except wire.WireError:
            return msg
        req = Request(*msg)
        req._answer = self._answer
        return req


class Subscription:
    """An async context manager and async iterator of :class:`Message`.

    Iteration ends when the subscription ends; :attr:`error` then says why
    (``out_of_capacity``, ``node_lost``, ``timed_out``, ``refused: ...``), or is
    None after a plain unsubscribe. A message that asks for an answer
    (:meth:`ClientAPI.request`) comes as a :class:`Request`.
    """

    def __init__(self, client: ClientAPI, topic: str, key: str | None, mode: int,
                 callback: Callable[[Message], Any] | None = None) -> None:  # fmt: skip
        self.client = client
        self.topic = topic
        self.key = key
        self.mode = mode
        self.callback = callback
        self._st: SubState | None = None
        self._session: ClientSession | None = None  # the session it was made on (client/router.py)

    async def __aenter__(self) -> Subscription:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.client._closed:
            await self.unsubscribe()

    @property
    def state(self) -> SubState:
        assert self._st is not None, "use 'async with' or await start() first"
        return self._st

    @property
    def session(self) -> ClientSession:
        assert self._session is not None, "use 'async with' or await start() first"
        return self._session

    def begin(self) -> None:
        """Send the subscription (the confirmation comes later)."""
        c = self.client
        c._check_open()
        self._session, self._st = c.router.subscribe(self.topic, self.key, self.mode)
        c._kick()

    async def confirmation(self, deadline: float = math.inf) -> bool:
        """Wait until the node confirms or refuses the subscription; False at the deadline."""
        st = self.state
        return await self.client._until(lambda: st.confirmed or st.reason is not None, deadline)

    async def start(self, timeout: float | None = None) -> None:
        """Subscribe and wait until the node confirms (or refuses); then start the callback, if any.
        TimeoutError after ``timeout`` seconds without an answer (the subscription stays asked for)."""
        self.begin()
        if not await self.confirmation(math.inf if timeout is None else self.client._now() + timeout):
            raise TimeoutError(f"the subscription to {self.topic!r} was not confirmed within {timeout} s")
        if self.callback is not None and self.reason is None:
            self.client._background(self._dispatch)

    async def _dispatch(self) -> None:
        assert self.callback is not None
        async for msg in self:
            try:
                got = self.callback(msg)
                if inspect.isawaitable(got):
                    await got
            except Exception as exc:
                self.client.callback_errors += 1
                self.client.last_callback_error = exc

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

    async def next(self, timeout: float | None = None) -> Message:
        """The next message; StopAsyncIteration once the subscription ended, TimeoutError after
        ``timeout`` seconds (None: wait) without one."""
        st, c = self.state, self.client
        deadline = math.inf if timeout is None else c._now() + timeout
        while True:
            if not st.queue:
                if not await c._until(lambda: bool(st.queue) or st.reason is not None, deadline):
                    raise TimeoutError(f"no message on {self.topic!r} within {timeout} s")
                if not st.queue:
                    raise StopAsyncIteration
            c._since_yield += 1
            if c._since_yield >= 64:  # let the I/O loop run during long bursts
                c._since_yield = 0
                await c._checkpoint()
                continue  # (look again: another task may have taken it meanwhile)
            self.session.consumed(st)  # (taken and counted with no await between: a cancel cannot split them)
            msg = st.queue.popleft()
            if msg.tags and REPLY_TO in msg.tags and REQUEST_ID in msg.tags:
                return c._as_request(msg)
            return msg

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        return await self.next()
