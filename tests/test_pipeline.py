"""`roost audit` on a real Spark (local mode): it agrees with scripts/check.py on every count, on
generated logs with known flaws and on a real chaos run, reuses its Parquet, and writes the
report, the summary and the plots."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from roost.pipeline import audit, checker
from roost.pipeline.durablerules import DURABLE_VIOLATIONS
from roost.pipeline.rules import COUNT_FIELDS, VIOLATION
from scripts import gen_events
from tests.clusterkit import ROOT
from tests.test_check import History
from tests.test_check_durable import clean

RUN_FIELDS = (
    "files",
    "events",
    "malformed",
    "duplicate_publishes",
    "unpaired_fault_ends",
    "phantom_deliveries",
    "stray_deliveries",
    "by_kind",
    "malformed_lines",
)


def assert_agrees(run_dir: Path, summary: dict[str, Any]) -> dict[str, Any]:
    """The audit's report of `run_dir` equals the reference checker's on every count; returns it."""
    ref = checker.check_run(run_dir)
    [aud] = [r for r in summary["runs"] if os.path.samefile(r["run"]["dir"], run_dir)]
    for k in RUN_FIELDS:
        assert aud["input"][k] == ref["input"][k], k
    assert aud["published"] == ref["published"]
    for mode in ("reliable", "fire"):
        for k in ("totals", "lost_by_class", "latency", "paths"):
            assert aud["modes"][mode][k] == ref["modes"][mode][k], (mode, k)
    assert aud["faults"] == ref["faults"]
    assert aud["agreement"] == ref["agreement"]
    kinds = {k: sum(v["kind"] == k for v in ref["violations"]) for k in aud["violations"]["by_kind"]}
    assert aud["violations"]["by_kind"] == kinds
    assert aud["ok"] == ref["ok"]
    for name in ("lost", "duplicated", "reordered"):  # (the samples: the checker's first items, in its order)
        keep = ("pid", "seq", "sub")
        assert [tuple(x[k] for k in keep) for x in aud[name]] == [tuple(x[k] for k in keep) for x in ref[name][:100]]
    for k, v in ref["durable"].items():  # durable mode: every figure, and the lists' first 100 items
        assert aud["durable"][k] == (v[:100] if k in ("lost", "duplicated", "regressions", "conflicts") else v), k
    return aud


def test_audit_agrees_with_the_checker_on_planted_flaws_and_reuses_its_parquet(tmp_path, spark):
    run = tmp_path / "gen"
    truth = gen_events.generate(
        run, events=30000, seed=5, lose=4, dup=3, reorder=3, kill_lose=2, malformed=5, disagree=True
    )
    out = tmp_path / "audit"
    # Small chunks: every file is read in several parallel pieces, and line numbers still match.
    summary = audit.audit([str(run)], out, spark=spark, quiet=True, chunk_bytes=50_000)
    assert summary["audit"]["converted"] == 1 and summary["audit"]["reused"] == 0
    aud = assert_agrees(run, summary)
    totals = {f: sum(aud["modes"][m]["totals"][f] for m in aud["modes"]) for f in COUNT_FIELDS}
    # The planted flaws, found exactly (truth.json of scripts/gen_events.py):
    assert aud["modes"]["reliable"]["lost_by_class"][VIOLATION] == len(truth["lost"]) == 4
    assert totals["duplicated"] == len(truth["duplicated"]) == 3
    assert aud["violations"]["by_kind"]["reordered"] == len(truth["reordered"]) == 3
    assert aud["modes"]["reliable"]["totals"]["lost"] == 4 + 2  # (+ the 2 allowed: n3 was killed)
    assert sorted((m["file"], m["line"]) for m in aud["input"]["malformed_lines"]) == sorted(
        (m[0], m[1]) for m in truth["malformed"]
    )
    assert aud["agreement"]["agreed"] is False and not summary["ok"]
    stored = sorted(p.name for p in (out / "parquet" / "events" / f"run={aud['run']['id']}").iterdir())
    assert stored == [
        "ev=deliver",
        "ev=fault",
        "ev=malformed",
        "ev=puback",
        "ev=publish",
        "ev=status",
        "ev=subscribe",
        "ev=unsubscribe",
    ]

    again = audit.audit([str(run)], out, spark=spark, quiet=True)  # the Parquet is reused, same answer
    assert again["audit"]["converted"] == 0 and again["audit"]["reused"] == 1
    assert again["runs"][0]["modes"] == aud["modes"] and again["runs"][0]["input"] == aud["input"]

    # What a killed conversion leaves (Spark's _temporary, an old staging directory) is never read.
    part = next((out / "parquet" / "events" / f"run={aud['run']['id']}" / "ev=publish").glob("*.parquet"))
    for left in (
        out / "parquet" / "events" / "_temporary" / "0" / "task_0" / f"run={aud['run']['id']}" / "ev=publish",
        out / "parquet" / ".staging-old" / f"run={aud['run']['id']}" / "ev=publish",
    ):
        left.mkdir(parents=True)
        (left / part.name).write_bytes(part.read_bytes())
    with (run / "events" / "sub-0.jsonl").open("a") as f:  # a changed run is converted again
        f.write('{"t": 1, "proc": "sub-0"}\n')
    third = audit.audit([str(run)], out, spark=spark, quiet=True)
    assert third["audit"]["converted"] == 1
    assert third["runs"][0]["input"]["malformed"] == aud["input"]["malformed"] + 1
    assert third["runs"][0]["input"]["duplicate_publishes"] == 0
    assert_agrees(run, third)


def test_every_kind_of_bad_line_is_counted_with_its_file_and_line_as_the_checker_does(tmp_path, spark):
    run = tmp_path / "bad"
    gen_events.generate(run, events=2000, seed=9)
    bad = [
        b"not json\n",
        b"\n",
        b'{"t": 1}\n',
        b"[1, 2]\n",
        b'{"t": 1, "proc": "x", "ev": "nope"}\n',
        b'{"t": 1, "proc": "x", "ev": "publish", "pid": "a", "seq": 1.0, "topic": "o", "key": null, '
        b'"mode": "reliable", "member": null}\n',
        b'{"t": 1, "proc": "x", "ev": "publish", "pid": "a", "seq": 99999999999999999999, "topic": "o", '
        b'"key": null, "mode": "reliable", "member": null}\n',
        b'{"t": 1, "proc": "x", "ev": "deliver", "sub": "\\ud800", "topic": "o", "key": null, "mode": "fire", '
        b'"pid": "a", "seq": 1, "member": null}\n',
        b'\xff\xfe{"t": 1}\n',
        b'{"t": NaN, "proc": "x", "ev": "status"}\n',
        b'{"t": 1, "proc": "x"} {}\n',
        b'{"t": 1, "proc": "x", "ev": "fault", "fault": "kill", "target": "n1", "phase": "start", "params": 3}\n',
        struct.pack("B", 0) * 3 + b"\n",
        b'{"t": 1' + b"0" * 400 + b', "proc": "x", "ev": "status", "member": "n1", "digest": null, '
        b'"subscriptions": null, "state": "s"}\n',
    ]
    with (run / "events" / "pub-0.jsonl").open("ab") as f:
        for b in bad:
            f.write(b)
        # valid lines: a field no event defines, of a type no column has; a subscribe with a null member
        f.write(b'{"t": 1, "proc": "x", "ev": "failover", "client": "x", "from": null, "to": "n1", "seq": "x"}\n')
        f.write(
            b'{"t": 1, "proc": "x", "ev": "subscribe", "sub": "s9", "topic": "o", "key": null, "mode": "fire", '
            b'"member": null}\n'
        )
        for t in (b"100000000000000000000", b"9007199254740993"):  # (past int64; past a double's 2**53)
            f.write(
                b'{"t": ' + t + b', "proc": "x", "ev": "status", "member": "n9", "digest": null, '
                b'"subscriptions": null, "state": "s"}\n'
            )
        f.write(b'{"t": 1, "proc": "x", "ev": "failover", "client": "pub-0", "from": null, "to": "n1"}')  # (no \n)
    summary = audit.audit([str(run)], tmp_path / "out", spark=spark, quiet=True, chunk_bytes=4096)
    aud = assert_agrees(run, summary)
    assert aud["input"]["malformed"] == len(bad)
    assert aud["input"]["by_kind"]["failover"] == 2  # (the last line, without its newline, is one)
    assert aud["input"]["by_kind"]["status"] == 2 + 3  # (2 here and the 3 members' of the run)


def null_member_run(run_dir: Path) -> Path:
    """A hand-written run without faults: null members (a puback, a subscribe, a deliver), a keyed
    and a whole-topic subscription of one subscriber, a loss, a duplicate and a phantom."""
    h = History()
    h.subscribe(0, "s", member=None)
    h.subscribe(0, "s", key="k")
    h.add(1, "pub-0", "publish", pid="p1", seq=1, topic="t", key="k", mode="reliable", member=None)
    h.add(1.001, "pub-0", "puback", pid="p1", seq=1, member=None)  # acknowledged, never delivered
    h.publish(2, 2, key="k")
    h.deliver(2.1, "s", 2, key="k", member=None)
    h.deliver(2.2, "s", 2, key="k")  # twice
    h.deliver(2.3, "s", 9)  # never published
    return h.write(run_dir)


def test_audit_of_a_real_chaos_run_and_others_in_one_job_writes_report_summary_and_plots(tmp_path, spark, chaos_run):
    run, proc = chaos_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = tmp_path / "audit"
    other = null_member_run(tmp_path / "hand")
    summary = audit.audit([str(run), str(other)], out, spark=spark, quiet=True)
    hand = assert_agrees(other, summary)
    # (one message on two subscriptions of "s": the keyed and the whole-topic one count it each)
    assert hand["modes"]["reliable"]["totals"]["lost"] == 2 and hand["violations"]["by_kind"] == {
        "lost": 2,
        "duplicated": 2,
        "reordered": 0,
        "phantom": 1,
        "disagreement": 0,
        **dict.fromkeys(DURABLE_VIOLATIONS, 0),
    }  # (no durable events in this run)
    aud = assert_agrees(run, summary)
    assert aud["modes"]["reliable"]["totals"]["acknowledged"] > 1000 and aud["faults"]
    assert all(f["gap"] > 0 for f in aud["faults"])
    assert json.loads((out / "summary.json").read_text())["runs"][0]["modes"] == aud["modes"]
    report = (out / "report.md").read_text()
    assert aud["run"]["id"] in report and "| reliable |" in report and "| fault |" in report
    for png in aud["plot_files"]:
        data = (out / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, png
        assert f"]({png})" in report


def durable_flaws_run(run_dir: Path) -> Path:
    """A hand-written durable run with one of each flaw durable mode must not have (a crash and its
    redelivery besides): a lost acknowledged put, a message at two offsets, a read below the
    committed cursor and a commit going back, two messages at one offset, a record never put."""
    h = clean()
    h.put(20, 7)  # acknowledged, never read: lost
    h.record(9, 16, 2)  # seq 2 at 11 and 16
    h.open(10)
    h.record(10.5, 14, 5)  # below the committed 16
    h.commit(11, 15)  # back from 16
    h.open(0, sub="dsub-1", client="dc-1")
    h.record(12, 12, 4, sub="dsub-1", client="dc-1")  # offset 12 carried seq 3 for dc-0 (and dc-1 lacks 6)
    h.record(12.1, 17, 99, sub="dsub-1", client="dc-1")  # never put
    h.fault(5, "kill", "n1", "start")
    h.fault(7, "kill", "n1", "end")
    return h.write(run_dir)


def test_audit_agrees_with_the_checker_on_durable_mode(tmp_path, spark, durable_chaos_run):
    """The durable section, through the same rules (pipeline/durablerules.py): on planted flaws
    and on a real durable chaos run, every figure of the checker's."""
    hand = durable_flaws_run(tmp_path / "dflaws")
    run, proc = durable_chaos_run
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = audit.audit([str(hand), str(run)], tmp_path / "out", spark=spark, quiet=True)
    aud = assert_agrees(hand, summary)
    assert aud["violations"]["by_kind"] == {"lost": 0, "duplicated": 0, "reordered": 0, "phantom": 0,
                                            "disagreement": 0, "durable_lost": 7, "durable_duplicated": 1,
                                            "durable_reordered": 0, "durable_phantom": 1, "offset_conflict": 1,
                                            "cursor_regression": 2}  # fmt: skip
    assert not aud["ok"] and aud["durable"]["crashes"] == 1 and len(aud["durable"]["faults"]) == 1
    real = assert_agrees(run, summary)
    assert real["ok"] and real["durable"]["acknowledged"] > 300 and real["durable"]["totals"]["redelivered"] >= 1
    report = (tmp_path / "out" / "report.md").read_text()
    assert "Durable: " in report and "| dc-0/w | dur.b |" in report


