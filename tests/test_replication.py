"""Replicated state: LWW merge laws (property tests), anti-entropy, peer queues,
failure detection, the peer codec and cluster config validation."""

from __future__ import annotations

import copy
import math
import random
import re
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roost.cluster.config import load_cluster_config
from roost.cluster.member import MemberCore
from roost.cluster.membership import Membership
from roost.cluster.partitionlog import LogSettings
from roost.cluster.peerwire import FrameDecoder, PeerProtocolError, PeerType, check_entries_untrusted, encode, mac
from roost.cluster.replication import PeerQueue
from roost.node import versions
from roost.node.config import ConfigError, NodeConfig
from roost.node.core import BrokerCore, Log
from tests.corekit import FakeClient, connect, delivered, frames_to, make_core, replicated

WHO = [b"\x01" * 16, b"\x02" * 16, ("127.0.0.1", 9000)]


def replica(node_id: str = "n1", idx: int = 0, horizon: float = math.inf) -> BrokerCore:
    return BrokerCore(
        NodeConfig(id=node_id),
        random.Random(idx),
        1,
        node_idx=idx,
        replicating=True,
        wall_offset=1_780_000_000.0,
        tombstone_horizon=horizon,
    )  # fake time 0 is a day in 2026


def collected(actions: list) -> int:
    """Tombstones the collection's log line reports."""
    return sum(a.fields["count"] for a in actions if isinstance(a, Log) and a.event == "tombstones_collected")


def observable(core: BrokerCore):
    """Everything merge decides: registers (with versions), addresses, homes, index."""
    return (
        sorted((repr(w), c.cver, c.addr, c.home, sorted(c.subs.items(), key=repr)) for w, c in core.clients.items()),
        core.state_digest()[0],
        list(core.digest),
    )


# One write: which client, which register, who wrote it, when, what.
write = st.tuples(
    st.integers(0, 2),  # who
    st.sampled_from([("a", None), ("a", "k"), ("b", None)]),
    st.integers(0, 2),  # writer node index
    st.integers(1, 40),  # hlc
    st.booleans(),  # present
    st.integers(0, 1),  # mode
)


def entry(w) -> list:
    who_i, (topic, key), node_i, hlc, present, mode = w
    who = WHO[who_i] if isinstance(WHO[who_i], bytes) else list(WHO[who_i])  # as on the wire
    cver = versions.make(hlc, node_i, True, 0)
    # everything about a client-level version follows from the version itself, as in reality
    return [who, cver, "127.0.0.1", 1000 + hlc * 3 + node_i, f"n{node_i + 1}",
            [[topic, key, versions.make(hlc, node_i, present, mode)]], hlc]  # fmt: skip


def applied(groups) -> BrokerCore:
    core = replica("n9", 9)  # a bystander: none of the writers
    for g in groups:
        core.merge(check_entries_untrusted([entry(w) for w in g]), 0.0)
    return core


@settings(max_examples=300, deadline=None)
@given(st.lists(write, max_size=25), st.randoms(use_true_random=False))
def test_merge_is_commutative_associative_and_idempotent(writes, rnd):
    reference = observable(applied([writes]))
    shuffled = list(writes)
    rnd.shuffle(shuffled)
    assert observable(applied([shuffled])) == reference  # any order
    cut = rnd.randint(0, len(writes))
    assert observable(applied([writes[:cut], writes[cut:]])) == reference  # any grouping
    assert observable(applied([writes, writes, shuffled])) == reference  # repeats change nothing
    singles = [[w] for w in shuffled]
    assert observable(applied(singles)) == reference


@settings(max_examples=200, deadline=None)
@given(st.lists(write, max_size=20))
def test_newest_version_wins_each_register(writes):
    core = applied([writes])
    newest: dict = {}
    for who_i, tk, node_i, hlc, present, mode in writes:
        v = versions.make(hlc, node_i, present, mode)
        newest[WHO[who_i], tk] = max(v, newest.get((WHO[who_i], tk), 0))
    assert {(w, tk): v for w, c in core.clients.items() for tk, v in c.subs.items()} == newest
    for c in core.clients.values():
        for (topic, key), v in c.subs.items():
            slot = core.index.topics.get(topic, {}).get(key, {})
            assert (c.cid in slot) == versions.is_present(v)  # the index follows the registers
            if c.cid in slot:
                assert slot[c.cid] == versions.mode_of(v)


# Anti-entropy itself (DIGEST -> DIFF -> DIFFEND and the answering pushes) is tested on real
# member cores over the simulator's links: tests/test_sim.py.


