"""The blocking client for threads: :class:`Client`, the asyncio client run in a thread of its own.

A session needs its I/O to run while the application does something else (acknowledge what
arrives, answer the node's liveness checks, resend what was lost), so the blocking client cannot
be a loop the caller drives: it starts an asyncio event loop in a daemon thread, runs the asyncio
client (client/aio.py) there, and each call submits a coroutine to it and waits for the result,
for at most ``timeout`` seconds. Any number of threads may call one client. A subscription's
``callback`` runs in a worker thread, one message at a time, so it may call the client itself.

    with Client("127.0.0.1:7400") as c:
        with c.subscribe("prices") as sub:
            c.publish("prices", b"42")
            for msg in sub:
                ...
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import math
import threading
from collections.abc import Callable, Coroutine, Iterator
from types import TracebackType
from typing import Any, Self, TypeVar

from roost.client import aio
from roost.client.api import ClientClosed, LogRead, NodeLost, Request, durable_id, request_of
from roost.client.connection import check_timeout
from roost.client.receive import Message
from roost.client.session import ClientConfig

__all__ = ["Client", "ClientClosed", "ClientConfig", "LogRead", "Message", "NodeLost", "Request", "Subscription",
           "durable_id"]  # fmt: skip

R = TypeVar("R")


class Default:
    """The client's own ``timeout`` (a call's ``timeout=None`` means no limit)."""


DEFAULT = Default()


class Client:
    """The client for plain threads (see client/api.py's ClientAPI for what each call does).

    ``timeout`` (seconds, None: no limit) bounds every call that waits for the cluster, unless
    the call takes its own; a call that runs out raises TimeoutError. The other arguments are
    those of the async clients (``node`` may be a list; None means ``ROOST_NODES``)."""

    def __init__(self, node: Any = None, *, timeout: float | None = 30.0, **kwargs: Any) -> None:
        self.timeout = check_timeout(timeout)
        self.aclient = aio.Client(node, **kwargs)
        self._loop: asyncio.AbstractEventLoop | None = None  # (made by connect: a client never used holds none)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # (a call is submitted to the loop, or the client is closed: not both)
        self._state = "new"  # -> "open" -> "closing" -> "closed"

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close(flush=et is None)

    def connect(self) -> None:
        """Start the I/O thread and connect (NodeLost when no node answers). Once per client."""
        with self._lock:
            if self._state != "new":
                raise ClientClosed(f"connect() is called once per client (this one is {self._state})")
            self._state = "open"
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="roost-client", daemon=True)
            self._thread.start()
        try:
            self._call(self.aclient.__aenter__())
        except BaseException:
            self._stop()
            raise

    def close(self, flush: bool = True) -> None:
        """Wait (for ``node_timeout`` at most) until what was published is acknowledged, then stop.
        Calls other threads are waiting in raise ClientClosed; a second close waits for the first."""
        with self._lock:
            first = self._state == "open"
            if first:
                self._state = "closing"
        if not first:
            if self._thread is not None and self._thread is not threading.current_thread():
                self._thread.join()
            return
        try:
            self._call(self.aclient.__aexit__(None if flush else RuntimeError, None, None), closing=True)
        finally:
            self._stop()

    def _stop(self) -> None:
        """No call is taken from now on; every call under way ends (ClientClosed), then the loop."""
        with self._lock:
            if self._state == "closed":
                return
            self._state = "closed"
        loop, thread = self._loop, self._thread
        assert loop is not None and thread is not None
        if thread.is_alive():
            done = asyncio.run_coroutine_threadsafe(_cancel_the_rest(), loop)
            try:
                done.result()
            finally:
                loop.call_soon_threadsafe(loop.stop)
                if thread is not threading.current_thread():
                    thread.join()
        if not loop.is_running():
            loop.close()

    def _call(self, coro: Coroutine[Any, Any, R], closing: bool = False) -> R:
        """Run ``coro`` on the client's loop and wait for it (the calls bound their own waits on
        the loop, where a time-out cannot lose what they took). Interrupted (Ctrl-C), it is
        cancelled there too, so no orphan goes on to take the next message."""
        with self._lock:
            if self._state != ("closing" if closing else "open") or self._loop is None:
                coro.close()
                raise ClientClosed("the client is closed (or was never connected: use 'with Client(...)')")
            fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result()
        except concurrent.futures.CancelledError:
            raise ClientClosed("the client was closed during the call") from None
        except BaseException:
            fut.cancel()
            raise

    @property
    def session(self) -> Any:
        return self.aclient.session

    @property
    def router(self) -> Any:
        return self.aclient.router

    @property
    def node(self) -> tuple[str, int]:
        return self.aclient.node

    @property
    def client_id(self) -> bytes:
        return self.aclient.client_id

    @property
    def producer_id(self) -> bytes:
        return self.aclient.producer_id

    @property
    def config(self) -> ClientConfig:
        return self.aclient.config

    @property
    def callback_errors(self) -> int:
        return self.aclient.callback_errors

    @property
    def last_callback_error(self) -> BaseException | None:
        return self.aclient.last_callback_error

    @property
    def send_errors(self) -> int:
        return self.aclient.send_errors

    @property
    def session_errors(self) -> int:
        return self.aclient.session_errors

    @property
    def last_session_error(self) -> Exception | None:
        return self.aclient.last_session_error

    # ------------------------------------------------------------ the API

    def publish(self, topic: str, payload: bytes | str | bytearray | memoryview, key: str | None = None,
                tags: dict[str, str] | None = None,
                *, mode: str = "reliable", wait: bool = False,
                timeout: float | Default | None = DEFAULT) -> int:  # fmt: skip
        t = self._timeout(timeout)
        return self._call(self.aclient.publish(topic, payload, key, tags, mode=mode, wait=wait, timeout=t))

    def flush(self, timeout: float | None = math.inf) -> bool:
        return self._call(self.aclient.flush(timeout))

    def status(self, timeout: float = 3.0) -> dict[str, Any]:
        return self._call(self.aclient.status(timeout))

    def put(self, topic: str, payload: bytes | str, key: str | None = None, tags: dict[str, str] | None = None,
            *, wait: bool = False, timeout: float | Default | None = DEFAULT) -> tuple[int, int]:  # fmt: skip
        t = self._timeout(timeout)
        return self._call(self.aclient.put(topic, payload, key, tags, wait=wait, timeout=t))

    def get(self, topic: str, durable: str, count: int = 1, *, start: str | int | datetime.datetime = "earliest",
            timeout: float | None = None, client: str = "default") -> list[Message]:  # fmt: skip
        return self._call(self.aclient.get(topic, durable, count, start=start, timeout=timeout, client=client))

    def read(self, topic: str, offset: int = 0, count: int = 1000, *, timeout: float | None = 10.0) -> LogRead:
        return self._call(self.aclient.read(topic, offset, count, timeout=timeout))

    def position(self, topic: str, durable: str, *, client: str = "default") -> int | None:
        return self.aclient.position(topic, durable, client=client)

    def commit(self, topic: str, durable: str, *, client: str = "default", timeout: float | None = 10.0) -> bool:
        return self._call(self.aclient.commit(topic, durable, client=client, timeout=timeout))

    def request(self, topic: str, payload: bytes | str, *, timeout: float | None = 5.0, key: str | None = None,
                tags: dict[str, str] | None = None) -> Message:  # fmt: skip
        return self._blocking(self._call(self.aclient.request(topic, payload, timeout=timeout, key=key, tags=tags)))

    def subscribe(self, topic: str, key: str | None = None, mode: str = "reliable", *,
                  query: str | None = None, queue: str | None = None,
                  callback: Callable[[Message], Any] | None = None) -> Subscription:  # fmt: skip
        """A subscription to use with ``with`` and ``for msg in sub`` (or ``sub.next(timeout)``);
        ``topic``, ``query`` and ``queue`` as in the trio client. ``callback`` runs in a worker
        thread for each message instead."""
        return Subscription(self, topic, key, mode, callback, query, queue)

    def _timeout(self, timeout: float | Default | None) -> float | None:
        return self.timeout if isinstance(timeout, Default) else timeout

    def _blocking(self, msg: Message) -> Message:
        """A request whose ``respond`` returns once the answer is sent (not an awaitable)."""
        if not isinstance(msg, Request):
            return msg
        return request_of(msg, msg._reply_to, self._answer)

    def _answer(self, req: Request, payload: bytes | str, tags: dict[str, str] | None) -> None:
        """(A request's ``respond``: the asyncio client's answer, waited for.)"""
        self._call(self.aclient._answer(req, payload, tags, self.timeout))


class Subscription:
    """A context manager and iterator of :class:`Message`; iteration ends with the subscription
    (``error`` says why, as in the async clients)."""

    def __init__(self, client: Client, topic: str, key: str | None, mode: str,
                 callback: Callable[[Message], Any] | None, query: str | None = None,
                 queue: str | None = None) -> None:  # fmt: skip
        self.client = client
        self.topic, self.key, self.callback = topic, key, callback
        wrapped = None
        if callback is not None:

            def wrapped(msg: Message) -> Any:
                return asyncio.to_thread(callback, client._blocking(msg))

        self.asub = client.aclient.subscribe(topic, key, mode, query=query, queue=queue, callback=wrapped)
        self.filter, self.query, self.queue = self.asub.filter, query, queue

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client._state == "open":
            self.unsubscribe()

    @property
    def mode(self) -> int:
        return self.asub.mode

    def start(self, timeout: float | Default | None = DEFAULT) -> None:
        """Subscribe and wait until the node confirms (TimeoutError after ``timeout``, the client's
        own by default; the subscription is then withdrawn)."""
        self.client._call(self.asub.start(self.client._timeout(timeout)))

    def unsubscribe(self) -> None:
        self.client._call(self.asub.unsubscribe())

    @property
    def reason(self) -> str | None:
        return self.asub.reason

    @property
    def error(self) -> str | None:
        return self.asub.error

    @property
    def active(self) -> bool:
        return self.asub.active

    def next(self, timeout: float | None = None) -> Message:
        """The next message; TimeoutError after ``timeout`` seconds (None: wait), StopIteration
        once the subscription ended."""
        msg = self.client._call(_next_or_none(self.asub, timeout))  # (timed on the loop: nothing is lost)
        if msg is None:
            raise StopIteration
        return self.client._blocking(msg)

    def next_batch(self, max_count: int = 1024, timeout: float | None = None) -> list[Message]:
        """What is queued, up to ``max_count`` messages, waiting as ``next`` does for the first:
        one call into the client's loop for the lot (each is a hop between threads)."""
        batch = self.client._call(_batch_or_none(self.asub, max_count, timeout))
        if batch is None:
            raise StopIteration
        return [self.client._blocking(m) for m in batch]

    def batches(self, max_count: int = 1024) -> Iterator[list[Message]]:
        """``for batch in sub.batches()``: ``next_batch`` until the subscription ends."""
        while True:
            try:
                yield self.next_batch(max_count)
            except StopIteration:
                return

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        return self.next()


async def _next_or_none(sub: aio.Subscription, timeout: float | None) -> Message | None:
    try:
        return await sub.next(timeout)
    except StopAsyncIteration:
        return None


async def _batch_or_none(sub: aio.Subscription, max_count: int, timeout: float | None) -> list[Message] | None:
    try:
        return await sub.next_batch(max_count, timeout)
    except StopAsyncIteration:
        return None


async def _cancel_the_rest() -> None:
    """Cancel every task on the loop but this one (calls of other threads, callbacks, the I/O's
    own tasks) and wait until they are done, so that no caller waits on a loop that stopped."""
    me = asyncio.current_task()
    rest = [t for t in asyncio.all_tasks() if t is not me]
    for t in rest:
        t.cancel()
    await asyncio.gather(*rest, return_exceptions=True)
