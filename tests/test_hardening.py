"""What a remote sender can do to a node: integers out of range, counters it could push out of
msgpack's range, a STATUS that could fail to encode. The core directly, then a real process."""

from __future__ import annotations

import hashlib
import json
import random
import socket
import subprocess
import sys
import urllib.request
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from roost.client import decoding, durablewire, wire
from roost.client.wire import ErrorCode, FrameType, WireError
from roost.node.admission import Admission
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore
from roost.node.procs import free_port
from sim.check import budget_drift
from tests.clusterkit import ROOT, Node, roost
from tests.corekit import PAD, FakeClient, connect, frames_to, make_core, sends

A = ("127.0.0.1", 5001)
B = ("127.0.0.1", 5002)
TOP = wire.SEQ_LIMIT - 1  # the greatest sequence the wire allows


def counters_in_range(metrics: dict[str, int]) -> None:
    bad = {k: v for k, v in metrics.items() if not 0 <= v < wire.SEQ_LIMIT}
    assert not bad, bad


def test_a_producer_going_back_from_the_top_moves_no_counter_out_of_range():
    """The sequence that ended a node: a PUB at the top of the sequence space, then one at 1
    from the same producer. What it may count is bounded by the messages it carried."""
    core = make_core()
    sub, pub = connect(core, A, B)
    sub.sub("t", mode=0)
    msg = [wire.pack_message("t", None, None, b"x")]
    for first in (TOP, 1, 1):
        core.handle_datagrams([(wire.encode_pub(pub.cid, pub.cookie, pub.pid, first, first, True, msg), B)], 1.0)
    m = core.metrics
    counters_in_range(m)
    assert m["published"] == 1 and m["pub_duplicates"] <= 2
    wire.encode_status_reply(core.status())  # (raised OverflowError before)
    # and the node still serves: a fresh producer's message reaches the subscriber
    other = connect(core, ("127.0.0.1", 5003))[0]
    out = other.pub([("t", b"after")], now=2.0)
    assert [f[3][0][3] for f in frames_to(out, A) if f[0] is FrameType.MSGS] == [b"after"]


@pytest.mark.parametrize("first", [wire.SEQ_LIMIT, 2**64 - 2, 2**64 - 1])
def test_sequences_at_or_above_2_63_are_refused_where_decoded(first):
    cid, cookie, pid = b"c" * 16, b"k" * 16, b"p" * 16
    msg = [wire.pack_message("t", None, None, b"x")]
    frames = [
        wire.encode_pub(cid, cookie, pid, first, 1, True, msg),
        wire.encode_pub(cid, cookie, pid, 1, first, True, msg),
        wire.encode_pubrun(cid, cookie, pid, first, "t", [b"x"]),
        wire.encode_ack(cid, cookie, 1, first, []),
        wire.encode_ack(cid, cookie, 1, 1, [[first, first]]),
        wire.encode_cmds(cid, cookie, first, 1, []),
        wire.encode_cmds(cid, cookie, 1, first, []),
        wire.encode_ping(cid, cookie, 1, 0, first),
        wire.encode_bye(cid, cookie, first),
        msgpack.packb([wire.VERSION, FrameType.PUBACK, pid, first]),
        msgpack.packb([wire.VERSION, FrameType.MSGS, 7, first, []]),
        msgpack.packb([wire.VERSION, FrameType.MSGS, 7, 1, [["t", None, None, b"x", pid, first]]]),
        durablewire.encode_commit(cid, cookie, pid, "d", "t", 0, first),
    ]
    for data in frames:
        with pytest.raises(WireError) as err:
            decoding.decode_untrusted_frame(data)
        assert err.value.code == ErrorCode.MALFORMED and "2**63" in err.value.text, data
    # the last sequence a batch takes must stay below the limit too
    top = wire.encode_pub(cid, cookie, pid, TOP, TOP, True, msg * 2)
    with pytest.raises(WireError, match="below 2\\*\\*63"):
        decoding.decode_untrusted_frame(top)
    assert decoding.decode_untrusted_frame(wire.encode_pub(cid, cookie, pid, TOP, TOP, True, msg))[4] == TOP


