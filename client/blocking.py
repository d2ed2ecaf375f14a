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
from roost.client.api import ClientClosed, LogRead, NodeLost, Request
from roost.client.receive import Message
from roost.client.session import ClientConfig

__all__ = ["Client", "ClientClosed", "ClientConfig", "LogRead", "Message", "NodeLost", "Request", "Subscription"]

R = TypeVar("R")


class Client:
    """The client for plain threads (see client/api.py's ClientAPI for what each call does).

    ``timeout`` (seconds, None: no limit) bounds every call that waits for the cluster, unless
    the call takes its own; a call that runs out raises TimeoutError. The other arguments are
    those of the async clients (``node`` may be a list; None means ``ROOST_NODES``)."""

    def __init__(self, node: Any = None, *, timeout: float | None = 30.0, **kwargs: Any) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds or None, not {timeout!r}")
        self.timeout = timeout
        self.aclient = aio.Client(node, **kwargs)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="roost-client", daemon=True)
        self._open = False

    # ------------------------------------------------------------ lifecycle

    def __enter__(self) -> Self:
        self.connect()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close(flush=et is None)

    def connect(self) -> None:
        """Start the I/O thread and connect (NodeLost when no node answers)."""
        self._thread.start()
        try:
            self._call(self.aclient.__aenter__(), None)
        except BaseException:
            self._stop()
            raise
        self._open = True

    def close(self, flush: bool = True) -> None:
        """Wait (for ``node_timeout`` at most) until what was published is acknowledged, then stop."""
        if self._open:
            self._open = False
            try:
                self._call(self.aclient.__aexit__(None if flush else RuntimeError, None, None), None)
            finally:
                self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _call(self, coro: Coroutine[Any, Any, R], timeout: float | str | None = "default") -> R:
        wait = self.timeout if timeout == "default" else timeout
        assert wait is None or isinstance(wait, float | int)
        if not self._thread.is_alive():
            coro.close()
            raise ClientClosed("the client is not connected: use 'with Client(...)' or connect() first")
        fut = asyncio.run_coroutine_threadsafe(coro, self._loop)
        try:
            return fut.result(wait)
        except concurrent.futures.TimeoutError:
            fut.cancel()
            raise TimeoutError(f"no answer within {wait} s") from None

    @property
    def session(self) -> Any:
        return self.aclient.session

    @property
    def router(self) -> Any:
        return self.aclient.router

    # ------------------------------------------------------------ the API

    def publish(self, topic: str, payload: bytes | str, key: str | None = None, tags: dict[str, str] | None = None,
                *, mode: str = "reliable", wait: bool = False) -> int:  # fmt: skip
        return self._call(self.aclient.publish(topic, payload, key, tags, mode=mode, wait=wait))

    def flush(self, timeout: float = math.inf) -> bool:
        return self._call(self.aclient.flush(timeout), None)

    def status(self, timeout: float = 3.0) -> dict[str, Any]:
        return self._call(self.aclient.status(timeout), None)

    def put(self, topic: str, payload: bytes | str, key: str | None = None, tags: dict[str, str] | None = None,
            *, wait: bool = False) -> tuple[int, int]:  # fmt: skip
        return self._call(self.aclient.put(topic, payload, key, tags, wait=wait))

    def get(self, topic: str, durable: str, count: int = 1, *, start: str | int | datetime.datetime = "earliest",
            timeout: float | None = None, client: str = "default") -> list[Message]:  # fmt: skip
        return self._call(self.aclient.get(topic, durable, count, start=start, timeout=timeout, client=client), None)

    def read(self, topic: str, offset: int = 0, count: int = 1000, *, timeout: float = 10.0) -> LogRead:
        return self._call(self.aclient.read(topic, offset, count, timeout=timeout), None)

    def position(self, topic: str, durable: str, *, client: str = "default") -> int | None:
        return self.aclient.position(topic, durable, client=client)

    def commit(self, topic: str, durable: str, *, client: str = "default", timeout: float = 10.0) -> bool:
        return self._call(self.aclient.commit(topic, durable, client=client, timeout=timeout), None)

    def request(self, topic: str, payload: bytes | str, *, timeout: float = 5.0, key: str | None = None,
                tags: dict[str, str] | None = None) -> Message:  # fmt: skip
        return self._call(self.aclient.request(topic, payload, timeout=timeout, key=key, tags=tags), None)

    def subscribe(self, topic: str, key: str | None = None, mode: str = "reliable", *,
                  callback: Callable[[Message], Any] | None = None) -> Subscription:  # fmt: skip
        """A subscription to use with ``with`` and ``for msg in sub`` (or ``sub.next(timeout)``).
        ``callback`` runs in a worker thread for each message instead."""
        return Subscription(self, topic, key, mode, callback)

    def _blocking(self, msg: Message) -> Message:
        """A request's ``respond`` that returns once the answer is sent (not an awaitable)."""
        if not isinstance(msg, Request):
            return msg
        req = Request(*msg)
        req._answer = lambda r, payload, tags: self._call(self.aclient._answer(r, payload, tags))
        return req


class Subscription:
    """A context manager and iterator of :class:`Message`; iteration ends with the subscription
    (``error`` says why, as in the async clients)."""

    def __init__(self, client: Client, topic: str, key: str | None, mode: str,
                 callback: Callable[[Message], Any] | None) -> None:  # fmt: skip
        self.client = client
        wrapped = None
        if callback is not None:
            def wrapped(msg: Message) -> Any:
                return asyncio.to_thread(callback, client._blocking(msg))

        self.asub = client.aclient.subscribe(topic, key, mode, callback=wrapped)

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.client._open:
            self.unsubscribe()

    def start(self) -> None:
        self.client._call(self.asub.start())

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
        msg = self.client._call(_next_or_none(self.asub), timeout)
        if msg is None:
            raise StopIteration
        return self.client._blocking(msg)

    def __iter__(self) -> Iterator[Message]:
        return self

    def __next__(self) -> Message:
        return self.next()


async def _next_or_none(sub: aio.Subscription) -> Message | None:
    try:
        return await sub.next()
    except StopAsyncIteration:
        return None
