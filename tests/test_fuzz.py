"""Fuzzing the sans-IO cores: random datagrams (below), and the structure-aware campaign of
tests/fuzz/ (its package docstring says how): every frame type mutated, sequences of them from
several clients and peers, the invariants checked after each step.

``make test`` runs a bounded campaign, the same examples every time (derandomized), split into
tests that pytest-xdist spreads over its processes, each asserting it fed its share of the
200,000 mutated frames; scripts/fuzz.py runs a long one with fresh seeds.

For the random datagrams: the only datagrams allowed to change state are those that the real
decoders accept as a command from a validated source (cookie) or, for text, from a text
network; for those nothing is checked here: what a command changes is tested in test_core.py.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roost.client import decoding, wire
from roost.client.text import parse_untrusted_text
from roost.client.wire import FrameType, WireError
from tests.corekit import connect, make_core, sends
from tests.fuzz import campaign
from tests.fuzz.campaign import Tally

A = ("127.0.0.1", 5001)
B = ("127.0.0.1", 5002)
FAR = ("198.51.100.7", 4000)


def populated():
    core = make_core(mailbox_capacity=64, send_window=16)
    sub, pub = connect(core, A, B)
    sub.cmds([(1, "t", None, 1), (1, "t", "k", 0), (1, "u", None, 0)])
    core.handle_datagrams([(b"SUB t\n", ("127.0.0.1", 5009))], 0.0)
    pub.pub([("t", b"x"), ("u", b"y")])
    return core, sub, pub


def legit_change(core, data: bytes, addr) -> bool:
    """Would this datagram be accepted as a state-changing command?"""
    if data and (0x41 <= data[0] <= 0x5A or 0x61 <= data[0] <= 0x7A):
        try:
            verb, topic, _ = parse_untrusted_text(data)
            wire.check_topic(topic)
        except WireError:
            return False
        return verb in ("SUB", "UNSUB") and core._text_allowed(addr[0])
    try:
        f = decoding.decode_untrusted_frame(data, core.cfg.max_datagram)
    except WireError:
        return False
    if f[0] not in (FrameType.CMDS, FrameType.PUB, FrameType.PUBRUN, FrameType.ACK, FrameType.PING):
        return False
    return core.cookies.check(addr, f[1], f[2], 0.0)


def check_one(core, data: bytes, addr) -> None:
    before = core.state_digest()
    allowed = legit_change(core, data, addr)
    out = core.handle_datagrams([(data, addr)], 0.0)  # must not raise
    for s in sends(out):  # (and what it sends is valid: a relayed batch is what was checked)
        if s.data[:1] and 0x90 <= s.data[0] <= 0x9F:
            decoding.decode_untrusted_frame(s.data, core.cfg.max_datagram)
    core.tick(0.0)
    if not allowed:
        assert core.state_digest() == before, data


@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.sampled_from([A, B, FAR]))
def test_random_datagrams(data, addr):
    core, _, _ = populated()
    check_one(core, data, addr)


# ------------------------------------------------------------ the structure-aware campaign

#: (target, setup, examples, the mutated frames it must feed at least, 10-13 % below what it
#: feeds): 207,000 in all (233,626 are fed), 53 s of CPU on the 2-core VM (docs/security.md,
#: "Fuzzing"). A frame counts once its bytes differ from its template's and the core's decoding
#: entry point took it.
CAMPAIGN = [
    ("node", "single", 175, 20_500), ("node", "tight", 175, 26_000), ("node", "replica", 175, 23_500),
    ("node", "partitioned", 175, 22_000), ("member", "replicated", 200, 23_000), ("member", "partitioned", 200, 23_000),
    ("client", "router", 400, 50_000), ("config", "toml", 120, 19_000),
]  # fmt: skip
assert sum(share for *_, share in CAMPAIGN) >= 200_000


@pytest.mark.parametrize(("target", "setup", "examples", "share"), CAMPAIGN, ids=[f"{t}-{s}" for t, s, *_ in CAMPAIGN])
def test_campaign(target, setup, examples, share):
    tally = Tally()
    campaign.run(target, examples, tally, setups=(setup,))
    print(f"\n{target} ({setup}): {tally.line()} in {tally.seconds:.1f} s")
    assert tally.mutated >= share, tally.line()
    if target in ("node", "member", "client"):  # (a member told by a peer that it left serves no more)
        assert tally.served >= tally.examples * (0.5 if target == "member" else 1.0), tally.line()


def test_the_campaign_finds_the_status_overflow_that_ddc9aa4_fixed(monkeypatch):
    """The fuzzer would have found the bug that motivated it: with ddc9aa4 undone (sequences up to
    2**64 - 1 from the wire, a PUB's duplicates not bounded by its messages), the node campaign
    fails, a counter out of msgpack's range."""
    from roost.client import decoding, wire
    from roost.node import producers

    monkeypatch.setattr(wire, "SEQ_LIMIT", 1 << 64)
    monkeypatch.setattr(decoding, "SEQ_LIMIT", 1 << 64)
    monkeypatch.setattr(producers, "min", lambda a, b: a, raising=False)  # skip = min(acked + 1 - first, len)
    tally = Tally()
    with pytest.raises(AssertionError, match=r"out of 0\.\.2\*\*63-1|acknowledged through"):
        campaign.run("node", 40, tally, setups=("single",), shrink=False)
    print(f"\nfound after {tally.mutated:,} mutated frames of the examples before the failing one")


#: A module of constants of every kind hypothesis collects (integers and strings, 5-byte bytes as
#: a plan is drawn), written outside tests/ so that hypothesis counts it as local code.
_CONSTANTS = "\n".join([
    "INTS = [" + ", ".join(str(1000 + 7919 * i) for i in range(60)) + ", 150, 151, 199, 250, 101]",
    "BYTES = [" + ", ".join(repr(bytes([i, 255 - i, i * 3 % 256, 7, i ^ 0x55])) for i in range(60)) + "]",
    "TEXT = [" + ", ".join(repr(f"s{i}x") for i in range(60)) + "]",
    "FLOATS = [" + ", ".join(f"{i}.25" for i in range(1, 60)) + "]",
]) + "\n"  # fmt: skip


def test_the_frames_do_not_depend_on_what_is_imported(tmp_path, monkeypatch):
    """A fixed seed feeds the same frames whatever else the process imported: hypothesis mixes the
    literals of every local module loaded into what it draws (campaign.no_local_constants)."""
    import importlib
    import sys

    def tally() -> tuple[int, int, int]:
        t = Tally()
        for target, setup in (("node", "single"), ("client", "router")):
            campaign.run(target, 3, t, setups=(setup,), shrink=False)
        return t.examples, t.mutated, t.frames

    before = tally()
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "roost_fuzz_constants.py").write_text(_CONSTANTS)
    try:
        importlib.import_module("roost_fuzz_constants")
        assert tally() == before
    finally:
        sys.modules.pop("roost_fuzz_constants", None)


