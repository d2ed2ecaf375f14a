"""scripts/check.py and pipeline/rules.py: the checker finds exactly the flaws planted in a
log, classifies each loss against docs/guarantees.md, and reports bad input without crashing.

Two kinds of input: runs from scripts/gen_events.py, whose truth.json says what was planted, and
small hand-written histories where each test controls every time. All in-process and small.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from roost.pipeline import checker, eventlog, reportschema, rules
from roost.pipeline.rules import ALLOWED_CUT, ALLOWED_DIED, ALLOWED_ENDED, VIOLATION
from scripts import check, gen_events

ROOT = Path(__file__).resolve().parent.parent

T0 = 1_000_000.0


def run_cli(capsys: pytest.CaptureFixture[str], run_dir: Path, *args: str) -> tuple[int, str]:
    code = check.main([str(run_dir), *args])
    return code, capsys.readouterr().out


def run_json(capsys: pytest.CaptureFixture[str], run_dir: Path, *args: str) -> tuple[int, dict[str, Any]]:
    code, out = run_cli(capsys, run_dir, "--json", *args)
    return code, json.loads(out)


def triples(items: list[dict[str, Any]], cls: str | None = None) -> list[list[Any]]:
    return sorted([i["pid"], i["seq"], i["sub"]] for i in items if cls is None or i["class"] == cls)


def violation_triples(report: dict[str, Any], kind: str) -> list[list[Any]]:
    return triples([v for v in report["violations"] if v["kind"] == kind])


class History:
    """A hand-written run: every event's time is T0 + the given seconds."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def add(self, t: float, proc: str, ev: str, **fields: Any) -> None:
        e = {"t": T0 + t, "proc": proc, "ev": ev, **fields}
        assert eventlog.validate(e) is None, (eventlog.validate(e), e)
        self.events.append(e)

    def subscribe(
        self,
        t: float,
        sub: str,
        topic: str = "t",
        key: str | None = None,
        mode: str = "reliable",
        member: str | None = "n1",
    ) -> None:
        self.add(t, sub, "subscribe", sub=sub, topic=topic, key=key, mode=mode, member=member)

    def cancel(
        self, t: float, sub: str, topic: str = "t", key: str | None = None, reason: str = "out_of_capacity"
    ) -> None:
        self.add(t, sub, "cancel", sub=sub, topic=topic, key=key, reason=reason)

    def publish(
        self,
        t: float,
        seq: int,
        pid: str = "p1",
        topic: str = "t",
        key: str | None = None,
        mode: str = "reliable",
        member: str = "n1",
        ack: bool = True,
        proc: str = "pub-0",
    ) -> None:
        self.add(t, proc, "publish", pid=pid, seq=seq, topic=topic, key=key, mode=mode, member=member)
        if ack and mode == "reliable":
            self.add(t + 0.001, proc, "puback", pid=pid, seq=seq, member=member)

    def deliver(
        self,
        t: float,
        sub: str,
        seq: int,
        pid: str = "p1",
        topic: str = "t",
        key: str | None = None,
        mode: str = "reliable",
        member: str | None = "n1",
    ) -> None:
        self.add(t, sub, "deliver", sub=sub, topic=topic, key=key, mode=mode, pid=pid, seq=seq, member=member)

    def fault(self, t: float, fault: str, target: str, phase: str) -> None:
        self.add(t, "nemesis", "fault", fault=fault, target=target, phase=phase)

    def check(self, end: float = 100.0, **kw: Any) -> dict[str, Any]:
        run = eventlog.RunInfo(dir="mem", started=T0, ended=T0 + end, members=["n1", "n2", "n3"])
        return checker.check_events(self.events, run, **kw)

    def write(self, run_dir: Path, end: float = 100.0, config_text: str = "") -> Path:
        (run_dir / "events").mkdir(parents=True)
        (run_dir / "run.json").write_text(
            json.dumps({"seed": 0, "started": T0, "ended": T0 + end, "members": {}, "config_text": config_text})
        )
        by_proc: dict[str, list[str]] = {}
        for e in self.events:
            by_proc.setdefault(e["proc"], []).append(json.dumps(e))
        for proc, lines in by_proc.items():
            (run_dir / "events" / f"{proc}.jsonl").write_text("\n".join(lines) + "\n")
        return run_dir


