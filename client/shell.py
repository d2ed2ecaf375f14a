"""What an event loop provides the client: the I/O primitives, as a pure interface.

The protocol lives in the sans-IO :class:`roost.client.router.Router` and its sessions; what a
user calls (client/api.py, and the client/durableapi.py it holds) is the same for trio and
asyncio: change the router, wake the I/O, wait until some condition on the router holds. So it
is plain ``async def`` code over the primitives below, which a shell implements for its event
loop: the trio shell (client/library.py) and the asyncio shell (client/aio.py), each made from
the client's connection (client/connection.py: the router, the sockets, the closed state and
one I/O turn, ``exchange``) and its turn policy (client/turns.py). The blocking client
(client/blocking.py) runs the asyncio one in a thread.

Every method here is abstract: a shell adds its loop and nothing of the client's logic, and the
logic calls a shell only through these.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roost.client.connection import Connection
    from roost.client.turns import TurnPolicy


class Shell(abc.ABC):
    """The I/O primitives of one event loop (see the module)."""

    #: Truthy while ``kick`` may have something to do for a publish that opened no session (wake
    #: an I/O loop that waits): a shell that knows when none waits gives the container of its
    #: waiting loops, never rebound (a publish skips the call then: client/api.py); else True.
    kick_wakes: Any

    @abc.abstractmethod
    def __init__(self, conn: Connection, turns: TurnPolicy) -> None:
        """A shell drives ``conn``'s sessions as ``turns``, the latency policy, decides."""

    @abc.abstractmethod
    def now(self) -> float:
        """The loop's clock: the sessions' ``now``."""

    @abc.abstractmethod
    async def until(self, cond: Callable[[], bool], deadline: float = math.inf) -> bool:
        """Wait until ``cond()`` holds (checked again whenever the I/O changed something) or the
        deadline passes (False); ClientClosed once the client is closed."""

    @abc.abstractmethod
    def kick(self) -> None:
        """Make the I/O send what the router queued now, not at its next deadline (and start
        the I/O of any session the router just opened)."""

    @abc.abstractmethod
    async def sleep_until(self, deadline: float) -> None:
        """The loop's sleep."""

    @abc.abstractmethod
    async def checkpoint(self) -> None:
        """The loop's yield: lets the I/O run during long bursts of calls."""

    @abc.abstractmethod
    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Blocking file I/O (a durable reader's offsets file) off the loop."""

    @abc.abstractmethod
    async def resolve(self, host: str, port: int) -> list[tuple[Any, ...]]:
        """The loop's ``getaddrinfo`` for UDP."""

    @abc.abstractmethod
    async def open(self) -> None:
        """Open the shell's task group (in the task that enters the client)."""

    @abc.abstractmethod
    def spawn(self) -> None:
        """A socket and an I/O loop for every session the router opened since the last call."""

    @abc.abstractmethod
    def background(self, fn: Callable[[], Any]) -> None:
        """Run ``fn()`` as a task that lives at most as long as the client."""

    @abc.abstractmethod
    async def shutdown(self) -> None:
        """Stop the I/O, close the sockets, wake every waiter (they raise ClientClosed)."""