def test_roost_audit_command_exits_2_on_a_missing_run_and_names_it(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "roost", "audit", str(tmp_path / "nope"), "--out", str(tmp_path / "o")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "nope/run.json: no such file" in r.stderr
    (tmp_path / "empty" / "events").mkdir(parents=True)
    (tmp_path / "empty" / "run.json").write_text("{}")
    r = subprocess.run(
        [sys.executable, "-m", "roost", "audit", str(tmp_path / "empty"), "--grace", "-1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--grace must be a finite number >= 0" in r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "roost", "audit", str(tmp_path / "empty")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "no *.jsonl event files" in r.stderr


@pytest.mark.slow
def test_roost_audit_command_end_to_end(tmp_path):
    """The command as a user runs it: its own Spark session, a progress bar, exit 1 on a violation."""
    run = tmp_path / "gen"
    gen_events.generate(run, events=3000, seed=2, lose=1)
    r = subprocess.run(
        [sys.executable, "-m", "roost", "audit", str(run), "--out", str(tmp_path / "o"), "--master", "local[1]"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1, r.stderr[-3000:]
    assert "FAIL" in r.stdout and "1 violations" in r.stdout
    assert "audit: done" in r.stderr and "14/14" in r.stderr  # the progress bar reached its end
    assert (tmp_path / "o" / "report.md").exists()