def path_row(report: dict[str, Any], mode: str, sub: str, pid: str = "p1") -> dict[str, Any]:
    rows = [p for p in report["modes"][mode]["paths"] if p["sub"] == sub and p["pid"] == pid]
    assert len(rows) == 1, report["modes"][mode]["paths"]
    return rows[0]


# -- generated runs with known flaws ---------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_finds_exactly_the_planted_losses_duplicates_and_reorderings(tmp_path, capsys, seed):
    truth = gen_events.generate(tmp_path, events=6000, seed=seed, lose=4, dup=3, reorder=3)
    code, report = run_json(capsys, tmp_path)
    assert code == 1
    assert violation_triples(report, "lost") == truth["lost"]
    assert triples(report["lost"]) == truth["lost"]
    assert triples(report["duplicated"]) == truth["duplicated"]
    assert violation_triples(report, "duplicated") == truth["duplicated"]
    assert triples(report["reordered"]) == truth["reordered"]
    assert violation_triples(report, "reordered") == truth["reordered"]
    assert {v["kind"] for v in report["violations"]} == {"lost", "duplicated", "reordered"}
    rel = report["modes"]["reliable"]["totals"]
    assert rel["lost"] == 4 and rel["missing"] == 4
    assert rel["expected"] == rel["acknowledged"] == rel["delivered"] + rel["lost"]
    assert report["input"]["events"] == truth["events"]
    assert report["input"]["malformed"] == 0


def test_clean_generated_run_passes_with_every_count_consistent(tmp_path, capsys):
    truth = gen_events.generate(tmp_path, events=4000, seed=9)
    code, report = run_json(capsys, tmp_path)
    assert code == 0 and report["ok"] and report["violations"] == []
    assert report["lost"] == [] and report["duplicated"] == [] and report["reordered"] == []
    for mode in ("reliable", "fire"):
        totals = report["modes"][mode]["totals"]
        assert totals["expected"] > 100
        assert totals["missing"] == totals["lost"] == totals["duplicated"] == totals["reordered"] == 0
        assert report["modes"][mode]["latency"]["n"] == totals["received"]
        assert 0 < report["modes"][mode]["latency"]["max"] < 0.01
    assert report["modes"]["fire"]["totals"]["acknowledged"] == 0
    # sub-4 received messages inside its grace: delivered but not expected.
    assert sum(p["unexpected"] for p in report["modes"]["reliable"]["paths"] if p["sub"] == "sub-4") > 0
    assert report["agreement"]["agreed"] is True
    assert report["input"]["events"] == truth["events"]
    assert [f["fault"] for f in report["faults"]] == ["loss"]


def test_loss_after_the_acking_member_is_killed_is_allowed_and_without_the_kill_a_violation(tmp_path, capsys):
    truth = gen_events.generate(tmp_path, events=6000, seed=4, kill_lose=3)
    code, report = run_json(capsys, tmp_path)
    assert code == 0, report["violations"]
    assert triples(report["lost"], ALLOWED_DIED) == sorted(t[:3] for t in truth["allowed_lost"])
    assert report["modes"]["reliable"]["lost_by_class"][ALLOWED_DIED] == 3

    nemesis = tmp_path / "events" / "nemesis.jsonl"
    kept = [line for line in nemesis.read_text().splitlines() if '"kill"' not in line]
    nemesis.write_text("\n".join(kept) + "\n")
    code, report = run_json(capsys, tmp_path)
    assert code == 1
    assert violation_triples(report, "lost") == sorted(t[:3] for t in truth["allowed_lost"])


def test_malformed_lines_are_reported_with_file_and_line(tmp_path, capsys):
    truth = gen_events.generate(tmp_path, events=3000, seed=6, malformed=5)
    code, report = run_json(capsys, tmp_path)
    assert code == 0  # a bad line breaks no promise; it is reported
    assert sorted([m["file"], m["line"]] for m in report["input"]["malformed_lines"]) == sorted(truth["malformed"])
    assert report["input"]["events"] == truth["events"]
    code, text = run_cli(capsys, tmp_path)
    for file, line in truth["malformed"]:
        assert f"{file}:{line}: " in text


