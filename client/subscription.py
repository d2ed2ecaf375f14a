"""A subscription of the async clients: an async context manager and iterator of messages.

What ``ClientAPI.subscribe`` returns (client/api.py): it asks the client's router for the
subscription, waits on the client's shell for its confirmation and its messages, takes them
from the subscription's queue (client/receive.py's ``SubState``) and counts them as taken, and
hands each to the application as a :class:`Message` (a :class:`roost.client.api.Request` when
it asks for an answer). With a callback, a task of the client feeds it instead.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, cast

from roost.client import subjects
from roost.client.connection import ClientClosed
from roost.client.receive import Fields, Message, Receiver, SubState, message_of
from roost.client.session import ClientSession
from roost.client.wire import Reason

if TYPE_CHECKING:
    from roost.client.api import ClientAPI

_new = tuple.__new__  # (message_of without its partial: Subscription.__anext__)

__all__ = ["Subscription"]


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
        if not self.client._conn.closed:
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
            self.client._shell.background(self._dispatch)

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
