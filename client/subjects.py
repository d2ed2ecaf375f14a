"""Subscription filters: subject wildcards, tag queries and queue groups in one string.

Topics are dot-separated tokens (``orders.eu.paid``), as NATS subjects are. A
subscription names a *filter*::

    <pattern>[ queue=<group>][ where <query>]

- ``pattern``: a topic whose tokens may be ``*`` (exactly one token) or, as the
  last token, ``>`` (one or more tokens): ``orders.*.paid``, ``orders.>``. A
  ``*`` or ``>`` inside a token (``ord*``, ``a.b>``) is refused; so is ``>``
  before the last token. A pattern without wildcards is a topic and means
  exactly that topic, whatever its characters (FASTPUSS topics keep their
  meaning). Empty tokens (``a..b``) are tokens like any other.
- ``queue=<group>``: the subscription joins a queue group; each message goes to
  one live member of the group (the subscriptions with the same filter and key).
- ``where <query>``: only messages whose tags satisfy the query (client/query.py).

The filter string is the subscription's identity everywhere (the node's
registers, replication, CANCEL, the client's map of subscriptions), so two
subscriptions that differ only in their query are two subscriptions, as two
NATS subscriptions with one subject are. The library builds it
(:func:`make_filter`); what comes off the network goes through
:func:`parse_filter_untrusted`, memoised, which refuses anything malformed with
a :class:`FilterError` that says what and where.

:class:`PatternTrie` is the index of filters by their pattern's tokens: the
work of matching a topic grows with the topic's tokens (and the wildcards on
its way), not with the number of subscriptions.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from roost.client.query import Query, QueryError, compile_query

MAX_FILTER_BYTES = 1024
MAX_PATTERN_BYTES = 255
MAX_QUEUE_CHARS = 64
_QUEUE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
_WHITESPACE = re.compile(r"[ \t\n\x0b\f\r]")


class FilterError(ValueError):
    """A subscription filter that cannot be used; the message says why and where."""


class Filter:
    """A parsed filter. ``wild``: its pattern has a wildcard; ``plain``: the filter is a
    bare topic (no wildcard, queue or query), which the indexes keep in their dicts."""

    __slots__ = ("text", "pattern", "tokens", "wild", "queue", "query", "plain")

    def __init__(self, text: str, pattern: str, queue: str | None, query: Query | None) -> None:
        self.text = text
        self.pattern = pattern
        self.tokens = tuple(pattern.split("."))
        self.wild = "*" in self.tokens or self.tokens[-1] == ">"
        self.queue = queue
        self.query = query
        self.plain = not self.wild and queue is None and query is None

    def matches(self, topic: str, tags: dict[str, str] | None) -> bool:
        """Does a message of ``topic`` with ``tags`` pass this filter? (slow path: one filter)"""
        if self.wild:
            if not tokens_match(self.tokens, topic.split(".")):
                return False
        elif topic != self.pattern:
            return False
        return self.query is None or self.query.matches(tags)

    def __repr__(self) -> str:
        return f"Filter({self.text!r})"


def is_plain(text: str) -> bool:
    """A bare topic (no wildcard, queue group or query): the indexes' dict path."""
    return " " not in text and "*" not in text and ">" not in text


def partition_topic(text: str) -> str | None:
    """The topic whose partition holds a subscription to ``text`` (partitioned mode): the
    topic itself, or a filter's pattern; None for a wildcard pattern, which spans every
    partition (docs/cluster.md, "Wildcards in partitioned mode")."""
    if is_plain(text):
        return text
    f = parse_filter_untrusted(text)
    return None if f.wild else f.pattern


def tokens_match(pattern: tuple[str, ...] | list[str], tokens: list[str]) -> bool:
    """The reference meaning of a pattern, token by token (the trie's tests compare with it)."""
    for i, p in enumerate(pattern):
        if p == ">":
            return len(tokens) > i
        if i >= len(tokens) or (p != "*" and p != tokens[i]):
            return False
    return len(tokens) == len(pattern)


def check_pattern(pattern: str) -> str:
    """A subscription pattern: a topic whose whole tokens may be ``*``, or ``>`` last."""
    if not pattern:
        raise FilterError("a subscription needs a topic or pattern")
    if len(pattern) > 63 and len(pattern.encode()) > MAX_PATTERN_BYTES:
        raise FilterError(f"pattern longer than {MAX_PATTERN_BYTES} bytes")
    if _WHITESPACE.search(pattern):
        raise FilterError("pattern contains whitespace")
    if "*" in pattern or ">" in pattern:
        tokens = pattern.split(".")
        for i, t in enumerate(tokens):
            if t == ">" and i < len(tokens) - 1:
                raise FilterError(f"'>' matches the rest of a topic and must be its last token: {pattern!r}")
            if t not in ("*", ">") and ("*" in t or ">" in t):
                raise FilterError(
                    f"'*' and '>' are wildcards and must be whole tokens, as in 'a.*.c' or 'a.>': "
                    f"token {t!r} of {pattern!r}"
                )
    return pattern


