"""The member's disk runner (cluster/logstore.py) on real files: a failed disk action is reported
as ``LogFailed`` and nothing after it in the batch is done; the member core stops on it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from roost.cluster.events import LogFailed, LogReloaded, LogWritten
from roost.cluster.logrecords import message_body
from roost.cluster.logstore import LogStore
from roost.cluster.partitionlog import (
    Append,
    Checkpoint,
    LogSettings,
    ReadLog,
    Reload,
    ResetLog,
    Sync,
    Truncate,
)
from roost.node.segmentlog import Record


def _store(tmp_path: Path, lines: list[tuple[Any, ...]]) -> LogStore:
    return LogStore(tmp_path / "log", lambda level, event, **f: lines.append((level, event, f)), LogSettings(), 4096)


def _recs(start: int, n: int) -> list[Record]:
    return [Record(o, 1000 + o, message_body(1, ["t", None, None, b"x" * 180], b"p", o + 1))
            for o in range(start, start + n)]  # fmt: skip


def test_a_write_that_fails_is_reported_and_the_rest_of_its_batch_is_not_done(tmp_path: Path) -> None:
    lines: list[tuple[Any, ...]] = []
    store = _store(tmp_path, lines)
    assert store.perform_all([Append(0, _recs(0, 5), True)]) == [LogWritten(0, 5)]
    shutil.rmtree(tmp_path / "log" / "p00000")  # (the disk fails: the next segment cannot be made)
    out = store.perform_all([Append(0, _recs(5, 30), True), Append(0, _recs(35, 1), True), ReadLog(0, 0, 10, "t")])
    assert len(out) == 1 and isinstance(out[0], LogFailed) and out[0].partition == 0, out
    assert "No such file or directory" in out[0].reason
    assert [(lv, ev) for lv, ev, _ in lines] == [("error", "log_failed")]


def test_a_read_of_a_damaged_record_is_a_failed_log_not_a_dead_worker(tmp_path: Path) -> None:
    lines: list[tuple[Any, ...]] = []
    store = _store(tmp_path, lines)
    store.perform_all([Append(0, _recs(0, 5), True)])
    seg = next((tmp_path / "log" / "p00000").glob("*.log"))
    data = bytearray(seg.read_bytes())
    data[:4] = (0xFFFFFFF0).to_bytes(4, "big")  # (a garbage length in the first record)
    seg.write_bytes(bytes(data))
    out = store.perform_all([ReadLog(0, 0, 10, "t")])
    assert len(out) == 1 and isinstance(out[0], LogFailed) and "offset 0 is damaged" in out[0].reason


def test_the_commit_checkpoint_is_written_after_its_records_and_read_at_start(tmp_path: Path) -> None:
    """A restarted owner took ``end - max_uncommitted`` as its commit: a bound that appends outside
    the room check (EPOCH, cursors) could break, so a restarted leader could serve records never
    committed. The commit it knew is now kept beside the log and read back at start. (When the
    core asks for one, and that it never lowers it but for a cut: tests/test_partitionlog_disk.py.)"""
    lines: list[tuple[Any, ...]] = []
    store = _store(tmp_path, lines)
    out = store.perform_all([Append(0, _recs(0, 5), True), Checkpoint(0, 2), Append(0, _recs(5, 5), True),
                             Checkpoint(0, 4)])  # fmt: skip
    assert out == [LogWritten(0, 10), LogWritten(0, 10)]  # (one run, one fsync: the checkpoints go with it)
    assert (tmp_path / "log" / "p00000" / "commit").read_text() == "4\n"
    assert store.perform_all([Append(0, _recs(10, 1), False), Sync(0)]) == [LogWritten(0, 11), None]
    store.close()
    assert _store(tmp_path, lines).open_all().logs[0].commit == 4
    (tmp_path / "log" / "p00000" / "commit").write_text("garbage")
    assert _store(tmp_path, lines).open_all().logs[0].commit == 0  # (nothing known committed: safe)


def test_a_cut_below_the_checkpoint_lowers_it(tmp_path: Path) -> None:
    """Cold review: a truncate below the checkpoint left it there, so after a restart the records
    of the next branch at those offsets counted as committed."""
    lines: list[tuple[Any, ...]] = []
    store = _store(tmp_path, lines)
    store.perform_all([Append(0, _recs(0, 7), True), Checkpoint(0, 6)])
    store.perform_all([Checkpoint(0, 3), Truncate(0, 3), Append(0, _recs(3, 5), True)])  # (as the core asks)
    store.close()
    assert _store(tmp_path, lines).open_all().logs[0].commit == 3


def test_a_reload_cuts_the_log_and_reads_it_again(tmp_path: Path) -> None:
    store = _store(tmp_path, [])
    store.perform_all([Append(0, _recs(0, 10), True), Checkpoint(0, 8)])
    (_, ev) = store.perform_all([Checkpoint(0, 6), Reload(0, 6)])
    assert isinstance(ev, LogReloaded) and ev.partition == 0
    assert (ev.scan.start, ev.scan.end, ev.scan.commit) == (0, 6, 6)
    assert ev.scan.state.producers == {b"p": (6, 5)}
    assert store.perform_all([ReadLog(0, 0, 100, "t")])[0].records[-1].offset == 5


def test_an_empty_log_reset_to_a_later_start_begins_there_after_a_restart(tmp_path: Path) -> None:
    """Second review: a follower reset to its leader's start 10 with no record yet was left out of
    what a restart reads: its core began at 0 and its first append failed, at every start."""
    store = _store(tmp_path, [])
    store.perform_all([ResetLog(0, 10)])
    store.close()
    store = _store(tmp_path, [])
    scan = store.open_all().logs[0]
    assert (scan.start, scan.end) == (10, 10)
    assert store.perform_all([Append(0, _recs(10, 1), True)]) == [LogWritten(0, 11)]


def test_a_seen_file_of_an_older_version_is_ignored_and_an_empty_directory_opens_no_log(tmp_path: Path) -> None:
    """The claims' ``seen`` file is gone with the quorum (docs/durable.md): one left by an older
    version, even garbled, neither stops the open nor makes a log."""
    (tmp_path / "log" / "p00003").mkdir(parents=True)
    (tmp_path / "log" / "p00003" / "seen").write_text("garbage")
    store = _store(tmp_path, [])
    read = store.open_all()
    assert read.logs == {} and read.error == "" and not store.logs