def moved_client() -> tuple[BrokerCore, BrokerCore, FakeClient, FakeClient]:
    """A client subscribed to "t" at n1, replicated to n2; then the same process (same
    session, batches going on) talks to n2, which never saw its session."""
    a, b = replica("n1", 0), replica("n2", 1)
    (ca,) = connect(a, ("127.0.0.1", 5001))
    ca.sub("t", now=1.0)
    b.merge(check_entries_untrusted(ca.take_pushes()), 1.0)
    cb = FakeClient(b, ca.addr, cid=ca.cid)
    cb.hello(1.0)  # (n1's cookie is n1's: every member keys its own)
    cb.batch = ca.batch
    return a, b, ca, cb


def test_a_later_write_wins_over_a_concurrent_one():
    a, b, ca, cb = moved_client()
    cb.cmds([(0, "t", None, 0)], now=2.0)  # unsubscribed at n2
    a.merge(check_entries_untrusted(cb.take_pushes()), 2.0)
    assert a.index.count == b.index.count == 0
    assert a.clients[ca.cid].home == "n2" and not a.clients[ca.cid].local


def test_a_client_that_moved_keeps_its_subscriptions_when_it_continues_its_session():
    _, b, ca, cb = moved_client()
    (ack,) = frames_to(cb.sub("u", now=2.0), cb.addr)
    assert ack[1:] == (cb.session, 2, [0])
    assert b.clients[ca.cid].modes() == {("t", None): 1, ("u", None): 1}


def test_pong_known_means_the_node_holds_a_subscription_for_the_client():
    core = replica()  # a replica keeps a timed-out client's record, with tombstones
    fc = FakeClient(core, ("127.0.0.1", 5001))
    fc.hello()
    (pong,) = frames_to(fc.ping(0.1), fc.addr)
    assert pong[2] is False  # no record
    fc.sub("t", now=0.2)
    (pong,) = frames_to(fc.ping(0.3, token=2), fc.addr)
    assert pong[2] is True
    core.tick(30.0)  # silent for longer than subscriber_timeout
    assert fc.cid in core.clients and not core.clients[fc.cid].live
    (pong,) = frames_to(fc.ping(30.1, token=3), fc.addr)
    assert pong[2] is False  # the record is there, its subscriptions are not: the client must learn it


def test_tombstones_are_collected_after_the_horizon():
    a = replica(horizon=60.0)
    (fc,) = connect(a, ("127.0.0.1", 5001))
    fc.sub("t", now=0.0)
    fc.cmds([(0, "t", None, 0)], now=1.0)
    assert ("t", None) in a.clients[fc.cid].subs  # the tombstone
    a.collect_tombstones(10.0)
    assert a.metrics["tombstones_collected"] == 0
    assert collected(a.collect_tombstones(100.0)) == 1
    assert ("t", None) not in a.clients[fc.cid].subs


def test_expire_home_tombstones_the_dead_members_clients():
    a, b = replica("n1", 0), replica("n2", 1)
    (cb,) = connect(b, ("127.0.0.1", 5002))
    cb.sub("t", now=0.0)
    a.merge(check_entries_untrusted(cb.take_pushes()), 0.0)
    assert a.index.count == 1
    expiry = check_entries_untrusted(replicated(a.expire_home("n2", 5.0)))
    assert len(expiry) == 1 and a.index.count == 0
    # n2 was not dead after all and its client still talks to it: the subscription stands
    b2 = replica("n2", 1)
    b2.merge(check_entries_untrusted(list(b.dump())), 0.0)
    b2.clients[cb.cid].last_seen = 4.0
    reasserted = replicated(b2.merge(expiry, 5.0))
    assert b2.index.count == 1 and b2.metrics["reasserted"] == 1
    a.merge(check_entries_untrusted(reasserted), 5.1)
    assert a.index.count == 1  # the re-assertion wins everywhere
    # a home whose client has been silent accepts the expiry
    b.merge(expiry, 20.0)
    assert b.index.count == 0


# ---------------------------------------------------------------- peer queue


def test_peer_queue_windows_acks_and_requeues_in_order():
    q = PeerQueue(max_queue=1000, chunk=2, window=2)
    es = [[b"%d" % i, 0, "h", 1, "n1", [["t", None, 1]]] for i in range(7)]
    q.add(es)
    p1, p2 = q.next_push(), q.next_push()
    assert q.next_push() is None  # window of 2
    assert [e[0] for e in p1[1]] == [b"0", b"1"] and [e[0] for e in p2[1]] == [b"2", b"3"]
    q.acked(p1[0])
    q.disconnected()  # p2 was in flight: it goes back to the front
    assert [e[0] for e in q.next_push()[1]] == [b"2", b"3"]
    assert len(q) == 5


