"""The client API, written once for every shell: publish, subscribe, request/reply (and, through
the :class:`roost.client.durableapi.DurableAPI` it holds, durable logs).

:class:`ClientAPI` is a concrete class made of components: its connection (client/connection.py:
the names, the router, the sockets, the closed state, one I/O turn), its shell (the I/O
primitives of one event loop, client/shell.py's interface, implemented by client/library.py for
trio and client/aio.py for asyncio: each of those modules' ``Client`` is this class naming its
shell, ``_shell_class``), the turn policy they share (client/turns.py) and its durable mode. The
shell's primitives the calls use on every message are bound to the client once, at
construction (``_kick``, ``_until``...), so a publish calls the shell's method with no hop
between.

Request/reply is built on plain subscriptions, as in NATS: each client subscribes (reliably) to
its own inbox topic ``_INBOX.<client id>`` on its first request, and a request is a reliable
publish with two tags, ``roost.reply_to`` (the inbox) and ``roost.request`` (the request's
number). A subscriber sees such a message as a :class:`Request`, and ``respond`` publishes the
answer to the inbox with the same number. Replies for requests that timed out are dropped.
"""

from __future__ import annotations

import datetime
import math
import os
import socket
from collections.abc import Callable
from types import TracebackType
from typing import Any, ClassVar, Self

from roost.client import wire
from roost.client.addresses import Addr, NodeSpec
from roost.client.connection import ClientClosed, Connection, NodeLost, check_timeout
from roost.client.durableapi import DurableAPI, LogRead
from roost.client.durableclient import durable_id
from roost.client.receive import Message
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession
from roost.client.shell import Shell
from roost.client.subscription import Subscription
from roost.client.turns import TurnPolicy
from roost.client.udp import send_now
from roost.client.wire import MODE_NAMES

REPLY_TO = "roost.reply_to"
REQUEST_ID = "roost.request"
RELIABLE = MODE_NAMES["reliable"]
_IS_RELIABLE = {name: mode == RELIABLE for name, mode in MODE_NAMES.items()}

__all__ = ["ClientAPI", "ClientClosed", "LogRead", "Message", "NodeLost", "Request", "Subscription", "durable_id",
           "request_of"]  # fmt: skip


def _payload_bytes(payload: Any) -> bytes:
    """A payload as the wire carries it: a str's UTF-8, a bytes-like object's bytes. Anything
    else is refused here: packed as it is, the node refuses the whole PUB datagram, the valid
    messages in it with it, and a reliable one is then resent for ever."""
    if isinstance(payload, str):
        return payload.encode()
    if isinstance(payload, bytes | bytearray | memoryview):
        return bytes(payload)
    raise TypeError(f"payload must be bytes or str (or a bytearray or memoryview), not {type(payload).__name__}")


def _mode(mode: str) -> int:
    try:
        return MODE_NAMES[mode]
    except KeyError:
        raise ValueError(f"mode must be one of {', '.join(MODE_NAMES)}, not {mode!r}") from None


class Request(Message):
    """A message that asks for an answer (it came from :meth:`ClientAPI.request`).

    ``respond`` (:class:`Message`'s) publishes the answer to the requester's inbox; in the async
    clients it returns an awaitable, in the blocking client it returns once the answer is sent.
    A Request is a Message with the same fields that carries what answers it, given when it is
    made (:func:`request_of`): the reply topic and the function that answers."""

    _reply_to: str
    _responder: Responder


#: What answers a request: ``responder(request, payload, tags)`` (ClientAPI._answer, or the
#: blocking client's, which waits until the answer is sent).
Responder = Callable[[Request, bytes | str, dict[str, str] | None], Any]


def request_of(msg: Message, reply_to: str, responder: Responder) -> Request:
    """``msg`` as a :class:`Request` answered on ``reply_to`` by ``responder``."""
    req = Request(*msg)
    req._reply_to = reply_to
    req._responder = responder
    return req