def test_each_kind_of_bad_line_is_named(tmp_path, capsys):
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1)
    h.deliver(1.01, "s", 1)
    run_dir = h.write(tmp_path / "run")
    good = (run_dir / "events" / "s.jsonl").read_text()
    bad = [
        b'{"t": 1, "proc": "s", "ev": "deliver"',
        b'{"t": 1, "proc": "s", "ev": "deliver", "sub": "s", "topic": "t", "key": null, "mode": "reliable", '
        b'"pid": "p1", "member": null}',
        b'{"t": 1, "proc": "s", "ev": "deliver", "sub": "s", "topic": "t", "key": null, "mode": "reliable", '
        b'"pid": "p1", "seq": true, "member": null}',
        b'{"t": "1", "proc": "s", "ev": "status"}',
        b'{"t": NaN, "proc": "s", "ev": "status"}',
        b'{"t": 1, "proc": "s", "ev": "subscribe", "sub": "s", "topic": "t", "key": null, "mode": "durable", '
        b'"member": "n1"}',
        b'{"t": 1, "proc": "s", "ev": "hello"}',
        b'["not", "an", "object"]',
        b'{"t": 1, "proc": "s", "ev": "status", "member": "n1", "digest": "\xff", "subscriptions": 1, "state": "x"}',
        b"",
        b'{"t": 1, "proc": "s"} {"t": 2}',
    ]
    (run_dir / "events" / "s.jsonl").write_bytes(good.encode() + b"\n".join(bad) + b"\n")
    code, report = run_json(capsys, run_dir)
    assert code == 0
    assert report["input"]["events"] == 4  # subscribe, publish, puback, deliver
    errors = {m["line"]: m["error"] for m in report["input"]["malformed_lines"] if m["file"] == "s.jsonl"}
    first = good.count("\n") + 1
    assert sorted(errors) == list(range(first, first + len(bad)))
    expected = [
        "bad JSON",
        "deliver: missing field 'seq'",
        "deliver: field 'seq' is bool, expected an integer",
        "field 't' is str, expected a number",
        "field 't' is not finite",
        "subscribe: field 'mode' is 'durable', expected one of fire, reliable",
        "unknown ev 'hello'",
        "not a JSON object (list)",
        "not UTF-8",
        "bad JSON",
        "bad JSON",
    ]
    for offset, want in enumerate(expected):
        assert errors[first + offset].startswith(want), (offset, errors[first + offset])
    assert report["modes"]["reliable"]["totals"]["delivered"] == 1


# -- expectations: keys, grace, windows -------------------------------------------------------------


def test_keyed_subscription_expects_only_its_key_and_whole_topic_expects_every_key():
    h = History()
    h.subscribe(0, "keyed", key="k1")
    h.subscribe(0, "whole")
    for seq, key in enumerate(["k1", "k2", None, "k1"], 1):
        h.publish(1 + seq, seq, key=key)
        h.deliver(1.5 + seq, "whole", seq, key=key)
    h.publish(6, 5, topic="other", key="k1")  # another topic: expected by nobody
    h.deliver(2.5, "keyed", 1, key="k1")  # keyed misses seq 4 (k1): lost
    h.deliver(3.5, "keyed", 2, key="k2")  # a k2 message at the k1 subscriber: stray, not delivered
    r = h.check()
    keyed, whole = path_row(r, "reliable", "keyed"), path_row(r, "reliable", "whole")
    assert (keyed["expected"], keyed["delivered"], keyed["lost"]) == (2, 1, 1)
    assert (whole["expected"], whole["delivered"], whole["lost"]) == (4, 4, 0)
    assert triples(r["lost"]) == [["p1", 4, "keyed"]]
    assert r["input"]["stray_deliveries"] == 1


