"""client/router.py alone, with fake time: PUB and SUB go to the session of the topic's primary,
a topic's publishes change session only once the old one acknowledged them all, no map means
one session exactly as before, and only a newer map changes the routes."""

from __future__ import annotations

import dataclasses

import pytest

from roost.client import clustermap, decoding, wire
from roost.client.router import Router, derive_id
from roost.client.session import ClientConfig, ClientSession
from roost.client.wire import FrameType

CID, PID, FPID = b"c" * 16, b"p" * 16, b"f" * 16
COOKIE = b"k" * 16
THREE = {f"n{i}": (("127.0.0.1", 7400 + i), ("127.0.0.1", 7500 + i)) for i in (1, 2, 3)}
MAP1 = clustermap.compute(1, THREE, set(THREE), 16, 2)


def addr(member: str) -> tuple[str, int]:
    return THREE[member][0]


def router() -> Router:
    return Router(CID, PID, FPID, ClientConfig(), 0.0, node=addr("n1"), session=5)


def welcome(member: str, cmap: clustermap.ClusterMap | None, with_map: bool = True) -> bytes:
    params: dict = {"ping_interval": 0.5, "runs": 1}  # (as this build's nodes say)
    if cmap is not None:
        params["map_epoch"] = cmap.epoch
        if with_map:
            params["map"] = clustermap.encode(cmap)
    return wire.encode_welcome(member, COOKIE, params, [[m, *a[0]] for m, a in THREE.items()])


def connect(r: Router, s: ClientSession, member: str, cmap: clustermap.ClusterMap | None, now: float = 0.0) -> None:
    r.tick(s, now)
    assert [decoding.decode_untrusted_frame(d)[0] for _, d in s.outgoing(now)] == [FrameType.HELLO]
    r.handle_datagrams(s, [(welcome(member, cmap), s.node)], now)
    assert s.connected


def frames(s: ClientSession, now: float = 0.0) -> list[tuple]:
    """(destination, decoded frame) of what the session sends now."""
    return [(a, decoding.decode_untrusted_frame(d)) for a, d in s.outgoing(now)]


def topic_led_by(cmap: clustermap.ClusterMap, member: str, prefix: str = "t") -> str:
    return next(f"{prefix}{i}" for i in range(1000) if cmap.primary(f"{prefix}{i}") == member)


def test_without_a_map_everything_goes_to_one_session_with_the_users_ids():
    r = router()
    connect(r, r.first, "n1", None)
    for i in range(20):
        assert r.publish(f"t{i}", None, None, b"x", True) == i + 1  # the session's own sequence
        r.subscribe(f"s{i}", None, 1)
    assert r.sessions == [r.first] and r.cmap is None
    sent = frames(r.first)
    assert {a for a, _ in sent} == {addr("n1")}
    assert {f[1] for _, f in sent} == {CID} and {f[3] for _, f in sent if f[0] is FrameType.PUB} == {PID}


@pytest.mark.parametrize("cmap", [None, MAP1])
def test_offer_fire_publishes_take_no_sequence_and_bind_nothing(cmap):
    """``offer``: a fire publish returns 0 and leaves no pending run and no reliable sequence
    bound to its topic; a reliable one takes the next router-wide sequence, a pending run and
    (with a map) binds its topic to it; a full window is None, and nothing is queued then."""
    r = router()
    connect(r, r.first, "n1", cmap)
    t = topic_led_by(MAP1, "n1")
    assert r.offer(t, None, None, b"f", False) == 0
    assert not r._pending and r._bind.get(t, (r.first, 0)) == (r.first, 0) and r.last_seq == 0
    assert r.offer(t, None, None, b"r", True) == 1
    assert len(r._pending) == 1 and r._bind.get(t) == ((r.first, 1) if cmap is not None else None)
    r.first.pub.cfg = dataclasses.replace(r.first.pub.cfg, pub_window=1)
    assert r.offer(t, None, None, b"r2", True) is None and r.last_seq == 1
    assert r.offer(t, None, None, b"f2", False) == 0  # (fire has no window)
    # offer writes Publisher.window_full out: its bytes bound too (room for messages, none for bytes)
    r.first.pub.cfg = dataclasses.replace(r.first.pub.cfg, pub_window=100, pub_window_bytes=r.first.pub.unacked_bytes)
    assert r.first.pub.window_full and r.offer(t, None, None, b"r3", True) is None and r.last_seq == 1
    r.first.pub.cfg = dataclasses.replace(r.first.pub.cfg, pub_window_bytes=r.first.pub.unacked_bytes + 1)
    assert not r.first.pub.window_full and r.offer(t, None, None, b"r3", True) == 2
    sent = [f for _, f in frames(r.first)]
    pubs = [m[3] for f in sent if f[0] is FrameType.PUB for m in f[7]]
    runs = [p for f in sent if f[0] is FrameType.PUBRUN for p in f[6]]
    assert sorted(pubs + runs) == [b"f", b"f2", b"r", b"r3"]
    assert [f[6] for f in sent if f[0] is FrameType.PUBRUN] == [[b"f", b"f2"]]  # (fire, one topic: a run)


