"""Address-validation cookies: keys of each member's own, drawn from its core's rng and rotated
every cookie_lifetime (node/cookies.py), and the client's side of them: an ACK carries the
cookie of the member it goes to (client/membercookies.py)."""

from __future__ import annotations

import random

import pytest

from roost.client import decoding, membercookies, wire
from roost.client.session import ClientConfig, ClientSession
from roost.client.wire import ErrorCode, FrameType, Mode
from roost.cluster.config import load_cluster_config
from roost.cluster.member import MemberCore
from roost.node import cookies
from roost.node.cookies import CookieJar
from roost.node.core import Send
from sim.simulation import Simulation
from tests.corekit import connect, frames_to, make_core
from tests.test_replication import GOOD  # (the two-member cluster config those tests load)

A = ("127.0.0.1", 5001)
CID = b"c" * 16
LIFE = 600.0


def jar(seed: int = 1) -> CookieJar:
    return CookieJar(random.Random(seed), LIFE)


def test_a_cookie_is_valid_in_its_lifetime_and_the_next_and_never_after():
    j = jar()
    c = j.issue(A, CID, 10.0)
    assert j.check(A, CID, c, 10.0) and j.is_fresh(A, CID, c, LIFE - 1)
    assert j.check(A, CID, c, 2 * LIFE - 1)  # the previous key is still accepted...
    assert not j.is_fresh(A, CID, c, 2 * LIFE - 1)  # ...but a PING is answered with a new cookie
    new = j.issue(A, CID, 2 * LIFE - 1)
    assert new != c
    assert not j.check(A, CID, c, 2 * LIFE)  # two keys ago: refused, though it was proven (cached) before
    assert j.check(A, CID, new, 2 * LIFE)


def test_a_cookie_is_bound_to_its_address_and_client_id():
    j = jar()
    c = j.issue(A, CID, 0.0)
    assert not j.check(("127.0.0.1", 5002), CID, c, 0.0)
    assert not j.check(("127.0.0.2", 5001), CID, c, 0.0)
    assert not j.check(A, b"d" * 16, c, 0.0)


def test_a_node_idle_for_a_whole_lifetime_has_forgotten_both_keys():
    j = jar()
    c = j.issue(A, CID, 0.0)
    assert not j.check(A, CID, c, 2 * LIFE + 1)  # (the key of the bucket in between was never drawn)


def test_a_wall_clock_stepped_back_keeps_the_current_key():
    j = jar()
    c = j.issue(A, CID, 5 * LIFE)
    assert j.issue(A, CID, LIFE) == c and j.check(A, CID, c, 0.0)


def test_the_keys_are_drawn_from_the_cores_rng_alone():
    """The simulator replays a seed: same rng, same cookies; and a node's keys are no one
    else's (another seed here; the shells pass random.SystemRandom())."""
    assert jar(1).issue(A, CID, 0.0) == jar(1).issue(A, CID, 0.0)
    assert jar(1).issue(A, CID, 0.0) != jar(2).issue(A, CID, 0.0)
    rng = random.Random(1)
    j = jar(1)
    assert [j.issue(A, CID, t * LIFE) for t in range(3)] == [
        CookieJar._make(rng.randbytes(cookies.KEY_LEN), A, CID) for _ in range(3)
    ]  # (a key per lifetime)


def test_the_cache_of_proven_cookies_is_bounded_and_forgets_retired_keys(monkeypatch):
    monkeypatch.setattr(cookies, "MAX_PROVEN", 10)
    j = jar()
    for port in range(50):
        addr = ("127.0.0.1", 6000 + port)
        assert j.check(addr, CID, j.issue(addr, CID, 0.0), 0.0)
    assert j.remembered <= 10
    j.issue(A, CID, LIFE)  # (one rotation: the proven ones are still good, under the previous key)
    assert 0 < j.remembered <= 10
    j.issue(A, CID, 2 * LIFE)
    assert j.remembered == 0


def test_a_ping_with_the_previous_keys_cookie_gets_a_new_one_then_the_old_one_is_refused():
    core = make_core(cookie_lifetime=10.0)
    (c,) = connect(core, A)  # (its cookie from the bucket of time 0)
    old = c.cookie
    (pong,) = frames_to(c.ping(12.0), A)
    assert pong[0] is FrameType.PONG and pong[3] != old
    c.cookie = pong[3]
    (again,) = frames_to(c.ping(12.5), A)
    assert again[0] is FrameType.PONG and again[3] == c.cookie  # (fresh: kept)
    c.cookie = old
    assert [f[:2] for f in frames_to(c.ping(20.0), A)] == [(FrameType.ERROR, ErrorCode.BAD_COOKIE)]
    c.cookie = pong[3]
    assert frames_to(c.ping(20.0), A)[0][0] is FrameType.PONG