def test_keyed_and_whole_topic_subscriptions_of_one_client_share_one_delivery():
    h = History()
    h.subscribe(0, "s", key="k1")
    h.subscribe(0, "s")
    h.publish(1, 1, key="k1")
    h.deliver(1.1, "s", 1, key="k1")
    r = h.check()
    rows = r["modes"]["reliable"]["paths"]
    assert [(p["key"], p["expected"], p["delivered"], p["duplicated"]) for p in rows] == [
        (None, 1, 1, 0),
        ("k1", 1, 1, 0),
    ]
    assert r["ok"]


@pytest.mark.parametrize(("grace", "expected"), [(0.5, 0), (0.2, 1), (0.0, 1)])
def test_grace_after_the_confirmation(grace, expected):
    h = History()
    h.subscribe(10, "s")
    h.publish(10.3, 1, member="n2")  # published at another member 0.3 s after the confirmation, missed
    h.publish(11, 2)
    h.deliver(11.1, "s", 2)
    r = h.check(grace=grace)
    row = path_row(r, "reliable", "s")
    assert row["expected"] == 1 + expected
    assert row["lost"] == expected
    assert r["ok"] is (expected == 0)


def test_grace_option_of_the_cli_against_the_generated_late_subscriber(tmp_path, capsys):
    truth = gen_events.generate(tmp_path, events=3000, seed=8)
    assert truth["grace_missed"]
    code, report = run_json(capsys, tmp_path)
    assert code == 0
    code, report = run_json(capsys, tmp_path, "--grace", "0")
    assert code == 1
    assert violation_triples(report, "lost") == truth["grace_missed"]
    assert report["options"]["grace"] == 0


def test_cancel_allows_the_loss_and_a_resubscription_opens_a_new_window():
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1)
    h.deliver(1.1, "s", 1)
    h.publish(2, 2)  # never delivered: the subscription is cancelled (mailbox freed)
    h.cancel(3, "s")
    h.publish(4, 3)  # between the windows: expected by nobody
    h.subscribe(5, "s")
    h.publish(5.2, 4)  # inside the new window's grace
    h.publish(6, 5)  # expected, lost without an excuse: the new window ends with the run
    h.publish(7, 6)
    h.deliver(7.1, "s", 6)
    r = h.check(end=20)
    row = path_row(r, "reliable", "s")
    assert (row["expected"], row["delivered"], row["lost"]) == (4, 2, 2)
    assert [(x["seq"], x["class"]) for x in r["lost"]] == [(2, ALLOWED_ENDED), (5, VIOLATION)]


def test_resubscribe_without_cancel_after_failover_gets_a_new_window_with_its_grace():
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1)
    h.add(2, "s", "failover", client="s", **{"from": "n1", "to": "n2"})
    h.subscribe(2.1, "s", member="n2")
    h.publish(2.3, 2, member="n2")  # inside the new grace
    r = h.check(end=10)
    row = path_row(r, "reliable", "s")
    assert row["expected"] == 1  # only seq 1, from the first window
    assert [(x["seq"], x["class"]) for x in r["lost"]] == [(1, VIOLATION)]


def test_unacknowledged_reliable_message_is_missing_but_not_lost():
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1, ack=False)
    r = h.check()
    row = path_row(r, "reliable", "s")
    assert (row["expected"], row["acknowledged"], row["missing"], row["lost"]) == (1, 0, 1, 0)
    assert r["ok"]


# -- classification ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "target", "at", "cls"),
    [
        ("kill", "n1", 5, ALLOWED_DIED),
        ("kill", "all", 5, ALLOWED_DIED),
        ("restart", "n1", 5, VIOLATION),  # a restart is the member coming back, not dying
        ("kill", "n1", 30, VIOLATION),  # a kill long after the publish explains nothing
        ("kill", "n1", 0.5, VIOLATION),  # killed before the publish: the restarted member acked it
        ("kill", "n2", 5, VIOLATION),  # another member died
        ("pause", "n1", 5, VIOLATION),  # a pause shorter than subscriber_timeout loses nothing
    ],
)
def test_loss_classified_by_the_fault_on_the_acking_member(fault, target, at, cls):
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1)
    h.fault(at, fault, target, "start")
    h.fault(at + 1, fault, target, "end")
    r = h.check()
    assert [x["class"] for x in r["lost"]] == [cls]
    assert r["ok"] is (cls != VIOLATION)