def test_pub_and_sub_go_to_the_session_of_the_topics_primary():
    r = router()
    connect(r, r.first, "n1", MAP1)
    assert r.cmap == MAP1 and r.by_member == {"n1": r.first}
    t1, t2, t3 = (topic_led_by(MAP1, m) for m in ("n1", "n2", "n3"))
    r.publish(t1, None, None, b"1", True)
    assert r.sessions == [r.first]  # the first member leads t1: nothing else opened
    r.publish(t2, None, None, b"2", True)
    s2 = r.by_member["n2"]
    assert s2.node == addr("n2") and s2.cid == derive_id(CID, "n2") and s2.pub.pid == derive_id(PID, "n2")
    s3, _ = r.subscribe(t3, None, 1)
    assert s3 is r.by_member["n3"] and s3.node == addr("n3") and s3.cid == derive_id(CID, "n3")
    assert len({s.cid for s in r.sessions}) == 3
    connect(r, s2, "n2", MAP1)
    connect(r, s3, "n3", MAP1)
    assert [(a, f[0], f[7][0][0]) for a, f in frames(s2) if f[0] is FrameType.PUB] == [(addr("n2"), FrameType.PUB, t2)]
    assert [(a, f[5][0][1]) for a, f in frames(s3) if f[0] is FrameType.CMDS] == [(addr("n3"), t3)]
    assert [f[7][0][0] for _, f in frames(r.first) if f[0] is FrameType.PUB] == [t1]


def test_a_topic_moves_to_its_new_primary_only_once_the_old_session_acknowledged_it():
    r = router()
    connect(r, r.first, "n1", MAP1)
    topic = next(f"o{i}" for i in range(1000) if MAP1.primary(f"o{i}") == "n2"
                 and clustermap.compute(2, THREE, {"n1", "n3"}, 16, 2).primary(f"o{i}") == "n3")  # fmt: skip
    seqs = [r.publish(topic, None, None, b"%d" % i, True) for i in range(3)]
    s2 = r.by_member["n2"]
    connect(r, s2, "n2", MAP1)
    assert [f[4] for _, f in frames(s2) if f[0] is FrameType.PUB] == [1]  # (first seq) the three in one PUB
    map2 = clustermap.compute(2, THREE, {"n1", "n3"}, 16, 2)  # n2 down: n3 leads the topic now
    r.handle_datagrams(s2, [(wire.encode_redirect("n2", clustermap.encode(map2)), addr("n2"))], 0.1)
    assert r.cmap == map2 and r.session_for(topic) is r.by_member["n3"]
    r.handle_datagrams(s2, [(wire.encode_puback(s2.pub.pid, 2), addr("n2"))], 0.2)
    assert r.acked == seqs[1]
    r.publish(topic, None, None, b"3", True)  # seq 3 is not acknowledged yet: stays on s2
    assert r.pub_session(topic) is s2 and s2.last_seq == 4
    r.handle_datagrams(s2, [(wire.encode_puback(s2.pub.pid, 3), addr("n2"))], 0.3)
    assert r.pub_session(topic) is s2  # seq 4 is still out
    r.handle_datagrams(s2, [(wire.encode_puback(s2.pub.pid, 4), addr("n2"))], 0.4)
    assert r.acked == 4
    r.publish(topic, None, None, b"4", True)
    s3 = r.by_member["n3"]
    assert s2.last_seq == 4 and s3.last_seq == 1  # moved: everything before it was acknowledged


