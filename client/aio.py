"""The asyncio client: :class:`Client`, the client API (client/api.py) over :class:`AsyncioShell`,
the I/O primitives (client/shell.py) on asyncio.

Callbacks rather than a task per session: each session's socket is watched with
``loop.add_reader``, and a turn (drain every ready datagram, feed the router, fire due timers,
send what the session produced, wake waiters) runs when it is readable, at the session's next
deadline (``loop.call_at``), or soon after an API call changed the router (``kick``; one turn
for however many calls came before the loop ran). A ``create_datagram_endpoint`` transport would
read one datagram per loop iteration and call the protocol once per datagram; draining the
socket ourselves hands the router whole batches, as the trio shell does.

The latency policy is the trio shell's (client/turns.py): on a quiet path an API call makes
the turn itself, before it returns, and so do the calls of a burst (``_turn_here``); a wait
on a sparse path has the turn that brings what it waits for hold that turn's sends (a
message's ACK) for a turn scheduled right after it, so the application has its message first.
(A turn here is a callback already, with no task to hand over from: a waiting task has no
socket to drive itself.)

    async with Client("127.0.0.1:7400") as c:
        async with c.subscribe("prices") as sub:
            await c.publish("prices", b"42")
            async for msg in sub:
                ...
"""

from __future__ import annotations

import asyncio
import math
import socket
from collections.abc import Callable
from typing import Any

from roost.client.api import (
    ClientAPI,
    ClientClosed,
    LogRead,
    NodeLost,
    Request,
    ShellAttribute,
    Subscription,
    durable_id,
)
from roost.client.connection import Connection
from roost.client.receive import Message
from roost.client.router import Router
from roost.client.session import ClientConfig, ClientSession
from roost.client.shell import Shell
from roost.client.turns import CALLER, LOOP, WAITER, TurnPolicy
from roost.client.udp import open_client_socket, yield_cpu

__all__ = ["Client", "ClientClosed", "ClientConfig", "LogRead", "Message", "NodeLost", "Request", "Subscription",
           "durable_id"]  # fmt: skip


