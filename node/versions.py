"""Versions of subscription registers: hybrid logical clock + node + flags in one int.

A subscription (client, topic, key) is a last-writer-wins register. Its
version packs, from most to least significant bits:

    40 bits  HLC physical part: milliseconds since 2025-01-01 (34 years)
    12 bits  HLC logical counter
     8 bits  index of the writing node in the sorted member list (tie-break)
     4 bits  flags: PRESENT (subscribed, not a tombstone), RELIABLE (mode)

so "newer" is plain integer comparison and a merge is ``max()``: commutative,
associative and idempotent, whatever order replicas see writes in. One int per
register also keeps memory per subscription low (one object, not a tuple).
The whole thing fits msgpack's uint64.
"""

from __future__ import annotations

EPOCH_MS = 1_735_689_600_000  # 2025-01-01T00:00:00Z
PRESENT = 0b10
RELIABLE = 0b01
_COUNTER_BITS = 12
_NODE_BITS = 8
FLAG_BITS = 4
# Why a tombstone was written (bits 2-3 of its version).
REASON_UNSUBSCRIBED, REASON_OUT_OF_CAPACITY, REASON_TIMED_OUT = 0, 1, 2
_LOW = _NODE_BITS + FLAG_BITS


def make(hlc: int, node_idx: int, present: bool, mode: int) -> int:
    return (hlc << _LOW) | (node_idx << FLAG_BITS) | (PRESENT if present else 0) | (mode & RELIABLE)


def is_present(version: int) -> bool:
    return bool(version & PRESENT)


def mode_of(version: int) -> int:
    return version & RELIABLE


def upper_bound(wall_s: float) -> int:
    """The largest version any node could write at Unix time ``wall_s``."""
    ms = max(0, int(wall_s * 1000) - EPOCH_MS)
    return (((ms << _COUNTER_BITS) | ((1 << _COUNTER_BITS) - 1)) << _LOW) | ((1 << _LOW) - 1)


def millis_of(version: int) -> int:
    """Wall-clock milliseconds (Unix) when the version was written."""
    return (version >> (_LOW + _COUNTER_BITS)) + EPOCH_MS


class HybridClock:
    """Hybrid logical clock (Kulkarni et al.): monotonic, close to wall time,
    and never behind any version this node has seen, so a write made after
    seeing a remote write always wins over it."""

    def __init__(self) -> None:
        self.last = 0  # (ms << 12) | counter

    def now(self, wall_s: float) -> int:
        ms = int(wall_s * 1000) - EPOCH_MS
        candidate = ms << _COUNTER_BITS
        self.last = candidate if candidate > self.last else self.last + 1
        return self.last

    def observe(self, version: int) -> None:
        hlc = version >> _LOW
        if hlc > self.last:
            self.last = hlc