def test_a_newer_redirect_moves_routing_and_an_older_one_is_ignored():
    r = router()
    connect(r, r.first, "n1", dataclasses.replace(MAP1, epoch=5))
    map2 = clustermap.compute(3, THREE, {"n1", "n3"}, 16, 2)  # (epoch 3 < 5: older)
    topic = next(f"r{i}" for i in range(1000) if MAP1.primary(f"r{i}") == "n2"
                 and map2.primary(f"r{i}") != "n2")  # fmt: skip
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(map2)), addr("n1"))], 0.1)
    assert r.cmap is not None and r.cmap.epoch == 5 and r.session_for(topic) is r.by_member["n2"]
    newer = dataclasses.replace(map2, epoch=6)
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(newer)), addr("n1"))], 0.2)
    assert r.cmap == newer and r.session_for(topic).node == addr(newer.primary(topic) or "")


def test_a_subscription_stays_on_its_session_when_the_map_changes():
    r = router()
    connect(r, r.first, "n1", MAP1)
    topic = topic_led_by(MAP1, "n2", "sub")
    s, _ = r.subscribe(topic, None, 1)
    newer = clustermap.compute(2, THREE, {"n1", "n3"}, 16, 2)
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(newer)), addr("n1"))], 0.1)
    assert r.session_for(topic) is not s
    s_again, _ = r.subscribe(topic, None, 0)  # a new mode for the subscription in force: the same session
    assert s_again is s
    r.unsubscribe(topic, None)
    s_new, _ = r.subscribe(topic, None, 1)  # a new subscription: at the primary of now
    assert s_new is r.session_for(topic)


def test_a_welcome_without_room_for_the_map_makes_the_session_ask_for_it():
    r = router()
    r.tick(r.first, 0.0)
    r.first.outgoing(0.0)
    r.handle_datagrams(r.first, [(welcome("n1", MAP1, with_map=False), addr("n1"))], 0.0)
    assert r.cmap is None
    assert [f for _, f in frames(r.first) if f[0] is FrameType.MAP] == [(FrameType.MAP, CID, COOKIE)]
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(MAP1)), addr("n1"))], 0.1)
    assert r.cmap == MAP1


def test_a_lost_map_request_is_asked_again_each_second_until_the_map_comes():
    """The MAP a WELCOME without room for the map makes the session send, or the REDIRECT that
    answers it, may be lost: the session asks again once a second until the map came (before,
    it asked once, and every durable call then waited for a map that would never come)."""
    r = router()
    r.tick(r.first, 0.0)
    r.first.outgoing(0.0)
    r.handle_datagrams(r.first, [(welcome("n1", MAP1, with_map=False), addr("n1"))], 0.0)
    asked = []
    for t in (0.0, 0.5, 0.99, 1.0, 1.5, 2.0):
        r.handle_datagrams(r.first, [(wire.encode_pong(0, True, COOKIE, []), addr("n1"))], t)  # (n1 is alive)
        r.tick(r.first, t)
        asked += [(t, f) for _, f in frames(r.first, t) if f[0] is FrameType.MAP]
    assert asked == [
        (0.0, (FrameType.MAP, CID, COOKIE)),
        (1.0, (FrameType.MAP, CID, COOKIE)),
        (2.0, (FrameType.MAP, CID, COOKIE)),
    ]
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(MAP1)), addr("n1"))], 2.1)
    r.handle_datagrams(r.first, [(wire.encode_pong(0, True, COOKIE, []), addr("n1"))], 5.0)
    r.tick(r.first, 5.0)
    assert r.cmap == MAP1 and r.first.connected and not [f for _, f in frames(r.first, 5.0) if f[0] is FrameType.MAP]


def test_a_session_knows_when_its_node_has_no_map_to_give():
    """``no_map_here`` (client/durableclient.py), which ends a durable call's wait for the map at
    once: only a WELCOME that announced no map says so; before a WELCOME, or after one that
    announced a map not come yet, the map may still come."""
    from roost.client.durableclient import no_map_here as _no_map_here

    plain, waiting = router(), router()
    for r, cmap in ((plain, None), (waiting, MAP1)):
        r.tick(r.first, 0.0)
        r.first.outgoing(0.0)
        assert not _no_map_here(r.first)  # (no WELCOME yet)
        r.handle_datagrams(r.first, [(welcome("n1", cmap, with_map=False), addr("n1"))], 0.0)
    assert _no_map_here(plain.first) and not _no_map_here(waiting.first)


