"""Deliberately broken builds for the simulator (``scripts/simulate.py --break NAME``).

Each one switches off a mechanism a guarantee rests on; a campaign over a
broken build must report violations with seeds that replay, which shows the
checker (sim/check.py) can fail. A broken build is selected by configuration:
the simulation puts the name in every core's ``breaks`` (node/config.py) and
the core skips that mechanism (an entry of None below). Those with a function
are still broken by patching this process.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _break_dedup() -> None:
    """Subscribers no longer drop a message they had already (by producer id and sequence)."""
    from roost.client.receive import Receiver

    deliver = Receiver._deliver
    Receiver._deliver = lambda self, m, seq, src, stream: deliver(self, m[:4], seq, src, stream)  # type: ignore[method-assign]


def _break_tombstones() -> None:
    """Replicas drop the tombstones that reach them: deletions do not replicate."""
    from roost.node import versions
    from roost.node.registers import Registers

    merge = Registers._merge

    def without_tombstones(self: Registers, entries: list[Any], now: float) -> None:
        merge(self, [(*e[:5], [s for s in e[5] if versions.is_present(s[2])], e[6]) for e in entries], now)

    Registers._merge = without_tombstones  # type: ignore[method-assign]


def _break_restream() -> None:
    """A member keeps streaming to a client's new address where the old stream left off."""
    from roost.node.delivery import Delivery

    Delivery._readdressed = lambda self, c, carry: None  # type: ignore[method-assign]


def _break_handoff() -> None:
    """Partitioned mode: a member whose view gives a partition a new owner hands it nothing."""
    from roost.cluster.partitioned import Partitioned

    Partitioned._hand_off = lambda self, parts, old: None  # type: ignore[method-assign]


def _break_void() -> None:
    """Partitioned mode: a client's reset (new session, sync, timeout) ends nothing at the owners."""
    from roost.node.registers import Registers

    Registers._void_older = lambda self, c, cver, now: None  # type: ignore[method-assign]


# Deliberately broken builds (``scripts/simulate.py --break NAME``): each must be caught.
BREAKS: dict[str, Callable[[], None] | None] = {
    "no-dedup": _break_dedup,
    "no-tombstones": _break_tombstones,
    "no-restream": _break_restream,
    "no-handoff": _break_handoff,  # (partitioned mode)
    "no-void": _break_void,  # (partitioned mode)
    "early-ack": None,  # (partitioned mode: durable; cluster/partitionlog.py ``early_ack``)
    "no-fsync": None,  # (partitioned mode: durable; cluster/logdisk.py syncs nothing)
}
_broken: set[str] = set()


def apply_break(name: str | None) -> None:
    """Break this process's build as ``name`` says (once); None leaves it whole."""
    if name is not None and name not in _broken:
        patch = BREAKS[name]
        if patch is not None:
            patch()
        _broken.add(name)
