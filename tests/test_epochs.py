"""Map epochs are monotonic forever (docs/cluster.md, "Map epochs across restarts"): the ceiling on
disk (cluster/epochstore.py), the member core that hands a map out only within it
(cluster/partitionmap.py), the simulator's model of it, and a real cluster restarted whole."""

from __future__ import annotations

import dataclasses
import os
import random
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from roost.client import decoding, wire
from roost.cluster.epochstore import (
    CEILING,
    EPOCH_FILE,
    EPOCH_MAGIC,
    EpochStore,
    EpochStoreError,
    decode_ceiling_untrusted,
    encode_ceiling,
)
from roost.cluster.events import (
    Dial,
    EpochsPersisted,
    Exit,
    LinkClosed,
    LogsRead,
    PersistEpochs,
    ServeClients,
    SnapshotRead,
    Start,
    Stored,
    Tick,
)
from roost.cluster.member import MemberCore
from roost.cluster.partitionmap import EPOCH_BLOCK, MAX_EPOCH
from roost.cluster.raftstore import seal
from roost.node.actions import Trace
from sim.simulation import run_seed
from sim.world import sim_config
from tests.clusterkit import LocalCluster
from tests.polling import wait_until

# ---------------------------------------------------------------- the file


def test_the_ceiling_round_trips_and_a_missing_file_is_zero(tmp_path: Path) -> None:
    store = EpochStore(tmp_path / "data")  # (the data_dir does not exist yet: the write makes it)
    assert store.read() == 0
    store.write(1000)
    assert store.read() == 1000 and EpochStore(tmp_path / "data").read() == 1000
    store.write(MAX_EPOCH - EPOCH_BLOCK)
    assert store.read() == MAX_EPOCH - EPOCH_BLOCK
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [EPOCH_FILE]  # (no .tmp left)


@pytest.mark.parametrize(
    ("data", "why"),
    [
        (b"", "shorter than a header"),
        (b"XXXX" + encode_ceiling(5)[4:], "magic"),
        (encode_ceiling(5)[:-1] + b"\x06", "CRC32C"),
        (encode_ceiling(5)[:-1], "CRC32C"),
    ],
)
def test_a_damaged_file_is_refused_naming_it(tmp_path: Path, data: bytes, why: str) -> None:
    (tmp_path / EPOCH_FILE).write_bytes(data)
    with pytest.raises(EpochStoreError) as e:
        EpochStore(tmp_path).read()
    assert str(tmp_path / EPOCH_FILE) in str(e.value) and why in str(e.value)


@pytest.mark.parametrize("ceiling", [0, MAX_EPOCH - EPOCH_BLOCK + 1, MAX_EPOCH + 1, (1 << 64) - 1])
def test_a_ceiling_out_of_range_is_refused_on_read_and_never_written(tmp_path: Path, ceiling: int) -> None:
    (tmp_path / EPOCH_FILE).write_bytes(seal(EPOCH_MAGIC, CEILING.pack(ceiling)))
    with pytest.raises(EpochStoreError, match="outside"):
        EpochStore(tmp_path).read()
    with pytest.raises(ValueError, match="outside"):
        decode_ceiling_untrusted((tmp_path / EPOCH_FILE).read_bytes())
    if not 1 <= ceiling <= MAX_EPOCH:  # (one in the last block is written, and refused when read: epochs ran out)
        with pytest.raises(EpochStoreError):
            EpochStore(tmp_path / "other").write(ceiling)


# ---------------------------------------------------------------- the member core


def core() -> MemberCore:
    cc = dataclasses.replace(sim_config(3, mode="partitioned"), trace=True)
    return MemberCore(cc, "m0", rng=random.Random(1), now=0.0, wall_offset=1_780_000_000.0, incarnation=1)


def persists(out: list[Any]) -> list[int]:
    return [a.ceiling for a in out if isinstance(a, PersistEpochs)]


def published(out: list[Any]) -> list[int]:
    return [a.fields["epoch"] for a in out if isinstance(a, Trace) and a.event == "map_published"]


