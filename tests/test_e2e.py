"""End to end: `roost node`, `roost pub` and `roost sub` as real processes."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import msgpack
import pytest

from roost.client import decoding, wire
from roost.node.procs import fastpuss_roundtrip, free_udp_port
from tests.clusterkit import ROOT, Node, roost, start_sub, sub_lines
from tests.corekit import random_datagram
from tests.polling import wait_until


def script(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python scripts/...`` from the repository root."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


def processes_mentioning(text: str) -> list[str]:
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    return [line for line in ps.splitlines() if text in line]


@pytest.fixture
def node(tmp_path):
    n = Node(tmp_path)
    yield n
    n.stop()


def fastpuss_line_works(port: int) -> bool:
    return fastpuss_roundtrip("127.0.0.1", port) == b"MSG t1\nhello world  "


def test_fastpuss_line_against_a_node_process(node):
    assert fastpuss_line_works(node.port)


def test_cli_reliable_10000_in_order_without_duplicates(node):
    sub = start_sub(node.addr, "t", 10000)
    pub = roost("pub", "t", "m{n}", "--node", node.addr, "--count", "10000", "--mode", "reliable")
    assert pub.returncode == 0, pub.stderr
    assert sub_lines(sub) == [f"m{i}" for i in range(10000)]


def test_cli_fire_key_and_stdin(node):
    sub = start_sub(node.addr, "k.t", 2, timeout=20, mode="fire", key="a")
    assert roost("pub", "k.t", "--node", node.addr, "--key", "b", "--mode", "fire", input="no\n").returncode == 0
    pub = roost("pub", "k.t", "--node", node.addr, "--key", "a", "--mode", "fire", input="one\ntwo\n")
    assert pub.returncode == 0, pub.stderr
    assert sub_lines(sub, timeout=30) == ["one", "two"]


def test_sub_timeout_exits_non_zero_with_a_message(node):
    r = roost("sub", "quiet", "--node", node.addr, "--count", "1", "--timeout", "0.5")
    assert r.returncode != 0
    assert "timed out after 0.5 s with 0 of 1 messages" in r.stderr


def test_a_cli_client_that_exits_says_bye_and_leaves_no_time_out(tmp_path):
    node = Node(tmp_path, extra="[timeouts]\nsubscriber_timeout = 60.0\n")
    try:
        sub = start_sub(node.addr, "bye", 1)
        assert roost("pub", "bye", "one", "--node", node.addr).returncode == 0
        assert sub_lines(sub) == ["one"]
        # The subscriber closed; with a 60 s time-out, only its BYE can have dropped it by now (the
        # publisher held no subscription: the node kept no record of it to drop).
        wait_until(lambda: "event=client_closed" in node.log.read_text(), what="client_closed in the log")
        status = json.loads(roost("status", "--node", node.addr, "--json").stdout)
        assert status["clients"] == 0 and status["metrics"]["clients_closed"] == 1
    finally:
        assert node.stop() == 0
    log = node.log.read_text()
    assert "client_timed_out" not in log and log.count("event=node_stopped") == 1


def test_pub_to_a_dead_node_fails_clearly():
    r = roost("pub", "t", "x", "--node", f"127.0.0.1:{free_udp_port()}")
    assert r.returncode != 0 and "no answer from node" in r.stderr


def test_100000_random_datagrams_do_not_stop_the_node(node):
    rng = random.Random(2026)
    valid = [
        wire.encode_hello(b"h" * 16),
        wire.encode_cmds(b"c" * 16, b"k" * 16, 1, 1, [(1, "t", None, 1)]),
        wire.encode_pub(b"c" * 16, b"k" * 16, b"p" * 16, 1, 1, True, [wire.pack_message("t1", None, None, b"x")]),
        b"SUB t1\n", b"PUB t1\nbody", b"UNSUB t1\n",
        msgpack.packb([1, 3, [[[[[]]]]]]),
    ]  # fmt: skip
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.setblocking(False)
        for i in range(100_000):
            data = random_datagram(rng, valid, max_len=200, max_flips=4)
            try:
                s.sendto(data, ("127.0.0.1", node.port))
                sent += 1
            except BlockingIOError:
                time.sleep(0.001)
            if i % 200 == 0:
                time.sleep(0.001)  # keep within the node's socket buffer most of the time
            with contextlib.suppress(BlockingIOError):  # drop the node's error replies
                while s.recv(70000):
                    continue
    assert sent > 95_000
    # The kernel may still hold a backlog for the node: a HELLO is answered only
    # after everything before it was processed, and one sent while the node's
    # socket buffer is full is dropped, so it is sent again until one is answered.
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(0.5)

        def welcomed() -> bool:
            s.sendto(wire.encode_hello(b"w" * 16), ("127.0.0.1", node.port))
            try:
                return decoding.decode_untrusted_frame(s.recv(1000))[0] is wire.FrameType.WELCOME
            except TimeoutError:
                return False

        wait_until(welcomed, timeout=30, what="a WELCOME after the flood")
    assert fastpuss_line_works(node.port)
    # and the acceptance line above: 10,000 reliable messages, in order, no duplicates
    test_cli_reliable_10000_in_order_without_duplicates(node)
    assert "Traceback" not in node.log.read_text()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_clean_shutdown_on_signal(tmp_path, sig):
    n = Node(tmp_path)
    assert n.stop(sig) == 0
    log = n.log.read_text()
    assert "node=e2e event=signal" in log and log.count("event=node_stopped") == 1
    for line in log.splitlines():
        assert " node=e2e " in line


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("[node]\nclient_adr = '127.0.0.1:1'\n", "[node] client_adr: unknown key"),
        ("[node]\nclient_addr = 'localhost'\n", "[node] client_addr = 'localhost': must be HOST:PORT"),
        ("[limits]\nmax_datagram = 100\n", "[limits] max_datagram = 100: must be an integer from 1200 to 65507"),
        ("[timeouts]\nsubscriber_timeout = 'soon'\n", "[timeouts] subscriber_timeout = 'soon': must be a number"),
        ("[limits]\nsend_window = true\n", "[limits] send_window = True: must be an integer"),
        ("[nodes]\nid = 'x'\n", "unknown section [nodes]"),
        ("[node\n", "not valid TOML"),
        ("[node]\nlog_level = 'loud'\n", "must be one of debug, info, warning, error"),
        ("[timeouts]\nretransmit_timeout = 5\nretransmit_max = 1\n", "retransmit_max = 1.0: must be at least"),
        ("[limits]\nsend_window = 64\n", "[limits] max_payload = 1048576: must be at most a quarter of send_window"),
        (
            "[node]\nadvertise_addr = '127.0.0.1:0'\n",
            "advertise_addr = '127.0.0.1:0': must be empty (client_addr) or "
            "HOST:PORT with an IP address that is not a wildcard, and a port other than 0",
        ),
    ],
)
def test_bad_config_exits_non_zero_naming_file_key_and_allowed(tmp_path, content, needle):
    cfg = tmp_path / "bad.toml"
    cfg.write_text(content)
    r = roost("node", "--config", str(cfg))
    assert r.returncode == 2
    assert str(cfg) in r.stderr and needle in r.stderr, r.stderr


def test_missing_config_file(tmp_path):
    r = roost("node", "--config", str(tmp_path / "nope.toml"))
    assert r.returncode == 2 and "cannot read" in r.stderr


def test_a_config_that_is_not_utf8_is_refused_as_not_toml(tmp_path):
    """tomllib decodes the file first: bytes that are not UTF-8 raised UnicodeDecodeError past
    read_toml, where every other unreadable config is a ConfigError naming the file (fuzzing)."""
    from roost.node.config import ConfigError, load_node_config

    cfg = tmp_path / "latin1.toml"
    cfg.write_bytes(b'[node]\nid = "n\xe9"\n')
    with pytest.raises(ConfigError, match=r"latin1\.toml: not valid TOML: not UTF-8 at byte 14"):
        load_node_config(cfg)


def test_shipped_config_loads():
    from roost.node.config import load_node_config

    cfg = load_node_config(os.path.join(ROOT, "configs", "single.toml"))
    assert cfg.client_addr == ("127.0.0.1", 7400) and cfg.id == "n1"


def test_cluster_demo_streams_through_a_crash_and_leaves_nothing_behind():
    r = script("scripts/demo.py", timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert "killed n1" in out
    assert "OK: the subscriber got 40 of 40 messages, each once and in order" in out
    assert "OK: every member reports the same subscriptions after the restart" in out  # n1 pulled the state
    assert processes_mentioning("configs/cluster3.toml") == []


def test_single_node_demo():
    r = script("scripts/demo.py", "--single")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "delivered: hello #9" in r.stdout and "MSG t1\\nhello world  " in r.stdout
    assert processes_mentioning("run/demo.toml") == []


def test_generated_docs_are_up_to_date():
    r = script("scripts/gen_docs.py", "--check")
    assert r.returncode == 0, r.stdout


def test_bench_script_runs_and_reliable_loses_nothing():
    import json

    r = script("scripts/bench.py", "--quick", "--workloads", "W3", "--json")
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [(row["system"], row["workload"], row["mode"]) for row in rows] == [
        ("roost", "W3", "reliable"),
        ("roost", "W3", "fire"),
    ]
    reliable = rows[0]
    assert reliable["delivered"] == reliable["messages"] == 550 and reliable["lost"] == 0
    assert reliable["duplicated"] == reliable["out_of_order"] == 0
    assert 0 < reliable["p50_us"] <= reliable["p99_us"] <= reliable["max_us"]
    assert reliable["cpu"]["node"] > 0 and reliable["cpu"]["publisher"] > 0 and reliable["cpu"]["subscriber"] > 0


def test_benchfloor_measures_each_way_from_the_sink():
    """scripts/benchfloor.py's three ways, shortened: each row's latencies come from the sink's
    report (a way whose sink heard nothing would fail the run, not print a row)."""
    r = script("scripts/benchfloor.py", "-n", "400", "--warmup", "100", timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [line.strip("|").split("|") for line in r.stdout.splitlines()[2:]]
    assert [w.strip() for w, _, _ in rows] == ["blocking", "trio", "trio-tasks"]
    for _, p50, p99 in rows:
        assert 0 < int(p50) <= int(p99)


def test_benchrate_reports_the_subscribers_rate_and_each_process_cpu():
    """scripts/benchrate.py, shortened: a row per run with the subscriber's rate, nothing lost
    on loopback at this size, and each process's CPU (the relay's reported by itself on exit)."""
    r = script("scripts/benchrate.py", "-n", "3000", "--repeat", "1", timeout=60)
    assert r.returncode == 0, r.stderr
    run = r.stdout.splitlines()[2].strip("|").split("|")
    assert run[0].strip() == "1" and float(run[1].replace(",", "")) > 0 and run[2].strip() == "0"
    assert all(float(c) >= 0 for c in run[4].split("/")) and len(run[4].split("/")) == 3
    bad = script("scripts/benchrate.py", "--size", "8", timeout=30)
    assert bad.returncode != 0 and "--size must be at least 16" in bad.stderr


def test_benchcalls_prints_the_cpu_of_each_call_per_mode():
    """scripts/benchcalls.py, shortened: a row per mode with four positive figures in ns, a
    publish costing more than the empty loop it runs in; bad arguments are refused by name."""
    r = script("scripts/benchcalls.py", "-n", "2000", "--rounds", "1", timeout=90)
    assert r.returncode == 0, r.stderr
    rows = [line.strip("|").split("|") for line in r.stdout.splitlines()[2:]]
    assert [row[0].strip() for row in rows] == ["reliable", "fire"]
    for _, base, pub, take, decode in rows:
        assert 0 < int(base) < int(pub) and int(take) > 0 and int(decode) > 0
    for args, why in ((["--modes", "relaible"], "['relaible'] not among reliable, fire"),
                      (["-n", "10"], "-n 10: must be at least 1000"), (["--rounds", "0"], "--rounds 0")):  # fmt: skip
        bad = script("scripts/benchcalls.py", *args, timeout=30)
        assert bad.returncode == 2 and why in bad.stderr, bad.stderr


def test_benchhops_follows_w3_messages_through_every_hop():
    """scripts/benchhops.py, shortened: every step's figures come from messages followed through
    the three processes' sends and receives (none followed fails the run instead)."""
    r = script("scripts/benchhops.py", "--mode", "reliable", "--quick", timeout=90)
    assert r.returncode == 0, r.stderr
    assert "| W3 latency" in r.stdout and "| reliable |" in r.stdout
    steps = [line.strip("|").split("|") for line in r.stdout.splitlines() if line.startswith("| ") and "->" in line]
    assert len(steps) == 5
    total = next(line for line in r.stdout.splitlines() if line.startswith("| total"))
    p50s = [int(p50) for _, p50, _ in steps]
    assert all(x > 0 for x in p50s) and int(total.split("|")[2]) > 0