class AsyncioShell(Shell):
    """The I/O primitives on asyncio (see the module): the callbacks that drive ``conn``'s
    sessions, as ``turns`` decides."""

    def __init__(self, conn: Connection, turns: TurnPolicy) -> None:
        self.conn = conn
        self.socks = conn.socks  # (the connection's, never rebound: id(session) -> its socket)
        self._turns = turns  # (quiet path, bursts, sparse path, held sends)
        self.kick_wakes = True  # (a kick always has a turn to schedule: client/shell.py)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timers: dict[int, asyncio.TimerHandle] = {}
        self._changed: asyncio.Event | None = None
        self._kicked = False
        self.tasks: set[asyncio.Task[Any]] = set()  # (the background tasks: callbacks, look-ups)
        self._hold: Callable[[], bool] | None = None  # (a sparse wait's: its turns hold their sends)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            raise RuntimeError("the client is not connected: use 'async with Client(...)' first")
        return self._loop

    # ------------------------------------------------------------ primitives (client/shell.py)

    def now(self) -> float:
        return self.loop.time()

    async def until(self, cond: Callable[[], bool], deadline: float = math.inf) -> bool:
        if cond():
            return True
        start = self.loop.time()
        hold = None
        if self._hold is None and self._turns.drives():  # (sparse: the turn that brings it holds its sends)
            hold = self._hold = TurnPolicy.holds(cond)
        try:
            while not cond():
                if self.conn.closed:
                    raise self.conn.closed_error()
                assert self._changed is not None
                if deadline == math.inf:
                    await self._changed.wait()
                    continue
                if self.loop.time() >= deadline:
                    return False
                try:
                    async with asyncio.timeout_at(deadline):
                        await self._changed.wait()
                except TimeoutError:
                    return cond()
            return True
        finally:
            if hold is not None and self._hold is hold:
                self._hold = None
            self._turns.waited(start, self.loop.time())

    def kick(self) -> None:
        self.spawn()
        if not self._kicked and not self.conn.closed:
            r = self.conn._router
            if r is not None and self._turn_here(r):
                return
            self._kicked = True
            self.loop.call_soon(self._turn_all)

    def _turn_here(self, r: Router) -> bool:
        """On a quiet path (``TurnPolicy.turn_here``: one session, nothing sent or received for
        ``idle_gap``, or within a burst after it), make the session's turn in the caller, no
        turn of the loop's being due: the datagram leaves before the call returns. Then give
        up the CPU (the node, woken on this core by the datagram, runs now: see udp.send_all)."""
        if len(r.sessions) != 1:
            return False
        s = r.sessions[0]
        if not self.conn.socket_fits(s) or not self._turns.turn_here(r, self.loop.time()):
            return False
        if self._turn(s, CALLER):
            yield_cpu()
        return True

    async def sleep_until(self, deadline: float) -> None:
        await asyncio.sleep(max(0.0, deadline - self.loop.time()))

    async def checkpoint(self) -> None:
        await asyncio.sleep(0)

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        return await self.loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)

    async def open(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()

    def background(self, fn: Callable[[], Any]) -> None:
        if self.conn.closed:
            return
        task = self.loop.create_task(fn())
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def shutdown(self) -> None:
        self._stop_io()
        self._wake()  # (waiters see the client closed)
        tasks = [t for t in self.tasks if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def _stop_io(self) -> None:
        self.conn.closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for sock in self.socks.values():
            if sock.fileno() >= 0:
                self.loop.remove_reader(sock)
                sock.close()

    def spawn(self) -> None:
        """A socket and a reader for every session the router opened since we last looked."""
        if self.conn.closed or self.conn._router is None:
            return
        for s in self.conn._router.sessions:
            if id(s) not in self.socks:
                self._watch(s, open_client_socket(s.node, self.conn.config.socket_buffer))
                self.loop.call_soon(self._turn, s)

    def _watch(self, s: ClientSession, sock: socket.socket) -> None:
        self.socks[id(s)] = sock
        self.loop.add_reader(sock, self._turn, s)

    # ------------------------------------------------------------ the I/O turn

    def _turn_all(self) -> None:
        self._kicked = False
        if self.conn._router is not None:
            for s in self.conn._router.sessions:
                if id(s) in self.socks:
                    self._turn(s)

    def _turn(self, s: ClientSession, by: str = LOOP) -> bool:
        """One turn of ``s``'s socket (``by``: the loop, or a caller on a quiet path); whether
        it received or sent anything."""
        if self.conn.closed:
            return False
        try:
            return self._io(s, by)
        except Exception as exc:  # (a socket that broke: the client ends, its waiters hear why)
            self.conn.fail(exc)
            self._stop_io()
            self._wake()
            return False

    def _io(self, s: ClientSession, by: str) -> bool:
        r, key = self.conn.router, id(s)
        sock = self.socks[key]
        new = self.conn.socket_for(s, sock)
        if new is not None:
            self.loop.remove_reader(sock)
            sock.close()
            self._watch(s, sock := new)
        # (a caller's turn on a quiet path holds nothing: its datagram leaves before the call returns,
        # as in the trio shell; a task in a sparse wait has its message held by the loop's turns)
        hold = self._hold if by != CALLER else None
        came, busy = self.conn.exchange(s, sock, hold)
        if busy:
            self._turns.turned(came, self.loop.time(), WAITER if hold is not None and by == LOOP else by)
            self._wake()
            if came and hold is not None and not self._kicked:  # (what it held goes at the next turn,
                self._kicked = True  # once the waiter had its message: its task runs first)
                self.loop.call_soon(self._turn_all)
        deadline = min(s.next_deadline(), r.put_deadline())
        timer = self._timers.get(key)
        if timer is None or timer.when() != deadline:
            if timer is not None:
                timer.cancel()
            self._timers[key] = self.loop.call_at(deadline, self._on_timer, s)
        return busy

    def _on_timer(self, s: ClientSession) -> None:
        self._timers.pop(id(s), None)
        self._turn(s)

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()


class Client(ClientAPI):
    """The client for asyncio programs: ``async with Client(...) as c`` (see ClientAPI for the API)."""

    _shell_class = AsyncioShell
    loop = ShellAttribute()  # (the shell's event loop, once the client is open)
