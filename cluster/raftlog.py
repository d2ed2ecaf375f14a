"""The Raft core's log in memory: its entries after a snapshot base (sans-IO).

Index ``base`` is the last index a snapshot covers (0: none) and ``base_term``
its term; entry ``i`` for ``base < i <= last_index`` is ``entries[i - base - 1]``.
Below the base only the snapshot knows the state: an index there is committed,
so it matches every other member's by Raft's log matching property, which is
why ``term_at(base)`` is the base's term and anything before it is ``None``
(the caller treats it as matching, or sends the snapshot). The disk copy is
the shell's (cluster/raft.py asks for it with ``RaftPersist``).
"""

from __future__ import annotations


class RaftLog:
    """Entries (term, command) after a snapshot base; nothing here knows what a command means."""

    def __init__(self, base: int = 0, base_term: int = 0, entries: list[tuple[int, bytes]] | None = None) -> None:
        self.base = base
        self.base_term = base_term
        self.entries: list[tuple[int, bytes]] = list(entries or [])

    @property
    def last_index(self) -> int:
        return self.base + len(self.entries)

    @property
    def last_term(self) -> int:
        return self.entries[-1][0] if self.entries else self.base_term

    def term_at(self, index: int) -> int | None:
        """The term of the entry at ``index``; None before the base or past the end."""
        if index == self.base:
            return self.base_term
        if self.base < index <= self.last_index:
            return self.entries[index - self.base - 1][0]
        return None

    def command(self, index: int) -> bytes:
        return self.entries[index - self.base - 1][1]

    def slice(self, first: int, max_count: int, max_bytes: int) -> list[tuple[int, bytes]]:
        """Entries from ``first`` (> base), at most ``max_count`` and ``max_bytes`` of commands, one at least."""
        out: list[tuple[int, bytes]] = []
        size = 0
        for entry in self.entries[first - self.base - 1 : first - self.base - 1 + max_count]:
            size += len(entry[1])
            if out and size > max_bytes:
                break
            out.append(entry)
        return out

    def first_of_term(self, index: int) -> int:
        """The first index (after the base) holding the same term as ``index``: the paper's fast back-off."""
        term = self.term_at(index)
        while index - 1 > self.base and self.term_at(index - 1) == term:
            index -= 1
        return index

    def truncate_after(self, index: int) -> None:
        del self.entries[index - self.base :]

    def append(self, term: int, command: bytes) -> int:
        self.entries.append((term, command))
        return self.last_index

    def compact(self, index: int) -> None:
        """Forget the entries up to ``index`` (a snapshot covers them now)."""
        term = self.term_at(index)
        assert term is not None and index >= self.base
        del self.entries[: index - self.base]
        self.base, self.base_term = index, term

    def reset(self, index: int, term: int) -> None:
        """Nothing but a snapshot at (index, term): an InstallSnapshot replaced the whole log."""
        self.base, self.base_term, self.entries = index, term, []
