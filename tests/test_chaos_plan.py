"""scripts/chaos.py's choice of targets, without processes: a leave takes only a member outside the
durable metadata quorum's voters (the cluster refuses a voter's leave), is skipped and said so
when there is none, and the member faults (kill, pause, partition) still fall on voters, which is
the point of a chaos run against a quorum."""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import pytest

from roost.cluster.config import load_cluster_config
from roost.cluster.launcher import write_local_config
from scripts import chaos


def make_run(tmp_path: Path) -> chaos.Run:
    (tmp_path / "events").mkdir()
    config = tmp_path / "cluster.toml"
    write_local_config(config, 3, "chaos-plan-secret-0123456789", cluster_extra='mode = "partitioned"\n',
                       hosts=list(chaos.LOOPBACK_HOSTS))  # fmt: skip
    run = chaos.Run(argparse.Namespace(out=str(tmp_path), seed=1))
    run.cc = load_cluster_config(str(config))
    run.config = str(config)
    return run


def test_the_generated_configs_members_are_all_voters_so_only_the_joiner_may_leave(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    try:
        assert run.cc.settings.quorum == ("n1", "n2", "n3")
        assert chaos.non_voters(run) == []
        run.joined[chaos.JOINER] = (("127.0.0.14", 1), ("127.0.0.14", 2))
        assert chaos.non_voters(run) == [chaos.JOINER]
        run.held.add(chaos.JOINER)  # (a fault holds it: not now)
        assert chaos.non_voters(run) == []
    finally:
        run.nemesis.close()


def test_a_leave_with_no_non_voter_is_skipped_and_said_so_not_a_failure(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    try:
        assert chaos.leave(run) == "-"
        assert "no member outside the quorum's voters ['n1', 'n2', 'n3']" in run.info["leave"]["skipped"]
        assert run.left == set()
    finally:
        run.nemesis.close()
    assert (tmp_path / "events" / "nemesis.jsonl").read_text() == ""  # (no fault was injected)


def test_kills_pauses_and_partitions_fall_on_voters(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    run.nemesis.close()
    voters = set(run.cc.settings.quorum)
    plan = chaos.schedule(random.Random(3), ["kill", "pause", "partition", "loss", "join", "leave"],
                          [m.id for m in run.cc.members], 120.0)  # fmt: skip
    hit = {target for _, _, kind, target in plan if kind in chaos.MEMBER_FAULTS}
    assert hit and hit <= voters and len(hit) >= 2
    assert {kind for _, _, kind, _ in plan} >= {"kill", "pause", "partition", "join", "leave"}


def test_the_netns_config_is_netns3_in_the_mode_asked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--netns --mode partitioned: the durable workload needs a partitioned cluster, and
    configs/netns3.toml says replicated; the run's copy says partitioned, with the same members,
    and still reads the secret file netns3.toml names."""
    monkeypatch.setenv("ROOST_CLUSTER_SECRET", "chaos-plan-secret-0123456789")  # (no secret file made)
    base = load_cluster_config(str(chaos.NETNS_CONFIG))
    for mode in ("partitioned", "replicated"):
        cc = load_cluster_config(chaos.netns_config(mode, tmp_path))
        assert cc.settings.mode == mode
        assert [(m.id, m.client_addr, m.peer_addr, m.data_dir) for m in cc.members] == [
            (m.id, m.client_addr, m.peer_addr, m.data_dir) for m in base.members
        ]
    text = (tmp_path / "cluster.toml").read_text()
    assert f'secret_file = "{chaos.ROOT / "run" / "netns3.secret"}"' in text