def test_a_status_reply_says_what_it_could_not_encode_instead_of_raising():
    status = {
        "node": "n1",
        "published": -(2**64),
        "nested": {"big": 2**70, "ok": 3},
        "odd": object(),
        "fine": 2**64 - 1,
    }
    f = decoding.decode_untrusted_frame(wire.encode_status_reply(status))
    got = f[1]
    assert got["node"] == "n1" and got["nested"]["ok"] == 3 and got["fine"] == 2**64 - 1
    assert got["published"].startswith("unencodable") and got["nested"]["big"].startswith("unencodable")
    assert sorted(got["unencodable"]) == [".nested.big", ".odd", ".published"]
    assert "unencodable" not in decoding.decode_untrusted_frame(wire.encode_status_reply({"a": 1}))[1]


def _send(sock: socket.socket, addr: tuple[str, int], data: bytes) -> tuple[Any, ...]:
    sock.sendto(data, addr)
    sock.settimeout(5)
    return decoding.decode_untrusted_frame(sock.recv(65536))


def test_the_three_datagram_sequence_leaves_a_real_node_serving(tmp_path):
    mon = free_port("127.0.0.1", socket.SOCK_STREAM)
    node = Node(tmp_path, extra=f'[monitor]\naddr = "127.0.0.1:{mon}"\n')
    try:
        host, port = node.addr.split(":")
        addr = (host, int(port))
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.bind(("127.0.0.7", 0))
            cid, pid = b"a" * 16, b"b" * 16
            welcome = _send(s, addr, wire.encode_hello(cid))
            assert welcome[0] is FrameType.WELCOME
            cookie = welcome[2]
            msg = [wire.pack_message("t", None, None, b"x")]
            # the original attack's 2**64 - 2 is refused where decoded; the top it may use is not harmful
            refused = _send(s, addr, wire.encode_pub(cid, cookie, pid, 2**64 - 2, 2**64 - 2, True, msg))
            assert refused[0] is FrameType.ERROR and refused[1] == ErrorCode.MALFORMED
            for first in (TOP, 1):
                assert _send(s, addr, wire.encode_pub(cid, cookie, pid, first, first, True, msg))[0] is FrameType.PUBACK
        st = roost("status", "--node", node.addr, "--json")
        assert st.returncode == 0, st.stderr
        assert json.loads(st.stdout)
        with urllib.request.urlopen(f"http://127.0.0.1:{mon}/varz", timeout=10) as r:
            varz = json.load(r)
        ints = {k: v for k, v in varz.items() if isinstance(v, int) and not isinstance(v, bool)}
        assert varz["in_msgs"] == 1 and varz["counters"]["pub_duplicates"] == 1
        counters_in_range({**ints, **varz["counters"], **varz["drops"]})
        assert node.proc.poll() is None
    finally:
        assert node.stop() == 0


# ------------------------------------------------------------ the text protocol cannot reflect

T1, T2 = ("127.0.0.1", 6001), ("127.0.0.1", 6002)


def _text_bytes(out: list[Any], addr: tuple[str, int]) -> int:
    return sum(len(s.data) for s in sends(out) if s.addr == addr)


def test_a_text_subscriber_is_sent_at_most_3x_what_it_sent_and_renewals_add():
    core = make_core()
    sub = b"SUB t\n" + b"." * 94  # 100 bytes in: 300 may go out
    core.handle_datagrams([(sub, T1)], 0.0)
    body = b"x" * 40  # each MSG line is 46 bytes
    out = core.handle_datagrams([(b"PUB t\n" + body, T2) for _ in range(10)], 0.0)
    assert _text_bytes(out, T1) == 6 * 46 and core.metrics["dropped_text_budget"] == 4
    out = core.handle_datagrams([(sub, T1), *[(b"PUB t\n" + body, T2) for _ in range(10)]], 1.0)
    assert _text_bytes(out, T1) == 7 * 46  # (24 bytes were left over, a renewal adds 300)
    assert core.metrics["dropped_text_budget"] == 7
    # the ERR a text datagram gets is within 3x of it too
    (err,) = sends(core.handle_datagrams([(b"SUB t", T1)], 2.0))
    assert err.data == b"ERR malformed S"  # (15 bytes: 3x the 5 it answers)
    lifted = make_core(text_amplification=0)
    lifted.handle_datagrams([(b"SUB t\n", T1)], 0.0)
    assert _text_bytes(lifted.handle_datagrams([(b"PUB t\n" + body, T2)] * 10, 0.0), T1) == 460


