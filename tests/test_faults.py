"""scripts/faults.py and scripts/netns.py with real nft rules, namespaces and sockets.

These need root, nft and ip. Missing tools are installed (scripts/netns.py
ensure_tools, as ``make`` does); when that is impossible the tests FAIL with
the exact install command instead of skipping, so a machine that cannot run
chaos runs is noticed.

No test waits a fixed time for something not to happen. Datagrams between
two sockets on one machine are delivered in the order sent, so a marker
datagram sent after the heal (or after the measured batch) proves that
everything sent before it has either arrived already or was dropped.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from scripts import faults, netns
from scripts.faults import FaultError, FaultTable, FaultUnavailable

SO_RCVBUFFORCE = 33  # (Linux; root may exceed rmem_max, so 2000 datagrams fit unread)
MARKER = b"marker"


@pytest.fixture(scope="module", autouse=True)
def tools() -> None:
    """Install nft and ip if missing; fail (not skip) with the install command if impossible."""
    why = netns.why_unusable("tests/test_faults.py")
    if why is not None:
        pytest.fail(why)


@pytest.fixture
def ft() -> Iterator[FaultTable]:
    with FaultTable() as table:
        yield table
    assert faults.TABLE not in nft_tables()


def nft_tables() -> str:
    return subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout


def udp(host: str = "127.0.0.1") -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
    s.bind((host, 0))
    s.settimeout(2.0)  # a safety bound: every expected datagram arrives in microseconds
    return s


def port(s: socket.socket) -> int:
    return int(s.getsockname()[1])


def until_marker(tx: socket.socket, rx: socket.socket, tries: int = 50) -> list[bytes]:
    """Send markers from ``tx`` to ``rx`` until one arrives; return what ``rx`` got before it.

    Markers may be lost too (a loss rule covers them), hence the retries; a
    marker that arrives was sent after everything else, so nothing sent
    earlier can still be on its way.
    """
    got: list[bytes] = []
    for _ in range(tries):
        tx.sendto(MARKER, rx.getsockname())
        rx.settimeout(0.2)
        try:
            while (data := rx.recv(64)) != MARKER:
                got.append(data)
            return got
        except TimeoutError:
            continue  # this marker was dropped: send another
    raise AssertionError(f"no marker arrived in {tries} tries")


def send_numbered(tx: socket.socket, rx: socket.socket, n: int) -> list[int]:
    for i in range(n):
        tx.sendto(b"%d" % i, rx.getsockname())
    return [int(d) for d in until_marker(tx, rx) if d != MARKER]


# ------------------------------------------------------------------ loopback


def test_loss_drops_about_the_percentage(ft: FaultTable) -> None:
    tx, rx = udp(), udp()
    fault = ft.loss(10, ports=[port(rx)])
    got = send_numbered(tx, rx, 2000)
    lost = 2000 - len(set(got))
    assert 100 <= lost <= 320, f"{lost} of 2000 lost at 10% (expected 5-16%)"
    assert got == sorted(got) and len(got) == len(set(got))
    ft.heal(fault)
    assert send_numbered(tx, rx, 500) == list(range(500))


def test_dup_duplicates_about_the_percentage(ft: FaultTable) -> None:
    tx, rx = udp(), udp()
    ft.dup(10, ports=[port(rx)])
    got = send_numbered(tx, rx, 2000)
    extra = len(got) - 2000
    assert set(got) == set(range(2000)), "dup lost datagrams"
    assert 100 <= extra <= 320, f"{extra} duplicates of 2000 at 10% (expected 5-16%)"
    assert max(got.count(i) for i in set(got)) == 2  # a duplicate is never duplicated again


def test_isolate_blocks_both_directions_and_heal_restores(ft: FaultTable) -> None:
    member, other = udp(), udp()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    fault = ft.isolate(ports=[port(member), port(listener)])
    assert "isolate" in str(fault)
    for i in range(10):
        other.sendto(b"in%d" % i, member.getsockname())
        member.sendto(b"out%d" % i, other.getsockname())  # silently dropped: no EPERM for the sender
    with socket.socket() as c, pytest.raises(TimeoutError):
        c.settimeout(0.3)  # (a SYN that got through would be answered in microseconds)
        c.connect(listener.getsockname())
    ft.heal(fault)
    assert until_marker(other, member) == []  # nothing sent during the isolation arrives, the marker does
    assert until_marker(member, other) == []
    socket.create_connection(listener.getsockname(), timeout=2.0).close()  # connects again (raises if not)
    listener.close()
    ft.heal(fault)  # healing twice does nothing


def test_cut_between_addresses_is_one_way(ft: FaultTable) -> None:
    a, b = udp("127.0.0.11"), udp("127.0.0.12")
    cut = ft.cut("127.0.0.11", "127.0.0.12", one_way=True)
    for i in range(5):
        a.sendto(b"a%d" % i, b.getsockname())
    b.sendto(b"back", a.getsockname())
    assert a.recv(64) == b"back"  # the other way works
    ft.heal(cut)
    assert until_marker(a, b) == []  # what a sent during the cut never arrived (only the marker after the heal)
    with pytest.raises(FaultError, match="not ports"):
        ft.cut([7401], [7402])  # type: ignore[list-item]


def test_clear_removes_every_table_of_ours() -> None:
    ft = FaultTable()
    with ft:
        ft.loss(50, ports=[9])
        ft.dup(5, ports=[9])
        listed = nft_tables()
        assert f"table inet {faults.TABLE}" in listed and f"table ip {faults.TABLE}" in listed
        ft.clear()
        assert faults.TABLE not in nft_tables()
        ft.isolate(ports=[9])  # usable again after clear
    assert faults.TABLE not in nft_tables()  # __exit__ cleared it
    with pytest.raises(FaultError, match="give ports= or addrs="):
        FaultTable().loss(10)


def test_two_tables_share_ours_and_each_clears_only_its_own_faults() -> None:
    """Two processes (a chaos run beside another script's partition) each with a FaultTable: the
    second takes a number the first does not use, the first's clear leaves the second's fault in
    force (it once deleted the whole table), and the table goes with the last fault."""
    a, b = FaultTable(), FaultTable()
    try:
        rx, tx = udp(), udp()
        fa = a.isolate(ports=[9])
        fb = b.isolate(ports=[port(rx)])
        assert fa.id != fb.id
        a.clear()
        assert fa.id not in a.faults and fb.id in b.faults
        for i in range(20):  # b's isolation still drops everything to rx
            tx.sendto(b"%d" % i, rx.getsockname())
        rx.settimeout(0.3)  # (one that got through would arrive in microseconds)
        with pytest.raises(TimeoutError):
            rx.recv(64)
        listed = subprocess.run(["nft", "list", "table", "inet", faults.TABLE], capture_output=True, text=True,
                                check=True).stdout  # fmt: skip
        assert f"chain f{fb.id} " in listed and f"chain f{fa.id} " not in listed
        fa2 = a.loss(10, ports=[9])  # a number neither uses now
        assert fa2.id not in (fa.id, fb.id)
        a.heal(fa2)
        b.clear()
        assert until_marker(tx, rx) == []  # nothing sent during the isolation arrives, the marker does
        assert faults.TABLE not in nft_tables()
    finally:
        a.clear()
        b.clear()
        rx.close()
        tx.close()


def test_delay_holds_packets_or_says_what_it_needs(ft: FaultTable) -> None:
    tx, rx = udp(), udp()
    try:
        import netfilterqueue  # noqa: F401
    except ImportError:
        with pytest.raises(FaultUnavailable, match="pip install netfilterqueue"):
            ft.delay(50, ports=[port(rx)])
        return
    fault = ft.delay(50, 0, ports=[port(rx)])
    sent = {}
    for i in range(20):
        sent[i] = time.monotonic()
        tx.sendto(b"%d" % i, rx.getsockname())
    for _ in range(20):
        i = int(rx.recv(64))
        assert time.monotonic() - sent[i] >= 0.045
    ft.heal(fault)
    assert "ROOST_CHAOS" not in subprocess.run(["iptables", "-w", "-t", "mangle", "-S"], capture_output=True,
                                               text=True).stdout  # fmt: skip


# ------------------------------------------------------------------ namespaces

AGENT = r"""
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 9000))
s.settimeout(5.0)
print("ready", flush=True)
for line in sys.stdin:  # "send ADDR PAYLOAD" or "recv"
    cmd = line.split()
    if cmd[0] == "send":
        s.sendto(cmd[2].encode(), (cmd[1], 9000))
        print("sent", flush=True)
    else:
        data, src = s.recvfrom(100)
        print(data.decode(), src[0], flush=True)
