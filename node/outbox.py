"""What the broker core's components share while an entry point runs: the actions being built,
the timer heap and the entry point's time.

Theory of operation. An entry point of the broker core (node/core.py) sets ``now``, routes its
event to the components, and takes what ``out`` holds at the end. Every component appends its
actions to the one ``out`` list as it runs (the list is never replaced, so a component may keep a
reference to it), so no component needs to know which entry point it was called from. Timers are
one heap of ``(due, kind, key)`` entries; ``BrokerCore.tick`` pops what is due and hands each to
the component of its kind. An entry may be stale by the time it fires (the client went, the
mailbox was acknowledged): every handler checks. Equal entries are indistinguishable, so the
order the heap pops them in does not depend on the order they were pushed.
"""

from __future__ import annotations

import heapq
from typing import Any

from roost.node.actions import Action, Log, Send, Trace
from roost.node.cookies import Addr

# Timer kinds in the heap.
TIMER_RTO, TIMER_LIVENESS, TIMER_LEASE, TIMER_PRODUCER = range(4)

# An unvalidated address never gets more than this many times the bytes it sent.
AMPLIFICATION = 3


class Outbox:
    """The actions of the entry point running, the timers, and its time."""

    __slots__ = ("now", "out", "timers")

    def __init__(self) -> None:
        self.out: list[Action] = []
        self.timers: list[tuple[float, int, Any]] = []
        self.now = 0.0  # of the entry point running (for code that is not passed it)

    def send(self, addr: Addr, data: bytes) -> None:
        self.out.append(Send(addr, data))

    def log(self, level: str, event: str, **fields: Any) -> None:
        self.out.append(Log(level, event, fields))

    def trace(self, event: str, **fields: Any) -> None:
        """A ``Trace`` action (callers test their ``cfg.trace`` first: no cost when it is off)."""
        self.out.append(Trace(event, fields))

    def timer(self, at: float, kind: int, key: Any) -> None:
        heapq.heappush(self.timers, (at, kind, key))


def fmt(addr: Addr) -> str:
    """An address as logs show it."""
    return f"{addr[0]}:{addr[1]}"