def test_acked_and_flush_cover_every_session():
    r = router()
    connect(r, r.first, "n1", MAP1)
    t1, t2 = topic_led_by(MAP1, "n1"), topic_led_by(MAP1, "n2")
    g = [r.publish(t, None, None, b"x", True) for t in (t1, t2, t1)]
    assert g == [1, 2, 3]
    s2 = r.by_member["n2"]
    connect(r, s2, "n2", MAP1)
    marks = r.flush_marks()
    r.handle_datagrams(r.first, [(wire.encode_puback(PID, 2), addr("n1"))], 0.1)
    assert r.acked == 1 and not r.flushed(marks)  # n2 has not acknowledged the second
    r.handle_datagrams(s2, [(wire.encode_puback(s2.pub.pid, 1), addr("n2"))], 0.2)
    assert r.acked == 3 and r.flushed(marks)


def test_durable_requests_take_a_session_that_failed_over_back_to_the_member_the_map_names():
    """A durable request is served by its partition's leader only (members do not forward it).
    The session kept for n3 failed over to n1 while n3 was silent (a pause); n3 is in the map
    again, so a durable request takes the session back to n3; a reliable route does not move it."""
    r = router()
    connect(r, r.first, "n1", MAP1)
    topic = topic_led_by(MAP1, "n3", "d")
    s3 = r.durable_session_for(topic)
    assert s3 is r.by_member["n3"] and s3.node == addr("n3")
    connect(r, s3, "n3", MAP1)
    r.tick(s3, 2.0)  # n3 silent past node_timeout: the session moves on, and n1 welcomes it
    assert s3.node != addr("n3") and not s3.connected
    r.handle_datagrams(s3, [(welcome("n1", MAP1), s3.node)], 2.1)
    assert s3.node_id == "n1" and r.session_for(topic) is s3 and s3.node == addr("n1")
    assert r.durable_session_for(topic) is s3
    assert s3.node == addr("n3") and not s3.connected  # back to n3: a HELLO goes there
    r.tick(s3, 2.2)
    assert (addr("n3"), FrameType.HELLO) in [(a, f[0]) for a, f in frames(s3, 2.2)]
    assert r.durable_session_for(topic) is s3 and s3.node == addr("n3")  # (once: it stays)


def test_every_put_datagram_fits_the_sessions_max_datagram():
    """A burst of durable puts is packed up to the datagram size: the PUT header (ids, cookie,
    sequences) counts too, or the member refuses the frame as too large and the go-back-N
    retry resends the same oversized frame forever (seen as a stall after 1,089 puts)."""
    from roost.client import durablewire

    largest = 0
    for size in range(10, 30):  # (how close a datagram's last message comes to the limit depends on the size)
        r = router()
        connect(r, r.first, "n1", MAP1)
        topic = topic_led_by(MAP1, "n1")
        p = MAP1.partition(topic)
        for _ in range(1_200):  # (each goes out alone, as put() is called)
            r.put(topic, None, None, b"x" * size)
        assert len(r.first.outgoing(0.0)) == 1_200
        r.handle_datagrams(r.first, [(durablewire.encode_putack(r.putter.pid, p, 300, 0), addr("n1"))], 0.1)
        r.tick(r.first, 0.5)  # (past the retry time-out: 301.. again, packed, with 3-byte sequences)
        again = [d for _, d in r.first.outgoing(0.5) if decoding.decode_untrusted_frame(d)[0] is FrameType.PUT]
        assert sum(len(decoding.decode_untrusted_frame(d)[-1]) for d in again) == 1_200 - 300
        largest = max(largest, *(len(d) for d in again))
    assert largest <= r.first.max_datagram


# ---------------------------------------------------------------- durable puts (found by the simulator)


def member_at(a: tuple[str, int]) -> str:
    return next(m for m, (client, _) in THREE.items() if client == a)