def test_text_subscriptions_expire_by_default_unless_renewed():
    core = make_core()
    lease = core.cfg.text_sub_lease
    assert lease > 0
    core.handle_datagrams([(b"SUB a\n" + PAD, T1), (b"SUB b\n" + PAD, T1)], 0.0)
    core.tick(lease / 2)
    core.handle_datagrams([(b"SUB b\n", T1)], lease / 2)  # renewed
    core.tick(lease + 0.1)
    assert core.text_subs == 1
    out = core.handle_datagrams([(b"PUB a\nx", T2), (b"PUB b\ny", T2)], lease + 0.2)
    assert [s.data for s in sends(out)] == [b"MSG b\ny"]
    core.tick(1.5 * lease + 0.1)
    assert core.text_subs == 0 and core.index.count == 0


# ------------------------------------------------------------ limits no single party can empty


def _pub_from(fc: Any, pid: bytes, now: float) -> list[Any]:
    msg = wire.pack_message("t", None, None, b"")
    return [f for f in frames_to(fc.send(wire.encode_pub(fc.cid, fc.cookie, pid, 1, 1, False, [msg]), now), fc.addr)
            if f[0] is FrameType.ERROR]  # fmt: skip


def test_hosts_that_filled_the_producer_table_lose_their_oldest_to_a_newcomer_not_everyone():
    core = make_core(max_producers=12, max_per_host=100)
    attackers = connect(core, *[(f"127.0.0.{i}", 9000) for i in range(2, 5)])
    for i in range(12):  # three hosts fill the table, 4 each
        assert _pub_from(attackers[i % 3], bytes([i]) * 16, 0.0) == []
    assert len(core.producers) == 12
    (err,) = _pub_from(attackers[0], b"\xee" * 16, 0.1)  # a holder of the most gets nothing more
    assert err[1] == ErrorCode.OVERLOADED and "max_producers = 12" in err[2]
    (legit,) = connect(core, ("127.0.0.11", 9000))
    for i in range(3):  # the newcomer takes slots while it holds at least two fewer than the largest
        assert _pub_from(legit, bytes([100 + i]) * 16, 1.0 + i) == []
    assert len(core.producers) == 12 and core.metrics["producers_evicted"] == 3
    assert bytes([0]) * 16 not in core.producers  # (the oldest of the host that held the most went first)
    hosts = sorted(core.admission.per_host.values())
    assert hosts == [3, 3, 3, 3]  # (one taken from each attacker in turn)
    (err,) = _pub_from(legit, b"\xef" * 16, 5.0)  # now at its share: refused like the others
    assert err[1] == ErrorCode.OVERLOADED
    # the evicted producer is simply a new one when it comes back, and all counts stay exact
    core.tick(core.cfg.producer_timeout + 10)
    assert core.producers == {} and core.producer_hosts == {}
    assert sum(core.admission.per_host.values()) == len([c for c in core.clients.values() if c.counted])


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5)), max_size=200))
def test_admission_knows_the_largest_holder_whatever_the_order(ops):
    adm = Admission(max_per_host=1000)
    for admit, h in ops:
        host = f"10.0.0.{h}"
        if admit:
            adm.admit(host, 0, 10**9, "producers", "max_producers")
        else:
            adm.release(host)
        assert adm.top == max(adm.per_host.values(), default=0)
        assert {n: set(hs) for n, hs in adm.by_count.items()} == {
            n: {x for x, c in adm.per_host.items() if c == n} for n in set(adm.per_host.values())
        }
        big = adm.largest("other")
        assert big is None if adm.top < 2 else adm.per_host[big] == adm.top