def check_queue(queue: str) -> str:
    if not _QUEUE.fullmatch(queue):
        raise FilterError(f"a queue group name is 1..{MAX_QUEUE_CHARS} letters, digits, '_', '-' or '.': {queue!r}")
    return queue


def make_filter(pattern: str, queue: str | None = None, query: str | None = None) -> str:
    """The filter string for a subscription (validated: raises FilterError, QueryError)."""
    check_pattern(pattern)
    text = pattern
    if queue is not None:
        text += " queue=" + check_queue(queue)
    if query is not None:
        compile_query(query)
        text += " where " + query
    parse_filter_untrusted(text)  # (the same rules as a node's, size included)
    return text


def _parse(text: str) -> Filter:
    if text.__class__ is not str or not text:
        raise FilterError("a subscription needs a topic or pattern")
    if len(text) > MAX_FILTER_BYTES // 4 and len(text.encode()) > MAX_FILTER_BYTES:
        raise FilterError(f"subscription filter longer than {MAX_FILTER_BYTES} bytes")
    pattern, sep, rest = text.partition(" ")
    check_pattern(pattern)
    queue = query = None
    if sep:
        if rest.startswith("queue="):
            word, sep, rest = rest.partition(" ")
            queue = check_queue(word[6:])
            if sep and not rest.startswith("where "):
                raise FilterError(f"after the queue group comes 'where <query>' or nothing: {text!r}")
        if rest.startswith("where "):
            try:
                query = compile_query(text, len(text) - len(rest) + 6)
            except QueryError as exc:
                # positions count in the query the user wrote, not in the filter string
                raise FilterError(f"bad query: {exc}") from None
        elif queue is None or sep:
            raise FilterError(f"a pattern is followed by ' queue=<group>' or ' where <query>': {text!r}")
    return Filter(text, pattern, queue, query)


_parsed: dict[str, Filter] = {}


def parse_filter_untrusted(text: object) -> Filter:
    """A filter from the network (or a user), checked whole; memoised."""
    f = _parsed.get(text) if text.__class__ is str else None  # type: ignore[call-overload]
    if f is None:
        f = _parse(text)  # type: ignore[arg-type]
        if len(_parsed) >= 4096:  # (bounded: a query can be 1 KB of 32 conditions)
            _parsed.clear()
        _parsed[f.text] = f
    return f


class _Node:
    __slots__ = ("children", "star", "rest", "here")

    def __init__(self) -> None:
        self.children: dict[str, _Node] = {}
        self.star: _Node | None = None
        self.rest: dict[str, None] = {}  # filters whose pattern ends in '>' after this node
        self.here: dict[str, None] = {}  # filters whose pattern ends at this node


class PatternTrie:
    """Filters by the tokens of their patterns: literal tokens, ``*`` and a final ``>``."""

    __slots__ = ("root", "size")

    def __init__(self) -> None:
        self.root = _Node()
        self.size = 0

    def add(self, f: Filter) -> None:
        node = self.root
        tokens = f.tokens
        last = len(tokens) - 1
        for i, t in enumerate(tokens):
            if t == ">" and i == last:
                if f.text not in node.rest:
                    node.rest[f.text] = None
                    self.size += 1
                return
            if t == "*":
                if node.star is None:
                    node.star = _Node()
                node = node.star
            else:
                child = node.children.get(t)
                if child is None:
                    child = node.children[t] = _Node()
                node = child
        if f.text not in node.here:
            node.here[f.text] = None
            self.size += 1

    def remove(self, f: Filter) -> None:
        path: list[tuple[_Node, str]] = []
        node = self.root
        tokens = f.tokens
        last = len(tokens) - 1
        for i, t in enumerate(tokens):
            if t == ">" and i == last:
                if node.rest.pop(f.text, 0) is None:
                    self.size -= 1
                break
            nxt = node.star if t == "*" else node.children.get(t)
            if nxt is None:
                return
            path.append((node, t))
            node = nxt
        else:
            if node.here.pop(f.text, 0) is None:
                self.size -= 1
        # prune the branches left empty, deepest first
        for parent, t in reversed(path):
            child = parent.star if t == "*" else parent.children[t]
            assert child is not None
            if child.children or child.star is not None or child.rest or child.here:
                break
            if t == "*":
                parent.star = None
            else:
                del parent.children[t]

    def match(self, tokens: list[str]) -> Iterator[str]:
        """The filters whose patterns match a topic's tokens, each once."""
        level = [self.root]
        n = len(tokens)
        for i in range(n):
            t = tokens[i]
            nxt = []
            for node in level:
                if node.rest:
                    yield from node.rest
                child = node.children.get(t)
                if child is not None:
                    nxt.append(child)
                if node.star is not None:
                    nxt.append(node.star)
            if not nxt:
                return
            level = nxt
        for node in level:
            if node.here:
                yield from node.here