class ShellAttribute:
    """An attribute of a client that is its shell's (the asyncio client's ``loop``): the client
    shows it without a method of its own, and it is read from the shell each time."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, client: ClientAPI | None, owner: type | None = None) -> Any:
        return self if client is None else getattr(client._shell, self.name)


class ClientAPI:
    """Everything a client does (see the module): its shell's I/O over its connection.

    A subclass names its shell (``_shell_class``) and adds nothing else: client/library.py's
    ``Client`` (trio), client/aio.py's (asyncio)."""

    _shell_class: ClassVar[type[Shell]]

    def __init__(
        self,
        node: NodeSpec = None,
        *,
        members: NodeSpec = None,
        client_id: bytes | None = None,
        config: ClientConfig | None = None,
        producer_id: bytes | None = None,
        offsets_dir: str | os.PathLike[str] | None = None,
        send: Callable[[socket.socket, list[tuple[Addr, bytes]]], int] = send_now,
        router: Callable[..., Router] = Router,
    ) -> None:
        """``node``: the node to talk to first, as ``"host:port"``, ``(host, port)``, or a list of
        them (``"h1:7400,h2:7400"``) tried in turn; None means ``ROOST_NODES`` or 127.0.0.1:7400.
        Host names are resolved when the client connects and again when its node goes quiet.
        ``members`` (optional): more nodes to fail over to; the cluster map in WELCOME adds the
        rest. ``producer_id`` (16 bytes, default random) names this client's reliable publishes:
        a client that publishes the same sequence of messages again under the same producer id
        (a retried Spark task) has them delivered once. ``offsets_dir``: where durable readers
        record what they committed before the cluster hears it (client/offsets.py): no repeats
        after a crash there. ``send`` (client/udp.py's ``send_now``: how many failed) sends a
        session's datagrams, and ``router`` makes the router (client/router.py's ``Router``):
        what tests give to watch what leaves, or to plant a fault where datagrams are fed."""
        conn = self._conn = Connection(
            node, members=members, client_id=client_id, config=config, producer_id=producer_id,
            offsets_dir=offsets_dir, send=send, router=router,
        )  # fmt: skip
        self.config = conn.config
        self.client_id, self.producer_id = conn.client_id, conn.producer_id
        self._turns = TurnPolicy(conn.config)  # (quiet path, bursts, sparse path, held sends)
        shell = self._shell = conn.shell = self._shell_class(conn, self._turns)
        # The primitives the calls use on every message, the shell's bound methods taken once:
        # a publish calls the shell's kick with no hop through the shell object or a wrapper.
        self._now = shell.now
        self._until = shell.until
        self._kick = shell.kick
        self._checkpoint = shell.checkpoint
        self._kick_wakes = shell.kick_wakes  # (truthy while _kick may have something to do: publish)
        self._deadline = conn.deadline
        self._check_open = conn.check_open
        self._since_yield = 0
        self.callback_errors = 0  # exceptions raised by subscription callbacks (the client carries on)
        self.last_callback_error: BaseException | None = None
        self._inbox: Subscription | None = None  # (request/reply)
        self._requests = 0
        self._replies: dict[str, Message | None] = {}  # request number -> its reply, while awaited
        self._durable = DurableAPI(conn, shell)  # (durable mode: put, get, read, position, commit)

    # ------------------------------------------------------------ the connection

    @property
    def router(self) -> Router:
        """The client's router (client/router.py); RuntimeError before it connected."""
        return self._conn.router

    @property
    def session(self) -> ClientSession:
        """The first session: the user's client id, talking to ``node`` (the only one
        unless a partitioned cluster sent its map)."""
        return self._conn.router.first

    @property
    def node(self) -> Addr:
        """The node this client talks to first (its resolved address once connected)."""
        return self._conn.node

    @property
    def send_errors(self) -> int:
        """Datagrams the socket refused to send (the protocols' retries repair that)."""
        return self._conn.send_errors

    @property
    def session_errors(self) -> int:
        """Datagrams the session failed on (a bug; the client carries on)."""
        return self._conn.session_errors

    @property
    def last_session_error(self) -> Exception | None:
        return self._conn.last_session_error

    async def __aenter__(self) -> Self:
        await self._shell.open()
        try:
            await self._conn.connect()
        except BaseException:
            await self._shell.shutdown()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        conn = self._conn
        try:
            if et is None and conn._router is not None and conn.session.connected:
                await self.flush(timeout=self.config.node_timeout)
        finally:
            conn.goodbye()
            await self._shell.shutdown()

    async def aclose(self) -> None:
        """Close without ``async with`` (what leaving it does: flush for ``node_timeout`` at most)."""
        await self.__aexit__(None, None, None)

    # ------------------------------------------------------------ publishing

    async def publish(
        self,
        topic: str,
        payload: bytes | str | bytearray | memoryview,
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
        conn = self._conn
        if conn.closed:
            raise conn.closed_error()
        if payload.__class__ is not bytes:
            payload = _payload_bytes(payload)
        reliable = _IS_RELIABLE.get(mode)
        if reliable is None:
            reliable = _mode(mode) == RELIABLE  # (the error, for a mode that is not a name)
        if timeout is not None:  # (before anything is queued; 0 cannot wait for a PUBACK)
            check_timeout(timeout, zero=not (wait and reliable))
        r = conn._router or conn.router
        if reliable or r.cmap is not None:
            seq = r.offer(topic, key, tags, payload, reliable)  # (None: no room in the window)
        else:  # (a fire publish with one session goes to it: Router.offer adds nothing there)
            seq = r.first.pub.publish(topic, key, tags, payload, False)
        if seq is None or wait:
            return await self._publish_waiting(r, seq, topic, key, tags, payload, reliable, wait, timeout)
        self._since_yield += 1
        if self._kick_wakes or r.cmap is not None:  # (else _kick has nothing to do: ~60 ns a publish)
            self._kick()  # (it wakes a waiting I/O loop, and starts one for each session opened: that takes a map)
        if self._since_yield >= self.config.yield_every:
            self._since_yield = 0
            await self._checkpoint()
        return seq

    async def _publish_waiting(self, r: Router, seq: int | None, topic: str, key: str | None,
                               tags: dict[str, str] | None, payload: bytes, reliable: bool, wait: bool,
                               timeout: float | None) -> int:  # fmt: skip
        """``publish``'s waits, apart from its common case: for room in the window (``seq``
        None: not offered yet), then with ``wait`` for the acknowledgement."""
        deadline = self._deadline(timeout, zero=not (wait and reliable))
        if seq is None:
            self._kick()
            if not await self._until(lambda: not r.window_full(topic) or r.lost, deadline):
                raise TimeoutError(f"no room in the publish window within {timeout} s: not published")
            if r.lost:
                raise NodeLost("node lost: not published")
            seq = r.publish(topic, key, tags, payload, reliable)
        self._since_yield += 1
        self._kick()
        if wait and reliable:
            if not await self._until(lambda: r.acked >= seq or r.lost, deadline):
                raise TimeoutError(f"not acknowledged within {timeout} s (it stays queued and is retried)")
            if r.acked < seq:
                raise NodeLost("node lost before acknowledging the publish")
        elif self._since_yield >= self.config.yield_every:
            self._since_yield = 0
            await self._checkpoint()
        return seq

    async def flush(self, timeout: float | None = math.inf) -> bool:
        """Wait until every reliable publish, every durable put and every command so far is
        acknowledged, on every session (``timeout`` 0: whether they are, now)."""
        deadline = self._deadline(timeout, zero=True)
        r = self.router
        self._kick()
        marks = r.flush_marks()
        puts = r.putter.marks()

        def done() -> bool:
            return r.lost or (r.flushed(marks) and r.putter.flushed(puts))

        if self._conn.closed:
            return False
        try:
            return await self._until(done, deadline) and not r.lost
        except ClientClosed:  # (closed meanwhile: not everything is known to be acknowledged)
            return False

    async def status(self, timeout: float = 3.0) -> dict[str, Any]:
        """The status map of the node this client was given (what ``roost status`` prints).
        One STATUS datagram, never sent again: ``timeout`` is what ends the wait for a lost one,
        so it cannot be None."""
        deadline = self._deadline(timeout, none=False)
        s = self.session
        s.last_status = None
        s.status_request()
        self._kick()
        if not await self._until(lambda: s.last_status is not None, deadline):
            raise NodeLost("no STATUS reply from the node")
        assert s.last_status is not None
        return s.last_status

    # ------------------------------------------------------------ durable mode (client/durableapi.py)

    async def put(self, topic: str, payload: bytes | str, key: str | None = None,
                  tags: dict[str, str] | None = None, *, wait: bool = False,
                  timeout: float | None = None) -> tuple[int, int]:  # fmt: skip
        """Publish one message durably (docs/durable.md): stored in the log of its topic's
        partition on both owners before it is acknowledged. Returns (partition, sequence);
        ``wait=True`` returns only after the acknowledgement. Needs a partitioned cluster.
        ``timeout`` bounds the waits, as for :meth:`publish`."""
        return await self._durable.put(topic, payload, key, tags, wait=wait, timeout=timeout)

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
        return await self._durable.get(topic, durable, count, start=start, timeout=timeout, client=client)

    async def read(self, topic: str, offset: int = 0, count: int = 1000, *,
                   timeout: float | None = 10.0) -> LogRead:  # fmt: skip
        """Read committed messages of ``topic`` from log offset ``offset`` (up to ``count``), without a
        durable subscription: for readers that keep their own offsets (the Spark source). Raises
        NodeLost when the partition's primary does not answer within ``timeout``."""
        return await self._durable.read(topic, offset, count, timeout=timeout)

    def position(self, topic: str, durable: str, *, client: str = "default") -> int | None:
        """The offset :meth:`commit` would move the cursor of (``client``, ``durable``) on ``topic``
        to: past everything :meth:`get` returned in this process (None before its first answer).
        An application that records what it processed (docs/durable.md) logs this with the commit."""
        return self._durable.position(topic, durable, client=client)

    async def commit(self, topic: str, durable: str, *, client: str = "default",
                     timeout: float | None = 10.0) -> bool:  # fmt: skip
        """Move the cursor of durable subscription (``client``, ``durable``) past everything
        :meth:`get` returned; True once that is on disk on the partition's owners."""
        return await self._durable.commit(topic, durable, client=client, timeout=timeout)

    # ------------------------------------------------------------ subscribing

    def subscribe(self, topic: str, key: str | None = None, mode: str = "reliable", *,
                  query: str | None = None, queue: str | None = None,
                  callback: Callable[[Message], Any] | None = None) -> Subscription:  # fmt: skip
        """A subscription to use with ``async with`` and ``async for msg in sub``.

        ``topic`` may hold wildcards: ``*`` for one token, ``>`` (last) for the rest
        (``orders.*.paid``, ``orders.>``). ``query`` (Tendermint's language, as
        ``"kind = 'order' AND amount > 100"``) passes only messages whose tags satisfy it;
        ``queue`` joins a queue group, which gets each message once, at one of its members.
        A bad pattern, query or group name raises ValueError saying what and where.
        With ``callback`` (a function or a coroutine function of the message), a task of the
        client calls it for each message instead; what it raises is counted in ``callback_errors``."""
        return Subscription(self, topic, key, _mode(mode), callback, query=query, queue=queue)

    # ------------------------------------------------------------ request/reply

    async def request(self, topic: str, payload: bytes | str, *, timeout: float | None = 5.0, key: str | None = None,
                      tags: dict[str, str] | None = None) -> Message:  # fmt: skip
        """Publish a request on ``topic`` and wait for the first reply (a subscriber's
        ``msg.respond(...)``); raises TimeoutError after ``timeout`` seconds without one."""
        self._check_open()
        deadline = self._deadline(timeout)
        inbox = await self._open_inbox(deadline)
        self._requests += 1
        rid = str(self._requests)
        self._replies[rid] = None
        try:
            await self.publish(
                topic,
                payload,
                key,
                {**(tags or {}), REPLY_TO: inbox.topic, REQUEST_ID: rid},
                timeout=max(0.0, deadline - self._now()),
            )  # (room in the window: within it too)
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
            msg = st.take()
            s.consumed(st)
            n = (msg.tags or {}).get(REQUEST_ID)
            if n in self._replies and self._replies[n] is None:
                self._replies[n] = msg
        return self._replies[rid] is not None or st.reason is not None

    def _answer(self, req: Request, payload: bytes | str, tags: dict[str, str] | None = None,
               timeout: float | None = None) -> Any:  # fmt: skip
        """The publish (an awaitable) that answers ``req`` (its ``respond``)."""
        return self.publish(req._reply_to, payload, None, {**(tags or {}), REQUEST_ID: (req.tags or {})[REQUEST_ID]},
                            timeout=timeout)  # fmt: skip

    def _as_request(self, msg: Message) -> Message:
        """A message with tags as the application gets it: a Request if it asks for an answer
        and its reply topic is one we could answer on (anyone may send the tags)."""
        tags = msg.tags or {}
        if REPLY_TO not in tags or REQUEST_ID not in tags:
            return msg
        try:
            wire.check_topic(tags[REPLY_TO])
        except wire.WireError:
            return msg
        return request_of(msg, tags[REPLY_TO], self._answer)