def test_an_error_text_is_cut_to_what_a_client_decodes():
    """An ERROR may quote what the sender sent (a kilobyte filter in a text SUB's reason):
    over the decoder's 1024 characters no client could read it."""
    f = decoding.decode_untrusted_frame(wire.encode_error(ErrorCode.BAD_TOPIC, "topic filter: " + "x" * 2000))
    assert f[1] == ErrorCode.BAD_TOPIC and len(f[2]) == wire.MAX_ERROR_TEXT and f[2].endswith("...")


def test_a_filter_is_parsed_only_once_the_budgets_let_its_subscription_in():
    """Parsing a kilobyte query costs ~100 us: a host over its budget is refused before it."""
    core = make_core(max_subscriptions_per_host=2)
    (c,) = clients(core, A)
    query = " AND ".join(f"k{j} = 'v{j}'" for j in range(40))  # (over the 32 conditions a query may have)
    assert _subscribe(c, ["a", "b", f"t.* where {query}"]) == [ErrorCode.OK, ErrorCode.OK, ErrorCode.OVERLOADED]
    assert core.metrics["error_bad_topic"] == 0
    c.cmds([(0, "a", None, 0)])
    assert _subscribe(c, [f"t.* where {query}"]) == [ErrorCode.BAD_TOPIC]
    assert core.metrics["error_bad_topic"] == 1 and core.index.count == 1


def clients(core: Any, *addrs: tuple[str, int]) -> list[FakeClient]:
    """FakeClients holding a cookie, with ids of their whole address (corekit's may collide)."""
    out = [FakeClient(core, a, hashlib.md5(repr(a).encode()).digest()) for a in addrs]
    for c in out:
        c.hello()
    return out


def _subscribe(fc: Any, topics: list[str], now: float = 0.0) -> list[int]:
    """The CMDACK's codes for SUBs of ``topics`` in one batch."""
    (ack,) = [
        f for f in frames_to(fc.cmds([(1, t, None, 0) for t in topics], now), fc.addr) if f[0] is FrameType.CMDACK
    ]
    return list(ack[3])


def test_subscriptions_and_filter_bytes_are_budgeted_per_host_and_freed_exactly():
    core = make_core(max_subscriptions_per_host=5, max_filter_bytes_per_host=4096)
    a1, a2 = clients(core, ("127.0.0.2", 1), ("127.0.0.2", 2))  # one host, two clients
    assert _subscribe(a1, [f"a.{i}" for i in range(3)]) == [ErrorCode.OK] * 3
    assert _subscribe(a2, ["b.0", "b.1", "b.2"]) == [ErrorCode.OK, ErrorCode.OK, ErrorCode.OVERLOADED]
    assert core.metrics["refused_max_subscriptions_per_host"] == 1
    (other,) = clients(core, ("127.0.0.3", 1))
    assert _subscribe(other, ["c.0"]) == [ErrorCode.OK]  # another host has its own budget
    assert core.budgets.hosts == {"127.0.0.2": [5, 5 * 3, 0], "127.0.0.3": [1, 3, 0]}
    a1.cmds([(0, "a.0", None, 0)])
    long = "d." + "x" * 250
    assert _subscribe(a2, [long]) == [ErrorCode.OK]
    assert core.budgets.hosts["127.0.0.2"] == [5, 4 * 3 + len(long), 0]
    assert core.budgets.filter_bytes == 4 * 3 + len(long) + 3
    # filter bytes: a host's long filters run out before its count does
    q = " AND ".join(f"k{j} = '{'v' * 100}'" for j in range(8))
    (b,) = clients(core, ("127.0.0.4", 1))
    codes = _subscribe(b, [f"e.{i}.* where {q}" for i in range(5)])
    assert codes == [ErrorCode.OK] * 4 + [ErrorCode.OVERLOADED]  # (911 bytes each, 4096 a host)
    assert core.metrics["refused_max_filter_bytes_per_host"] == 1
    # a client that goes frees what its host was charged, to the byte
    core.tick(core.cfg.subscriber_timeout + 1)
    assert core.budgets.hosts == {} and core.budgets.filter_bytes == 0 and core.index.count == 0