def test_peer_queue_overflow_gives_way_to_anti_entropy():
    q = PeerQueue(max_queue=3, chunk=10)
    q.add([[b"x", 0, "h", 1, "n1", [["t", None, 1]]]] * 4)
    assert q.overflowed and len(q) == 0 and q.next_push() is None
    q.add([[b"y", 0, "h", 1, "n1", []]])
    assert len(q) == 0
    q.repaired()
    q.add([[b"y", 0, "h", 1, "n1", []]])
    assert len(q) == 1


# ---------------------------------------------------------------- membership


def test_failure_detector_states():
    m = Membership(["n2"], suspect_after=0.6, down_after=1.5, now=0.0)
    assert m.heard("n2", 0.1, "syncing", 0, 0) == ("unknown", "syncing")
    assert m.heard("n2", 0.2, "ready", 5, 1) == ("syncing", "ready")
    assert m.tick(0.5) == []
    assert m.tick(0.9) == [("n2", "ready", "suspect")]
    assert m.tick(1.8) == [("n2", "suspect", "down")]
    assert m.down_for("n2", 2.8) == pytest.approx(1.0)
    assert m.heard("n2", 3.0, "ready", 5, 1) == ("down", "ready")
    never = Membership(["n3"], 0.6, 1.5, now=0.0)
    assert never.tick(1.0) == [] and never.tick(1.6) == [("n3", "unknown", "down")]


# ---------------------------------------------------------------- peer codec


def test_frames_survive_any_split_of_the_stream():
    frames = [[PeerType.PUSH, i, [[b"c" * 16, 1, "127.0.0.1", 9, "n1", [["t", None, i]]]]] for i in range(20)]
    data = b"".join(encode(f) for f in frames)
    rng = random.Random(3)
    dec = FrameDecoder(1 << 20)
    got = []
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 40)
        dec.feed(data[pos : pos + step])
        while (f := dec.next_frame_untrusted()) is not None:
            got.append(f)
        pos += step
    assert got == frames


def test_the_size_limit_applies_when_a_frame_is_read_not_when_it_arrived():
    """Frames after the last handshake frame may come in the same segment:
    they are judged by the limit in force once the handshake is done."""
    big = encode([PeerType.PUSH, 1, [[b"c" * 16, 1, "127.0.0.1", 9, "n1", [["t" * 200, None, i] for i in range(5)]]]])
    dec = FrameDecoder(512)
    dec.feed(encode([PeerType.AUTH, b"m" * 32]) + big)
    assert dec.next_frame_untrusted() == [PeerType.AUTH, b"m" * 32]
    dec.max_frame = 1 << 20
    assert dec.next_frame_untrusted()[0] == PeerType.PUSH


def test_decoder_refuses_oversized_and_garbage():
    with pytest.raises(PeerProtocolError, match="exceeds max_frame"):
        _read_one((101).to_bytes(4, "big"))
    with pytest.raises(PeerProtocolError, match="undecodable"):
        _read_one(b"\x00\x00\x00\x01\xc1")
    with pytest.raises(PeerProtocolError, match=r"\[type"):
        _read_one(encode({"a": 1}))  # type: ignore[arg-type]


def _read_one(data: bytes):
    dec = FrameDecoder(100)
    dec.feed(data)
    return dec.next_frame_untrusted()


# A valid entry of each kind of client; every row below breaks one field of the binary one.
V_RELIABLE, V_FIRE = versions.make(10, 0, True, 1), versions.make(11, 0, True, 0)
BINARY_ENTRY = [b"c" * 16, V_FIRE, "127.0.0.1", 9000, "n1", [["t", None, V_RELIABLE], ["t", "k", V_FIRE]], 5]
TEXT_ENTRY = [["10.0.0.1", 7001], V_FIRE, "10.0.0.1", 7001, "n2", [["t", None, V_FIRE]], 0]
FIELDS = ("who", "cver", "host", "port", "home", "subs", "session")
SUB_FIELDS = ("topic", "key", "version")


def with_field(field: str, value) -> list:
    """BINARY_ENTRY with one field replaced; ``sub`` and SUB_FIELDS are in its last subscription."""
    e = copy.deepcopy(BINARY_ENTRY)
    if field in FIELDS:
        e[FIELDS.index(field)] = value
    elif field == "sub":
        e[5][-1] = value
    else:
        e[5][-1][SUB_FIELDS.index(field)] = value
    return e


