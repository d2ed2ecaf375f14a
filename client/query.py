"""Tag queries, Tendermint's language (ADR 033 and its pubsub ``query`` package).

A subscription may carry a query over the message's tags::

    kind = 'order' AND amount > 100 AND placed >= DATE 2026-01-01

Grammar (keywords in capitals, as Tendermint spells them)::

    query      := condition ( "AND" condition )*
    condition  := tag "EXISTS" | tag op operand | tag "CONTAINS" string
    op         := "=" | "<" | "<=" | ">" | ">="
    operand    := string | number | "DATE" yyyy-mm-dd | "TIME" RFC 3339 time
    string     := '...'   (no escapes; a string cannot hold a quote, as in Tendermint)
    number     := -?[0-9]+(.[0-9]+)?
    tag        := one or more of letters, digits and . _ - / : +

What a condition means for a message whose tags are strings (Roost's tags are
str -> str, docs/protocol.md):

- ``tag EXISTS``: the message has the tag.
- ``tag = 'text'``: the tag's value is exactly ``text``; ``CONTAINS``: it holds ``text``.
- a number operand: the tag's value read as a number (the same ``number`` syntax, or
  with an exponent) compares with it; a value that is not a number never matches.
- ``DATE``/``TIME``: the value read as a date (yyyy-mm-dd) or an RFC 3339 time with
  a zone compares with it; anything else never matches.
- ``<`` and friends with a string operand, or ``CONTAINS`` with a number, are refused
  when the query is compiled (Tendermint compares strings only for equality).

A query is parsed and compiled once per subscription (:func:`compile_query`
memoises), into one Python closure per condition; matching a message is a dict
lookup and a comparison per condition. A tag value is read as a number, date or
time through a small cache, since one message is tested against many queries. A malformed query raises
:class:`QueryError`, whose ``position`` (0-based offset into the query text)
says where.

A hand-written tokenizer rather than a parser library: the grammar is eleven
tokens and one level, and the error positions are what users see.
"""

from __future__ import annotations

import datetime
import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

MAX_QUERY_CHARS = 1024
MAX_CONDITIONS = 32
#: An equality's value up to this long is kept as a string (compared with ==); a longer one as
#: its place in the query's text (no copy of a kilobyte value per subscription).
SHORT_VALUE = 24

_TOKEN = re.compile(
    r"""(?P<ws>\s+)
      | (?P<string>'[^']*')
      | (?P<op><=|>=|=|<|>)
      | (?P<number>-?[0-9]+(?:\.[0-9]+)?(?![A-Za-z0-9_./:+-]))
      | (?P<word>[A-Za-z0-9_./:+-]+)
      | (?P<bad>'|.)""",
    re.VERBOSE,
)
_KEYWORDS = frozenset({"AND", "EXISTS", "CONTAINS", "DATE", "TIME"})
_VALUE_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")

Tags = Mapping[str, str] | None
Test = Callable[[str], bool]


class QueryError(ValueError):
    """A query that cannot be compiled; ``position`` is the 0-based offset of the fault."""

    def __init__(self, query: str, position: int, what: str) -> None:
        super().__init__(f"{what} at position {position} of the query {query!r}")
        self.query = query
        self.position = position
        self.what = what


@functools.lru_cache(maxsize=4096)
def parse_number(text: str) -> int | float | None:
    """A tag value read as a number; None if it is not one (no 'nan', 'inf', '1_0' or spaces)."""
    if not _VALUE_NUMBER.fullmatch(text):
        return None
    if "." in text or "e" in text or "E" in text:
        return float(text)
    return int(text)


@functools.lru_cache(maxsize=1024)
def parse_date(text: str) -> datetime.date | None:
    if not _DATE.fullmatch(text):
        return None
    try:
        return datetime.date.fromisoformat(text)
    except ValueError:
        return None


@functools.lru_cache(maxsize=1024)
def parse_time(text: str) -> datetime.datetime | None:
    """An RFC 3339 time with a zone (``Z`` or an offset); None for anything else."""
    if len(text) < 20 or not _DATE.match(text) or text[10] not in "Tt":
        return None
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        return None
    return t if t.tzinfo is not None else None