def putting_to_n2() -> tuple[Router, ClientSession]:
    """A router connected at n1 with one durable put for a partition n2 leads, sent on n2's session."""
    r = router()
    connect(r, r.first, "n1", MAP1)
    r.put(topic_led_by(MAP1, "n2", "d"), None, None, b"x")
    s2 = r.by_member["n2"]
    connect(r, s2, "n2", MAP1)
    assert [f[0] for _, f in frames(s2)] == [FrameType.PUT]
    return r, s2


def test_a_due_put_with_no_connected_session_waits_instead_of_waking_at_once() -> None:
    """Simulator seed 4: the session of the primary lost its cookie after it sent a PUT; past the
    retry time-out the put stayed due, put_deadline stayed in the past, and the shell spun."""
    r, s2 = putting_to_n2()
    r.handle_datagrams(s2, [(wire.encode_error(wire.ErrorCode.BAD_COOKIE, "stale"), addr("n2"))], 0.1)
    assert not s2.connected
    r.tick(s2, 1.0)  # (past the retry time-out)
    assert r.put_deadline() > 1.0
    assert [f[0] for _, f in frames(s2, 1.0)] == [FrameType.HELLO]
    r.handle_datagrams(s2, [(welcome("n2", MAP1), addr("n2"))], 1.1)
    assert [f[0] for _, f in frames(s2, 1.1)] == [FrameType.PUT]  # (everything unacknowledged goes once connected)


def test_a_session_that_failed_over_goes_back_to_the_primary_its_puts_are_for() -> None:
    """Simulator seed 0: the session opened for n2 failed over while n2 was silent and stayed at
    another member, which refused every put (not the leader), for ever."""
    r = router()
    connect(r, r.first, "n1", MAP1)
    r.put(topic_led_by(MAP1, "n2", "d"), None, None, b"x")
    s2 = r.by_member["n2"]
    connect(r, s2, "n2", MAP1)
    frames(s2)
    r.tick(s2, 2.0)  # n2 silent for node_timeout: the session fails over
    other = s2.node
    assert other != addr("n2")
    r.handle_datagrams(s2, [(welcome(member_at(other), MAP1), other)], 2.1)  # (its map still names n2)
    assert s2.node == addr("n2") and not s2.connected
    frames(s2, 2.1)
    r.tick(s2, 2.1)
    assert [(a, f[0]) for a, f in frames(s2, 2.1)] == [(addr("n2"), FrameType.HELLO)]


@pytest.mark.parametrize("epoch", [9, 1])
def test_an_older_map_of_a_member_that_no_longer_leads_a_partition_replaces_ours(epoch: int) -> None:
    """Simulator seed 7: the newest epoch we were given was a map its member had left behind; the
    members' own maps had lower epochs (a restarted member starts low), so a put went for ever to
    a member whose every refusal carried a map we ignored. Seed 37: two members' maps had one epoch."""
    stale = clustermap.compute(epoch, THREE, {"n1", "n2"}, 16, 2)  # (from when n3 was down)
    topic = next(f"s{i}" for i in range(1000) if stale.primary(f"s{i}") == "n2" and MAP1.primary(f"s{i}") == "n3")
    r = router()
    connect(r, r.first, "n1", stale)
    r.put(topic, None, None, b"x")
    connect(r, r.by_member["n2"], "n2", MAP1)  # (epoch 1: n2 leads none of n3's partitions)
    assert r.cmap == MAP1 and r.session_for(topic) is r.by_member["n3"]


def test_an_older_map_that_holds_our_silent_member_down_replaces_ours() -> None:
    """Simulator seed 459: the member a stale map named primary had left; the session for it
    failed over to members whose maps (lower epochs) held it down, and went back to it for ever."""
    high = dataclasses.replace(MAP1, epoch=9)
    r = router()
    connect(r, r.first, "n1", high)
    topic = topic_led_by(MAP1, "n2", "d")
    r.put(topic, None, None, b"x")
    s2 = r.by_member["n2"]
    connect(r, s2, "n2", high)
    r.tick(s2, 2.0)
    other = s2.node
    without = clustermap.compute(2, THREE, {"n1", "n3"}, 16, 2)
    r.handle_datagrams(s2, [(welcome(member_at(other), without), other)], 2.1)
    assert r.cmap == without and s2.node == other  # (not back to n2: the map's primary is elsewhere now)