def test_valid_entries_are_passed_on_in_the_form_merge_expects():
    assert check_entries_untrusted([BINARY_ENTRY, TEXT_ENTRY, with_field("subs", [])]) == [
        (b"c" * 16, V_FIRE, "127.0.0.1", 9000, "n1", [["t", None, V_RELIABLE], ["t", "k", V_FIRE]], 5),
        (("10.0.0.1", 7001), V_FIRE, "10.0.0.1", 7001, "n2", [["t", None, V_FIRE]], 0),
        (b"c" * 16, V_FIRE, "127.0.0.1", 9000, "n1", [], 5),
    ]


# (field, what the error starts with, broken values)
BROKEN: list[tuple[str, str, list[Any]]] = [
    ("who", "who must be", [b"short", b"c" * 17, "c" * 16, None, ["10.0.0.1"], ["10.0.0.1", 7001, 0]]),
    ("who", "who host must be", [["example.com", 7001], [b"10.0.0.1", 7001], [None, 7001]]),
    ("who", "who port must be", [["10.0.0.1", 0], ["10.0.0.1", 65536], ["10.0.0.1", "7001"]]),
    ("cver", "cver must be", [-1, 2**64, "5", 5.0, True, None]),
    ("host", "host must be", ["h", "localhost", "", "127.0.0.1:9000", b"127.0.0.1", None]),
    ("port", "port must be", [0, -1, 65536, "9000", 9000.0, None]),
    ("home", "home must be", ["", "n" * 65, b"n1", 1, None]),
    ("subs", "subs must be", ["t", None, {"t": 1}, ("t", None, 1)]),
    ("sub", "a subscription is", ["t", None, ["t", None], ["t", None, V_FIRE, 0]]),
    ("topic", "bad subscription: topic", ["bad topic", "", "t" * 256, 5, None]),
    ("key", "bad subscription: key", ["", "k" * 256, b"k", 5]),
    ("version", "subscription version must be", [-1, 2**64, "7", 7.0, None]),
    ("session", "session must be", [-1, 2**64, "5", 5.0, None]),
]


@pytest.mark.parametrize(
    ("field", "value", "needle"),
    [pytest.param(f, v, n, id=f"{f}={v!r:.20}") for f, n, vs in BROKEN for v in vs],
)
def test_an_entry_with_one_broken_field_is_refused_naming_the_field(field, value, needle):
    with pytest.raises(PeerProtocolError, match="^" + re.escape(needle)):
        check_entries_untrusted([TEXT_ENTRY, with_field(field, value)])  # not only the first entry is checked


@pytest.mark.parametrize(
    ("entries", "needle"),
    [
        ("nope", "entries must be an array"),
        (None, "entries must be an array"),
        ({"a": 1}, "entries must be an array"),
        (["nope"], "an entry is"),
        ([BINARY_ENTRY[:6]], "an entry is"),
        ([[*BINARY_ENTRY, 0]], "an entry is"),
    ],
)
def test_entries_that_are_not_entries_are_refused(entries, needle):
    with pytest.raises(PeerProtocolError, match="^" + re.escape(needle)):
        check_entries_untrusted(entries)


def test_an_entry_homed_at_a_member_this_config_does_not_list_is_merged():
    """Members are added one at a time: a peer may already run with a member
    that this member's config does not list yet."""
    a = replica("n1", 0)
    a.merge(check_entries_untrusted([with_field("home", "n4")]), 0.0)
    assert a.clients[b"c" * 16].home == "n4" and a.index.count == 2


def test_handshake_macs_differ_per_direction():
    s, n1, n2 = b"secret", b"a" * 16, b"b" * 16
    assert mac(s, b"L", n1, n2, "n1", "n2") != mac(s, b"D", n1, n2, "n1", "n2")
    assert mac(s, b"L", n1, n2, "n1", "n2") != mac(b"other", b"L", n1, n2, "n1", "n2")


# ---------------------------------------------------------------- config


GOOD = """
[cluster]
secret = "0123456789abcdef"
[[members]]
id = "n1"
client_addr = "127.0.0.1:7401"
peer_addr = "127.0.0.1:7501"
data_dir = "d1"
[[members]]
id = "n2"
client_addr = "127.0.0.1:7402"
peer_addr = "127.0.0.1:7502"
data_dir = "d2"
"""