def test_the_campaign_catches_a_node_that_takes_a_wrong_cookie():
    """The check that a datagram the node must refuse changes nothing can fail: with the node built
    to take a frame whatever its cookie (the broken build "accept-any-cookie", tests/fuzz/
    target_node.py's "lax" setup), the node campaign fails (the rig judges what must be refused
    from the cookies the node gave, not by asking the node's cookie check)."""
    tally = Tally()
    with pytest.raises(AssertionError, match="must refuse"):
        campaign.run("node", 40, tally, setups=("lax",), shrink=False)
    print(f"\nfound after {tally.mutated:,} mutated frames of the examples before the failing one")


# ------------------------------------------------------------ an open problem the client campaign found

ATTACKER = ("203.0.113.66", 7400)


def _routed_subscription(spoof: bool) -> bool:
    """A router talks to a member of a partitioned cluster (n1, which leads every partition and
    says so in its WELCOME's map, epoch 1), and subscribes through the router; with ``spoof``, a
    REDIRECT spoofed from n1's address first brings a map of epoch 2 that names one member, at
    an attacker's address. True if n1 confirms the subscription within 12 s."""
    import random

    from roost.client import clustermap
    from roost.client.config import ClientConfig
    from roost.client.router import Router
    from roost.client.wire import Mode
    from roost.node.config import NodeConfig
    from roost.node.core import BrokerCore
    from roost.node.ownership import Ownership
    from tests.fuzz.target_client import NODE

    members = {"n1": (NODE, ("127.0.0.1", 7500))}
    core = BrokerCore(NodeConfig(id="n1", client_addr=NODE), random.Random(1), 1, members=[["n1", *NODE]],
                      node_idx=0, replicating=True, tombstone_horizon=30.0)  # fmt: skip
    own = Ownership("n1", 16)
    core.set_ownership(own)
    real = clustermap.compute(1, members, {"n1"}, 16, 1)
    core.reindex(*own.update(1, real.owners))
    core.set_cluster_map(clustermap.encode(real), 1)
    router = Router(b"\xc7" * 16, b"\xa7" * 16, b"\xf7" * 16, ClientConfig(), 0.0, node=NODE)
    addrs = {}
    now = 0.0

    def run(seconds: float) -> None:
        nonlocal now
        for _ in range(int(seconds / 0.1)):
            now += 0.1
            for i, s in enumerate(list(router.sessions)):
                addrs[id(s)] = ("127.0.0.1", 9600 + i)
                router.tick(s, now)
                for dst, data in s.outgoing(now):
                    if dst == NODE:  # (the attacker does not answer)
                        for a in core.handle_datagrams([(data, addrs[id(s)])], now):
                            target = next((x for x in router.sessions if addrs.get(id(x)) == getattr(a, "addr", None)),
                                          None)  # fmt: skip
                            if target is not None:
                                router.handle_datagrams(target, [(a.data, NODE)], now)

    run(1.0)
    assert router.connected and router.cmap is not None and router.cmap.epoch == 1
    if spoof:
        evil = clustermap.compute(2, {"x": (ATTACKER, ATTACKER)}, {"x"}, 16, 1)
        router.handle_datagrams(router.first, [(wire.encode_redirect("n1", clustermap.encode(evil)), NODE)], now)
    _, st = router.subscribe("t", None, Mode.FIRE)
    run(12.0)
    return st.confirmed


