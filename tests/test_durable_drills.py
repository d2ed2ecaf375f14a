"""The pure helpers of the durable drills (scripts/durable_cluster.py, scripts/durable_availability.py):
the copied config every drill runs on, and the figures they print. No process is started here."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path

import pytest

from roost.client import ring
from scripts.durable_availability import (
    SOURCE,
    ack_gaps,
    check_read,
    first_logged,
    leads,
    longest_silence,
    member_hosts,
    pick_topic,
)
from scripts.durable_cluster import config_text, moved_address, spread


def test_moved_address_shifts_the_port_and_replaces_the_host() -> None:
    assert moved_address("127.0.0.1:7411", 30000) == "127.0.0.1:37411"
    assert moved_address("127.0.0.1:7411", 30000, "127.0.0.41") == "127.0.0.41:37411"
    assert moved_address("[::1]:80") == "[::1]:80"
    with pytest.raises(ValueError, match="out of range"):
        moved_address("127.0.0.1:40000", 30000)
    with pytest.raises(ValueError, match="not host:port"):
        moved_address("7411")


def test_config_copy_keeps_the_settings_and_moves_ports_data_and_secret(tmp_path: Path) -> None:
    """The drills' cluster: the source's settings untouched (defaults are the product), every
    address moved, data and secret under the work directory."""
    src = tomllib.loads(SOURCE.read_text())
    hosts = member_hosts(SOURCE, 40)
    copy = tomllib.loads(config_text(src, tmp_path, 30000, hosts))
    assert copy["cluster"] == {**src["cluster"], "secret_file": str(tmp_path / "cluster.secret")}
    assert copy["node"] == src["node"] and "durable" not in copy
    assert [m["id"] for m in copy["members"]] == ["n1", "n2", "n3", "n4", "n5"]
    for i, (old, new) in enumerate(zip(src["members"], copy["members"], strict=True)):
        assert new["data_dir"] == str(tmp_path / "data" / old["id"])
        for key in ("client_addr", "peer_addr", "monitor_addr"):
            port = int(old[key].rpartition(":")[2])
            assert new[key] == f"127.0.0.{41 + i}:{port + 30000}"


def test_ack_gaps_around_an_event() -> None:
    acks = [1.0, 1.1, 1.2, 4.0, 4.1, 6.0]
    longest, first = ack_gaps(acks, 2.0)
    assert first == pytest.approx(2.0) and longest == pytest.approx(2.8)  # (1.2 -> 4.0)
    assert ack_gaps([1.0, 1.1], 0.5) == pytest.approx((0.5, 0.5))  # (from the event itself: no ack before it)
    assert ack_gaps(acks, 7.0) == (math.inf, math.inf)


def test_longest_silence_counts_the_ends() -> None:
    assert longest_silence([], 1.0, 4.0) == pytest.approx(3.0)
    assert longest_silence([0.5, 1.5, 2.0, 9.0], 1.0, 4.0) == pytest.approx(2.0)  # (2.0 -> the end)


def test_check_read_wants_every_acknowledged_payload_once() -> None:
    assert check_read(["a", "b"], ["a", "probe", "b", "probe"]) == ""  # (unacknowledged: any number)
    assert check_read(["a", "b"], ["a"]).startswith("1 acknowledged records missing")
    assert "1 read twice" in check_read(["a", "b"], ["a", "b", "a"])


def test_pick_topic_finds_a_partition_with_the_replicas_asked_for() -> None:
    placed = [("n1", "n2", "n3"), ("n4", "n5", "n1")] * 2
    topic = pick_topic("t-", 4, placed, leads("n4"))
    assert placed[ring.partition_of(topic, 4)][0] == "n4"
    with pytest.raises(ValueError):
        pick_topic("t-", 4, placed, leads("n9"), tries=50)


def test_first_logged_reads_the_members_log_times() -> None:
    log = ("2026-11-29T09:53:17.440Z INFO node=n2 event=peer_state peer=n1 old=ready new=suspect\n"
           "2026-11-29T09:53:18.315Z WARNING node=n2 event=peer_state peer=n1 old=suspect new=down\n")  # fmt: skip
    t = first_logged(log, "peer=n1 old=suspect new=down", 0.0)
    assert t is not None and t % 60 == pytest.approx(18.315)
    assert first_logged(log, "new=down", t + 0.001) is None


def test_spread() -> None:
    assert spread([3.0, 1.0, 2.0, 10.0]) == (1.0, 2.5, 10.0)
    assert all(math.isnan(x) for x in spread([]))
