"""The trio client: :class:`Client`, the I/O of :class:`roost.client.api.ClientAPI` on trio.

Per session of the router: one UDP socket (its own source port, so MSGS for a session's client
id reach that session alone) and one background task that drains it, feeds the router, fires
the session's timers and sends what it produces. API calls (client/api.py) change the router and
wake those tasks; awaiting callers sleep on a single "something changed" event.

    async with Client("127.0.0.1:7400") as c:
        async with c.subscribe("prices", mode="reliable") as sub:
            await c.publish("prices", b"42")
            msg = await sub.next()
"""

from __future__ import annotations

import math
import socket
from collections.abc import Callable
from typing import Any

import trio

from roost.client.api import ClientAPI, ClientClosed, LogRead, NodeLost, Request, Subscription, durable_id
from roost.client.receive import Message
from roost.client.session import ClientConfig, ClientSession
from roost.client.udp import open_client_socket

Addr = tuple[str, int]

__all__ = ["Client", "ClientClosed", "ClientConfig", "LogRead", "Message", "NodeLost", "Request", "Subscription",
           "durable_id"]  # fmt: skip


class Client(ClientAPI):
    """The client for trio programs: ``async with Client(...) as c`` (see ClientAPI for the API)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._nursery: trio.Nursery | None = None
        self._changed = trio.Event()
        self._wait_scopes: dict[int, trio.CancelScope] = {}

    # ------------------------------------------------------------ primitives (client/api.py)

    def _now(self) -> float:
        return trio.current_time()

    async def _until(self, cond: Callable[[], bool], deadline: float = math.inf) -> bool:
        with trio.move_on_at(deadline):
            while not cond():
                if self._closed:
                    raise self._closed_error()
                await self._changed.wait()
            return True
        return False

    def _kick(self) -> None:
        """Make the I/O loops flush now instead of at their next deadline (and start the
        loop of any session the router just opened)."""
        r = self._router
        if r is not None and len(r.sessions) > len(self._socks):
            self._spawn()
        if self._wait_scopes:  # (once per wait: trio's cancel costs a few microseconds)
            for scope in self._wait_scopes.values():
                scope.cancel()
            self._wait_scopes.clear()

    async def _sleep_until(self, deadline: float) -> None:
        await trio.sleep_until(deadline)

    async def _checkpoint(self) -> None:
        await trio.lowlevel.checkpoint()

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await trio.to_thread.run_sync(fn, *args)

    async def _resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        return await trio.socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)

    async def _open(self) -> None:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()

    def _background(self, fn: Callable[[], Any]) -> None:
        if self._nursery is not None and not self._closed:
            self._nursery.start_soon(fn)

    async def _shutdown(self) -> None:
        """Stop the I/O tasks; the caller's own exception, if any, propagates unwrapped."""
        self._closed = True
        self._wake()  # (tasks waiting on the client, outside its block too, hear it closed)
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        try:
            await self._nursery_cm.__aexit__(None, None, None)
        finally:
            for sock in self._socks.values():
                sock.close()

    def _spawn(self) -> None:
        """A socket and an I/O task for every session the router opened since we last looked."""
        if self._nursery is None or self._closed or self._router is None:
            return
        for s in self._router.sessions:
            if id(s) not in self._socks:
                self._socks[id(s)] = open_client_socket(s.node, self.config.socket_buffer)
                self._nursery.start_soon(self._run, s)

    # ------------------------------------------------------------ the I/O loop

    async def _run(self, s: ClientSession) -> None:
        try:
            await self._io(s)
        except Exception as exc:  # (a socket that broke: the client ends, its waiters hear why)
            self._fail(exc)
            self._wake()
            for scope in self._wait_scopes.values():  # (the other sessions' loops end too)
                scope.cancel()

    async def _io(self, s: ClientSession) -> None:
        r, key = self.router, id(s)
        while not self._closed:
            sock = self._socks[key]
            new = self._socket_for(s, sock)
            if new is not None:
                sock.close()
                sock = self._socks[key] = new
            came, busy = self._exchange(s, sock)
            if busy:
                self._wake()
            if came:
                await trio.lowlevel.checkpoint()
                continue
            with trio.CancelScope(deadline=min(s.next_deadline(), r.put_deadline())) as scope:
                self._wait_scopes[key] = scope
                await trio.lowlevel.wait_readable(sock)
            self._wait_scopes.pop(key, None)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()