def test_a_router_subscribes_at_its_member():
    assert _routed_subscription(spoof=False)


@pytest.mark.xfail(strict=True, reason="open problem: a REDIRECT spoofed from the node's address with a higher map "
                                       "epoch makes the router route to an attacker's address for good")  # fmt: skip
def test_a_spoofed_redirect_with_a_higher_epoch_takes_the_routes():
    """The router adopts any map of a higher epoch than its own that comes from its node's address,
    and UDP cannot tell a spoofed datagram from its node's: a map naming only an attacker's
    address sends every new subscription (and publish) there, and no member sets it right (they
    send their maps, of lower epochs, only to clients that reach them). The client campaign found
    it with the routes checked through the router, and withholds such maps meanwhile
    (tests/fuzz/target_client.py, ``hijacks``). Strict: when it is solved this test passes, fails
    as an unexpected pass, and the xfail and ``hijacks`` go."""
    assert _routed_subscription(spoof=True)


def test_the_config_templates_set_every_setting_and_load(tmp_path):
    """The config target's generated templates set every key of SETTINGS and CLUSTER_SETTINGS (and
    [[members]]), and each loads as it is: a setting added to a table is fuzzed from then on."""
    from roost.cluster.config import CLUSTER_SETTINGS, MEMBER_KEYS
    from roost.node.config import SETTINGS
    from tests.fuzz.target_config import ConfigRig, emit, generated

    docs = generated()
    keys = {(sec, k) for d in docs for sec, table in d.items() if isinstance(table, dict) for k in table}
    assert {(s.section, s.key) for s in [*SETTINGS, *CLUSTER_SETTINGS]} <= keys
    assert {k for d in docs for m in d.get("members", []) for k in m} == set(MEMBER_KEYS)
    rig = ConfigRig(tmp_path, [])
    for d in docs:
        text = emit(d).encode()
        rig.path.write_bytes(text)
        before = rig.accepted
        rig._load(text)
        assert rig.accepted == before + 1, emit(d)