def synced(m: MemberCore, stored: int | None, heard: int = 0) -> list[Any]:
    """The shell's start: the stores read, Start, (peers' epochs ``heard``), every dial refused
    (no peer runs), no snapshot."""
    out = m.handle(LogsRead({}, "", quorum=Stored(0, None, 0, 0, None, []), epochs=stored), 0.0)
    out += m.handle(Start(), 0.0)
    out += m.handle(SnapshotRead(None, "missing"), 0.01)
    t = 0.01
    while not m.life.pull_done and t < 60:  # (each PULL fails: its dial is refused, or it times out)
        for d in [a for a in out if isinstance(a, Dial)]:
            out += m.handle(LinkClosed(d.link, "connection refused"), t)
        out = [a for a in out if not isinstance(a, Dial)]
        if heard:
            m.maps.heard_epoch(heard)  # (as a peer's HEARTBEAT does, once our view has settled)
            heard = 0
        t = max(t + 0.01, min(m.next_deadline(), t + 1.0))
        out += m.handle(Tick(), t)
    assert m.life.pull_done
    return [a for a in out if not isinstance(a, Dial)]


def live(m: MemberCore, peer: str) -> None:
    """``peer`` heard from, ready (as its HEARTBEAT tells): live in our view."""
    m.membership.heard(peer, m.now, "ready", 0, 0)
    m.maps.unreached.discard(peer)


def test_a_restart_starts_above_the_stored_ceiling_and_hands_out_nothing_before_a_new_one_is_durable() -> None:
    m = core()
    out = synced(m, stored=4000)
    asked = persists(out)
    assert asked == [4000 + EPOCH_BLOCK]  # (the first epoch, 4001, plus a block)
    assert m.cmap is not None and m.cmap.epoch > 4000
    # (not one map for clients, and no serving, until the ceiling is on disk)
    assert m.broker.map_epoch == 0 and published(out) == [] and not any(isinstance(a, ServeClients) for a in out)
    assert m.phase == "syncing"
    out = m.handle(EpochsPersisted(asked[0]), m.now + 1.0)
    assert m.phase == "ready" and any(isinstance(a, ServeClients) for a in out)
    assert published(out) == [m.cmap.epoch] and m.broker.map_epoch == m.cmap.epoch > 4000
    # (a WELCOME carries it)
    assert m.broker.params["map_epoch"] == m.cmap.epoch


def test_a_first_start_reserves_a_block_and_later_maps_within_it_need_no_write() -> None:
    m = core()
    out = synced(m, stored=0)
    assert persists(out) == [EPOCH_BLOCK]
    out = m.handle(EpochsPersisted(EPOCH_BLOCK), m.now + 1.0)
    first = m.broker.map_epoch
    assert 1 <= first < EPOCH_BLOCK and m.phase == "ready"
    live(m, "m1")  # (a change of view: a new map, within the block)
    moved = m.maps.remap(m.now)
    out = m.handle(EpochsPersisted(12345), m.now + 2.0)  # (an answer to nothing asked: ignored)
    assert moved is not None and m.broker.map_epoch == first + 1 and persists(out) == []


def test_a_map_above_the_ceiling_waits_for_the_next_block_and_the_broker_keeps_the_one_before() -> None:
    m = core()
    m.handle(EpochsPersisted(EPOCH_BLOCK), m.now + 0.0)  # (ignored: nothing asked yet)
    out = synced(m, stored=0)
    m.handle(EpochsPersisted(persists(out)[0]), m.now + 1.0)
    before = m.broker.map_epoch
    m.maps.heard_epoch(EPOCH_BLOCK + 500)  # (a peer's HEARTBEAT: far past our block)
    live(m, "m1")
    m.maps.remap(m.now)
    out = m.handle(SnapshotRead(None, "late"), m.now)  # (any event: the actions the remap queued)
    assert m.cmap is not None and m.cmap.epoch == EPOCH_BLOCK + 501
    assert m.broker.map_epoch == before  # (not yet: its ceiling is not on disk)
    (ceiling,) = persists(out)
    assert ceiling == EPOCH_BLOCK + 501 + EPOCH_BLOCK - 1
    out = m.handle(EpochsPersisted(ceiling), m.now + 2.5)
    assert m.broker.map_epoch == EPOCH_BLOCK + 501 and published(out) == [EPOCH_BLOCK + 501]


def test_a_member_restarted_from_an_old_disk_serves_above_the_epochs_it_heard_while_syncing() -> None:
    m = core()
    out = synced(m, stored=10, heard=50_000)  # (its peers went on while its disk was away)
    assert m.phase == "syncing" and m.broker.map_epoch == 0
    assert m.cmap is not None and m.cmap.epoch == 50_001
    asked = persists(out)
    assert asked == [10 + EPOCH_BLOCK]  # (the first, for the epoch above its own ceiling; one at a time)
    out = m.handle(EpochsPersisted(asked[0]), m.now + 1.0)
    assert persists(out) == [50_001 + EPOCH_BLOCK - 1] and m.broker.map_epoch == 0 and m.phase == "syncing"
    out = m.handle(EpochsPersisted(50_001 + EPOCH_BLOCK - 1), m.now + 1.5)
    assert m.phase == "ready" and m.broker.map_epoch == 50_001 and published(out) == [50_001]