@pytest.mark.parametrize(
    ("change", "needle"),
    [
        (('secret = "0123456789abcdef"', 'secret = "short"'), "secret = 'short': must be a string of at least 16"),
        (('secret = "0123456789abcdef"', ""), "[cluster] secret (or secret_file, or $ROOST_CLUSTER_SECRET): required"),
        (
            ('"127.0.0.1:7402"', '"127.0.0.1:7401"'),
            "n1 client_addr = '127.0.0.1:7401' and n2 client_addr = '127.0.0.1:7401': the same port on the same host",
        ),
        (
            ('data_dir = "d2"', 'data_dir = "d2"\nmonitor_addr = "127.0.0.1:7501"'),
            "n1 peer_addr = '127.0.0.1:7501' and n2 monitor_addr = '127.0.0.1:7501': the same port",
        ),
        (
            ('data_dir = "d2"', 'data_dir = "d2"\nmonitor_addr = "0.0.0.0:7502"'),
            "n2 peer_addr = '127.0.0.1:7502' and n2 monitor_addr = '0.0.0.0:7502': the same port",
        ),
        (
            ("[cluster]", '[monitor]\naddr = "127.0.0.1:8222"\n[cluster]'),
            "[monitor] addr: set per member as monitor_addr in [[members]]",
        ),
        (('id = "n2"', 'id = "n 2"'), "id = 'n 2': must be 1..64 chars"),
        (('data_dir = "d2"', 'data_dir = "d2"\nport = 5'), "port: unknown key"),
        (("[cluster]", "[cluster]\nheartbeat_interval = 0"), "heartbeat_interval = 0: must be a number of seconds"),
        (('peer_addr = "127.0.0.1:7502"', 'peer_addr = "nohost"'), "peer_addr = 'nohost': must be HOST:PORT"),
        (
            ("[cluster]", '[durable]\nfsync = "sometimes"\n[cluster]'),
            '[durable] fsync = \'sometimes\': must be "always", "interval" or "never"',
        ),
        (("[cluster]", "[durable]\nsegment_bytes = 10\n[cluster]"), "[durable] segment_bytes = 10: must be an integer"),
        (
            ("[cluster]", "[durable]\nfsync_every = 1\n[cluster]"),
            "[durable] fsync_every: unknown key; known keys: fsync,",
        ),
        (
            ("[cluster]", "[durable]\nfetch_bytes = 100000\n[cluster]\nmax_frame = 65536"),
            "[durable] fetch_bytes = 100000: must be at most half of [cluster] max_frame (65536)",
        ),
        (
            ('secret = "0123456789abcdef"', 'secret = "0123456789abcdef"\nsecret_file = "s"'),
            "[cluster] secret and secret_file: set one of them, not both",
        ),
        (('secret = "0123456789abcdef"', 'secret_file = "/"'), "[cluster] secret_file = '/': cannot read"),
        (
            ('secret = "0123456789abcdef"', 'secret_file = "s\\u0000"'),  # (ValueError before: fuzzing)
            "[cluster] secret_file = 's\\x00': cannot read",
        ),
        (('data_dir = "d2"', 'data_dir = "d2"\nmonitor_addr = "x:1"'), "monitor_addr = 'x:1': must be HOST:PORT"),
        (
            (
                'data_dir = "d2"',
                'data_dir = "d2"\nadvertise_addr = "127.0.0.1:7401"\n'
                '[[members]]\nid="n3"\nclient_addr="127.0.0.1:7403"\npeer_addr="127.0.0.1:7503"\n'
                'data_dir="d3"\nadvertise_addr = "127.0.0.1:7401"',
            ),
            "advertise_addr, else client_addr) = ('127.0.0.1', 7401): must be unique",
        ),
        (
            ('data_dir = "d2"', 'data_dir = "d2"\nadvertise_addr = "127.0.0.1:7401"'),  # (n1's client_addr)
            "advertise_addr, else client_addr) = ('127.0.0.1', 7401): must be unique",
        ),
        (
            ('data_dir = "d2"', 'data_dir = "d2"\nadvertise_addr = "127.0.0.1:0"'),
            "advertise_addr = '127.0.0.1:0': must be an address clients can be sent to",
        ),
        (('data_dir = "d2"', 'data_dir = "d2"\nadvertise_addr = "0.0.0.0:7402"'), "not a wildcard"),
        (('"127.0.0.1:7402"', '"0.0.0.0:7402"'), "client_addr = '0.0.0.0:7402': clients cannot be sent to a wildcard"),
        (
            ("[cluster]", '[node]\nadvertise_addr = "127.0.0.1:1"\n[cluster]'),
            "[node] advertise_addr: set per member in [[members]]",
        ),
        (("[cluster]", "node = 5\n[cluster]"), "[node] must be a table"),  # (a TypeError before: fuzzing)
        (("[cluster]", 'monitor = "addr"\n[cluster]'), "[monitor] must be a table"),
    ],
)
def test_cluster_config_errors_name_file_key_and_allowed(tmp_path, change, needle):
    p = tmp_path / "c.toml"
    p.write_text(GOOD.replace(*change))
    with pytest.raises(ConfigError) as exc:
        load_cluster_config(p)
    assert str(p) in str(exc.value) and needle in str(exc.value)