"""


class Agent:
    """A UDP socket at ADDR:9000 inside a namespace, driven line by line."""

    def __init__(self, ns: str) -> None:
        self.proc = subprocess.Popen([*netns.exec_prefix(ns), sys.executable, "-c", AGENT, netns.addr_of(ns)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        assert self.ask(None) == "ready"

    def ask(self, line: str | None) -> str:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if line is not None:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        answer = self.proc.stdout.readline().strip()
        assert answer, f"agent exited ({self.proc.poll()}) on {line!r}"
        return answer

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait(5)


def links() -> list[str]:
    return [e["ifname"] for e in json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True,
                                                           text=True, check=True).stdout)]  # fmt: skip


def test_netns_up_down_and_faults_between_hosts() -> None:
    busy = {ns: netns.pids_in(ns) for ns in netns.namespaces()}
    if any(busy.values()):
        pytest.fail(f"roost-h* namespaces in use by processes {busy}: another chaos run is going on")
    netns.down()
    try:
        assert netns.up(2) == ["roost-h1", "roost-h2"]
        assert netns.up(2) == ["roost-h1", "roost-h2"]  # idempotent
        assert netns.namespaces() == ["roost-h1", "roost-h2"]
        assert {"roost-br0", "roost-v1", "roost-v2"} <= set(links())
        a, b = Agent("roost-h1"), Agent("roost-h2")
        try:
            assert a.ask("send 127.77.0.2 hello") == "sent"
            assert b.ask("recv") == "hello 127.77.0.1"  # from h1's own address
            with FaultTable(netns=["roost-h1", "roost-h2"]) as ft:
                fault = ft.isolate(ns="roost-h2")
                a.ask("send 127.77.0.2 lost1")
                b.ask("send 127.77.0.1 lost2")
                ft.heal(fault)
                a.ask("send 127.77.0.2 after")
                b.ask("send 127.77.0.1 back")
                assert b.ask("recv") == "after 127.77.0.1"  # not lost1: it was dropped
                assert a.ask("recv") == "back 127.77.0.2"  # not lost2
        finally:
            a.close()
            b.close()
    finally:
        netns.down()
    assert netns.namespaces() == []
    assert not [n for n in links() if n.startswith("roost-")]
    assert faults.TABLE not in nft_tables()
    assert netns.down() == []  # nothing left: still fine


def test_the_shared_lock_is_reentrant_in_a_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Second review: a signal handler's clear() took the lock file again while the main thread
    held it (flock locks per open file): the process hung, and every chaos process with it."""
    monkeypatch.setattr(faults, "LOCK_FILE", str(tmp_path / "lock"))

    inside: list[bool] = []

    def nested() -> None:
        with faults.shared_lock(), faults.shared_lock():
            inside.append(True)

    t = threading.Thread(target=nested, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive() and inside == [True]