def test_a_failed_write_or_a_bad_file_stops_the_member() -> None:
    m = core()
    out = synced(m, stored=7)
    out = m.handle(EpochsPersisted(persists(out)[0], "/data/map_epoch: No space left on device"), m.now + 1.0)
    (exit_,) = [a for a in out if isinstance(a, Exit)]
    assert "map_epoch" in exit_.error and m.phase == "stopped" and m.broker.map_epoch == 0
    m = core()  # (the shell found the file damaged: LogsRead carries the error naming it)
    out = m.handle(LogsRead({}, "the map epochs: /data/map_epoch: damaged, refusing to start without it"), 0.0)
    (exit_,) = [a for a in out if isinstance(a, Exit)]
    assert "/data/map_epoch" in exit_.error and m.phase == "stopped"


def test_without_a_store_the_map_is_handed_out_at_start_as_before() -> None:
    m = core()
    m.handle(Start(), 0.0)
    assert m.cmap is not None and m.broker.map_epoch == m.cmap.epoch == 1


# ---------------------------------------------------------------- the simulator


def test_the_simulator_catches_a_member_that_hands_a_map_out_before_its_ceiling_is_on_disk() -> None:
    """--break eager-map-epochs (review: the check across lives alone caught it in 0 of 300 seeds):
    every map handed out is checked against the ceiling on the member's disk at that moment."""
    check, _ = run_seed(0, mode="partitioned", durable=False, broken="eager-map-epochs")
    assert any("above its ceiling" in v for v in check.violations)
    clean, _ = run_seed(0, mode="partitioned", durable=False)
    assert not any("above its ceiling" in v for v in clean.violations)


def test_the_simulator_catches_a_member_that_forgets_its_ceiling() -> None:
    """--break volatile-map-epochs: a member restarted hands out epochs from 1 again."""
    for seed in range(12):
        check, _ = run_seed(seed, mode="partitioned", durable=False, broken="volatile-map-epochs")
        if any("handed out a map of epoch" in v for v in check.violations):
            return
    pytest.fail("12 seeds of volatile-map-epochs without a violation")


# ---------------------------------------------------------------- real processes


def welcome_epoch(addr: tuple[str, int]) -> int:
    """The map epoch a new client is told by the member at ``addr`` (its WELCOME), 0 if none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(1.0)
        s.sendto(wire.encode_hello(os.urandom(16)), addr)
        try:
            data, _ = s.recvfrom(65536)
        except TimeoutError:
            return 0
    f = decoding.decode_untrusted_frame(data)
    if f[0] is not wire.FrameType.WELCOME:
        return 0
    return int(f[decoding.WELCOME_PARAMS].get("map_epoch", 0))


@pytest.mark.slow
def test_the_map_epoch_clients_see_rises_across_a_kill_and_restart_of_every_member(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, n=3, cluster_extra='mode = "partitioned"\n')
    c.start()
    try:
        wait_until(lambda: c.status("n1")["map"]["live"] == c.ids, what="every member live", timeout=90)
        addrs = [("127.0.0.1", c.client_ports[m]) for m in c.ids]
        wait_until(lambda: all(welcome_epoch(a) > 0 for a in addrs), what="a map epoch in every WELCOME", timeout=60)
        before = max(welcome_epoch(a) for a in addrs)
        stored = [EpochStore(Path(c.cc.member(m).data_dir)).read() for m in c.ids]
        assert all(s >= EPOCH_BLOCK for s in stored), stored
        for m in c.ids:
            c.kill(m)  # (SIGKILL: nothing written at exit)
        time.sleep(0.2)
        c.start()
        wait_until(lambda: c.status("n1")["map"]["live"] == c.ids, what="every member live again", timeout=90)
        wait_until(lambda: all(welcome_epoch(a) > 0 for a in addrs), what="a map epoch in every WELCOME", timeout=60)
        after = [welcome_epoch(a) for a in addrs]
        assert min(after) > before, (before, after)
        assert min(after) > max(stored), (stored, after)  # (above every ceiling of the first lives)
    finally:
        c.stop()
