"""What every client shell shares: the primitives it provides, the state they act on, the I/O turn.

The protocol lives in the sans-IO :class:`roost.client.router.Router` and its sessions. What a
user calls (client/api.py, and the client/durableapi.py it holds) is the same for trio and asyncio: change the
router, wake the I/O, wait until some condition on the router holds. So it is plain
``async def`` code over primitives that a shell provides for its event loop:

- ``_now()``: the loop's clock (the sessions' ``now``);
- ``_until(cond, deadline)``: wait until ``cond()`` holds (re-checked whenever the I/O changed
  something) or the deadline passes; ClientClosed once the client is closed;
- ``_kick()``: make the I/O send what the router queued now, not at its next deadline;
- ``_sleep_until(deadline)``, ``_checkpoint()``: the loop's sleep and yield;
- ``_in_thread(fn, *args)``: blocking file I/O (a durable reader's offsets file);
- ``_resolve(host, port)``: the loop's ``getaddrinfo``;
- ``_open()``, ``_spawn()``, ``_background(fn)``, ``_shutdown()``: the shell's task group, one
  socket and I/O loop per session, a task that lives as long as the client, and the end.

:class:`ClientBase` holds the rest: the connection (names resolved into the router's first
session, looked up again when the node goes quiet), the closed state, and ``_exchange``, one
turn of a session's socket, which each shell's I/O loop calls when the socket is readable or a
deadline passed. The trio shell (client/library.py) and the asyncio shell (client/aio.py) are
those primitives and a loop each; the blocking client (client/blocking.py) runs the asyncio one
in a thread.
"""

from __future__ import annotations

import abc
import functools
import math
import numbers
import os
import socket
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from roost.client import addresses
from roost.client.addresses import Addr, NodeSpec
from roost.client.offsets import OffsetFile
from roost.client.receive import Message
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession
from roost.client.udp import drain, open_client_socket, send_now

if TYPE_CHECKING:
    from roost.client.api import Subscription


class NodeLost(ConnectionError):
    """No node answered within ``node_timeout`` (or none could be resolved)."""


class ClientClosed(ConnectionError):
    """A call on a client that was closed (or whose I/O failed), or that waited while it closed."""


def check_timeout(timeout: object, *, zero: bool = False, none: bool = True) -> float | None:
    """``timeout`` as seconds (None: no limit), or a ValueError that says what came, raised
    before the call changes anything: a bad one publishes, subscribes or moves nothing.

    ``zero``: the call can finish without an answer from the cluster (take what is queued, find
    room in the window, see whether all is acknowledged), so 0 means "do not wait", as
    ``queue.Queue.get`` takes it. A call that needs an answer could never have one within 0 s,
    and would only fail after it had asked: there 0 is refused. ``none`` False: a call whose wait
    only its timeout can end refuses None."""
    if timeout is None and none:
        return None
    if isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        try:
            seconds = float(timeout)
        except (OverflowError, ValueError):  # (an int past a float's range)
            seconds = math.nan
        if seconds > 0 or (zero and seconds == 0):
            return seconds
    allowed = f"a number of seconds {'>= 0' if zero else '> 0'}"
    raise ValueError(f"timeout must be {'None or ' if none else ''}{allowed}, not {timeout!r}")


