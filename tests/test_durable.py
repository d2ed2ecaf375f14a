"""Durable logs in a real member process: recovered from disk at start, a torn tail cut and logged."""

from __future__ import annotations

from pathlib import Path

import msgpack

from node.segmentlog import Record, SegmentLog, encode_record
from tests.clusterkit import LocalCluster
from tests.polling import wait_until


def test_a_member_recovers_its_partition_logs_at_start_and_cuts_a_torn_tail(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, n=1, cluster_extra='mode = "partitioned"\npartitions = 16\n')
    logdir = tmp_path / "data" / "n1" / "log" / "p00003"
    log, _ = SegmentLog.open(logdir)
    bodies = [msgpack.packb([1, 2])] + [msgpack.packb([1, 0, "t", None, None, b"m%d" % i, b"P" * 16, i])
                                        for i in range(1, 6)]  # fmt: skip
    log.append([Record(o, 1000 + o, b) for o, b in enumerate(bodies)])
    log.close()
    seg = next(logdir.glob("*.log"))
    torn = seg.read_bytes()[:-7]
    seg.write_bytes(torn)  # the last record half written (a crash mid-append)
    c.start()
    try:
        wait_until(lambda: "event=logs_read" in c.log("n1"), what="logs read")
        text = c.log("n1")
        assert "event=log_tail_cut partition=3 cut_at=5" in text, text
        assert "event=logs_read partitions=1 records=5" in text
        # the only member leads the partition: it claims it with a new epoch, written on disk
        cut = sum(len(encode_record(o, 1000 + o, b)) for o, b in enumerate(bodies[:5]))  # (where m5 began)
        wait_until(lambda: seg.stat().st_size > cut, what="the EPOCH record")  # (read-only: it is the member's)
    finally:
        c.stop()
    after = SegmentLog.open(logdir)[0].read(0, max_records=100)
    assert [msgpack.unpackb(r.body)[5] for r in after[1:5]] == [b"m1", b"m2", b"m3", b"m4"]  # m5 was cut
    epoch = msgpack.unpackb(after[5].body)
    assert epoch[1] == 2 and epoch[0] > 1  # an EPOCH record above the one in the log
