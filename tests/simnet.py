"""A seeded fake network for sans-IO cores: drops, duplicates, reorders.

A plain event loop (a heap of timed deliveries), not trio, so that a run is a
pure function of its seed and any failure replays from it (docs/architecture.md).
"""

from __future__ import annotations

import heapq
import random
from typing import Any

from roost.client.session import ClientConfig, ClientSession
from roost.node.core import BrokerCore, Send
from tests.corekit import NODE


class SimNet:
    def __init__(self, seed: int, core: BrokerCore, loss: float = 0.0, dup: float = 0.0,
                 delay: tuple[float, float] = (0.0005, 0.002)) -> None:  # fmt: skip
        self.rng = random.Random(seed)
        self.core = core
        self.loss, self.dup, self.delay = loss, dup, delay
        self.now = 0.0
        self.sessions: dict[tuple[str, int], ClientSession] = {}
        self._heap: list[tuple[float, int, Any, Any, bytes]] = []
        self._n = 0
        self.partitioned: set[tuple[str, int]] = set()
        self.dropped = self.duplicated = 0

    def add_session(self, addr: tuple[str, int], cfg: ClientConfig | None = None) -> ClientSession:
        b = bytes([addr[1] % 256]) * 16
        s = ClientSession(b, b[::-1], bytes([7]) + b[1:], cfg or ClientConfig(), self.now, node=NODE)
        self.sessions[addr] = s
        return s

    def _transmit(self, src: Any, dst: Any, data: bytes) -> None:
        if src in self.partitioned or dst in self.partitioned:
            return
        copies = 0 if self.rng.random() < self.loss else 1
        if copies and self.rng.random() < self.dup:
            copies = 2
        self.dropped += copies == 0
        self.duplicated += copies == 2
        for _ in range(copies):
            self._n += 1
            at = self.now + self.rng.uniform(*self.delay)
            heapq.heappush(self._heap, (at, self._n, src, dst, data))

    def _from_core(self, actions: list[Any]) -> None:
        for a in actions:
            if isinstance(a, Send):
                self._transmit(NODE, a.addr, a.data)

    def _pump_sessions(self) -> None:
        for addr, s in self.sessions.items():
            for dst, d in s.outgoing(self.now):
                self._transmit(addr, dst, d)

    def run(self, until: float, step: float = 0.005, stop: Any = None) -> None:
        while self.now < until:
            nxt = self.now + step
            while self._heap and self._heap[0][0] <= nxt:
                at, _, src, dst, data = heapq.heappop(self._heap)
                self.now = max(self.now, at)
                if dst == NODE:
                    self._from_core(self.core.handle_datagrams([(data, src)], self.now))
                elif dst in self.sessions:
                    self.sessions[dst].handle_datagrams([(data, src)], self.now)
                self._pump_sessions()
            self.now = nxt
            self._from_core(self.core.tick(self.now))
            for s in self.sessions.values():
                if self.now >= s.next_deadline():
                    s.tick(self.now)
            self._pump_sessions()
            if stop is not None and stop():
                return