class ClientBase(abc.ABC):
    """The state and the connection every client shell shares (see the module)."""

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
        if producer_id is not None and len(producer_id) != 16:
            raise ValueError(f"producer_id must be 16 bytes, not {len(producer_id)}")
        self._names = addresses.parse_nodes(node)
        self._names += [a for a in (addresses.parse_nodes(members) if members else []) if a not in self._names]
        self.node: Addr = self._names[0]  # (the resolved address once connected)
        self.config = config or ClientConfig()
        self.client_id = client_id or os.urandom(16)
        self.producer_id = producer_id or os.urandom(16)
        self._router: Router | None = None
        self._send, self._make_router = send, router
        self._socks: dict[int, socket.socket] = {}  # id(session) -> its socket
        # Truthy while ``_kick`` may have something to do for a publish that opened no session
        # (wake an I/O loop that waits): a shell that knows when none waits gives the container
        # of its waiting loops (a publish skips the call then: client/api.py); else always True.
        self._kick_wakes: Any = True
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
        self._offsets = OffsetFile(offsets_dir) if offsets_dir is not None else None
        self._inbox: Subscription | None = None  # (request/reply: client/api.py)
        self._requests = 0
        self._replies: dict[str, Message | None] = {}  # request number -> its reply, while awaited

    # ------------------------------------------------------------ the shell's primitives

    @abc.abstractmethod
    def _now(self) -> float:
        """The loop's clock: the sessions' ``now``."""

    def _deadline(self, timeout: float | None, *, zero: bool = False, none: bool = True) -> float:
        """The loop-clock time ``timeout`` seconds from now (None: never); a bad ``timeout`` is
        refused (check_timeout)."""
        seconds = check_timeout(timeout, zero=zero, none=none)
        return math.inf if seconds is None else self._now() + seconds

    @abc.abstractmethod
    async def _until(self, cond: Callable[[], bool], deadline: float = math.inf) -> bool:
        """Wait until ``cond()`` holds (checked again whenever the I/O changed something) or the deadline
        passes (False); ClientClosed once the client is closed."""

    @abc.abstractmethod
    def _kick(self) -> None:
        """Make the I/O send what the router queued now, not at its next deadline."""

    @abc.abstractmethod
    async def _sleep_until(self, deadline: float) -> None:
        """The loop's sleep."""

    @abc.abstractmethod
    async def _checkpoint(self) -> None:
        """The loop's yield: lets the I/O run during long bursts of calls."""

    @abc.abstractmethod
    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Blocking file I/O (a durable reader's offsets file) off the loop."""

    @abc.abstractmethod
    async def _resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        """The loop's ``getaddrinfo`` for UDP."""

    @abc.abstractmethod
    async def _open(self) -> None:
        """Open the shell's task group (in the task that enters the client)."""

    @abc.abstractmethod
    def _spawn(self) -> None:
        """A socket and an I/O loop for every session the router opened since the last call."""

    @abc.abstractmethod
    def _background(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` as a task that lives at most as long as the client."""

    @abc.abstractmethod
    async def _shutdown(self) -> None:
        """Stop the I/O, close the sockets, wake every waiter (they raise ClientClosed)."""

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
        try:
            if et is None and self._router is not None and self.session.connected:
                await self.flush(timeout=self.config.node_timeout)
        finally:
            self._goodbye()
            await self._shutdown()

    def _goodbye(self) -> None:
        """Tell every node we talk to that we are closing (BYE), so that each drops our
        subscriptions now rather than log a time-out ``subscriber_timeout`` later. Once, on
        each session's own socket; a lost BYE leaves the time-out to do it. The ACKs not sent
        yet go before it (a turn that brought what a task waited for holds them back: the
        trio client's ``_until_driving``), so a message the application took just before it
        left is acknowledged; nothing else queued is sent."""
        if self._router is None or self._error is not None or self._closed:
            return
        for s in self._router.sessions:
            sock = self._socks.get(id(s))
            if sock is not None and sock.fileno() >= 0:
                self.send_errors += self._send(sock, s.close())

    async def aclose(self) -> None:
        """Close without ``async with`` (what leaving it does: flush for ``node_timeout`` at most)."""
        await self.__aexit__(None, None, None)

    @abc.abstractmethod
    async def flush(self, timeout: float = math.inf) -> bool:
        """(client/api.py's: leaving the client flushes what it published)"""

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
        self._router = self._make_router(
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

    def _noticed(self, s: ClientSession, now: float, events: list[tuple[Any, ...]]) -> None:
        """Every I/O turn: once the user's session misses a PONG (and when it fails over), look its
        node names up again, at most once per ``node_timeout``: a container that moved has a new
        address under the same name, and the session can only fail over to addresses it has."""
        if self._resolving or now < self._resolve_after or s is not self.router.first or self._literal:
            return
        if now - s.last_heard < s.ping_interval * 1.5 and not any(e[0] == "node_silent" for e in events):
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

    def _exchange(self, s: ClientSession, sock: socket.socket,
                  hold: Callable[[], bool] | None = None) -> tuple[int, bool]:  # fmt: skip
        """One turn of session ``s``'s socket, the same in every shell: drain what is ready, feed
        the router, fire the session's due timers, send what it produced. Returns how many
        datagrams came and whether anything happened (the shell then wakes its waiters).
        ``hold``: when datagrams came and it holds once they are fed, the session keeps what
        it would send for the next turn (the trio shell's waiting task that drives the socket:
        its loop, woken as the wait ends, makes that turn as soon as the task yields)."""
        r = self.router
        batch = drain(sock, 65536)
        now = self._now()
        if batch:
            try:
                r.handle_datagrams(s, batch, now)
            except Exception as exc:
                # The session validates every frame and ignores what it cannot use, so an
                # exception here is a bug the datagrams found. Anyone who can send from a
                # node's address could trigger it again and again, so it must not take the
                # client down: the rest of the batch is lost as UDP may lose it, and the
                # protocols' retries repair that.
                self.session_errors += 1
                self.last_session_error = exc
        if now >= min(s.next_deadline(), r.put_deadline()):
            r.tick(s, now)
        if len(r.sessions) > len(self._socks):
            self._spawn()  # (the router opened a session here: a put for a new primary)
        # (a task that waits for what came takes it before the answers go: a message's ACK
        # leaves after its subscriber has it, at the next turn; W3 reliable p50 ~20 us lower)
        out = [] if batch and hold is not None and hold() else s.outgoing(now)
        if out:
            self.send_errors += self._send(sock, out)
        events = s.take_events()
        self._noticed(s, now, events)
        return len(batch), bool(batch or events or out)

    def _socket_fits(self, s: ClientSession) -> bool:
        """``s`` has its socket, of its node's family (else its loop's next turn opens a new one)."""
        sock = self._socks.get(id(s))
        return sock is not None and sock.family == addresses.family(s.node)

    def _socket_for(self, s: ClientSession, sock: socket.socket) -> socket.socket | None:
        """A new socket when ``s`` failed over to an address of the other family; None to keep
        ``sock`` (also when this host cannot open one: the sends fail, the session times that
        address out and moves on to the next)."""
        if sock.family == addresses.family(s.node):
            return None
        try:
            return open_client_socket(s.node, self.config.socket_buffer)
        except OSError:
            return None
