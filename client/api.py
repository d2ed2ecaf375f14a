"""The client API, written once for every shell: publish, subscribe, request/reply (and, through
the :class:`roost.client.durableapi.DurableAPI` it holds, durable logs), over the primitives of
client/clientbase.py.

Request/reply is built on plain subscriptions, as in NATS: each client subscribes (reliably) to
its own inbox topic ``_INBOX.<client id>`` on its first request, and a request is a reliable
publish with two tags, ``roost.reply_to`` (the inbox) and ``roost.request`` (the request's
number). A subscriber sees such a message as a :class:`Request`, and ``respond`` publishes the
answer to the inbox with the same number. Replies for requests that timed out are dropped.
"""

from __future__ import annotations

import datetime
import inspect
import math
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

from roost.client import subjects, wire
from roost.client.clientbase import ClientBase, ClientClosed, NodeLost, check_timeout
from roost.client.durableapi import DurableAPI, LogRead
from roost.client.durableclient import durable_id
from roost.client.receive import Fields, Message, Receiver, SubState, message_of
from roost.client.router import Router
from roost.client.session import ClientSession
from roost.client.wire import MODE_NAMES, Reason

REPLY_TO = "roost.reply_to"
REQUEST_ID = "roost.request"
RELIABLE = MODE_NAMES["reliable"]
_IS_RELIABLE = {name: mode == RELIABLE for name, mode in MODE_NAMES.items()}
_new = tuple.__new__  # (message_of without its partial: Subscription.__anext__)