def test_a_pool_filled_by_a_few_hosts_still_admits_a_newcomer_below_its_share():
    core = make_core(max_subscriptions=100, admission_share=0.8, max_subscriptions_per_host=25,
                     max_subscriptions_per_client=1000)  # fmt: skip
    attackers = clients(core, *[(f"127.0.0.{i}", 1) for i in range(2, 6)])
    for n, fc in enumerate(attackers):  # 3 x 25, then the 4th gets 5 below the share and 15 above it
        assert _subscribe(fc, [f"x.{n}.{i}" for i in range(30)]).count(ErrorCode.OK) == (25 if n < 3 else 20)
    assert core.index.count == 95
    # above admission_share, a host at its share (80 / the 4 hosts holding any) is refused...
    assert _subscribe(attackers[3], ["x.more"]) == [ErrorCode.OVER_CAPACITY]
    assert core.metrics["refused_max_subscriptions"] == 11
    # ...a newcomer holds none: it is admitted, up to the limit itself
    (legit,) = clients(core, ("127.0.0.11", 1))
    assert _subscribe(legit, [f"l.{i}" for i in range(8)]) == [ErrorCode.OK] * 5 + [ErrorCode.OVER_CAPACITY] * 3
    assert core.index.count == core.cfg.max_subscriptions


def _record(fc: Any, now: float = 0.0) -> int | None:
    """A SUB from ``fc``'s new client: None when its record was made, else the ERROR's code."""
    errs = [f for f in frames_to(fc.cmds([(1, "t", None, 0)], now), fc.addr) if f[0] is FrameType.ERROR]
    return errs[0][1] if errs else None


def test_client_records_above_the_share_go_to_hosts_below_it_not_to_those_that_filled_the_table():
    core = make_core(max_clients=10, admission_share=0.8, max_per_host=100)
    port = iter(range(1000, 2000))
    attackers = [f"127.0.0.{i}" for i in range(2, 5)]
    made = {h: 0 for h in attackers}
    for _ in range(5):  # round after round, each attacker host asks for a new record
        for h in attackers:
            (fc,) = clients(core, (h, next(port)))
            if _record(fc) is None:
                made[h] += 1
    # 8 (admission_share) round robin: 3, 3, 2; the third host was under its share (8 / 3): one more
    assert made == {h: 3 for h in attackers} and len(core.clients) == 9
    assert core.metrics["refused_max_clients"] == 15 - 9
    (fc,) = clients(core, (attackers[0], next(port)))
    assert _record(fc) == ErrorCode.OVERLOADED
    (legit,) = clients(core, ("127.0.0.11", 1))
    assert _record(legit) is None  # a newcomer holds none: under its share (8 / 4)
    (again,) = clients(core, ("127.0.0.11", 2))
    assert _record(again) == ErrorCode.OVERLOADED and len(core.clients) == 10  # (max_clients itself now)
    assert dict(core.client_share.per_host) == {**{h: 3 for h in attackers}, "127.0.0.11": 1}
    core.tick(core.cfg.subscriber_timeout + 1)  # records that go free their host's count
    assert core.clients == {} and core.client_share.per_host == {} and core.admission.per_host == {}
    assert budget_drift(core) == ""


