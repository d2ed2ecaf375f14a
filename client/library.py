"""The trio client library: :class:`Client` and :class:`Subscription`.

A thin shell around :class:`client.session.ClientSession`: one UDP socket
connected to the node, one background task that drains it, feeds the session,
fires its timers and sends what it produces. API calls change the session and
wake that task; awaiting callers sleep on a single "something changed" event.

    async with Client(("127.0.0.1", 7400)) as c:
        async with c.subscribe("prices", mode="reliable") as sub:
            await c.publish("prices", b"42")
            msg = await sub.next()
"""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import Any

import trio

from client.session import ClientConfig, ClientSession, Message, SubState
from client.udp import drain
from client.wire import MODE_NAMES, Reason

Addr = tuple[str, int]

__all__ = ["Client", "ClientConfig", "Message", "NodeLost", "Subscription"]


class NodeLost(ConnectionError):
    """The node did not answer within ``node_timeout``."""


def _addr(node: Addr | str) -> Addr:
    if isinstance(node, str):
        host, _, port = node.rpartition(":")
        return (host or "127.0.0.1", int(port))
    return node


def _mode(mode: str) -> int:
    try:
        return MODE_NAMES[mode]
    except KeyError:
        raise ValueError(f"mode must be one of {', '.join(MODE_NAMES)}, not {mode!r}") from None


class Client:
    def __init__(
        self,
        node: Addr | str = ("127.0.0.1", 7400),
        *,
        members: Sequence[Addr | str] | None = None,
        client_id: bytes | None = None,
        config: ClientConfig | None = None,
        producer_id: bytes | None = None,
    ) -> None:
        """``node`` is the node to talk to first; ``members`` (optional) the other
        nodes to fail over to; the cluster map in WELCOME adds the rest.
        ``producer_id`` (16 bytes, default random) names this client's reliable
        publishes: a client that publishes the same sequence of messages again
        under the same producer id (a retried Spark task) has them delivered once."""
        if producer_id is not None and len(producer_id) != 16:
            raise ValueError(f"producer_id must be 16 bytes, not {len(producer_id)}")
        self.node: Addr = _addr(node)
        self.config = config or ClientConfig()
        self.client_id = client_id or os.urandom(16)
        self.session = ClientSession(
            self.client_id, producer_id or os.urandom(16), os.urandom(16), self.config, trio.current_time(),
            node=self.node, members=[_addr(m) for m in members or []],
            session=int(time.time() * 1000),
        )  # fmt: skip
        self._sock: socket.socket | None = None
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        self._wait_scope: trio.CancelScope | None = None
        self._since_yield = 0
        self._closed = False
        self.send_errors = 0
        self.session_errors = 0  # datagrams the session failed on (a bug; the client carries on)
        self.last_session_error: Exception | None = None

    # ------------------------------------------------------------ lifecycle

    async def __aenter__(self) -> Client:
        family = socket.AF_INET6 if ":" in self.node[0] else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 * 1024 * 1024)
        sock.setblocking(False)
        sock.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", 0))
        self._sock = sock
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        self._nursery.start_soon(self._run)
        try:
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
        """Stop the I/O task; the caller's own exception, if any, propagates unwrapped."""
        self._closed = True
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            await self._nursery_cm.__aexit__(None, None, None)
        finally:
            if self._sock is not None:
                self._sock.close()

    # ------------------------------------------------------------ the I/O loop

    async def _run(self) -> None:
        s, sock = self.session, self._sock
        assert sock is not None
        while True:
            batch = drain(sock, 65536)
            now = trio.current_time()
            if batch:
                self._handle(batch, now)
            if now >= s.next_deadline():
                s.tick(now)
            out = s.outgoing(now)
            self._send(out)
            if batch or s.events or out:
                s.events.clear()
                self._wake()
            if batch:
                await trio.lowlevel.checkpoint()
                continue
            with trio.CancelScope(deadline=s.next_deadline()) as scope:
                self._wait_scope = scope
                await trio.lowlevel.wait_readable(sock)
            self._wait_scope = None

    def _handle(self, batch: list[tuple[bytes, Addr]], now: float) -> None:
        """Feed the session; whatever arrives, the I/O task must live on.

        The session validates every frame and ignores what it cannot use, so an
        exception here is a bug the datagrams found. Anyone who can send from a
        node's address could trigger it again and again, so it must not take
        the client down: the rest of the batch is lost as UDP may lose it, and
        the protocols' retries repair that.
        """
        try:
            self.session.handle_datagrams(batch, now)
        except Exception as exc:
            self.session_errors += 1
            self.last_session_error = exc

    def _send(self, datagrams: list[tuple[Addr, bytes]]) -> None:
        sock = self._sock
        assert sock is not None
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
        """Make the I/O loop flush now instead of at its next deadline."""
        if self._wait_scope is not None:
            self._wait_scope.cancel()

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
        s = self.session
        if reliable and s.window_full:
            self._kick()
            await self._until(lambda: not s.window_full)
        seq = s.publish(topic, key, tags, payload, reliable)
        self._since_yield += 1
        if wait and reliable:
            self._kick()
            await self._until(lambda: s.acked >= seq or s.lost)
            if s.acked < seq:
                raise NodeLost("node lost before acknowledging the publish")
        elif self._since_yield >= 64:
            self._since_yield = 0
            self._kick()
            await trio.lowlevel.checkpoint()
        else:
            self._kick()
        return seq

    async def flush(self, timeout: float = math.inf) -> bool:
        """Wait until every reliable publish and every command so far is acknowledged."""
        s = self.session
        self._kick()
        target = s.last_seq

        def done() -> bool:
            return s.lost or s.flushed(target)

        return await self._until(done, trio.current_time() + timeout) and not s.lost

    async def status(self, timeout: float = 3.0) -> dict[str, Any]:
        """The node's status map (what ``roost status`` prints)."""
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

    async def __aenter__(self) -> Subscription:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self.client._closed:
            await self.unsubscribe()

    async def start(self) -> None:
        """Subscribe and wait until the node confirms (or refuses)."""
        c = self.client
        self._st = st = c.session.subscribe(self.topic, self.key, self.mode)
        c._kick()
        await c._until(lambda: st.confirmed or st.reason is not None)

    async def unsubscribe(self) -> None:
        st = self._st
        if st is not None and st.reason is None:
            self.client.session.unsubscribe(self.topic, self.key)
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
        st = self._st
        assert st is not None, "use 'async with' or await start() first"
        c = self.client
        if not st.queue:
            await c._until(lambda: bool(st.queue) or st.reason is not None)
            if not st.queue:
                raise StopAsyncIteration
        c.session.consumed(st)
        c._since_yield += 1
        if c._since_yield >= 64:  # let the I/O loop run during long bursts
            c._since_yield = 0
            await trio.lowlevel.checkpoint()
        return st.queue.popleft()

    def __aiter__(self) -> AsyncIterator[Message]:
        return self

    async def __anext__(self) -> Message:
        return await self.next()
