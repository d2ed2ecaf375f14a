"""Who is subscribed to what: topic -> key -> subscriber -> mode.

Ray's SubscriptionIndex/EntityState in one nested dict: the ``None`` key holds
whole-topic subscribers ("subscribe to all"). A subscriber is either a binary
client id (``bytes``) or a text-protocol source address (``tuple``); the
broker tells them apart by type on the hot path. Adding or removing twice is a
no-op, so commands are idempotent and the last one wins.
"""

from __future__ import annotations

from typing import Any

Subscriber = Any  # bytes (binary client id) or (host, port) of a text client


class SubscriptionIndex:
    __slots__ = ("topics", "names", "count")

    def __init__(self) -> None:
        self.topics: dict[str, dict[str | None, dict[Subscriber, int]]] = {}
        self.names: dict[str, str] = {}  # topic -> the one stored copy of it
        self.count = 0

    def add(self, topic: str, key: str | None, who: Subscriber, mode: int) -> str:
        """Subscribe (or change mode). Returns the index's own copy of ``topic``
        so that callers can store that one object instead of another copy
        (a million subscriptions to few topics would otherwise hold a million
        equal strings)."""
        keys = self.topics.get(topic)
        if keys is None:
            keys = self.topics[topic] = {}
            self.names[topic] = topic
        else:
            topic = self.names[topic]
        subs = keys.get(key)
        if subs is None:
            subs = keys[key] = {}
        if who not in subs:
            self.count += 1
        subs[who] = mode
        return topic

    def remove(self, topic: str, key: str | None, who: Subscriber) -> bool:
        """Unsubscribe; True if there was something to remove. Empty levels go."""
        keys = self.topics.get(topic)
        if keys is None:
            return False
        subs = keys.get(key)
        if subs is None or who not in subs:
            return False
        del subs[who]
        self.count -= 1
        if not subs:
            del keys[key]
            if not keys:
                del self.topics[topic]
                del self.names[topic]
        return True

    def match(self, topic: str, key: str | None) -> dict[Subscriber, int] | None:
        """Subscribers of a message, each once, with the strongest mode.

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
