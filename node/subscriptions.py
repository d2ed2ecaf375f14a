"""Who is subscribed to what: filter -> key -> subscriber -> mode.

Ray's SubscriptionIndex/EntityState in one nested dict: the ``None`` key holds
whole-topic subscribers ("subscribe to all"). A subscriber is either a binary
client id (``bytes``) or a text-protocol source address (``tuple``); the
broker tells them apart by type on the hot path. Adding or removing twice is a
no-op, so commands are idempotent and the last one wins.

A subscription names a filter (client/subjects.py): a bare topic, or a pattern
with wildcards, a queue group or a tag query. Bare topics, by far the common
case, stay in ``topics`` (one dict lookup per message). Every other filter is
in ``filters`` and, by its pattern's tokens, in a :class:`PatternTrie`: a
message's topic walks the trie (cost grows with its tokens, not with the
number of filters), and each filter reached is checked against the message's
tags and, for a queue group, picks one member (node/delivery.py). Each key of
a queue group's filter has a short ``mark_id`` (client/wire.py) that names it in
the queue marks of MSGS; ``groups`` finds the group again by that id.
"""

from __future__ import annotations

from typing import Any

from roost.client.subjects import Filter, PatternTrie, is_plain, parse_filter_untrusted
from roost.client.wire import mark_id

Subscriber = Any  # bytes (binary client id) or (host, port) of a text client


class FilterSubs:
    """The subscribers of one filter that is not a bare topic."""

    __slots__ = ("filter", "keys", "turn", "marks", "members", "matched")

    def __init__(self, f: Filter) -> None:
        self.filter = f
        self.keys: dict[str | None, dict[Subscriber, int]] = {}
        self.turn = 0  # queue groups: where the next pick starts (round robin)
        self.marks: dict[str | None, bytes] = {}  # queue groups: key -> its mark id
        self.members: dict[str | None, list[Subscriber]] = {}  # queue groups: key -> members, in order
        self.matched = 0  # messages that passed this filter (/subsz)


class SubscriptionIndex:
    __slots__ = ("topics", "names", "count", "filters", "trie", "groups", "matched")

    def __init__(self) -> None:
        self.topics: dict[str, dict[str | None, dict[Subscriber, int]]] = {}
        self.names: dict[str, str] = {}  # topic -> the one stored copy of it
        self.count = 0
        self.filters: dict[str, FilterSubs] = {}
        self.trie = PatternTrie()
        self.groups: dict[bytes, tuple[FilterSubs, str | None]] = {}  # mark id -> queue group (and key)
        self.matched: dict[str, int] = {}  # bare topic -> messages delivered to its subscribers (/subsz)

    def _keys(self, topic: str, create: bool) -> tuple[str, dict[str | None, dict[Subscriber, int]] | None]:
        if is_plain(topic):
            keys = self.topics.get(topic)
            if keys is None and create:
                keys = self.topics[topic] = {}
                self.names[topic] = topic
            elif keys is not None:
                topic = self.names[topic]
            return topic, keys
        fs = self.filters.get(topic)
        if fs is None and create:
            f = parse_filter_untrusted(topic)  # (checked on the wire already: memoised)
            fs = self.filters[topic] = FilterSubs(f)
            self.trie.add(f)
        if fs is None:
            return topic, None
        return fs.filter.text, fs.keys

    def add(self, topic: str, key: str | None, who: Subscriber, mode: int) -> str:
        """Subscribe (or change mode). Returns the index's own copy of ``topic``
        so that callers can store that one object instead of another copy
        (a million subscriptions to few topics would otherwise hold a million
        equal strings)."""
        topic, keys = self._keys(topic, True)
        assert keys is not None
        fs = self.filters.get(topic)  # (None for a bare topic)
        subs = keys.get(key)
        if subs is None:
            subs = keys[key] = {}
            if fs is not None and fs.filter.queue is not None:
                mark = fs.marks[key] = mark_id(topic, key)
                self.groups[mark] = (fs, key)
        if who not in subs:
            self.count += 1
            if fs is not None:
                fs.members.pop(key, None)
        subs[who] = mode
        return topic

    def remove(self, topic: str, key: str | None, who: Subscriber) -> bool:
        """Unsubscribe; True if there was something to remove. Empty levels go."""
        topic, keys = self._keys(topic, False)
        if keys is None:
            return False
        subs = keys.get(key)
        if subs is None or who not in subs:
            return False
        del subs[who]
        self.count -= 1
        fs = self.filters.get(topic)
        if fs is not None:
            fs.members.pop(key, None)
        if not subs:
            del keys[key]
            if fs is not None and key in fs.marks:
                self.groups.pop(fs.marks.pop(key), None)
            if not keys:
                if is_plain(topic):
                    del self.topics[topic]
                    del self.names[topic]
                    self.matched.pop(topic, None)
                else:
                    self.trie.remove(self.filters.pop(topic).filter)
        return True

    def match(self, topic: str, key: str | None) -> dict[Subscriber, int] | None:
        """Subscribers of a message by bare topic, each once, with the strongest mode.

        Returns the stored dict itself in the common case (no keyed
        subscribers involved), so callers must not mutate it.
        """
        keys = self.topics.get(topic)
        if keys is None:
            return None
        every = keys.get(None)
        if key is None:
            return every
        keyed = keys.get(key)
        if keyed is None:
            return every
        if every is None:
            return keyed
        merged = dict(every)
        for who, mode in keyed.items():
            if mode > merged.get(who, -1):
                merged[who] = mode
        return merged

    def matching_filters(self, topic: str, tags: dict[str, str] | None) -> list[FilterSubs]:
        """The filters other than bare topics that a message passes (pattern and query)."""
        out = []
        filters = self.filters
        for text in self.trie.match(topic.split(".")):
            fs = filters[text]
            q = fs.filter.query
            if q is None or q.matches(tags):
                out.append(fs)
        return out
