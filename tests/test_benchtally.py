"""The bench's count of what a subscriber saw (scripts/benchsystems.py, ``Tally``): every
system's figures of loss, duplicates, order and latency come from it."""

from __future__ import annotations

from scripts.benchsystems import HEAD, Tally


def _msg(i: int, sent: float = 0.0) -> bytes:
    return HEAD.pack(i, sent) + b"pad"


def test_one_stream_counts_duplicates_order_and_the_end() -> None:
    t = Tally(4)
    assert [t.take(_msg(i)) for i in (0, 2, 1, 2, 9, 3)] == [False, False, False, False, False, True]
    r = t.result(0.0)
    assert (r["received"], r["lost"], r["duplicated"], r["out_of_order"]) == (4, 0, 2, 1)  # (9: out of range)
    assert len(r["latencies"]) == 4 and r["first"] <= r["last"]


def test_streams_per_publisher_and_topic_keep_their_own_order() -> None:
    """Two publishers (indexes 0-9 and 10-19), two topics each (index mod 2): an index below
    the last of its own stream is out of order, one below another stream's is not."""
    t = Tally(20, space=20, publishers=2, topics=2)
    for i in (10, 11, 0, 1, 12, 2, 3, 13, 14, 5, 4, 7, 9, 15, 6, 8, 16, 18, 17, 19):  # (each stream in order)
        t.take(_msg(i))
    assert t.ooo == 0 and t.got == 20
    for publishers, topics, order, ooo in [(2, 2, (15, 12, 11), 1),  # (11 after 15: publisher 1, topic 1)
                                           (1, 2, (2, 0, 3, 1), 2),  # (0 after 2, 1 after 3)
                                           (2, 1, (12, 3, 11, 2), 2)]:  # (11 after 12, 2 after 3)  # fmt: skip
        late = Tally(20, publishers=publishers, topics=topics)
        for i in order:
            late.take(_msg(i))
        assert late.ooo == ooo, (publishers, topics)


def test_latencies_count_from_the_warmup_on_and_a_subscriber_of_some_topics_ends_at_its_share() -> None:
    t = Tally(3, space=10, warmup=5)
    assert not t.take(_msg(1, 0.0))
    assert not t.take(_msg(6, 0.0))
    assert t.take(_msg(8, 0.0))
    assert len(t.lat) == 2 and all(x > 0 for x in t.lat)  # (now - sent, sent at 0)
    merged = Tally.merged([t, Tally(2, space=10)], 0.0)
    assert (merged["received"], merged["lost"]) == (3, 2)