@pytest.mark.parametrize(
    ("length", "config", "cls"),
    [
        (11.0, "", ALLOWED_CUT),  # default subscriber_timeout 10 s
        (5.0, "", VIOLATION),
        (5.0, "[timeouts]\nsubscriber_timeout = 3.0\n", ALLOWED_CUT),  # from run.json's config_text
    ],
)
def test_loss_when_the_member_was_cut_off_past_subscriber_timeout(tmp_path, capsys, length, config, cls):
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1)
    h.fault(2, "partition", "n1", "start")
    h.fault(2 + length, "partition", "n1", "end")
    code, r = run_json(capsys, h.write(tmp_path / "run", end=30, config_text=config))
    assert [x["class"] for x in r["lost"]] == [cls]
    assert code == (0 if cls != VIOLATION else 1)


@pytest.mark.parametrize(
    ("how", "cls"),
    [
        ("same", VIOLATION),
        ("members", "allowed: published through different members"),
        ("failover", "allowed: publisher failed over"),
        ("crash", "allowed: publishing member crashed"),
    ],
)
def test_reordering_is_a_violation_only_within_one_member_stream(how, cls):
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1, member="n1")
    h.publish(1.1, 2, member="n2" if how == "members" else "n1")
    if how == "failover":
        h.add(1.2, "pub-0", "failover", client="pub-0", **{"from": "n1", "to": "n2"})
    if how == "crash":
        h.fault(1.2, "kill", "n1", "start")
    h.deliver(1.5, "s", 2)
    h.deliver(1.6, "s", 1)
    r = h.check()
    assert [(x["seq"], x["after_seq"], x["class"]) for x in r["reordered"]] == [(1, 2, cls)]
    assert path_row(r, "reliable", "s")["reordered"] == 1
    assert r["ok"] is (cls != VIOLATION)


def test_fire_mode_duplicates_are_violations_and_its_losses_and_reorders_are_not():
    h = History()
    h.subscribe(0, "s", mode="fire")
    for seq in (1, 2, 3, 4):
        h.publish(seq, seq, mode="reliable")  # a reliable publish to a fire subscription is delivered as fire
    h.deliver(2.1, "s", 2, mode="fire")
    h.deliver(2.2, "s", 1, mode="fire")
    h.deliver(3.1, "s", 3, mode="fire")
    h.deliver(3.2, "s", 3, mode="fire")
    r = h.check()
    row = path_row(r, "fire", "s")
    assert (row["expected"], row["acknowledged"], row["delivered"], row["missing"], row["lost"]) == (4, 0, 3, 1, 0)
    assert (row["duplicated"], row["reordered"]) == (1, 1)
    assert r["modes"]["reliable"]["paths"] == []
    assert [(v["kind"], v["seq"]) for v in r["violations"]] == [("duplicated", 3)]


def test_a_delivery_of_a_message_never_published_is_a_phantom():
    h = History()
    h.subscribe(0, "s")
    h.deliver(1, "s", 7)
    r = h.check()
    assert [(v["kind"], v["seq"]) for v in r["violations"]] == [("phantom", 7)]
    assert r["input"]["phantom_deliveries"] == 1


# -- latency, faults, agreement ---------------------------------------------------------------------


def test_latency_percentiles_by_nearest_rank_over_first_deliveries():
    h = History()
    h.subscribe(0, "s")
    for seq in range(1, 11):
        h.publish(seq, seq)
        h.deliver(seq + seq / 1000, "s", seq)  # seq ms
    h.deliver(20, "s", 10)  # a duplicate does not count
    lat = h.check()["modes"]["reliable"]["latency"]
    assert lat["n"] == 10
    assert [round(lat[k] * 1000, 6) for k in ("p50", "p90", "p99", "max")] == [5, 9, 10, 10]
    assert rules.percentile([1.0, 2.0, 3.0], 50) == 2.0


