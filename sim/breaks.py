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


def _break_early_ack() -> None:
    """Durable mode: a leader commits (acknowledges puts, serves readers) once a record is on its own
    disk, without waiting for its followers' copies."""
    from roost.cluster.partitionlog import PartitionLog

    advance = PartitionLog._advance

    def alone(self: PartitionLog) -> list[Any]:
        followers, self.followers = self.followers, {}
        try:
            return advance(self)
        finally:
            self.followers = followers

    PartitionLog._advance = alone  # type: ignore[method-assign]


def _break_no_fsync() -> None:
    """Durable mode: an owner's appends are written but not synced, and counted durable all the same
    (fsync = never, without saying so): a power loss takes what it acknowledged."""
    from roost.cluster.partitionlog import LogSettings

    of = LogSettings.of.__func__  # type: ignore[attr-defined]
    # (the members' settings come from their config, fsync = "always": a changed default did nothing)
    LogSettings.of = classmethod(lambda cls, s: of(cls, s)._replace(fsync="never"))  # type: ignore[assignment,method-assign]


# Deliberately broken builds (``scripts/simulate.py --break NAME``): each must be caught.
BREAKS: dict[str, Callable[[], None] | None] = {
    "no-dedup": None,  # (client/receive.py: subscribers keep a message they had already)
    "no-tombstones": None,  # (node/registers.py: replicas drop the tombstones that reach them)
    "no-restream": None,  # (node/streams.py: a stream goes on at a client's new address)
    "no-handoff": None,  # (partitioned mode: cluster/replicator.py hand_off)
    "no-void": None,  # (partitioned mode; node/registers.py: a client's reset ends nothing at the owners)
    "early-ack": _break_early_ack,  # (partitioned mode: durable)
    "no-fsync": _break_no_fsync,  # (partitioned mode: durable)
    # (client/durableclient.py, partitioned mode: a durable reader commits what a GET answered
    # before the application has it, so a crash in between loses those records)
    "commit-before-read": None,
}
_broken: set[str] = set()


def apply_break(name: str | None) -> None:
    """Break this process's build as ``name`` says (once); None leaves it whole."""
    if name is not None and name not in _broken:
        patch = BREAKS[name]
        if patch is not None:
            patch()
        _broken.add(name)