def test_bench_replicated_cluster_w6_loses_nothing():
    r = script("scripts/bench.py", "--quick", "--workloads", "W6", "--modes", "reliable", "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert [(row["system"], row["workload"], row["mode"]) for row in rows] == [("roost", "W6", "reliable")]
    w6 = rows[0]  # (3 publishers at 3 members, each of the 3 subscribers due every message)
    assert w6["delivered"] == 3 * w6["messages"] == 90_000 and w6["lost"] == 0 and w6["all_acked"]
    assert w6["duplicated"] == w6["out_of_order"] == 0 and w6["msgs_per_s"] > 0
    assert w6["cpu"]["node"] > 0 and w6["cpu"]["publisher"] > 0 and w6["cpu"]["subscriber"] > 0


def test_bench_names_a_missing_peer_and_how_to_install_it(monkeypatch):
    from scripts import benchsystems
    from scripts.benchsystems import missing

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(benchsystems, "SBIN", ())
    assert missing("roost") is None
    assert missing("nats") == "nats-server is not installed: apt-get install nats-server (and pip install nats-py)"
    r = script("scripts/bench.py", "--peers", "nats,kafka", "--workloads", "W3")
    assert r.returncode == 1 and "unknown peer 'kafka'; known: nats, redis, mosquitto" in r.stderr


@pytest.mark.parametrize(("value", "want"), [("", (20000, 32768)), ("26384-32767", (26384, 32768)),
                                             ("1024-1024", (1024, 1025))])  # fmt: skip
def test_free_ports_come_from_roost_port_range(monkeypatch, value, want):
    """``make test``'s two test processes hand out ports from halves of the range (tests/conftest.py)."""
    from roost.node.procs import free_port, port_range

    monkeypatch.setenv("ROOST_PORT_RANGE", value)
    assert port_range() == want
    assert all(want[0] <= free_port() < want[1] for _ in range(20))


@pytest.mark.parametrize("value", ["7000", "30000-20000", "80-90", "1-2-3", "a-b", "30000-70000", " - ", "2000-3²"])
def test_a_bad_roost_port_range_is_refused_naming_the_variable(monkeypatch, value):
    from roost.node.procs import free_port

    monkeypatch.setenv("ROOST_PORT_RANGE", value)
    with pytest.raises(ValueError, match=r"ROOST_PORT_RANGE=.*: must be LOW-HIGH, two port numbers with 1024 <= LOW"):
        free_port()
