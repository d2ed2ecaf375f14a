"""A short chaos run on real processes, judged by the checker (the long ones are scripts/chaos.py runs)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.clusterkit import ROOT


def test_a_short_chaos_run_breaks_no_promise(chaos_run):
    """3 members, 3 publishers (2 reliable, 1 fire), 3 subscribers, 20 s of kills, pauses,
    partitions and 10% loss: nothing acknowledged is lost while its member lives, nothing is
    duplicated, the members agree at the end, and fire mode is counted."""
    out, chaos = chaos_run
    assert chaos.returncode == 0, chaos.stderr[-2000:]
    faults = [json.loads(line) for line in (out / "events" / "nemesis.jsonl").open()]
    assert len({f["fault"] for f in faults if f["phase"] == "start"}) >= 2  # the nemesis did strike
    check = subprocess.run([sys.executable, "scripts/check.py", str(out), "--json"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    report = json.loads(check.stdout)
    reliable, fire = report["modes"]["reliable"]["totals"], report["modes"]["fire"]["totals"]
    assert report["violations"] == [] and check.returncode == 0, report["violations"][:5]
    assert reliable["acknowledged"] > 1000 and reliable["duplicated"] == 0
    assert report["modes"]["reliable"]["lost_by_class"]["violation"] == 0
    assert fire["expected"] > 500 and fire["duplicated"] == 0  # (fire may lose, never duplicate)
    assert report["agreement"]["agreed"] is True
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
    assert "roost_chaos" not in tables  # every rule of the run is gone (inet, ip and netdev tables)
    config = json.loads((out / "run.json").read_text())["config_text"]
    for host in ("127.0.0.11", "127.0.0.12", "127.0.0.13"):  # and every member process
        assert host in config
    leftover = subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split()
    assert leftover == []


def test_a_short_durable_chaos_run_loses_duplicates_and_rewinds_nothing(durable_chaos_run):
    """Partitioned mode with durable publishers and subscribers that crash between get and
    commit (and are started again with the same client name): every acknowledged put is read
    by every durable subscription of its topic, the crashes make the broker give records again
    (redelivered), and after de-duplication by offset nothing is there twice, no offset carries
    two messages, and no cursor moves back."""
    out, chaos = durable_chaos_run
    assert chaos.returncode == 0, chaos.stderr[-2000:]
    info = json.loads((out / "run.json").read_text())
    assert sum(info["durable"]["restarts"].values()) >= 1  # a subscriber was killed and started again
    drain = info["durable"]["drain"]  # (the driver waited until the subscribers had read it all)
    assert drain["owed"] > 500 and drain["read"] == drain["owed"]
    check = subprocess.run([sys.executable, "scripts/check.py", str(out), "--json"], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)  # fmt: skip
    report = json.loads(check.stdout)
    assert report["violations"] == [] and check.returncode == 0, report["violations"][:5]
    d = report["durable"]
    assert d["acknowledged"] > 300 and d["crashes"] >= 1
    assert len(d["subscriptions"]) == 5  # dc-0 on three topics, dc-1 on two
    totals = d["totals"]
    assert totals["expected"] > 500 and totals["received"] >= totals["expected"]
    assert totals["redelivered"] >= 1 and totals["commits"] > 10
    assert (totals["lost"], totals["duplicated"], totals["cursor_regressions"], d["offset_conflicts"]) == (0, 0, 0, 0)
    assert report["modes"]["reliable"]["totals"]["acknowledged"] > 300  # (the reliable workload ran beside it)
    tables = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True, check=True).stdout
    assert "roost_chaos" not in tables
    assert subprocess.run(["pgrep", "-f", str(out)], capture_output=True, text=True).stdout.split() == []


def test_a_restarted_member_serves_once_its_new_life_says_so(tmp_path):
    """Found by a durable chaos run (seed 3): the nemesis logged a killed member's restart 5.5 s
    before it served again (a new Python process took 4 s to write its first line under load),
    because the previous life's lines said 'serving'; the checker then misjudged what the member's
    return explained. Only the lines written since the start count."""
    from scripts.chaos import served

    log = tmp_path / "n3.log"
    log.write_bytes(b"event=node_starting\nevent=serving addr=x\nevent=node_ready\n")  # the previous life
    since = log.stat().st_size
    assert served(log, 0) and not served(log, since)
    with log.open("ab") as f:
        f.write(b"event=node_starting state=syncing\n")
    assert not served(log, since)
    with log.open("ab") as f:
        f.write(b"event=serving addr=x\n")
    assert served(log, since)
