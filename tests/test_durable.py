"""Durable logs in a real member process: recovered from disk at start, a torn tail cut and logged."""

from __future__ import annotations

import datetime
import os
import re
import shutil
import signal
from pathlib import Path

import msgpack
import trio

from roost.client.clustermap import compute
from roost.client.library import Client
from roost.client.offsets import OffsetFile
from roost.cluster.config import load_cluster_config
from roost.node.segmentlog import Record, SegmentLog, encode_record
from tests.clusterkit import LocalCluster, roost
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


def _stored(tmp_path: Path, member: str, topic: str) -> list[bytes]:
    """The payloads of ``topic`` in every partition log of ``member`` (read after it stopped)."""
    out = []
    for d in sorted((tmp_path / "data" / member / "log").glob("p*")):
        for r in SegmentLog.open(d)[0].read(0, max_bytes=1 << 40, max_records=1 << 40):
            b = msgpack.unpackb(r.body)
            if b[1] == 0 and b[2] == topic:
                out.append(b[5])
    return out


def test_durable_puts_through_the_client_are_on_both_owners_and_outlive_a_kill9_of_the_primary(
        tmp_path: Path) -> None:  # fmt: skip
    c = LocalCluster(tmp_path, n=3, cluster_extra='mode = "partitioned"\npartitions = 8\n')
    c.start()
    acked: list[int] = []
    try:
        wait_until(lambda: all(c.status(m)["state"] == "ready" for m in c.ids), what="ready")

        async def put(lo: int, hi: int, via: str) -> None:
            async with Client(c.addr(via)) as cl:
                for i in range(lo, hi):
                    await cl.put("orders", f"o{i}")
                assert await cl.flush(30)
                acked.extend(range(lo, hi))

        trio.run(put, 0, 50, "n1")
        owners = _owners_of(c, "orders")
        c.kill(owners[0])  # the primary dies; its secondary takes the log over
        trio.run(put, 50, 100, next(m for m in c.ids if m != owners[0]))
    finally:
        c.stop()
    assert acked == list(range(100))
    for m in c.ids:  # (the two left own every partition: the puts after the kill committed on both)
        if m != owners[0]:
            assert _stored(tmp_path, m, "orders") == [f"o{i}".encode() for i in acked], m  # once each, in order


def _owners_of(c: LocalCluster, topic: str) -> list[str]:
    """The owners of ``topic``'s partition in the map with every member live (what each computes)."""
    cc = load_cluster_config(c.config)
    members = {m.id: (m.client_addr, m.peer_addr) for m in cc.members}
    cmap = compute(1, members, set(members), cc.settings.partitions, cc.settings.replicas)
    return list(cmap.owners[cmap.partition(topic)])


def test_roost_put_stores_durably_and_says_why_not_without_a_partitioned_cluster(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, n=2, cluster_extra='mode = "partitioned"\npartitions = 4\n')
    c.start()
    try:
        wait_until(lambda: all(c.status(m)["state"] == "ready" for m in c.ids), what="ready")
        r = roost("put", "audit", "e{n}", "--count", "5", "--node", c.addr("n2"))
        assert r.returncode == 0, r.stderr
        r = roost("put", "audit", "--node", c.addr("n1"), input="x\ny\n")
        assert r.returncode == 0, r.stderr
    finally:
        c.stop()
    assert _stored(tmp_path, "n1", "audit") == [b"e0", b"e1", b"e2", b"e3", b"e4", b"x", b"y"]
    assert _stored(tmp_path, "n2", "audit") == _stored(tmp_path, "n1", "audit")
    (tmp_path / "replicated").mkdir()
    plain = LocalCluster(tmp_path / "replicated", n=1)  # (a replicated cluster: no map, no partition logs)
    plain.start()
    try:
        r = roost("put", "audit", "x", "--node", plain.addr("n1"))
        assert r.returncode != 0 and "durable topics need a partitioned cluster" in r.stderr, r.stderr
    finally:
        plain.stop()