def test_one_host_whose_subscribers_never_acknowledge_is_refused_past_its_mailbox_share_not_everyone():
    core = make_core(max_mailbox_bytes=1 << 20, admission_share=0.5, send_window=4, mailbox_max_bytes=1 << 20)
    hog, pub = clients(core, ("127.0.0.2", 1), ("127.0.0.9", 1))
    assert _subscribe(hog, ["hog"]) == [ErrorCode.OK]
    hog.cmds([(1, "hog", None, 1)])  # (reliable: its mailbox keeps what it does not acknowledge)
    for _ in range(40):
        pub.pub([("hog", bytes(15000))], now=0.0)
    held = core.clients[hog.cid].mailbox
    assert held is not None and held.nbytes > (1 << 20) // 2
    assert _subscribe(hog, ["more"], now=2.0) == [ErrorCode.OVER_CAPACITY]  # the host holding it all
    assert core.metrics["refused_max_mailbox_bytes"] == 1
    (legit,) = clients(core, ("127.0.0.11", 1))
    assert _subscribe(legit, ["mine"], now=2.0) == [ErrorCode.OK]  # another host: under its share


# ------------------------------------------------------------ the attacks, on real processes


def _attack(*args: str) -> dict[str, Any]:
    r = subprocess.run([sys.executable, "scripts/attack.py", *args, "--json"], cwd=ROOT, capture_output=True,
                       text=True, timeout=180)  # fmt: skip
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


@pytest.mark.alone  # (a dozen processes on the machine's two cores: the others would be slowed)
def test_hosts_exhausting_a_node_leave_a_client_on_another_host_served():
    r = _attack("exhaust", "--duration", "6", "--attackers", "4", "--rate", "800")
    assert r["node_alive"] and r["attack_datagrams"] > 4 * 800 * 4
    assert r["legit_sent"] > 300 and r["legit_unique"] == r["legit_sent"]  # every message, through it all
    assert r["pings"] > 200 and r["pings_lost"] <= 2
    assert 0 < r["subscriptions"] <= 4 * (2 << 20) // 900  # (each host's filter bytes: ~930 B a filter)
    assert r["refused"]["refused_max_filter_bytes_per_host"] > 0


@pytest.mark.alone
def test_forged_text_subscriptions_get_at_most_3x_what_they_sent_from_the_whole_cluster():
    r = _attack("text", "--duration", "4", "--members", "2")
    assert r["subs_sent"] >= 60 and r["messages_published"] >= 600
    # (1 KB SUBs buy 3 KB each, so some 8 KB messages come, from both members, through the home)
    assert 0.5 * r["victim_bytes_sent"] < r["victim_bytes_received"] <= 3 * r["victim_bytes_sent"]
    off = _attack("text", "--duration", "2", "--members", "2", "--text-amplification", "0", "--sub-pad", "0")
    assert off["victim_bytes_received"] > 100 * off["victim_bytes_sent"]  # (what the bound prevents)


def test_a_host_over_its_bytes_per_second_is_dropped_unread_and_others_are_not():
    core = make_core(max_host_bytes_per_second=65536)
    P = ("127.0.0.8", 1)
    core.handle_datagrams([(b"SUB t\n" + PAD, T1)], 0.0)
    big = b"PUB t\n" + b"x" * 994  # 1,000 bytes
    core.handle_datagrams([(big, P)] * 100, 0.0)
    assert core.metrics["dropped_host_rate"] == 100 - 65 and core.metrics["published"] == 65
    out = core.handle_datagrams([(b"PUB t\nother host", ("127.0.0.9", 1))], 0.0)
    assert [s.data for s in sends(out)] == [b"MSG t\nother host"]
    core.handle_datagrams([(big, P)] * 40, 0.5)  # half a second: 32 KiB more
    assert core.metrics["published"] == 65 + 1 + 33
    assert make_core().cfg.max_host_bytes_per_second == 1 << 30


def test_a_text_address_that_subscribes_again_in_a_cluster_is_served_and_earns_credit():
    """Review finding: a text record outlives its last subscription in a cluster; subscribing
    again left it not local, so its credit never grew and its deliveries were dropped."""
    core = BrokerCore(NodeConfig(id="a"), random.Random(1), incarnation=1,
                      members=[["a", "127.0.0.1", 7400], ["b", "127.0.0.1", 7401]], node_idx=0,
                      wall_offset=1.8e9, replicating=True, tombstone_horizon=600.0)  # fmt: skip
    core.handle_datagrams([(b"SUB t\n" + PAD, T1)], 1.0)
    core.handle_datagrams([(b"UNSUB t\n", T1)], 2.0)
    core.tick(core.cfg.text_sub_lease + 10)  # (and a lease that ended, the default way)
    core.handle_datagrams([(b"SUB t\n" + PAD, T1)], core.cfg.text_sub_lease + 20)
    assert core.clients[T1].local and core.clients[T1].credit >= 3 * len(PAD)
    out = core.handle_datagrams([(b"PUB t\nhello", T2)] * 100, core.cfg.text_sub_lease + 21)
    assert _text_bytes(out, T1) == 100 * len(b"MSG t\nhello") and core.metrics["dropped_text_budget"] == 0