def test_a_members_cookie_is_refused_by_another_member_that_holds_the_same_secret(tmp_path):
    """The cluster secret keys no cookie: whoever knows it cannot mint one for any address."""
    p = tmp_path / "c.toml"
    p.write_text(GOOD)
    cc = load_cluster_config(p)
    n1, n2 = (MemberCore(cc, m, rng=random.SystemRandom(), now=0.0, wall_offset=1_780_000_000.0, incarnation=1)
              for m in ("n1", "n2"))  # fmt: skip

    def answers(m: MemberCore, data: bytes) -> list[tuple]:
        out = m.broker.handle_datagrams([(data, A)], 0.1)
        return [decoding.decode_untrusted_frame(a.data) for a in out if isinstance(a, Send)]

    (welcome,) = answers(n1, wire.encode_hello(CID))
    ping = wire.encode_ping(CID, welcome[2], 1, 0, 1)
    assert answers(n1, ping)[0][0] is FrameType.PONG
    assert [f[:2] for f in answers(n2, ping)] == [(FrameType.ERROR, ErrorCode.BAD_COOKIE)]


# ---------------------------------------------------------------- the client's side

N1, N2 = ("127.0.0.1", 7401), ("127.0.0.1", 7402)
K1, K2, K3 = b"1" * 16, b"2" * 16, b"3" * 16


def frames(out: list[tuple[tuple[str, int], bytes]]) -> list[tuple[tuple[str, int], tuple]]:
    return [(dst, decoding.decode_untrusted_frame(d)) for dst, d in out]


def subscribed_at_n1() -> ClientSession:
    s = ClientSession(CID, b"p" * 16, b"f" * 16, ClientConfig(), 0.0, node=N1, members=[N2], session=1)
    s.tick(0.0)
    s.outgoing(0.0)
    s.handle_datagrams([(wire.encode_welcome("n1", K1, {"ping_interval": 0.5}, []), N1)], 0.0)
    s.subscribe("t", None, Mode.RELIABLE)
    s.outgoing(0.0)
    s.handle_datagrams([(wire.encode_cmdack(1, 1, [0]), N1)], 0.0)
    return s


def msgs(seq: int) -> bytes:
    return wire.encode_msgs(5, seq, [wire.pack_message("t", None, None, b"%d" % seq)])


def test_an_ack_to_another_member_carries_that_members_own_cookie():
    """n2 delivers what was published there; our ACK goes to n2 with n2's cookie, asked for with
    a HELLO, never with n1's (which n2 would refuse)."""
    s = subscribed_at_n1()
    s.handle_datagrams([(wire.encode_welcome("n2", K2, {}, []), N2)], 0.05)  # (not asked for: ignored)
    s.handle_datagrams([(msgs(1), N2)], 0.1)
    assert [(dst, f[0]) for dst, f in frames(s.outgoing(0.1))] == [(N2, FrameType.HELLO)]
    assert not s.flushed(0)  # (the ACK is still owed)
    s.handle_datagrams([(wire.encode_welcome("n2", K2, {}, []), N2)], 0.11)
    assert s.cookie == K1 and s.node == N1  # (n2's WELCOME is no reconnection)
    ((dst, ack),) = frames(s.outgoing(0.11))
    assert dst == N2 and ack[0] is FrameType.ACK and ack[2] == K2 and ack[3:5] == (5, 1)
    assert s.flushed(0)
    # n2 restarted (new keys): it refuses the cookie; the ACK waits for the next one
    s.handle_datagrams([(wire.encode_error(ErrorCode.BAD_COOKIE, "send HELLO"), N2)], 0.2)
    assert s.connected and s.cookie == K1
    assert [(dst, f[0]) for dst, f in frames(s.outgoing(0.2))] == [(N2, FrameType.HELLO)]
    s.handle_datagrams([(wire.encode_welcome("n2", K3, {}, []), N2)], 0.21)
    ((dst, ack),) = frames(s.outgoing(0.21))
    assert dst == N2 and ack[0] is FrameType.ACK and ack[2] == K3