def test_roost_get_reads_from_the_cursor_and_a_new_primary_keeps_it(tmp_path: Path) -> None:
    """put 6, get 2 (committed), get 2 without commit (a crashed reader), then the primary dies:
    the next get starts at the committed cursor, so the uncommitted 2 come again, and nothing
    committed comes twice."""
    c = LocalCluster(tmp_path, n=3, cluster_extra='mode = "partitioned"\npartitions = 4\n')
    c.start()
    try:
        wait_until(lambda: all(c.status(m)["state"] == "ready" for m in c.ids), what="ready")
        assert roost("put", "jobs", "j{n}", "--count", "6", "--node", c.addr("n1")).returncode == 0
        r = roost("get", "jobs", "--durable", "w", "--count", "2", "--node", c.addr("n2"))
        assert (r.returncode, r.stdout) == (0, "j0\nj1\n"), r.stderr

        async def crashed_reader() -> list[bytes]:  # reads two and never commits
            async with Client(c.addr("n3")) as cl:
                return [m.payload for m in await cl.get("jobs", "w", 2, timeout=10)]

        assert trio.run(crashed_reader) == [b"j2", b"j3"]
        owners = _owners_of(c, "jobs")
        c.kill(owners[0])
        alive = next(m for m in c.ids if m != owners[0])
        r = roost("get", "jobs", "--durable", "w", "--count", "4", "--node", c.addr(alive), "--timeout", "20")
        assert (r.returncode, r.stdout) == (0, "j2\nj3\nj4\nj5\n"), r.stderr
        r = roost("get", "jobs", "--durable", "w", "--count", "1", "--node", c.addr(alive), "--timeout", "1")
        assert r.returncode == 1 and r.stdout == "" and "with 0 of 1" in r.stderr  # all committed
        r = roost("get", "jobs", "--durable", "other", "--start", "latest", "--node", c.addr(alive),
                  "--timeout", "1")  # fmt: skip
        assert r.returncode == 1 and r.stdout == ""  # a new subscription at the end sees nothing old

        async def plain_reads() -> list[tuple[list[bytes], int]]:  # no subscription: offsets are the reader's
            async with Client(c.addr(alive)) as cl:
                a = await cl.read("jobs", 0, 4)
                b = await cl.read("jobs", a.next, 100)
                z = await cl.read("jobs", b.next, 100)
                assert a.first == 0 and a.end == b.end == z.end and z.next == b.next
                return [([m.payload for m in x.messages], x.next) for x in (a, b, z)]

        got = trio.run(plain_reads)
        assert [g[0] for g in got] == [[b"j0", b"j1", b"j2", b"j3"], [b"j4", b"j5"], []]

        async def reader_with_an_offsets_file(crash_before_commit: bool) -> list[bytes]:
            async with Client(c.addr(alive), offsets_dir=tmp_path / "offsets") as cl:
                got = [m.payload for m in await cl.get("jobs", "z", 2, timeout=10)]
                if crash_before_commit:  # (the offset is on our disk, the COMMIT never left)
                    OffsetFile(tmp_path / "offsets").save("default", "z", "jobs", cl.position("jobs", "z") or 0)
                else:
                    assert await cl.commit("jobs", "z")
                return got

        assert trio.run(reader_with_an_offsets_file, True) == [b"j0", b"j1"]
        assert trio.run(reader_with_an_offsets_file, False) == [b"j2", b"j3"]  # (the cluster gave j0, j1 again)
        r = roost("get", "jobs", "--durable", "z", "--offsets-dir", str(tmp_path / "offsets"), "--node",
                  c.addr(alive))  # fmt: skip
        assert (r.returncode, r.stdout) == (0, "j4\n"), r.stderr
    finally:
        c.stop()


def _cursors(tmp_path: Path, member: str) -> tuple[int, list[tuple[int, int]]]:
    """The first offset of ``member``'s partition logs and its CURSOR records (offset, value)."""
    starts, out = [], []
    for d in sorted((tmp_path / "data" / member / "log").glob("p*")):
        log = SegmentLog.open(d)[0]
        for r in log.read(0, max_bytes=1 << 40, max_records=1 << 40):
            b = msgpack.unpackb(r.body)
            if b[1] == 1:
                out.append((r.offset, b[4]))
        if log.end > log.start + 1:
            starts.append(log.start)
    return max(starts), out