def test_a_session_failing_over_is_not_moved_back_before_it_is_connected_elsewhere() -> None:
    """Simulator seed 2342: the session kept for n3 (which had left) failed over to n1 and, before
    n1's WELCOME came, a durable request moved it back to n3 (its node_id still named the member
    it had reached the time before): it never got an answer anywhere, and every put stalled."""
    r = router()
    connect(r, r.first, "n1", MAP1)
    topic = topic_led_by(MAP1, "n3", "d")
    s3 = r.durable_session_for(topic)
    connect(r, s3, "n3", MAP1)
    r.tick(s3, 2.0)  # (n3 silent: the session tries another member)
    elsewhere = s3.node
    assert elsewhere != addr("n3") and not s3.connected
    assert r.durable_session_for(topic) is s3 and s3.node == elsewhere  # (not back yet: nobody answered)
    newer = clustermap.compute(4, THREE, {"n1", "n2"}, 16, 2)  # (n3 left: the member we reached knows it)
    r.handle_datagrams(s3, [(welcome(member_at(elsewhere), newer, with_map=False), elsewhere)], 2.1)
    assert s3.connected and r.durable_session_for(topic) is s3 and s3.node == elsewhere  # (its map first)


def test_a_map_without_a_live_owner_gives_way_to_an_older_one_that_has_one() -> None:
    """Simulator seed 6656: the newest map we had was a leaving member's last one, with no live
    member at all; every put waited for an owner, and the members' maps (lower epochs) were ignored."""
    empty = clustermap.compute(9, THREE, set(), 16, 2)
    r = router()
    connect(r, r.first, "n1", empty)
    assert r.cmap == empty and not any(empty.owners)
    r.handle_datagrams(r.first, [(welcome("n1", MAP1), addr("n1"))], 0.5)
    assert r.cmap == MAP1


def test_acked_moves_through_a_run_of_publishes_as_its_session_acknowledges_part_of_it():
    """Consecutive publishes through one session are one pending entry: ``acked`` still moves
    message by message within it."""
    r = router()
    connect(r, r.first, "n1", None)
    g = [r.publish("t", None, None, b"x", True) for _ in range(5)]
    assert g == [1, 2, 3, 4, 5]
    for through, want in ((2, 2), (2, 2), (4, 4), (5, 5)):
        r.handle_datagrams(r.first, [(wire.encode_puback(PID, through), addr("n1"))], 0.1)
        assert r.acked == want


def test_the_first_map_keeps_every_topic_on_the_first_session_until_what_it_had_is_acknowledged():
    """Without a map nothing is bound per topic; when the first map comes, a topic another
    member leads still goes to the first session while publishes sent before are unacknowledged
    (they could be overtaken), and moves once they are."""
    r = router()
    connect(r, r.first, "n1", None)
    t2 = topic_led_by(MAP1, "n2")
    r.publish(t2, None, None, b"before", True)
    frames(r.first)
    r.handle_datagrams(r.first, [(welcome("n1", MAP1), addr("n1"))], 0.1)  # (a map, as a member's WELCOME has it)
    assert r.cmap == MAP1
    r.publish(t2, None, None, b"during", True)
    assert r.sessions == [r.first] and r.first.last_seq == 2
    r.handle_datagrams(r.first, [(wire.encode_puback(PID, 2), addr("n1"))], 0.2)
    r.publish(t2, None, None, b"after", True)
    assert r.by_member["n2"].last_seq == 1 and r.first.last_seq == 2


