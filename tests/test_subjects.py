"""Subscription filters: patterns, the token trie, tag queries (client/subjects.py, client/query.py).

The trie and the query compiler are checked against slow reference matchers written here from
the rules in docs/protocol.md, over inputs hypothesis generates."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.client import wire
from roost.client.query import QueryError, compile_query, parse_number
from roost.client.subjects import (
    FilterError,
    PatternTrie,
    make_filter,
    parse_filter_untrusted,
    partition_topic,
    tokens_match,
)
from roost.node.subscriptions import SubscriptionIndex

# ---------------------------------------------------------------- patterns


@pytest.mark.parametrize(("pattern", "topic", "expected"), [
    ("demo.>", "demo.a", True),
    ("demo.>", "demo.b.c", True),
    ("demo.>", "demox", False),
    ("demo.>", "demo", False),
    ("demo.*", "demo.a", True),
    ("demo.*", "demo.a.b", False),
    ("*.b.*", "a.b.c", True),
    ("*.b.*", "a.x.c", False),
    ("*", "t1", True),
    ("*", "a.b", False),
    (">", "a.b.c", True),
    ("a.*.>", "a.b", False),
    ("a.*.>", "a.b.c", True),
    ("a..*", "a..b", True),
])  # fmt: skip
def test_pattern_meaning(pattern: str, topic: str, expected: bool) -> None:
    f = parse_filter_untrusted(pattern)
    assert f.matches(topic, None) is expected
    trie = PatternTrie()
    trie.add(f)
    assert (pattern in list(trie.match(topic.split(".")))) is expected


@pytest.mark.parametrize(("text", "says"), [
    ("ord*", "must be whole tokens"),
    ("a.b>", "must be whole tokens"),
    ("a.>.b", "must be its last token"),
    ("a.**", "must be whole tokens"),
    ("", "needs a topic or pattern"),
    ("a" * 256, "longer than 255 bytes"),
    ("a.> queue=", "queue group name"),
    ("a.> queue=bad name", "after the queue group"),
    ("a.> queue=w x", "after the queue group"),
    ("a.> nonsense", "followed by ' queue=<group>' or ' where <query>'"),
    ("a.> where amount >", "bad query: expected a string, number, DATE or TIME, found the end at position"),
    ("a where x = 1" + " AND x = 1" * 40, "at most 32 conditions"),
])  # fmt: skip
def test_bad_filters_are_refused_with_the_reason(text: str, says: str) -> None:
    with pytest.raises(FilterError) as exc:
        parse_filter_untrusted(text)
    assert says in str(exc.value)
    # and on the wire, as bad_topic with the same words
    with pytest.raises(wire.WireError) as werr:
        wire.check_filter(text)
    assert werr.value.code == wire.ErrorCode.BAD_TOPIC
    assert says in werr.value.text or (text == "" and werr.value.text == "topic must be a non-empty string")


def test_published_topics_cannot_hold_wildcards() -> None:
    for topic in ("demo.*", "demo.>", "a*b", "news>"):
        with pytest.raises(wire.WireError) as exc:
            wire.check_topic(topic)
        assert "wildcards, for subscriptions only" in exc.value.text
    assert wire.check_topic("demo.a") == "demo.a"


def test_filter_strings_name_pattern_queue_and_query() -> None:
    text = make_filter("orders.>", queue="workers", query="kind = 'order' AND amount > 100")
    assert text == "orders.> queue=workers where kind = 'order' AND amount > 100"
    f = parse_filter_untrusted(text)
    assert (f.pattern, f.queue, f.wild, f.plain) == ("orders.>", "workers", True, False)
    assert f.query is not None and f.query.matches({"kind": "order", "amount": "101"})
    assert not f.query.matches({"kind": "order", "amount": "100"})
    assert parse_filter_untrusted("t1").plain
    assert partition_topic("t1") == "t1"
    assert partition_topic("orders where kind = 'a'") == "orders"
    assert partition_topic("orders queue=w") == "orders"
    assert partition_topic("orders.*") is None
    with pytest.raises(QueryError) as exc:
        make_filter("orders", query="kind = 'order' AND")
    assert exc.value.position == len("kind = 'order' AND")


# ---------------------------------------------------------------- the trie against the reference

_tokens = st.sampled_from(["a", "b", "c", ""])
_topics = st.lists(_tokens, min_size=1, max_size=4).map(".".join)
_pattern_tokens = st.sampled_from(["a", "b", "c", "*"])


@st.composite
def _patterns(draw: Any) -> str:
    tokens = draw(st.lists(_pattern_tokens, min_size=1, max_size=4))
    if draw(st.booleans()):
        tokens[-1] = ">"
    return ".".join(tokens)


@settings(max_examples=300, deadline=None)
@given(st.lists(_patterns(), max_size=12), st.lists(_patterns(), max_size=6), st.lists(_topics, max_size=8))
def test_trie_matches_like_the_reference(added: list[str], removed: list[str], topics: list[str]) -> None:
    trie = PatternTrie()
    for p in added:
        trie.add(parse_filter_untrusted(p))
    for p in removed:
        trie.remove(parse_filter_untrusted(p))
    held = set(added) - set(removed)
    assert trie.size == len(held)
    for topic in topics:
        tokens = topic.split(".")
        got = list(trie.match(tokens))
        assert len(got) == len(set(got)), "a filter reached twice"
        assert set(got) == {p for p in held if tokens_match(p.split("."), tokens)}
    for p in held:
        trie.remove(parse_filter_untrusted(p))
    assert trie.size == 0 and not trie.root.children and trie.root.star is None


# ---------------------------------------------------------------- queries against the reference

_names = st.sampled_from(["kind", "amount", "tx.height", "day", "at"])
_strings = st.text(alphabet="abcor d", max_size=5)
_numbers = st.one_of(st.integers(-1000, 1000), st.decimals(-1000, 1000, places=2).map(float))
_dates = st.dates(datetime.date(2025, 1, 1), datetime.date(2027, 12, 31))
_times = st.datetimes(datetime.datetime(2025, 1, 1), datetime.datetime(2027, 1, 1)).map(
    lambda t: t.replace(microsecond=0, tzinfo=datetime.UTC)
)
_ops = st.sampled_from(["=", "<", "<=", ">", ">="])


@st.composite
def _condition(draw: Any) -> tuple[str, str, Any]:
    name = draw(_names)
    kind = draw(st.sampled_from(["exists", "contains", "string", "number", "date", "time"]))
    if kind == "exists":
        return (name, "EXISTS", None)
    if kind == "contains":
        return (name, "CONTAINS", draw(_strings))
    if kind == "string":
        return (name, "=", draw(_strings))
    op = draw(_ops)
    return (name, op, draw({"number": _numbers, "date": _dates, "time": _times}[kind]))


def _render(cond: tuple[str, str, Any]) -> str:
    name, op, v = cond
    if op == "EXISTS":
        return f"{name} EXISTS"
    if isinstance(v, str):
        return f"{name} {op} '{v}'"
    if isinstance(v, datetime.datetime):
        return f"{name} {op} TIME {v.isoformat().replace('+00:00', 'Z')}"
    if isinstance(v, datetime.date):
        return f"{name} {op} DATE {v.isoformat()}"
    return f"{name} {op} {v!r}"


def _reference(cond: tuple[str, str, Any], tags: dict[str, str]) -> bool:
    """The meaning of one condition, spelled out case by case (docs/protocol.md, Tag queries)."""
    name, op, v = cond
    if name not in tags:
        return False
    value = tags[name]
    if op == "EXISTS":
        return True
    if op == "CONTAINS":
        return v in value
    if isinstance(v, str):
        return value == v
    if isinstance(v, datetime.datetime):
        try:
            got: Any = datetime.datetime.fromisoformat(value)
        except ValueError:
            return False
        if got.tzinfo is None or "T" not in value:
            return False
    elif isinstance(v, datetime.date):
        try:
            got = datetime.date.fromisoformat(value)
        except ValueError:
            return False
        if len(value) != 10:
            return False
    else:
        try:
            got = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            return False
        if value.strip() != value or "_" in value or value.lower() in ("nan", "inf", "-inf", "infinity"):
            return False
    return {"=": got == v, "<": got < v, "<=": got <= v, ">": got > v, ">=": got >= v}[op]


@st.composite
def _tag_values(draw: Any) -> str:
    return draw(st.one_of(
        _strings, _numbers.map(str), _dates.map(str), _times.map(lambda t: t.isoformat().replace("+00:00", "Z")),
        st.sampled_from(["nan", "1e3", " 5", "1_0", "2026-13-01", "2026-01-01T00:00:00"]),
    ))  # fmt: skip


def _as_tag(v: Any) -> str:
    """An operand written as a tag value would be (so that equal values come up often)."""
    if isinstance(v, datetime.datetime):
        return v.isoformat().replace("+00:00", "Z")
    return v if isinstance(v, str) else str(v)


@settings(max_examples=400, deadline=None)
@given(st.lists(_condition(), min_size=1, max_size=4), st.data())
def test_query_matches_like_the_reference(conds: list[tuple[str, str, Any]], data: Any) -> None:
    near = [_as_tag(c[2]) for c in conds if c[2] is not None]
    values = st.one_of(_tag_values(), st.sampled_from(near)) if near else _tag_values()
    tag_sets = data.draw(st.lists(st.dictionaries(_names, values, max_size=5), min_size=1, max_size=6))
    text = " AND ".join(_render(c) for c in conds)
    q = compile_query(text)
    assert [c[:2] for c in q.conditions] == [c[:2] for c in conds]
    for tags in tag_sets:
        assert q.matches(tags) is all(_reference(c, tags) for c in conds), (text, tags)


@pytest.mark.parametrize(("query", "position", "says"), [
    ("", 0, "empty query"),
    ("kind =", 6, "found the end"),
    ("kind = 'order", 7, "unterminated string"),
    ("kind == 'a'", 6, "expected a string, number, DATE or TIME, found '='"),
    ("kind = 'a' OR x = 1", 11, "expected AND or the end"),
    ("amount > 'x'", 7, "compares numbers, dates or times, not a string"),
    ("kind CONTAINS 5", 14, "a string in single quotes"),
    ("AND = 1", 0, "expected a tag name"),
    ("day > DATE 2026-02-30", 11, "a date"),
    ("at > TIME 2026-01-01T00:00:00", 10, "a time with a zone"),
    ("kind ~ 'a'", 5, "unexpected character '~'"),
])  # fmt: skip
def test_malformed_queries_say_where(query: str, position: int, says: str) -> None:
    with pytest.raises(QueryError) as exc:
        compile_query(query)
    assert exc.value.position == position, str(exc.value)
    assert says in str(exc.value)


def test_tag_values_read_as_numbers_strictly() -> None:
    assert parse_number("100") == 100 and parse_number("-1.5") == -1.5 and parse_number("1e3") == 1000.0
    for bad in ("nan", "inf", " 1", "1_000", "0x10", ""):
        assert parse_number(bad) is None


# ---------------------------------------------------------------- the node's index


def test_index_matches_bare_topics_wildcards_and_queries_each_subscriber_once() -> None:
    idx = SubscriptionIndex()
    idx.add("demo.a", None, b"exact", 0)
    idx.add("demo.>", None, b"wild", 1)
    idx.add("demo.*", None, b"wild", 0)
    idx.add("demo.* where kind = 'order' AND amount > 100", None, b"query", 1)
    idx.add("demo.>", "k1", b"keyed", 0)
    assert idx.count == 5
    got = {fs.filter.text for fs in idx.matching_filters("demo.a", {"kind": "order", "amount": "150"})}
    assert got == {"demo.>", "demo.*", "demo.* where kind = 'order' AND amount > 100"}
    got = {fs.filter.text for fs in idx.matching_filters("demo.a", {"kind": "order", "amount": "50"})}
    assert got == {"demo.>", "demo.*"}
    assert idx.matching_filters("demox", None) == []
    assert idx.match("demo.a", None) == {b"exact": 0}
    for text, key, who in [("demo.>", None, b"wild"), ("demo.*", None, b"wild"), ("demo.>", "k1", b"keyed"),
                           ("demo.* where kind = 'order' AND amount > 100", None, b"query")]:  # fmt: skip
        assert idx.remove(text, key, who)
        assert not idx.remove(text, key, who)
    assert idx.filters == {} and idx.trie.size == 0 and idx.count == 1
