"""The simulated clock: a heap of timed events, run in order (sim/simulation.py's event loop).

Theory of operation
-------------------
Everything that happens in a simulated run is an event: a callable and its arguments, due at a
simulated time. ``at`` pushes one; ``run_until`` pops them in time order and calls each, moving
``now`` forward to its time (never back: an event due in the past runs now). Events due at the
same time run in the order they were pushed (a counter breaks the tie, so two runs of one seed
call them in the same order and the callables themselves are never compared). trio is not used:
its scheduler is not deterministic.

The simulation and its components (sim/accounting.py, sim/nemesis.py, sim/workload.py,
sim/durable.py) share one scheduler: it is their clock (``now``) and their way to act later
(``at``), and nothing else of the simulation.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any


class Scheduler:
    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callable[..., None], tuple[Any, ...]]] = []
        self._n = 0

    def at(self, t: float, fn: Callable[..., None], *args: Any) -> None:
        """Call ``fn(*args)`` at simulated time ``t`` (now, if ``t`` is past)."""
        self._n += 1
        heapq.heappush(self._heap, (t, self._n, fn, args))

    def run_until(self, until: float, max_events: int) -> tuple[int, str | None]:
        """Run every event due by ``until``, then stand at ``until``: (events run, None); or,
        once ``max_events`` have run and more are due, stop there: (events run, the name of the
        last one) for the caller to report (something wakes up without progress)."""
        heap = self._heap
        n = 0
        while heap and heap[0][0] <= until:
            t, _, fn, args = heapq.heappop(heap)
            self.now = max(self.now, t)
            fn(*args)
            n += 1
            if n >= max_events:
                return n, fn.__name__
        self.now = max(self.now, until)
        return n, None