def test_fault_delivery_gap_and_time_to_recover():
    h = History()
    h.subscribe(0, "s")
    for seq, at in enumerate([9, 10.5, 11, 13, 14, 20], 1):
        h.publish(at - 0.01, seq)
        h.deliver(at, "s", seq)
    h.fault(10, "partition", "n1", "start")
    h.fault(12, "partition", "n1", "end")
    h.fault(25, "pause", "n2", "start")  # never ended: lasts to the run's end, no delivery after
    f1, f2 = h.check(end=30)["faults"]
    assert (f1["fault"], f1["target"], f1["healed"], f1["deliveries"]) == ("partition", "n1", True, 4)
    assert f1["gap"] == pytest.approx(3.0)  # 14 -> 17 (end + 5 s)
    assert f1["recover"] == pytest.approx(1.0)  # 12 -> 13
    assert (f2["healed"], f2["end"], f2["recover"], f2["deliveries"]) == (False, None, None, 0)
    assert f2["gap"] == pytest.approx(5.0)  # 25 -> the run's end at 30, not 35: nothing after it counts


def test_members_disagreeing_after_the_heal_is_a_violation(tmp_path, capsys):
    gen_events.generate(tmp_path, events=2000, seed=2, disagree=True)
    code, report = run_json(capsys, tmp_path)
    assert code == 1
    assert report["agreement"]["agreed"] is False
    assert [v["kind"] for v in report["violations"]] == ["disagreement"]


def test_partitioned_members_agree_when_each_partitions_owners_do():
    """Partitioned members hold different partitions: only owners of the same one are compared."""
    a, b, c = "p:0=aa;1=bb", "p:1=bb;2=cc", "p:0=aa;2=cc"
    assert rules.agreement({"n1": a, "n2": b, "n3": c}) is True
    assert rules.agreement({"n1": a, "n2": "p:1=bf;2=cc", "n3": c}) is False  # (partition 1 differs)
    assert rules.agreement({"n1": a, "n2": None, "n3": c}) is False
    assert rules.agreement({"n1": "d1", "n2": "d1"}) is True and rules.agreement({"n1": "d1", "n2": "d2"}) is False
    assert rules.agreement({}) is None


def test_no_status_events_leaves_agreement_unknown():
    h = History()
    h.subscribe(0, "s")
    r = h.check()
    assert r["agreement"] == {"agreed": None, "digests": {}, "missing": ["n1", "n2", "n3"]}
    assert r["ok"]


# -- the command line -------------------------------------------------------------------------------


def test_exit_status_2_for_unusable_input(tmp_path, capsys):
    assert check.main([str(tmp_path / "nowhere")]) == 2
    (tmp_path / "run.json").write_text("{not json")
    assert check.main([str(tmp_path)]) == 2
    (tmp_path / "run.json").write_text("{}")
    assert check.main([str(tmp_path)]) == 2  # no events/
    (tmp_path / "events").mkdir()
    (tmp_path / "events" / "pub-0.jsonl").write_text("garbage\n")
    assert check.main([str(tmp_path)]) == 2  # no valid event
    assert "no valid event" in capsys.readouterr().err


def test_json_report_matches_its_schema_and_out_writes_the_same(tmp_path, capsys):
    run_dir = tmp_path / "run"
    gen_events.generate(run_dir, events=4000, seed=5, lose=1, dup=1, reorder=1, kill_lose=1, malformed=2, disagree=True)
    out = tmp_path / "report.json"
    code, stdout = run_cli(capsys, run_dir, "--json", "--out", str(out))
    assert code == 1
    report = json.loads(stdout)
    jsonschema.validate(report, reportschema.REPORT_SCHEMA)
    assert json.loads(out.read_text()) == report
    assert {v["kind"] for v in report["violations"]} == {"lost", "duplicated", "reordered", "disagreement"}
    broken = dict(report, modes={"reliable": report["modes"]["reliable"]})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, reportschema.REPORT_SCHEMA)