def test_retention_and_fsync_interval_a_durable_cursor_outlives_the_segments_that_held_it(tmp_path: Path) -> None:
    """fsync = interval acknowledges puts; retention (by size, small segments) deletes old segments on
    both owners while they serve, and the cursor of a durable subscription, written before the deleted
    part, is written again by the primary: still on disk, and read back after a restart."""
    durable = ('[durable]\nfsync = "interval"\nfsync_interval = 0.05\nsegment_bytes = 4096\n'
               "retention_bytes = 8192\nretention_check_interval = 0.2\n")  # fmt: skip
    c = LocalCluster(tmp_path, n=2, cluster_extra='mode = "partitioned"\npartitions = 1\n' + durable)
    c.start()
    try:
        wait_until(lambda: all(c.status(m)["state"] == "ready" for m in c.ids), what="ready")
        assert roost("put", "r", "a{n}" + "." * 60, "--count", "50", "--node", c.addr("n1")).returncode == 0
        r = roost("get", "r", "--durable", "w", "--count", "45", "--node", c.addr("n2"))  # (all within 8 KB)
        assert r.returncode == 0 and r.stdout.splitlines()[-1].startswith("a44."), r.stderr
        assert roost("put", "r", "b{n}" + "." * 60, "--count", "400", "--node", c.addr("n2")).returncode == 0

        def retained_past_the_cursor(m: str) -> bool:  # (the first cursor record was at offset 51)
            starts = re.findall(r"event=log_retained partition=0 segments=\d+ start=(\d+)", c.log(m))
            return bool(starts) and int(starts[-1]) > 60

        wait_until(lambda: all(retained_past_the_cursor(m) for m in c.ids), what="retention on both")
    finally:
        c.stop()
    for m in c.ids:
        start, cursors = _cursors(tmp_path, m)
        assert start > 50 and cursors and all(o >= start for o, _ in cursors)  # (the first one was deleted)
        assert {v for _, v in cursors} == {46}  # (offset 0 is EPOCH: a0..a44 are 1..45, the cursor is past them)
        assert sum(f.stat().st_size for f in (tmp_path / "data" / m / "log").rglob("*.log")) <= 8192 + 2 * 4096
    c.start()
    try:
        # (a lost cursor would be made again at "latest" and see nothing; the kept one reads from the
        # log's start, as the a* records are gone)
        r = roost("get", "r", "--durable", "w", "--count", "1", "--start", "latest", "--node", c.addr("n1"),
                  "--timeout", "20")  # fmt: skip
        assert r.returncode == 0 and r.stdout.startswith("b"), (r.stdout, r.stderr)
    finally:
        c.stop()


def test_roost_get_start_at_a_time_older_than_the_members_cache(tmp_path: Path) -> None:
    c = LocalCluster(tmp_path, n=1, cluster_extra='mode = "partitioned"\npartitions = 2\n'
                     "[durable]\ncache_records = 100\nmax_uncommitted = 10\n")  # fmt: skip
    c.start()
    try:
        wait_until(lambda: c.status("n1")["state"] == "ready", what="ready")
        assert roost("put", "t", "old{n}", "--count", "150", "--node", c.addr("n1")).returncode == 0
        at = datetime.datetime.now(datetime.UTC)  # (after every old one was acknowledged: stored before it)
        assert roost("put", "t", "new{n}", "--count", "150", "--node", c.addr("n1")).returncode == 0
        r = roost("get", "t", "--durable", "w", "--count", "2", "--start", at.isoformat(), "--node", c.addr("n1"))
        assert (r.returncode, r.stdout) == (0, "new0\nnew1\n"), r.stderr
        r = roost("get", "t", "--durable", "x", "--start", "yesterday", "--node", c.addr("n1"))
        assert r.returncode != 0 and "--start must be earliest, latest, an offset or an ISO 8601 time" in r.stderr
    finally:
        c.stop()


def test_a_new_secondary_is_woken_by_the_primary_and_puts_commit(tmp_path: Path) -> None:
    """The secondary dies: the map names the third member secondary while the primary goes on leading
    (no claim, so nobody asked the third member for its log, which is not active: no records, no
    claim seen). The primary's FETCH wakes it, it follows, and puts commit again (they waited for it
    forever before)."""
    c = LocalCluster(tmp_path, n=3, cluster_extra='mode = "partitioned"\npartitions = 1\n')
    c.start()
    try:
        wait_until(lambda: all(c.status(m)["state"] == "ready" for m in c.ids), what="ready")
        primary, secondary = _owners_of(c, "w")
        third = next(m for m in c.ids if m not in (primary, secondary))
        assert roost("put", "w", "first", "--node", c.addr(primary), "--timeout", "20").returncode == 0
        c.kill(secondary)
        wait_until(lambda: "live=2" in c.log(primary), what="the map without the secondary")
        r = roost("put", "w", "m{n}", "--count", "20", "--node", c.addr(primary), "--timeout", "20")
        assert r.returncode == 0, r.stderr
    finally:
        c.stop()
    assert _stored(tmp_path, third, "w") == [b"first"] + [b"m%d" % i for i in range(20)]


