"""The member's disk runner (cluster/logstore.py) on real files: a failed disk action is reported
as ``LogFailed`` and nothing after it in the batch is done; the member core stops on it."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from cluster.events import LogFailed, LogWritten
from cluster.logstore import LogStore
from cluster.partitionlog import Append, LogSettings, ReadLog
from node.segmentlog import Record


def _store(tmp_path: Path, lines: list[tuple[Any, ...]]) -> LogStore:
    return LogStore(tmp_path / "log", lambda level, event, **f: lines.append((level, event, f)), LogSettings(), 4096)


def _recs(start: int, n: int) -> list[Record]:
    return [Record(o, 1000 + o, b"x" * 200) for o in range(start, start + n)]


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
