"""client/durableclient.py alone, with fake time: a durable request goes to its partition's
primary, is sent again after 5 x pub_retry without an answer or pub_retry after a refusal (to
the member the map names then), a GET keeps the records at or past the offset read to, and the
commit-before-read break holds a GET's records until their COMMIT is answered."""

from __future__ import annotations

from roost.client import durablewire
from roost.client.durableclient import DONE, PAUSE, SENT, WELCOME, DurableClient
from roost.client.router import Router
from roost.client.session import ClientConfig
from roost.client.wire import FrameType
from tests.test_router import MAP1, addr, connect, frames, router, topic_led_by

RETRY = ClientConfig().pub_retry


def connected(breaks: frozenset[str] = frozenset()) -> tuple[Router, DurableClient]:
    r = Router(b"c" * 16, b"p" * 16, b"f" * 16, ClientConfig(breaks=breaks), 0.0, node=addr("n1"), session=5)
    connect(r, r.first, "n1", MAP1)
    return r, DurableClient(r.cfg)


def records(name: str, p: int, cursor: int, scanned: int, offsets: list[int], end: int = 100, status: int = 0) -> bytes:
    recs = [[o, 1000 + o, "d", None, None, f"m{o}".encode()] for o in offsets]
    return durablewire.encode_records(name, p, cursor, scanned, status, recs, 0, end)


def test_a_get_goes_to_the_primary_and_is_sent_again_without_an_answer_or_after_a_refusal():
    r, core = connected()
    topic = topic_led_by(MAP1, "n1", "d")
    p = MAP1.partition(topic)
    rd = core.reader(r, "default", "sub", topic, p)
    rd.get(10, 0.0)
    assert rd.step(0.0) and rd.ask is not None and rd.ask.state == SENT and rd.ask.session is r.first
    sent = frames(r.first)
    assert [f[0] for _, f in sent] == [FrameType.GET] and sent[0][0] == addr("n1")
    assert not rd.step(5 * RETRY - 0.01) and rd.ask.state == SENT  # (still waiting for its answer)
    assert not rd.step(5 * RETRY) and rd.ask.state == PAUSE  # (no answer: a pause, then again)
    assert rd.step(6 * RETRY) and [f[0] for _, f in frames(r.first, 6 * RETRY)] == [FrameType.GET]
    r.handle_datagrams(r.first, [(records("sub", p, 0, 0, [], status=1), addr("n1"))], 6.5 * RETRY)
    assert rd.ready() and not rd.step(6.5 * RETRY) and rd.ask.state == PAUSE  # (refused: not the leader yet)
    assert not rd.step(7.4 * RETRY) and rd.step(7.5 * RETRY)
    r.handle_datagrams(r.first, [(records("sub", p, 0, 3, [0, 2]), addr("n1"))], 8 * RETRY)
    assert rd.ready()
    rd.step(8 * RETRY)
    assert not rd.busy and [rec[0] for rec in rd.take()] == [0, 2] and rd.take() == []
    assert core.read_to[("default", "sub", topic)] == 3 == rd.nxt


def test_records_below_the_offset_read_to_are_dropped_and_the_commit_moves_the_cursor_there():
    r, core = connected()
    topic = topic_led_by(MAP1, "n1", "d")
    p = MAP1.partition(topic)
    rd = core.reader(r, "default", "sub", topic, p, nxt=5)  # (as from an offsets file)
    rd.get(10, 0.0)
    rd.step(0.0)
    get = frames(r.first)[0][1]
    assert get[-1] == 5  # (read from the offset read to)
    r.handle_datagrams(r.first, [(records("sub", p, 0, 9, [3, 4, 5, 8]), addr("n1"))], 0.1)
    rd.step(0.1)
    assert [rec[0] for rec in rd.take()] == [5, 8] and rd.nxt == 9 and not rd.at_end
    rd.commit(0.2)
    rd.step(0.2)
    assert [f[0] for _, f in frames(r.first, 0.2)] == [FrameType.COMMIT]
    r.handle_datagrams(r.first, [(durablewire.encode_committed("sub", p, 9, 0), addr("n1"))], 0.3)
    rd.step(0.3)
    assert not rd.busy and rd.committed


def test_a_request_waits_for_its_primarys_session_and_follows_the_map():
    """A topic whose primary has no session yet: the router opens one; the request waits for its
    WELCOME (or WELCOME_WAIT), then goes there."""
    r, core = connected()
    topic = topic_led_by(MAP1, "n2", "d")
    ask = core.read(r, topic, MAP1.partition(topic), 0, 10, 0.0)
    assert not ask.step(0.0) and ask.state == WELCOME and ask.session is r.by_member["n2"]
    assert not ask.ready()
    connect(r, r.by_member["n2"], "n2", MAP1, 0.1)
    assert ask.ready() and ask.step(0.1) and ask.state == SENT
    assert [f[0] for _, f in frames(r.by_member["n2"], 0.1)] == [FrameType.GET]
    r.handle_datagrams(r.by_member["n2"], [(records("", MAP1.partition(topic), 0, 0, []), addr("n2"))], 0.2)
    ask.step(0.2)
    assert ask.state == DONE and ask.answer is not None and ask.answer[0] is FrameType.RECORDS


def test_commit_before_read_holds_a_gets_records_until_their_commit_is_answered():
    """The deliberately broken build (ClientConfig.breaks): the cursor moves past the records
    before the application has them."""
    r, core = connected(frozenset({"commit-before-read"}))
    topic = topic_led_by(MAP1, "n1", "d")
    p = MAP1.partition(topic)
    rd = core.reader(r, "default", "sub", topic, p)
    rd.get(10, 0.0)
    rd.step(0.0)
    frames(r.first)
    r.handle_datagrams(r.first, [(records("sub", p, 0, 2, [0, 1]), addr("n1"))], 0.1)
    assert rd.step(0.1) and rd.busy and rd.take() == []  # (a COMMIT went first)
    assert [f[0] for _, f in frames(r.first, 0.1)] == [FrameType.COMMIT]
    r.handle_datagrams(r.first, [(durablewire.encode_committed("sub", p, 2, 0), addr("n1"))], 0.2)
    rd.step(0.2)
    assert not rd.busy and [rec[0] for rec in rd.take()] == [0, 1]
    assert DurableClient(router().cfg).commit_before_read is False