def test_the_secret_comes_from_a_file_or_the_environment_when_the_config_has_none(tmp_path, monkeypatch):
    p = tmp_path / "c.toml"
    (tmp_path / "secret").write_text("from-a-file-0123456789\nignored\n")
    (tmp_path / "secret").chmod(0o600)  # (tests/test_secrets.py: a file others may read is refused)
    p.write_text(GOOD.replace('secret = "0123456789abcdef"', 'secret_file = "secret"'))  # (beside the config)
    monkeypatch.setenv("ROOST_CLUSTER_SECRET", "from-the-environment-0123")
    assert load_cluster_config(p).settings.secret == "from-a-file-0123456789"
    p.write_text(GOOD.replace('secret = "0123456789abcdef"', ""))
    assert load_cluster_config(p).settings.secret == "from-the-environment-0123"
    p.write_text(GOOD)  # (a secret in the config is used as it is)
    assert load_cluster_config(p).settings.secret == "0123456789abcdef"
    monkeypatch.setenv("ROOST_CLUSTER_SECRET", "short")
    p.write_text(GOOD.replace('secret = "0123456789abcdef"', ""))
    with pytest.raises(ConfigError, match=r"\$ROOST_CLUSTER_SECRET: the secret must be a string of at least 16"):
        load_cluster_config(p)
    monkeypatch.delenv("ROOST_CLUSTER_SECRET")
    with pytest.raises(ConfigError, match="required"):
        load_cluster_config(p)


def test_members_of_different_machines_may_each_take_a_wildcard_monitoring_port(tmp_path):
    """Ports clash per machine: 0.0.0.0:8222 on two members at different addresses is fine
    (no traffic: the config is only loaded), and refused for two members of one machine."""
    p = tmp_path / "c.toml"
    apart = GOOD.replace('"127.0.0.1:7501"', '"192.0.2.1:7501"').replace('"127.0.0.1:7502"', '"192.0.2.2:7501"')
    apart = apart.replace('data_dir = "d1"', 'data_dir = "d1"\nmonitor_addr = "0.0.0.0:8222"')
    p.write_text(apart.replace('data_dir = "d2"', 'data_dir = "d2"\nmonitor_addr = "0.0.0.0:8222"'))
    assert [m.monitor_addr for m in load_cluster_config(p).members] == [("0.0.0.0", 8222)] * 2
    p.write_text(p.read_text().replace("0.0.0.0:8222", "127.0.0.1:8222"))  # (each machine's own loopback)
    assert [m.monitor_addr for m in load_cluster_config(p).members] == [("127.0.0.1", 8222)] * 2
    p.write_text(p.read_text().replace("127.0.0.1:8222", "0.0.0.0:8222"))
    p.write_text(p.read_text().replace('"192.0.2.2:7501"', '"192.0.2.1:7502"'))
    clash = "n1 monitor_addr = '0.0.0.0:8222' and n2 monitor_addr = '0.0.0.0:8222'"
    with pytest.raises(ConfigError, match=re.escape(clash)):
        load_cluster_config(p)