_COMPARE: dict[str, Callable[[Any, Any], bool]] = {
    "=": lambda a, b: bool(a == b),
    "<": lambda a, b: bool(a < b),
    "<=": lambda a, b: bool(a <= b),
    ">": lambda a, b: bool(a > b),
    ">=": lambda a, b: bool(a >= b),
}


def _typed_test(op: str, operand: Any, read: Callable[[str], Any]) -> Test:
    compare = _COMPARE[op]

    def test(value: str) -> bool:
        v = read(value)
        return v is not None and compare(v, operand)

    return test


class Query:
    """A compiled query: ``matches(tags)`` is true when every condition holds.

    Small, since a node holds one per subscription with a query and a stranger may send a
    thousand of them, each a kilobyte of 32 conditions: it keeps the text it was compiled
    from (``source[start:]``, often the filter string the subscription is keyed by, so no
    copy), an equality condition (the common one) as its tag and where its value lies in that
    text (compared in place, ``str.startswith`` at an offset: no copy of the value), and only
    the other conditions as closures. ``conditions`` is parsed again when asked (tests,
    status): nothing holds it."""

    __slots__ = ("_source", "_start", "_short", "_equal", "_tests")

    def __init__(self, source: str, start: int, short: tuple[tuple[str, str], ...], equal: tuple[str | int, ...],
                 tests: tuple[tuple[str, Test | None], ...]) -> None:  # fmt: skip
        self._source = source
        self._start = start
        # `tag = 'value'` with a value of at most SHORT_VALUE characters: (tag, value), compared
        # with == (as fast as a closure, and a few bytes); longer ones are offsets, below
        self._short = short
        # tag, start, end of each `tag = 'value'` (the value is source[start:end]), flat: a
        # tuple per condition would cost 64 bytes more each
        self._equal = equal
        self._tests = tests  # (tag, test): None for EXISTS

    @property
    def text(self) -> str:
        return self._source[self._start :]

    @property
    def conditions(self) -> list[tuple[str, str, Any]]:
        """(tag, op, operand) per condition, in the order written."""
        return _parse(self.text)[0]

    def matches(self, tags: Tags) -> bool:
        if not tags:
            return False
        for name, want in self._short:
            if tags.get(name) != want:
                return False
        equal = self._equal
        source = self._source
        for i in range(0, len(equal), 3) if equal else ():
            value = tags.get(equal[i])  # type: ignore[arg-type]
            start: int = equal[i + 1]  # type: ignore[assignment]
            if value is None or len(value) != equal[i + 2] - start or not source.startswith(value, start):  # type: ignore[operator]
                return False
        for name, test in self._tests:
            value = tags.get(name)
            if value is None or (test is not None and not test(value)):
                return False
        return True

    def __repr__(self) -> str:
        return f"Query({self.text!r})"


class _Tokens:
    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[tuple[str, str, int]] = []
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            assert kind is not None
            if kind == "ws":
                continue
            if kind == "bad":
                what = "an unterminated string" if m.group() == "'" else f"unexpected character {m.group()!r}"
                raise QueryError(text, m.start(), what)
            self.items.append((kind, m.group(), m.start()))
        self.i = 0

    def peek(self) -> tuple[str, str, int] | None:
        return self.items[self.i] if self.i < len(self.items) else None

    def take(self, expected: str) -> tuple[str, str, int]:
        t = self.peek()
        if t is None:
            raise QueryError(self.text, len(self.text), f"expected {expected}, found the end")
        self.i += 1
        return t

    def fail(self, t: tuple[str, str, int], expected: str) -> QueryError:
        return QueryError(self.text, t[2], f"expected {expected}, found {t[1]!r}")


