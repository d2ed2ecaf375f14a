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
find one, and the oldest trimmed from the front by moving a pointer. At most ``limit``
sequences are held; those trimmed count as seen (a late copy of one of them is taken as a
duplicate: bounded memory).
"""

from __future__ import annotations

from bisect import bisect_right

COMPACT_AFTER = 1024  # trimmed ranges left in the lists before they are dropped (and past half)


class Holes:
    __slots__ = ("starts", "ends", "head", "count")

    def __init__(self) -> None:
        # The ranges from index ``head`` on (those before it were trimmed: a pointer moves, as
        # the node's mailbox's ``base`` does, and the lists are compacted now and then, so that
        # trimming 65,536 ranges of one sequence each costs no list move per message)
        self.starts: list[int] = []  # first sequence of each range, ascending
        self.ends: list[int] = []  # last sequence of each range (inclusive)
        self.head = 0
        self.count = 0  # sequences held, all ranges together

    def __len__(self) -> int:
        return self.count

    def ranges(self) -> list[tuple[int, int]]:
        """The ranges held, oldest first (first, last)."""
        return list(zip(self.starts[self.head :], self.ends[self.head :], strict=True))

    def __contains__(self, seq: int) -> bool:
        i = bisect_right(self.starts, seq, self.head) - 1
        return i >= self.head and seq <= self.ends[i]

    def add(self, first: int, last: int, limit: int) -> None:
        """Hold ``first`` .. ``last``, which lie above every sequence held, and then only the
        newest ``limit`` sequences."""
        if last < first:
            return
        starts, ends = self.starts, self.ends
        if len(starts) > self.head and first <= ends[-1]:
            raise ValueError(f"holes {first}..{last} are not above the highest held, {ends[-1]}")
        starts.append(first)
        ends.append(last)
        self.count += last - first + 1
        excess = self.count - limit
        if excess <= 0:
            return
        head = self.head
        while excess > 0:
            n = ends[head] - starts[head] + 1
            if n > excess:
                starts[head] += excess
                self.count -= excess
                break
            excess -= n
            self.count -= n
            head += 1
        if head > COMPACT_AFTER and head > len(starts) // 2:
            del starts[:head], ends[:head]
            head = 0
        self.head = head

    def take(self, seq: int) -> bool:
        """True if ``seq`` was a hole, which it no longer is."""
        starts, ends = self.starts, self.ends
        i = bisect_right(starts, seq, self.head) - 1
        if i < self.head or seq > ends[i]:
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