def test_advertise_and_monitor_addresses_reach_the_member(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(GOOD.replace('data_dir = "d1"', 'data_dir = "d1"\nadvertise_addr = "127.0.0.9:17401"\n'
                              'monitor_addr = "127.0.0.1:8401"'))  # fmt: skip
    cc = load_cluster_config(p)
    n1 = cc.node_config("n1", bind_host="0.0.0.0")
    assert (n1.client_addr, n1.advertise_addr, n1.monitor_addr) == (("0.0.0.0", 7401), "127.0.0.9:17401",
                                                                     "0.0.0.0:8401")  # fmt: skip
    assert cc.node_config("n2").monitor_addr == "" and cc.node_config("n2").advertise_addr == "127.0.0.1:7402"
    core = MemberCore(cc, "n2", rng=random.Random(1), now=0.0, wall_offset=0.0, incarnation=1)
    assert core.broker.members[0] == ["n1", "127.0.0.9", 17401]  # (what WELCOME tells clients)


def test_durable_settings_reach_the_member_core_and_its_logs(tmp_path):
    p = tmp_path / "c.toml"
    p.write_text(GOOD.replace("[cluster]", '[durable]\nfsync = "interval"\nretention_bytes = 5000\n'
                              "fetch_wait = 2\n[cluster]"))  # fmt: skip
    cc = load_cluster_config(p)
    s = LogSettings.of(cc.settings)
    assert (s.fsync, s.retention_bytes, s.fetch_wait, s.max_uncommitted) == ("interval", 5000, 2.0, 10000)
    p.write_text(GOOD)
    assert LogSettings.of(load_cluster_config(p).settings) == LogSettings()  # (the same defaults)


def test_shipped_cluster3_config():
    cc = load_cluster_config("configs/cluster3.toml", need_secret=False)  # (its secret: tests/test_secrets.py)
    assert [m.id for m in cc.members] == ["n1", "n2", "n3"]
    assert [m.client_addr[1] for m in cc.members] == [7401, 7402, 7403]
    assert [m.peer_addr[1] for m in cc.members] == [7501, 7502, 7503]
    assert cc.node_config("n2").client_addr == ("127.0.0.1", 7402)


def test_versions_from_the_future_are_refused():
    a = replica()
    future = versions.make(versions.HybridClock().now(1_780_000_000.0 + 3600), 1, True, 1)
    a.merge(check_entries_untrusted([[b"f" * 16, future, "127.0.0.1", 9, "n2", [["t", None, future]], 0]]), 0.0)
    assert a.index.count == 0 and a.metrics["merge_refused_future"] == 1


def test_an_expired_tombstone_does_not_come_back_from_another_replica():
    a, b = replica("n1", 0, horizon=60.0), replica("n2", 1, horizon=60.0)
    (fc,) = connect(a, ("127.0.0.1", 5001))
    fc.sub("t", now=0.0)
    fc.cmds([(0, "t", None, 0)], now=1.0)
    b.merge(check_entries_untrusted(fc.take_pushes()), 1.0)
    assert collected(a.collect_tombstones(100.0)) == 1  # a collected, b not yet
    a.merge(check_entries_untrusted(list(b.dump())), 100.0)  # anti-entropy sends b's copy
    assert ("t", None) not in a.clients[fc.cid].subs
    assert collected(b.collect_tombstones(100.0)) == 1
    assert a.digest == b.digest


def test_text_records_go_with_their_last_subscription():
    single = make_core()
    single.handle_datagrams([(b"SUB t\n", ("127.0.0.1", 7001)), (b"UNSUB t\n", ("127.0.0.1", 7001))], 0.0)
    assert single.clients == {}
    a = replica(horizon=60.0)
    a.handle_datagrams([(b"SUB t\n", ("127.0.0.1", 7001)), (b"UNSUB t\n", ("127.0.0.1", 7001))], 0.0)
    assert collected(a.collect_tombstones(100.0)) == 1 and a.clients == {}


def replaced_process() -> tuple[BrokerCore, FakeClient, FakeClient]:
    """A client subscribed to "t" from one process (at 1.0), then from a restarted one: same
    client id, greater session, another address (at 2.0)."""
    core = replica()
    old = FakeClient(core, ("127.0.0.1", 5001))
    old.hello()
    old.sub("t", now=1.0)
    new = FakeClient(core, ("127.0.0.1", 5002), cid=old.cid)
    new.hello()
    new.session = old.session + 1
    new.sub("t", now=2.0)
    return core, old, new


def test_a_late_ping_of_a_replaced_process_does_not_take_the_client_back_to_its_old_address():
    """Simulator seed 7111: a PING of the old process, delayed in the network, arrived after the
    restarted process (same client id, greater session) had moved the client to its address."""
    core, old, new = replaced_process()
    assert core.clients[old.cid].addr == new.addr
    old.ping(now=2.5)  # the old process's last PING, late
    assert core.clients[old.cid].addr == new.addr and core.metrics["stale_pings"] == 1


def test_a_member_does_not_give_up_a_client_that_is_talking_to_it():
    """n2 believes the client's home is n1 (news of its move was cut off) and n1 has been
    down for subscriber_timeout; but the client acknowledges n2's stream: it is alive, and
    keeps its subscriptions (and what n2 holds for it) there."""
    _, b, ca, cb = moved_client()  # subscribed at n1, replicated to n2 (home n1 there)
    cb.ack(1, 0, now=5.0)  # it talks to n2
    b.expire_home("n1", 6.0)
    assert b.clients[ca.cid].modes() == {("t", None): 1}
    b.expire_home("n1", 20.0)  # silent for longer than subscriber_timeout (10 s) now: given up
    assert b.clients[ca.cid].modes() == {}


def test_a_stream_given_up_by_another_member_goes_on_when_the_client_takes_it_up_again():
    """Simulator seed 5685: a member's expiry of a client that was alive behind a partition
    dropped what it held for it; the mailbox is now kept for subscriber_timeout, and the
    stream resumes where it stopped when the client subscribes again."""
    _, b, ca, cb = moved_client()
    (pub,) = connect(b, ("127.0.0.1", 5009))
    pub.pub([("t", b"m1")], now=1.5)  # n2 holds m1 for the client, unacknowledged
    stream = b.clients[ca.cid].mailbox.stream_id
    b.expire_home("n1", 15.0)  # n1 down past subscriber_timeout, as n2 sees it
    assert b.clients[ca.cid].mailbox is None
    out = cb.sub("t", now=16.0)  # the client, alive, fails over to n2 and subscribes again
    assert b.clients[ca.cid].mailbox.stream_id == stream and b.metrics["mailboxes_resumed"] == 1
    out += b.tick(16.0 + b.cfg.retransmit_max)
    assert (stream, 1, b"m1") in delivered(out, cb.addr)


def test_a_restarted_process_never_takes_up_the_stream_its_predecessor_was_given_up_with():
    """Simulator seed 45: a new process (greater session, new address) was handed the old
    process's parked stream in the middle; its receiver waits for sequence 1 and got nothing."""
    _, b, ca, cb = moved_client()
    (pub,) = connect(b, ("127.0.0.1", 5009))
    pub.pub([("t", b"m1")], now=1.5)
    old_stream = b.clients[ca.cid].mailbox.stream_id
    b.expire_home("n1", 15.0)
    new = FakeClient(b, ("127.0.0.1", 5010), cid=ca.cid)
    new.hello(16.0)
    new.session = cb.session + 1
    new.sub("t", now=16.0)
    assert b.clients[ca.cid].mailbox.stream_id != old_stream and b.metrics["mailboxes_resumed"] == 0


def test_a_kept_mailbox_is_dropped_once_subscriber_timeout_has_passed():
    _, b, ca, _ = moved_client()
    (pub,) = connect(b, ("127.0.0.1", 5009))
    pub.pub([("t", b"m1")], now=1.5)
    b.expire_home("n1", 15.0)
    assert b.clients[ca.cid].parked is not None
    b.tombstone_horizon = 3600.0
    b.collect_tombstones(15.0 + b.cfg.subscriber_timeout + 1)  # the sweep that goes with tombstone collection
    assert b.clients[ca.cid].parked is None


def test_a_client_left_alone_because_it_talked_to_us_is_given_up_once_it_falls_silent():
    _, b, ca, cb = moved_client()
    cb.ack(1, 0, now=5.0)
    b.expire_home("n1", 6.0)
    assert b.expire_skipped == 1 and b.clients[ca.cid].modes() == {("t", None): 1}
    b.expire_home("n1", 16.0)  # asked again later (cluster/member.py), silent since 5.0
    assert b.expire_skipped == 0 and b.clients[ca.cid].modes() == {}


def test_a_stale_ping_is_answered_but_is_no_sign_of_life():
    core, old, _ = replaced_process()
    out = old.ping(now=3.0)
    assert [f[0].name for f in frames_to(out, old.addr)] == ["PONG"]
    assert core.clients[old.cid].last_seen == 2.0


def test_a_session_past_2_63_from_an_earlier_build_is_read_as_the_greatest():
    """An earlier build took any uint64 session from a client and replicated it: a snapshot or
    a peer holding one must stay readable (review finding: the whole snapshot was refused)."""
    from roost.client.wire import SEQ_LIMIT
    from roost.cluster.peerwire import check_entries_untrusted

    entry = [b"c" * 16, 5, "127.0.0.1", 7000, "n1", [["t", None, 7]], 2**64 - 1]
    assert check_entries_untrusted([entry])[0][6] == SEQ_LIMIT - 1
