"""Holes: the producer sequences a subscriber skipped and may still receive, as ranges.

Theory of operation. A subscriber de-duplicates reliable messages by producer id and sequence
(client/receive.py, ``Receiver._duplicate``). Two members' streams are not ordered with each
other, so when a producer's sequence jumps, the sequences jumped over are remembered as holes: a
later copy of one of them is new, not a duplicate. A subscriber of one topic in a hundred sees a
jump with every message, each skipping about a hundred sequences: kept one per sequence they
cost a hundred dict entries to add and a hundred to trim per message (W4 of the bench spent a
third of its subscribers' CPU there). Kept as ranges they cost one entry per jump.

A jump's range always lies above every hole held (the jump starts above the highest sequence
seen), so the ranges are added in order: two sorted lists of starts and ends, a bisection to
find one, and the oldest trimmed from the front. At most ``limit`` sequences are held; those
trimmed count as seen (a late copy of one of them is taken as a duplicate: bounded memory).
"""

from __future__ import annotations

from bisect import bisect_right


class Holes:
    __slots__ = ("starts", "ends", "count")

    def __init__(self) -> None:
        self.starts: list[int] = []  # first sequence of each range, ascending
        self.ends: list[int] = []  # last sequence of each range (inclusive)
        self.count = 0  # sequences held, all ranges together

    def __len__(self) -> int:
        return self.count

    def __contains__(self, seq: int) -> bool:
        i = bisect_right(self.starts, seq) - 1
        return i >= 0 and seq <= self.ends[i]

    def add(self, first: int, last: int, limit: int) -> None:
        """Hold ``first`` .. ``last``, which lie above every sequence held, and then only the
        newest ``limit`` sequences."""
        if last < first:
            return
        if self.starts and first <= self.ends[-1]:
            raise ValueError(f"holes {first}..{last} are not above the highest held, {self.ends[-1]}")
        self.starts.append(first)
        self.ends.append(last)
        self.count += last - first + 1
        excess = self.count - limit
        if excess <= 0:
            return
        starts, ends = self.starts, self.ends
        gone = 0
        while excess > 0:
            n = ends[gone] - starts[gone] + 1
            if n > excess:
                starts[gone] += excess
                self.count -= excess
                break
            excess -= n
            self.count -= n
            gone += 1
        del starts[:gone], ends[:gone]

    def take(self, seq: int) -> bool:
        """True if ``seq`` was a hole, which it no longer is."""
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, seq) - 1
        if i < 0 or seq > ends[i]:
            return False
        first, last = starts[i], ends[i]
        if first == last:
            del starts[i], ends[i]
        elif seq == first:
            starts[i] = seq + 1
        elif seq == last:
            ends[i] = seq - 1
        else:  # (split in two)
            ends[i] = seq - 1
            starts.insert(i + 1, seq + 1)
            ends.insert(i + 1, last)
        self.count -= 1
        return True