def test_an_adopted_client_is_charged_to_its_host_where_it_lives_now():
    """Review finding: a client that failed over was charged to no host at its new member (no
    per-host limit there) and still to its host at the old one."""
    a = BrokerCore(NodeConfig(id="a", max_subscriptions_per_host=5), random.Random(1), incarnation=1,
                   members=[["a", "127.0.0.1", 7400], ["b", "127.0.0.1", 7401]], node_idx=0,
                   wall_offset=1.8e9, replicating=True, tombstone_horizon=600.0)  # fmt: skip
    b = BrokerCore(NodeConfig(id="b", max_subscriptions_per_host=5), random.Random(2), incarnation=1,
                   members=[["a", "127.0.0.1", 7400], ["b", "127.0.0.1", 7401]], node_idx=1,
                   wall_offset=1.8e9, replicating=True, tombstone_horizon=600.0)  # fmt: skip
    H = ("10.9.9.9", 4000)
    (at_a,) = clients(a, H)
    assert _subscribe(at_a, [f"t.{i}" for i in range(3)]) == [ErrorCode.OK] * 3
    b.merge(at_a.take_pushes(), 1.0)
    assert b.clients[at_a.cid].live == 3 and b.budgets.hosts == {}  # (a's to count)
    at_b = FakeClient(b, H, at_a.cid)
    at_b.hello(2.0)
    at_b.session, at_b.batch = at_a.session, at_a.batch
    assert _subscribe(at_b, [f"u.{i}" for i in range(4)], 2.0) == [
        ErrorCode.OK,
        ErrorCode.OK,
        ErrorCode.OVERLOADED,
        ErrorCode.OVERLOADED,
    ]
    assert b.budgets.hosts == {"10.9.9.9": [5, 3 * 3 + 2 * 3, 0]} and b.admission.per_host == {"10.9.9.9": 1}
    a.merge(at_b.take_pushes(), 3.0)
    assert a.budgets.hosts == {} and a.admission.per_host == {}  # (its new home counts it)
    assert budget_drift(a) == "" and budget_drift(b) == ""


def test_client_records_do_not_shield_a_host_from_producer_eviction_nor_pile_up_timers():
    """Review findings: the largest holder was ranked by clients and producers together (a host
    of client records alone made eviction fail), and an evicted producer's timer re-armed itself
    beside the new one when it came back."""
    core = make_core(max_producers=6, max_per_host=100)
    for fc in clients(core, *[("127.0.0.30", p) for p in range(10)]):
        assert _subscribe(fc, ["park"]) == [ErrorCode.OK]  # 10 client records, no producers
    attackers = clients(core, ("127.0.0.2", 1), ("127.0.0.3", 1))
    for i in range(6):
        assert _pub_from(attackers[i % 2], bytes([i]) * 16, 0.0) == []
    (legit,) = clients(core, ("127.0.0.11", 1))
    assert _pub_from(legit, b"\x99" * 16, 1.0) == [] and core.metrics["producers_evicted"] == 1
    assert _pub_from(attackers[0], bytes([0]) * 16, 2.0)[0][1] == ErrorCode.OVERLOADED  # (its share is taken)
    core.tick(core.cfg.producer_timeout + 10)
    assert core.producers == {} and core.producing._producer_timers == set()
    assert [t for t in core.outbox.timers if t[1] == 3] == []  # (TIMER_PRODUCER: none left armed)