def test_a_put_refused_for_no_quorum_asks_the_other_members_for_their_map_and_says_why() -> None:
    """A member cut off from the quorum's majority refuses with PUT_NO_QUORUM and sends no map (its
    own names its side); the client asks the members it talks to for theirs, takes the newer one
    and puts there at once, and until then a put's error says why it is not acknowledged."""
    from roost.client import durablewire

    live = {m: a for m, a in THREE.items() if m != "n2"}
    newer = clustermap.compute(2, THREE, set(live), 16, 2)
    topic = next(f"d{i}" for i in range(1000) if MAP1.primary(f"d{i}") == "n2" and newer.primary(f"d{i}") == "n1")
    r = router()
    connect(r, r.first, "n1", MAP1)
    p, _ = r.put(topic, None, None, b"x")
    s2 = r.by_member["n2"]
    connect(r, s2, "n2", MAP1)
    assert [f[0] for _, f in frames(s2)] == [FrameType.PUT]
    frames(r.first)
    r.handle_datagrams(s2, [(durablewire.encode_putack(r.putter.pid, p, 0, durablewire.PUT_NO_QUORUM), addr("n2"))],
                       0.2)  # fmt: skip
    assert "metadata quorum" in r.putter.refusal(p) and r.putter.refusal() == r.putter.refusal(p)
    assert [f[0] for _, f in frames(r.first, 0.2)] == [FrameType.MAP]  # (n1 is asked for its map)
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(newer)), addr("n1"))], 0.3)
    assert r.cmap is not None and r.cmap.epoch == 2
    primary = newer.primary(topic)
    assert primary is not None
    moved = r.by_member[primary]
    assert moved is r.first  # (n1 leads it now, and its session is connected)
    assert FrameType.PUT in [f[0] for _, f in frames(moved, 0.3)]  # (at once: not at the retry time-out)
    r.handle_datagrams(moved, [(durablewire.encode_putack(r.putter.pid, p, 1, 0), moved.node)], 0.4)
    assert r.putter.refusal(p) == "" and r.putter.refusal() == ""


def test_a_put_unanswered_past_its_retry_time_out_asks_the_other_members_for_their_map() -> None:
    """Measured (scripts/durable_availability.py): after a kill of a partition's leader the client
    learned the new map only when its session failed over, 3 s after the members had it."""
    r, s2 = putting_to_n2()
    frames(r.first)
    r.tick(r.first, 0.1)
    assert FrameType.MAP not in [f[0] for _, f in frames(r.first, 0.1)]  # (not before the retry time-out)
    r.tick(s2, 0.6)
    assert FrameType.MAP in [f[0] for _, f in frames(r.first, 0.6)]
    assert FrameType.PUT in [f[0] for _, f in frames(s2, 0.6)]  # (and the put again)


def test_an_older_map_that_holds_down_the_member_our_puts_went_unanswered_at_replaces_ours() -> None:
    """Measured: the client's map came from the leader's own member, with a higher epoch than any
    other member's (epochs are per member); after the leader's kill the other members' maps, which
    hold it down, were older, and were ignored until the session to the dead member failed over."""
    high = dataclasses.replace(MAP1, epoch=9)
    down = clustermap.compute(2, THREE, {"n1", "n3"}, 16, 2)
    topic = next(f"d{i}" for i in range(1000) if high.primary(f"d{i}") == "n2" and down.primary(f"d{i}") == "n1")
    r = router()
    connect(r, r.first, "n1", high)
    r.put(topic, None, None, b"x")
    s2 = r.by_member["n2"]
    connect(r, s2, "n2", high)
    frames(s2)
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(down)), addr("n1"))], 0.1)
    assert r.cmap is not None and r.cmap.epoch == 9  # (older, and nothing says n2 is gone yet)
    r.tick(s2, 0.6)  # (the put to n2 went unanswered past its retry time-out)
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(down)), addr("n1"))], 0.7)
    assert r.cmap is not None and r.cmap.epoch == 2
    assert FrameType.PUT in [f[0] for _, f in frames(r.first, 0.7)]  # (to n1, the primary now)


def test_a_put_whose_map_names_no_live_owner_asks_for_a_newer_map_each_pub_retry() -> None:
    """Simulator seed 20209: a client held a joiner's map with no live member at all (epochs are per
    member); its puts waited for a newer map that nothing sent it, with no deadline: stalled."""
    empty = dataclasses.replace(MAP1, epoch=3, live=frozenset(), owners=tuple(() for _ in MAP1.owners))
    r = router()
    connect(r, r.first, "n1", empty)
    r.put(topic_led_by(MAP1, "n1", "d"), None, None, b"x")
    assert FrameType.MAP in [f[0] for _, f in frames(r.first)]
    assert r.put_deadline() <= r.cfg.pub_retry  # (it comes back: not an infinite wait)
    r.handle_datagrams(r.first, [(wire.encode_redirect("n1", clustermap.encode(dataclasses.replace(MAP1, epoch=4))),
                                  addr("n1"))], 0.1)  # fmt: skip
    assert FrameType.PUT in [f[0] for _, f in frames(r.first, 0.1)]
