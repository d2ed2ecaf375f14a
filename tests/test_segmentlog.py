"""The partition log on real files: append, roll, index, read, retention, truncation, torn tails."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from roost.node.segmentlog import HEADER, INDEX_ENTRY, LogCorrupt, LogUsage, Record, SegmentLog, encode_record


def recs(start: int, n: int, size: int = 50, t0: int = 1000) -> list[Record]:
    return [Record(o, t0 + o, bytes([o % 251]) * size) for o in range(start, start + n)]


def opened(d: Path, **kw: int) -> SegmentLog:
    log, _ = SegmentLog.open(d, **kw)
    return log


def test_appended_records_read_back_in_order_across_segments(tmp_path: Path) -> None:
    log = opened(tmp_path, segment_bytes=1000, index_bytes=200)
    log.append(recs(0, 100))
    assert log.sync() == 100
    assert len(log.segments) > 5  # 100 records of ~76 bytes in 1000-byte segments
    assert [s.size <= 1000 for s in log.segments] == [True] * len(log.segments)
    got = log.read(0, max_bytes=1 << 30, max_records=1000)
    assert got == recs(0, 100)
    assert log.read(37, max_records=5) == recs(37, 5)
    assert log.read(99) == recs(99, 1)
    assert log.read(100) == []


def test_read_stops_at_max_bytes_but_returns_at_least_one(tmp_path: Path) -> None:
    log = opened(tmp_path)
    log.append(recs(0, 10, size=400))
    assert [r.offset for r in log.read(0, max_bytes=1000)] == [0, 1]
    assert [r.offset for r in log.read(3, max_bytes=10)] == [3]


def test_an_offset_that_does_not_follow_on_is_refused_and_changes_nothing(tmp_path: Path) -> None:
    log = opened(tmp_path)
    log.append(recs(0, 3))
    with pytest.raises(LogUsage, match="append of offset 5, the log ends at 3"):
        log.append(recs(5, 1))
    with pytest.raises(LogUsage, match="over max_record"):
        log.append([Record(3, 0, b"x" * (3 << 20))])
    assert log.end == 3
    assert log.read(0) == recs(0, 3)


def test_reopen_finds_every_record_and_appends_after_them(tmp_path: Path) -> None:
    log = opened(tmp_path, segment_bytes=1000)
    log.append(recs(0, 40))
    log.close()
    log2, rec = SegmentLog.open(tmp_path, segment_bytes=1000)
    assert (log2.start, log2.end, rec.cut_bytes, rec.indexes_rebuilt) == (0, 40, 0, 0)
    log2.append(recs(40, 5))
    assert log2.read(0, max_bytes=1 << 30) == recs(0, 45)


@pytest.mark.parametrize("damage", ["cut", "crc", "garbage"])
def test_a_torn_tail_is_cut_at_the_first_bad_record_and_reported(tmp_path: Path, damage: str) -> None:
    log = opened(tmp_path)
    log.append(recs(0, 10))
    log.close()
    seg = sorted(tmp_path.glob("*.log"))[-1]
    data = bytearray(seg.read_bytes())
    seven = data.index(encode_record(7, 1007, bytes([7]) * 50))
    if damage == "cut":
        data = data[: seven + 30]  # record 7 half written
    elif damage == "crc":
        data[seven + HEADER.size + 3] ^= 0xFF  # a flipped bit in record 7's body
    else:
        data = data[:seven] + b"\x00\x00\x10\x00" + bytes(40)  # a length past the end
    seg.write_bytes(bytes(data))
    log2, rec = SegmentLog.open(tmp_path)
    assert rec.cut_at == 7
    assert rec.cut_bytes == len(data) - seven
    assert rec.cut_reason
    assert log2.end == 7
    assert log2.read(0, max_records=100) == recs(0, 7)
    assert seg.stat().st_size == seven  # cut on disk too, so a second open finds it clean
    log2.append(recs(7, 1))
    log2.close()
    log3, rec3 = SegmentLog.open(tmp_path)
    assert (rec3.cut_bytes, log3.end) == (0, 8)


def test_damage_in_a_closed_segment_refuses_to_open_naming_the_file(tmp_path: Path) -> None:
    log = opened(tmp_path, segment_bytes=1000)
    log.append(recs(0, 40))
    log.close()
    first = sorted(tmp_path.glob("*.log"))[0]
    data = bytearray(first.read_bytes())
    data[HEADER.size + 2] ^= 0xFF
    first.write_bytes(bytes(data))
    first.with_suffix(".index").unlink()  # so the segment is scanned
    with pytest.raises(LogCorrupt, match=rf"{first.name}: a bad CRC at byte 0"):
        SegmentLog.open(tmp_path, segment_bytes=1000)


def test_a_bad_index_is_rebuilt_and_reads_still_find_records(tmp_path: Path) -> None:
    log = opened(tmp_path, segment_bytes=2000, index_bytes=100)
    log.append(recs(0, 60))
    log.close()
    idx = sorted(tmp_path.glob("*.index"))[0]
    idx.write_bytes(INDEX_ENTRY.pack(5, 999_999))  # points past the segment
    log2, rec = SegmentLog.open(tmp_path, segment_bytes=2000, index_bytes=100)
    assert rec.indexes_rebuilt == 1
    assert log2.read(3, max_records=2) == recs(3, 2)
    assert len(idx.read_bytes()) > INDEX_ENTRY.size  # rewritten


def test_retention_deletes_closed_segments_by_size_and_by_age_never_the_active_one(tmp_path: Path) -> None:
    log = opened(tmp_path, segment_bytes=1000)
    log.append(recs(0, 100))  # times 1000..1099
    n = len(log.segments)
    assert log.retain(now_ms=0, max_bytes=1 << 40, max_age_ms=1 << 40) == []
    gone = log.retain(now_ms=0, max_bytes=3000, max_age_ms=1 << 40)
    assert gone and log.size <= 3000 + 1000
    assert log.start == log.segments[0].base > 0
    assert log.read(0)[0].offset == log.start  # a read before the start begins at the start
    newest_closed = log.segments[-2].last_ms
    assert newest_closed is not None
    log.retain(now_ms=newest_closed + 11, max_bytes=1 << 40, max_age_ms=10)
    assert len(log.segments) == 1 and n > 1
    assert log.end == 100
    assert not [p for p in tmp_path.iterdir() if p.stem.isdigit() and int(p.stem) < log.start]
    log.close()
    assert SegmentLog.open(tmp_path, segment_bytes=1000)[0].start == log.start


def test_truncate_cuts_the_tail_across_segments_and_survives_reopen(tmp_path: Path) -> None:
    log = opened(tmp_path, segment_bytes=1000)
    log.append(recs(0, 50))
    log.truncate(23)
    assert log.end == 23
    assert log.read(0, max_bytes=1 << 30, max_records=100) == recs(0, 23)
    log.append(recs(23, 2, size=10))
    log.close()
    log2 = opened(tmp_path, segment_bytes=1000)
    assert log2.end == 25
    assert log2.read(22, max_records=3) == [*recs(22, 1), *recs(23, 2, size=10)]
    with pytest.raises(LogUsage):
        log2.truncate(-1)


def test_reset_starts_an_empty_log_at_a_later_offset(tmp_path: Path) -> None:
    log = opened(tmp_path)
    log.append(recs(0, 5))
    log.reset(1000)
    assert (log.start, log.end, log.read(0)) == (1000, 1000, [])
    log.append(recs(1000, 2))
    log.close()
    assert opened(tmp_path).read(0) == recs(1000, 2)


def test_offset_for_time_finds_the_first_record_at_or_after(tmp_path: Path) -> None:
    log = opened(tmp_path, segment_bytes=1000)
    log.append(recs(0, 50))
    assert log.offset_for_time(0) == 0
    assert log.offset_for_time(1030) == 30
    assert log.offset_for_time(5000) == 50


def test_sync_fsyncs_the_segment_and_a_new_directory_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[int] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    log = opened(tmp_path)
    synced.clear()
    assert log.sync() == 0 and len(synced) == 1  # the directory (a segment was created)
    synced.clear()
    log.append(recs(0, 1))
    log.sync()
    assert len(synced) == 1  # the segment
    synced.clear()
    log.sync()
    assert synced == []  # nothing new


def test_retention_keeps_the_segment_holding_keep_from_and_says_where_it_wanted_to_go(tmp_path: Path) -> None:
    log = opened(tmp_path, segment_bytes=1000)
    log.append(recs(0, 100))
    bases = [s.base for s in log.segments]
    assert len(bases) > 3
    keep = bases[1] + 1  # (inside the second segment: only the first may go)
    assert log.retain(now_ms=1 << 40, max_bytes=1 << 40, max_age_ms=1, keep_from=keep) == [bases[0]]
    assert (log.start, log.wanted) == (bases[1], bases[-1])  # (age: every closed segment, were it not for keep)
    assert log.retain(now_ms=1 << 40, max_bytes=1 << 40, max_age_ms=1, keep_from=0) == []
    assert log.retain(now_ms=1 << 40, max_bytes=1 << 40, max_age_ms=1) == bases[1:-1]
    assert log.start == bases[-1] and log.read(log.start)[0].offset == bases[-1]


@pytest.mark.parametrize("damage", ["crc", "length"])
def test_a_read_that_meets_a_damaged_record_raises_log_corrupt(tmp_path: Path, damage: str) -> None:
    """Damage after the log was opened (recovery checked it then): a read checks each record as
    recovery does. Before, a garbage length became a read of gigabytes that killed the disk worker."""
    log = opened(tmp_path, segment_bytes=100_000)
    log.append(recs(0, 10))
    log.flush()
    seg = sorted(tmp_path.glob("*.log"))[0]
    at = 3 * (HEADER.size + 50)  # (record 3)
    data = bytearray(seg.read_bytes())
    if damage == "crc":
        data[at + HEADER.size + 1] ^= 0xFF
    else:
        data[at : at + 4] = (0xFFFFFFF0).to_bytes(4, "big")
    seg.write_bytes(bytes(data))
    assert [r.offset for r in log.read(0, max_records=3)] == [0, 1, 2]
    with pytest.raises(LogCorrupt, match=rf"{seg.name}: the record at offset 3 is damaged"):
        log.read(0)
    with pytest.raises(LogCorrupt):
        log.offset_for_time(1003)


class CountingLog(SegmentLog):
    """A log that notes how many records each read asks for (a spy by subclass: no method of the
    product is replaced)."""

    seen: list[int]

    def read(self, start: int, max_bytes: int = 1 << 20, max_records: int = 1000) -> list[Record]:
        self.seen.append(max_records)
        return super().read(start, max_bytes, max_records)


def test_offset_for_time_reads_a_large_segment_a_chunk_at_a_time(tmp_path: Path) -> None:
    log, _ = CountingLog.open(tmp_path, segment_bytes=1 << 24)
    assert isinstance(log, CountingLog)
    log.append(recs(0, 2500, size=10))
    log.seen = []
    assert log.offset_for_time(1000 + 2400) == 2400
    assert log.seen == [1000, 1000, 1000]  # (three chunks of 1000, never the whole segment at once)