def holding_n2s_cookie() -> ClientSession:
    """A session at n1 that acknowledged n2's delivery with n2's own cookie (asked with HELLO)."""
    s = subscribed_at_n1()
    s.handle_datagrams([(msgs(1), N2)], 0.1)
    s.outgoing(0.1)
    s.handle_datagrams([(wire.encode_welcome("n2", K2, {}, []), N2)], 0.1)
    s.outgoing(0.1)
    return s


def test_when_our_nodes_key_rotates_the_others_cookies_are_renewed_until_they_change():
    s = holding_n2s_cookie()
    s.handle_datagrams([(wire.encode_pong(s.ping_token, True, K1, []), N1)], 0.5)  # (the same cookie: no rotation)
    assert s.outgoing(0.5) == []
    s.handle_datagrams([(wire.encode_pong(2**40, True, K3, []), N1)], 1.0)  # (answers no PING of ours: not taken)
    assert s.cookie == K1 and s.outgoing(1.0) == []
    s.handle_datagrams([(wire.encode_pong(s.ping_token, True, K3, []), N1)], 1.0)  # n1 rotated
    assert [(dst, f[0]) for dst, f in frames(s.outgoing(1.0))] == [(N2, FrameType.HELLO)]
    s.handle_datagrams([(wire.encode_welcome("n2", K2, {}, []), N2)], 1.01)  # n2 has not rotated yet
    assert s.outgoing(1.1) == []  # (asked again only after hello_retry)
    assert [(dst, f[0]) for dst, f in frames(s.outgoing(1.3))] == [(N2, FrameType.HELLO)]
    s.handle_datagrams([(wire.encode_welcome("n2", b"4" * 16, {}, []), N2)], 1.31)  # now it has
    assert s.outgoing(1.6) == [] and s.member_cookies.held[N2] == b"4" * 16


def test_an_ack_owed_to_a_member_that_never_answers_is_given_up_after_node_timeout():
    s = subscribed_at_n1()
    s.handle_datagrams([(msgs(1), N2)], 0.1)
    hellos = [t for t in (0.1, 0.2, 0.4, 0.7, 1.0, 1.3) for dst, f in frames(s.outgoing(t)) if f[0] is FrameType.HELLO]
    assert hellos == [0.1, 0.4, 0.7, 1.0, 1.3] and not s.flushed(0)
    s.outgoing(1.6)  # node_timeout (1.5 s) after the first: n2 is gone
    assert s.flushed(0)


def test_a_session_that_moves_acknowledges_its_old_node_with_its_old_cookie():
    s = subscribed_at_n1()
    s.handle_datagrams([(msgs(1), N1)], 0.1)
    s.outgoing(0.1)
    s.move_to(N2, 0.2)
    s.handle_datagrams([(msgs(2), N1)], 0.3)
    acks = [(dst, f) for dst, f in frames(s.outgoing(0.3)) if f[0] is FrameType.ACK]
    assert [(dst, f[2]) for dst, f in acks] == [(N1, K1)]


@pytest.mark.parametrize("mode", ["replicated", "partitioned"])
def test_no_member_refuses_a_cookie_in_simulated_runs_without_faults(mode):
    """Every member keys its own cookies and rotates them every 2 s here (the simulator's short
    configs), over a network that loses 5% of the datagrams: clients acknowledge what every
    member delivers with that member's cookie, and renew them in time."""
    seeds = [s for s in range(40) if Simulation(s, mode=mode, faults=()).cc.node_config("m0").cookie_lifetime == 2][:3]
    assert len(seeds) == 3
    for seed in seeds:
        sim = Simulation(seed, mode=mode, faults=())
        assert sim.run().violations == []
        refused = datagrams = 0
        for m in sim.members.values():
            assert m.core is not None
            refused += m.core.broker.metrics["error_bad_cookie"]
            datagrams += m.core.broker.metrics["datagrams_in"]
        assert refused == 0 and datagrams > 0


def test_a_member_that_answers_none_of_a_renewal_is_forgotten_not_asked_at_every_rotation():
    s = holding_n2s_cookie()
    s.handle_datagrams([(wire.encode_pong(s.ping_token, True, K3, []), N1)], 1.0)  # n1 rotated; n2 has left since
    hellos = [t for t in (1.0 + 0.3 * i for i in range(12)) for dst, f in frames(s.outgoing(t)) if dst == N2]
    assert len(hellos) == 1 + membercookies.RENEW_TRIES and N2 not in s.member_cookies.held
    s.handle_datagrams([(wire.encode_pong(s.ping_token, True, b"5" * 16, []), N1)], 9.0)  # the next rotation
    assert [dst for dst, _ in frames(s.outgoing(9.0))] == []