def test_text_report_has_a_table_per_mode_and_lists_violations(tmp_path, capsys):
    truth = gen_events.generate(tmp_path, events=3000, seed=7, lose=1)
    code, text = run_cli(capsys, tmp_path)
    assert code == 1
    assert "\nreliable: " in text and "\nfire: " in text and "latency (n=" in text
    pid, seq, sub = truth["lost"][0]
    assert f"lost         pid {pid} seq {seq} sub {sub} member " in text
    assert text.rstrip().endswith("FAIL: 1 lost")


def test_script_runs_standalone(tmp_path):
    gen = subprocess.run(
        [sys.executable, "scripts/gen_events.py", str(tmp_path), "--events", "1500", "--seed", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert gen.returncode == 0, gen.stderr
    r = subprocess.run(
        [sys.executable, "scripts/check.py", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "OK: no promise broken" in r.stdout


def test_a_cancel_long_after_the_publish_explains_no_loss():
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1)  # never delivered
    h.cancel(60, "s")  # far past the horizon
    r = h.check(end=100)
    assert [(x["seq"], x["class"]) for x in r["lost"]] == [(1, VIOLATION)]


def test_a_cut_that_starts_long_after_the_publish_explains_no_loss(tmp_path, capsys):
    h = History()
    h.subscribe(0, "s")
    h.publish(1, 1)
    h.fault(60, "partition", "n1", "start")
    h.fault(72, "partition", "n1", "end")  # longer than subscriber_timeout, but far too late
    code, r = run_json(capsys, h.write(tmp_path / "run", end=100))
    assert [x["class"] for x in r["lost"]] == [VIOLATION] and code == 1


@pytest.mark.parametrize(
    ("published", "cls"),
    [
        (3.0, "allowed: subscription not yet at the member (confirmed while members were apart)"),
        (9.0, VIOLATION),  # well after the heal: the subscription had reached n1
    ],
)
def test_a_subscription_confirmed_while_a_member_was_apart_misses_what_that_member_took_until_the_heal(
        published, cls):  # fmt: skip
    h = History()
    h.fault(1, "partition", "n1", "start")
    h.subscribe(2, "s", member="n2")  # confirmed by n2 while n1 is cut off
    h.fault(5, "partition", "n1", "end")
    h.publish(published, 1)  # at n1
    r = h.check(end=30)
    assert [x["class"] for x in r["lost"]] == [cls]


def test_a_member_whose_status_could_not_be_read_is_a_disagreement():
    h = History()
    h.add(50, "status", "status", member="n1", digest="abc", subscriptions=1, state="ready")
    h.add(50, "status", "status", member="n2", digest=None, subscriptions=None, state="unreachable")
    r = h.check(end=60)
    assert r["agreement"]["agreed"] is False and not r["ok"]
    assert [v["kind"] for v in r["violations"]] == ["disagreement"]


def test_the_text_report_names_an_unreachable_member(tmp_path, capsys):
    h = History()
    h.add(50, "status", "status", member="n1", digest="abc", subscriptions=1, state="ready")
    h.add(50, "status", "status", member="n2", digest=None, subscriptions=None, state="unreachable")
    code, text = run_cli(capsys, h.write(tmp_path / "run", end=60))
    assert code == 1 and "n2=unreachable" in text


def test_a_puback_without_a_member_still_acknowledges_and_its_loss_counts():
    """chaos_worker.py writes a null member while the publisher has none; the message was
    acknowledged all the same, so never delivering it is a loss (once taken for unacknowledged,
    which hid such losses). Only a fault on every member can explain it."""
    h = History()
    h.subscribe(0, "s", member=None)  # (a subscription confirmed before the member was known)
    h.add(1, "pub-0", "publish", pid="p1", seq=1, topic="t", key=None, mode="reliable", member=None)
    h.add(1.001, "pub-0", "puback", pid="p1", seq=1, member=None)
    r = h.check()
    row = path_row(r, "reliable", "s")
    assert (row["expected"], row["acknowledged"], row["lost"]) == (1, 1, 1)
    assert r["lost"][0]["member"] is None and r["lost"][0]["class"] == VIOLATION
    assert r["published"]["reliable"] == {"messages": 1, "acknowledged": 1}
    h.fault(2, "kill", "all", "start")
    assert h.check()["lost"][0]["class"] == ALLOWED_DIED