def test_durable_puts_and_gets_go_on_after_their_primary_was_paused(tmp_path: Path) -> None:
    """Found by a chaos run (SIGSTOP of a primary for 3.4 s, then 0 puts acknowledged and 0
    records read on its partition for the rest of the run). While the primary is paused another
    member claims and leads; when it resumes, its own map never changed and it still leads at
    its old epoch, and the client's session for it had failed over to another member. Now the
    resumed primary claims above the epoch its follower brings, and the client takes its durable
    requests back to the member the map names."""
    c = LocalCluster(tmp_path, n=3, cluster_extra='mode = "partitioned"\npartitions = 8\n')
    c.start()
    try:
        wait_until(lambda: all(c.status(m)["state"] == "ready" for m in c.ids), what="ready")

        async def main() -> list[bytes]:
            async with Client(c.addr("n1")) as cl:
                await cl.put("jobs", "before", wait=True)
                assert cl.router.cmap is not None
                primary = cl.router.cmap.primary("jobs")
                assert primary is not None
                pid = c.launcher.pid_of(primary)
                assert pid is not None
                os.kill(pid, signal.SIGSTOP)
                try:
                    with trio.fail_after(30):  # (another member takes the partition over)
                        await cl.put("jobs", "during", wait=True)
                finally:
                    os.kill(pid, signal.SIGCONT)
                # Back at the resumed primary once the map names it again: puts go on meanwhile
                # (bounded polling of real processes; the map changes after down_after).
                sent = [b"before", b"during"]
                with trio.fail_after(30):
                    while True:
                        sent.append(b"after%d" % len(sent))
                        await cl.put("jobs", sent[-1], wait=True)
                        if cl.router.cmap.primary("jobs") == primary:
                            break
                        await trio.sleep(0.2)
                    sent.append(b"at the primary")
                    await cl.put("jobs", sent[-1], wait=True)
                got = await cl.get("jobs", "w", len(sent), timeout=30)
                assert await cl.commit("jobs", "w")
                assert [m.payload for m in got] == sent
                return sent

        assert trio.run(main)[:3] == [b"before", b"during", b"after2"]
    finally:
        c.stop()


def test_a_member_whose_log_write_fails_stops_and_its_partition_fails_over(tmp_path: Path) -> None:
    """The primary's disk fails (its partition directory is gone: the next segment cannot be made).
    Before, a failed write counted as done and the member went on serving from memory; now it stops
    (log_failed, cannot_run), the other owners take the partition over, and every put the client
    had acknowledged is on both survivors' disks."""
    durable = "[durable]\nsegment_bytes = 4096\n"
    c = LocalCluster(tmp_path, n=3, cluster_extra='mode = "partitioned"\npartitions = 1\n' + durable)
    c.start()
    try:
        wait_until(lambda: all(c.status(m)["state"] == "ready" for m in c.ids), what="ready")
        primary, _ = _owners_of(c, "f")
        assert roost("put", "f", "a{n}", "--count", "5", "--node", c.addr(primary), "--timeout", "20").returncode == 0
        shutil.rmtree(tmp_path / "data" / primary / "log" / "p00000")
        r = roost("put", "f", "b{n}" + "." * 100, "--count", "60", "--node", c.addr(primary), "--timeout", "40")
        assert r.returncode == 0, r.stderr
        wait_until(lambda: c.launcher.pid_of(primary) is None, what="the primary stopped")
        log = c.log(primary)
        assert "event=log_failed partition=0" in log and "event=cannot_run" in log, log[-2000:]
    finally:
        c.stop()
    want = [b"a%d" % i for i in range(5)] + [b"b%d" % i + b"." * 100 for i in range(60)]
    for m in c.ids:
        if m != primary:
            assert _stored(tmp_path, m, "f") == want