__all__ = ["ClientAPI", "ClientClosed", "LogRead", "Message", "NodeLost", "Request", "Subscription", "durable_id"]


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

    ``respond`` publishes the answer to the requester's inbox; in the async clients it returns
    an awaitable, in the blocking client it returns once the answer is sent."""

    _answer: Callable[[Request, bytes | str, dict[str, str] | None], Any]

    @property
    def reply_to(self) -> str:
        return (self.tags or {})[REPLY_TO]  # (a Request is made only when the tag is there)

    def respond(self, payload: bytes | str, tags: dict[str, str] | None = None) -> Any:
        return self._answer(self, payload, tags)


class ClientAPI(ClientBase):
    """Everything a client does, over the primitives its shell provides (client/clientbase.py)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        """(ClientBase's arguments)"""
        super().__init__(*args, **kwargs)
        self._durable = DurableAPI(self)  # (durable mode: put, get, read, position, commit)

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
        if self._closed:
            raise self._closed_error()
        if payload.__class__ is not bytes:
            payload = _payload_bytes(payload)
        reliable = _IS_RELIABLE.get(mode)
        if reliable is None:
            reliable = _mode(mode) == RELIABLE  # (the error, for a mode that is not a name)
        if timeout is not None:  # (before anything is queued; 0 cannot wait for a PUBACK)
            check_timeout(timeout, zero=not (wait and reliable))
        r = self._router or self.router
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

        if self._closed:
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

    def _answer(self, req: Request, payload: bytes | str, tags: dict[str, str] | None,
                timeout: float | None = None) -> Any:  # fmt: skip
        return self.publish(req.reply_to, payload, None, {**(tags or {}), REQUEST_ID: (req.tags or {})[REQUEST_ID]},
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
                 callback: Callable[[Message], Any] | None = None, *, query: str | None = None,
                 queue: str | None = None) -> None:  # fmt: skip
        self.client = client
        self.topic = topic
        # what the subscription is called on the wire and at the nodes (client/subjects.py)
        plain = query is None and queue is None and subjects.is_plain(topic)
        self.filter = topic if plain else subjects.make_filter(topic, queue, query)
        self.query = query
        self.queue = queue
        self.key = key
        self.mode = mode
        self.callback = callback
        self._st: SubState | None = None
        self._session: ClientSession | None = None  # the session it was made on (client/router.py)
        self._recv: Receiver  # its receiver, from begin() on (read per message taken: __anext__)

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
        self._session, self._st = c.router.subscribe(self.filter, self.key, self.mode)
        self._recv = self._session.recv
        c._kick()

    async def confirmation(self, deadline: float = math.inf) -> bool:
        """Wait until the node confirms or refuses the subscription; False at the deadline."""
        st = self.state
        return await self.client._until(lambda: st.confirmed or st.reason is not None, deadline)

    async def start(self, timeout: float | None = None) -> None:
        """Subscribe and wait until the node confirms (or refuses); then start the callback, if any.
        TimeoutError after ``timeout`` seconds without an answer (the subscription stays asked for)."""
        deadline = self.client._deadline(timeout)
        self.begin()
        if not await self.confirmation(deadline):
            await self.unsubscribe()  # (not left to collect messages nobody reads)
            raise TimeoutError(f"the subscription to {self.topic!r} was not confirmed within {timeout} s")
        if self.callback is not None and self.reason is None:
            self.client._background(self._dispatch)

    async def _dispatch(self) -> None:
        try:
            await self._feed_callback()
        except ClientClosed:  # (the client ended: so does the callback's task, quietly)
            return

    async def _feed_callback(self) -> None:
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
            self.client.router.unsubscribe(self.filter, self.key)
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
        deadline = c._deadline(timeout, zero=True)
        while True:
            if not st.queue:
                if not await c._until(lambda: bool(st.queue) or st.reason is not None, deadline):
                    raise TimeoutError(f"no message on {self.topic!r} within {timeout} s")
                if not st.queue:
                    raise StopAsyncIteration
            c._since_yield += 1
            if c._since_yield >= c.config.yield_every:  # let the I/O loop run during long bursts
                c._since_yield = 0
                await c._checkpoint()
                if not st.queue:
                    continue  # (another task took it meanwhile: wait again)
            self.session.consumed(st)  # (taken and counted with no await between: a cancel cannot split them)
            msg = st.take()
            if st.origins is not None:
                c._kick()  # (a queue group's message is acknowledged now that it is taken)
            return c._as_request(msg) if msg.tags else msg

    async def next_batch(self, max_count: int = 1024, timeout: float | None = None) -> list[Message]:
        """What is queued, up to ``max_count`` messages, waiting as ``next`` does for the first:
        for a subscriber that works on lists (one call, one checkpoint, one count of what it
        took, however many came). StopAsyncIteration once the subscription ended and nothing
        is left, TimeoutError after ``timeout`` seconds without a message."""
        if isinstance(max_count, bool) or not isinstance(max_count, int) or max_count < 1:
            raise ValueError(f"max_count must be an integer of at least 1, not {max_count!r}")
        out = [await self.next(timeout)]
        st, c = self.state, self.client
        n = min(max_count - 1, len(st.queue))
        if n:
            self.session.consumed(st, n)  # (counted and taken with no await between, as in next)
            take = st.take
            for _ in range(n):
                msg = take()
                out.append(c._as_request(msg) if msg.tags else msg)
            if st.origins is not None:
                c._kick()
        return out

    def batches(self, max_count: int = 1024) -> AsyncIterator[list[Message]]:
        """``async for batch in sub.batches()``: ``next_batch`` until the subscription ends."""
        return _Batches(self, max_count)

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        # (the common case without a second coroutine: a message is queued, no queue group, no
        # checkpoint due; anything else is next's)
        st, c = self._st, self.client
        if st is not None and st.queue and st.origins is None and c._since_yield < c.config.yield_every - 1:
            c._since_yield += 1
            recv = self._recv
            if st.counted and not recv.held:
                recv.buffered -= 1  # (Receiver.consumed's case without a queue group or held messages)
            else:
                recv.consumed(st)
            item = st.queue.popleft()  # (SubState.take, written out)
            if item.__class__ is bytes:
                return _new(Message, (st.topic, None, None, item, st.seqs.popleft()))
            fields = cast(Fields, item)
            return c._as_request(message_of(fields)) if fields[2] else message_of(fields)
        return await self.next()


class _Batches:
    """The async iterator of ``Subscription.batches``."""

    def __init__(self, sub: Subscription, max_count: int) -> None:
        self.sub, self.max_count = sub, max_count

    def __aiter__(self) -> _Batches:
        return self

    async def __anext__(self) -> list[Message]:
        return await self.sub.next_batch(self.max_count)