def _condition(toks: _Tokens) -> tuple[tuple[str, str, Any], Test | tuple[int, int] | None]:
    """One condition: (tag, op, operand), and how to test it: a closure, None (EXISTS) or, for
    an equality with a string, where that string lies in the query's text."""
    t = toks.take("a tag name")
    if t[0] not in ("word", "number") or t[1] in _KEYWORDS:
        raise toks.fail(t, "a tag name")
    tag = t[1]
    t = toks.take("an operator (=, <, <=, >, >=, CONTAINS or EXISTS)")
    if t[0] == "word" and t[1] == "EXISTS":
        return (tag, "EXISTS", None), None
    if t[0] == "word" and t[1] == "CONTAINS":
        o = toks.take("a string in single quotes")
        if o[0] != "string":
            raise toks.fail(o, "a string in single quotes (CONTAINS looks for text)")
        needle = o[1][1:-1]
        return (tag, "CONTAINS", needle), lambda value: needle in value
    if t[0] != "op":
        raise toks.fail(t, "an operator (=, <, <=, >, >=, CONTAINS or EXISTS)")
    op = t[1]
    o = toks.take("a string, number, DATE or TIME")
    if o[0] == "string":
        if op != "=":
            raise QueryError(toks.text, t[2], f"operator {op} compares numbers, dates or times, not a string")
        return (tag, op, o[1][1:-1]), (o[2] + 1, o[2] + len(o[1]) - 1)  # (where the value lies in the text)
    if o[0] == "number":
        n = parse_number(o[1])
        assert n is not None
        return (tag, op, n), _typed_test(op, n, parse_number)
    if o[0] == "word" and o[1] in ("DATE", "TIME"):
        v = toks.take("a date (yyyy-mm-dd)" if o[1] == "DATE" else "a time (RFC 3339, as 2026-11-24T10:00:00Z)")
        if o[1] == "DATE":
            d = parse_date(v[1]) if v[0] in ("word", "number") else None
            if d is None:
                raise toks.fail(v, "a date (yyyy-mm-dd)")
            return (tag, op, d), _typed_test(op, d, parse_date)
        tm = parse_time(v[1]) if v[0] in ("word", "number") else None
        if tm is None:
            raise toks.fail(v, "a time with a zone (RFC 3339, as 2026-11-24T10:00:00Z)")
        return (tag, op, tm), _typed_test(op, tm, parse_time)
    raise toks.fail(o, "a string, number, DATE or TIME")


def _parse(text: str) -> tuple[list[tuple[str, str, Any]], list[tuple[str, Test | tuple[int, int] | None]]]:
    if len(text) > MAX_QUERY_CHARS:
        raise QueryError(text, MAX_QUERY_CHARS, f"a query is at most {MAX_QUERY_CHARS} characters")
    toks = _Tokens(text)
    if not toks.items:
        raise QueryError(text, 0, "expected a condition, found an empty query")
    conditions, tests = [], []
    while True:
        cond, test = _condition(toks)
        conditions.append(cond)
        tests.append((cond[0], test))
        t = toks.peek()
        if t is None:
            break
        if t[0] != "word" or t[1] != "AND":
            raise toks.fail(t, "AND or the end of the query")
        toks.i += 1
        if len(conditions) == MAX_CONDITIONS:
            raise QueryError(text, t[2], f"a query has at most {MAX_CONDITIONS} conditions")
    return conditions, tests


def _compile(source: str, start: int) -> Query:
    _, tests = _parse(source[start:])
    offsets = [(tag, start + t[0], start + t[1]) for tag, t in tests if t.__class__ is tuple]  # type: ignore[index]
    short = tuple((tag, source[a:b]) for tag, a, b in offsets if b - a <= SHORT_VALUE)
    equal = tuple(x for tag, a, b in offsets if b - a > SHORT_VALUE for x in (tag, a, b))
    rest = tuple((tag, t) for tag, t in tests if t.__class__ is not tuple)
    return Query(source, start, short, equal, rest)  # type: ignore[arg-type]


_compiled: dict[str, Query] = {}


def compile_query(text: str, start: int = 0) -> Query:
    """Parse and compile the query ``text[start:]`` (memoised: subscriptions share their
    compiled queries). The Query keeps ``text`` itself: a filter string passes itself and
    where its query starts, and no copy of the query is kept."""
    key = text[start:] if start else text
    q = _compiled.get(key)
    if q is None:
        q = _compile(text, start)
        if len(_compiled) >= 4096:
            _compiled.clear()
        _compiled[key] = q
    return q
