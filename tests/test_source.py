"""The `roost` data source as a reader, on a real Spark (local mode) and a real 3-member
partitioned cluster: a batch read of a retained range gives exactly what was put; a streaming
query stopped mid-stream, with its last batch's commit lost as in a driver crash, and restarted
from its checkpoint writes every record once to a Parquet sink; startingOffsets "latest" and
JSON; mistakes stop the query with a message that names them."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import trio

from roost.client.clustermap import compute
from roost.client.library import Client
from roost.cluster.config import load_cluster_config
from tests.clusterkit import LocalCluster
from tests.polling import wait_until

PARTITIONED = 'mode = "partitioned"\npartitions = 8\n'


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    c = LocalCluster(tmp_path_factory.mktemp("source"), n=3, cluster_extra=PARTITIONED)
    c.start()
    wait_until(lambda: all(c.status(m)["state"] == "ready" for m in c.ids), what="ready", timeout=60)
    yield c
    c.stop()


def nodes(c: LocalCluster) -> str:
    return ",".join(c.addr(m) for m in c.ids)


def neighbour(c: LocalCluster, topic: str) -> str:
    """Another topic in ``topic``'s partition: its records lie between ours in the same log."""
    cc = load_cluster_config(c.config)
    members = {m.id: (m.client_addr, m.peer_addr) for m in cc.members}
    cmap = compute(1, members, set(members), cc.settings.partitions, cc.settings.replicas)
    return next(t for i in range(10_000) if cmap.partition(t := f"{topic}.other{i}") == cmap.partition(topic))


def put(c: LocalCluster, topic: str, names: list[str], other: str | None = None) -> tuple[int, list[int]]:
    """Put ``names`` as payloads of ``topic`` (key k<i % 3>, tag i), each followed by a record of
    ``other`` when given; returns the topic's partition and our records' log offsets, read back."""

    async def run() -> tuple[int, list[int]]:
        async with Client(c.addr("n1"), members=[c.addr("n2"), c.addr("n3")]) as cl:
            before = await cl.read(topic, 0, 1)
            for n in names:
                await cl.put(topic, n, key=f"k{int(n[1:]) % 3}", tags={"i": n[1:]})
                if other is not None:
                    await cl.put(other, "x" + n)
            assert await cl.flush(60)
            out, at = [], before.end
            while len(out) < len(names):
                r = await cl.read(topic, at, 500)
                out += [m.sequence or 0 for m in r.messages]  # (a log offset: never None here)
                at = r.next
            return before.partition, out[-len(names) :]

    return trio.run(run)


def reader(spark: Any, c: LocalCluster, topic: str, stream: bool = False, **options: Any) -> Any:
    r = (spark.readStream if stream else spark.read).format("roost").option("nodes", nodes(c)).option("topic", topic)
    for k, v in options.items():
        r = r.option(k, v)
    return r


def test_a_batch_read_of_a_retained_range_gives_every_record_as_it_was_put(spark, cluster):
    t0 = datetime.now(UTC).replace(microsecond=0, tzinfo=None)
    names = [f"b{i}" for i in range(500)]
    p, offsets = put(cluster, "src.batch", names, other=neighbour(cluster, "src.batch"))
    assert offsets == sorted(offsets) and offsets[-1] - offsets[0] >= 998  # (the other topic's records between)
    from pyspark.sql.functions import spark_partition_id

    df = reader(spark, cluster, "src.batch", offsetsPerPartition=300).load()
    assert df.schema.simpleString() == ("struct<topic:string,key:string,tags:map<string,string>,payload:binary,"
                                        "partition:int,offset:bigint,timestamp:timestamp>")  # fmt: skip
    rows = sorted(df.withColumn("task", spark_partition_id()).collect(), key=lambda r: r.offset)
    assert len({r.task for r in rows}) >= 4  # (1,000 offsets and more, in ranges of at most 300: read by 4 tasks)
    assert [bytes(r.payload).decode() for r in rows] == names
    assert [r.offset for r in rows] == offsets
    assert {r.topic for r in rows} == {"src.batch"} and {r.partition for r in rows} == {p}
    assert [(r.key, r.tags) for r in rows] == [(f"k{i % 3}", {"i": str(i)}) for i in range(500)]
    assert t0 <= min(r.timestamp for r in rows) <= max(r.timestamp for r in rows) <= datetime.now(UTC).replace(
        tzinfo=None)  # fmt: skip
    # a range by JSON offsets: [the 100th record, the 200th)
    part = reader(spark, cluster, "src.batch", startingOffsets=json.dumps({str(p): offsets[100]}),
                  endingOffsets=json.dumps({str(p): offsets[200]})).load().collect()  # fmt: skip
    assert sorted(bytes(r.payload).decode() for r in part) == sorted(names[100:200])


def _batches(ckpt: Path, sub: str) -> list[int]:
    d = ckpt / sub
    return sorted(int(f.name) for f in d.iterdir() if f.name.isdigit()) if d.exists() else []


def _end(ckpt: Path, batch: int) -> int:
    """The end offset of a micro-batch, as the checkpoint's offset log holds it."""
    end = json.loads((ckpt / "offsets" / str(batch)).read_text().splitlines()[-1])
    assert len(end) == 1 and all(k.isdigit() for k in end), end
    return int(next(iter(end.values())))


def _to_parquet(spark: Any, c: LocalCluster, topic: str, out: Path, ckpt: Path, **options: Any) -> Any:
    return (reader(spark, c, topic, stream=True, **options).load().writeStream.format("parquet")
            .option("path", str(out)).option("checkpointLocation", str(ckpt))
            .trigger(processingTime="200 milliseconds").start())  # fmt: skip


def _until(q: Any, cond: Any, what: str, timeout: float = 90, stop: bool = True) -> None:
    """Bounded polling of a running query; then stop it (always when it did not get there), and
    it must not have failed."""
    ok = False
    try:
        deadline = time.monotonic() + timeout
        while not cond():
            assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
            assert q.isActive, q.exception()
            q.awaitTermination(0.1)
        ok = True
    finally:
        if stop or not ok:
            q.stop()
    assert q.exception() is None


def _uncommit(ckpt: Path, out: Path, batch: int) -> None:
    """As if the driver died after writing the files of micro-batch ``batch`` and before the file
    sink and the commit log recorded it: their entries from ``batch`` on are deleted, and the
    offset log's after it (and the checksum files Hadoop writes beside each, ".<n>.crc")."""
    for d, gone in ((ckpt / "offsets", batch + 1), (ckpt / "commits", batch), (out / "_spark_metadata", batch)):
        for f in d.iterdir():
            n = f.name.removeprefix(".").removesuffix(".crc")
            if n.isdigit() and int(n) >= gone:
                f.unlink()


def _output(spark: Any, out: Path) -> list[tuple[int, str]]:
    """(offset, payload) of every row of the Parquet sink, read through its log as Spark does."""
    return sorted((r.offset, bytes(r.payload).decode()) for r in spark.read.parquet(str(out)).collect())


def _files_rows(out: Path) -> int:
    """Rows in every Parquet file of the sink's directory, listed in its log or not."""
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(f).num_rows for f in out.glob("*.parquet"))


def test_a_stream_stopped_mid_way_and_restarted_from_its_checkpoint_writes_every_record_once(spark, cluster, tmp_path):
    """maxRecordsPerTrigger 100 (log offsets) over 1,200 offsets: a dozen micro-batches. The query
    is stopped after two; its last committed batch is then made uncommitted (_uncommit), more
    records are put, and the restarted query runs that batch again from the offsets in its
    checkpoint and goes on to the end."""
    topic, other = "src.stream", neighbour(cluster, "src.stream")
    first = [f"s{i}" for i in range(400)]
    p, offsets = put(cluster, topic, first, other=other)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    begin = json.dumps({str(p): offsets[0]})  # (not "earliest": other tests' topics may share the partition)

    q = _to_parquet(spark, cluster, topic, out, ckpt, startingOffsets=begin, maxRecordsPerTrigger=100)
    _until(q, lambda: len(_batches(ckpt, "commits")) >= 2, "two micro-batches")
    read_so_far = len(_output(spark, out))
    assert 0 < read_so_far < len(first)  # stopped mid-stream
    _uncommit(ckpt, out, _batches(ckpt, "commits")[-1])
    more = [f"s{i}" for i in range(400, 600)]
    offsets += put(cluster, topic, more, other=other)[1]

    q = _to_parquet(spark, cluster, topic, out, ckpt, startingOffsets=begin, maxRecordsPerTrigger=100)
    _until(q, lambda: (b := _batches(ckpt, "commits")) and _end(ckpt, b[-1]) > offsets[-1], "the end")
    assert _output(spark, out) == list(zip(offsets, first + more, strict=True))  # every record, once, nothing else
    assert _files_rows(out) > len(offsets)  # (the uncommitted batch was written again: its first files are there)
    ends = [_end(ckpt, b) for b in _batches(ckpt, "offsets")]
    assert all(b - a <= 100 for a, b in zip([offsets[0], *ends], ends, strict=False)) and len(ends) >= 12


def test_starting_offsets_latest_reads_only_what_comes_after_the_query_started(spark, cluster):
    put(cluster, "src.latest", [f"o{i}" for i in range(50)])
    q = (reader(spark, cluster, "src.latest", stream=True, startingOffsets="latest").load()
         .selectExpr("cast(payload AS string) AS v").writeStream.format("memory").queryName("src_latest")
         .trigger(processingTime="200 milliseconds").start())  # fmt: skip
    try:
        wait_until(lambda: q.recentProgress, timeout=60, what="the first micro-batch (it fixes where latest was)")
        put(cluster, "src.latest", [f"n{i}" for i in range(30)])
        wait_until(lambda: sum(p["numInputRows"] for p in q.recentProgress) >= 30, timeout=60, what="the new records")
        got = sorted(r.v for r in spark.sql("SELECT v FROM src_latest").collect())
    finally:
        q.stop()
    assert got == sorted(f"n{i}" for i in range(30))


def test_latest_means_the_same_offset_when_spark_asks_again_after_a_restart(cluster):
    """Spark does not checkpoint where the first micro-batch began: a query restarted before that
    batch was committed asks initialOffset() again and plans the batch from there to the end in
    its offset log. Records put between the first initialOffset() and the first latestOffset()
    must be in that batch both times, or in neither. The stream reader's calls as Spark makes
    them, in this process."""
    from pyspark.sql.streaming.datasource import ReadMaxRows

    from roost.pipeline.source import RoostStreamReader, parse_options

    opts = parse_options({"nodes": nodes(cluster), "topic": "src.restart", "startingOffsets": "latest",
                          "maxRecordsPerTrigger": "10"}, streaming=True)  # fmt: skip
    put(cluster, "src.restart", [f"o{i}" for i in range(5)])
    first = RoostStreamReader(opts)
    start = first.initialOffset()
    p, between = put(cluster, "src.restart", [f"b{i}" for i in range(5)])
    end0 = first.latestOffset(start, first.getDefaultReadLimit())  # batch 0 ends here: the offset log has it
    assert end0 == {str(p): between[-1] + 1}

    def rows(reader: RoostStreamReader, a: dict, b: dict) -> list[bytes]:
        return [bytes(row[3]) for r in reader.partitions(a, b) for row in reader.read(r)]

    batch0 = rows(first, start, end0)
    after = put(cluster, "src.restart", [f"n{i}" for i in range(5)])[1]
    again = RoostStreamReader(opts)  # the restarted query plans batch 0 again
    assert rows(again, again.initialOffset(), end0) == batch0
    end1 = again.latestOffset(end0, ReadMaxRows(10))
    assert end1 == {str(p): after[-1] + 1} and rows(again, end0, end1) == [f"n{i}".encode() for i in range(5)]


def test_starting_offsets_json_and_available_now_read_from_that_offset_to_the_end_in_limited_batches(spark, cluster):
    p, offsets = put(cluster, "src.json", [f"j{i}" for i in range(60)])
    start = json.dumps({str(p): offsets[20]})
    q = (reader(spark, cluster, "src.json", stream=True, startingOffsets=start, maxRecordsPerTrigger=15).load()
         .selectExpr("cast(payload AS string) AS v", "offset").writeStream.format("memory").queryName("src_json")
         .trigger(availableNow=True).start())  # fmt: skip
    assert q.awaitTermination(120)
    assert q.exception() is None
    got = spark.sql("SELECT v, offset FROM src_json ORDER BY offset").collect()
    assert [r.v for r in got] == [f"j{i}" for i in range(20, 60)]
    assert len([p for p in q.recentProgress if p["numInputRows"]]) >= 3  # (40 records, at most 15 a batch)


@pytest.mark.parametrize(("options", "streaming", "message"), [
    ({"topic": "t"}, False, "option 'nodes' is required"),
    ({"nodes": "127.0.0.1", "topic": "t"}, False, "option 'nodes': '127.0.0.1' is not host:port"),
    ({"nodes": "h:1"}, True, "option 'topic' is required"),
    ({"nodes": "h:1", "topic": "t", "startingOffsets": "middle"}, True,
     "option 'startingOffsets' must be \"earliest\" or \"latest\" or JSON"),
    ({"nodes": "h:1", "topic": "t", "startingOffsets": '{"x": 1}'}, False, "option 'startingOffsets': 'x': 1 is not a"),
    ({"nodes": "h:1", "topic": "t", "startingOffsets": '{"1": -1}'}, True, "option 'startingOffsets': '1': -1 is not"),
    ({"nodes": "h:1", "topic": "t", "startingOffsets": "[1]"}, True, "option 'startingOffsets' must be"),
    ({"nodes": "h:1", "topic": "t", "endingOffsets": "earliest"}, False, "'endingOffsets' must be \"latest\" or JSON"),
    ({"nodes": "h:1", "topic": "t", "endingOffsets": "latest"}, True, "option 'endingOffsets' is for batch reads"),
    ({"nodes": "h:1", "topic": "t", "maxRecordsPerTrigger": "10"}, False, "'maxRecordsPerTrigger' is for streaming"),
    ({"nodes": "h:1", "topic": "t", "maxRecordsPerTrigger": "ten"}, True, "'maxRecordsPerTrigger' must be a whole"),
    ({"nodes": "h:1", "topic": "t", "offsetsPerPartition": "0"}, False, "option 'offsetsPerPartition' must be a whole"),
    ({"nodes": "h:1", "topic": "t", "timeout": "soon"}, True, "option 'timeout' must be a number of seconds"),
    ({"nodes": "h:1", "topic": "t", "timeout": "-1"}, True, "option 'timeout' must be a number of seconds above 0"),
    ({"nodes": "h:1", "topic": "t", "startingoffset": "earliest"}, True, "unknown option 'startingoffset'; the reader"),
])  # fmt: skip
def test_a_bad_option_is_named_with_what_is_allowed(options, streaming, message):
    """The checks the planner runs before the query starts (their way through Spark: below)."""
    from roost.pipeline.source import SourceError, parse_options

    with pytest.raises(SourceError, match=message):
        parse_options(options, streaming=streaming)


def test_a_bad_option_fails_a_batch_read_through_spark(spark, cluster):
    with pytest.raises(Exception, match="roost source: option 'nodes' is required"):
        spark.read.format("roost").option("topic", "t").load().collect()
    p, offsets = put(cluster, "src.options", ["e0"])
    with pytest.raises(Exception, match=r"option 'startingOffsets' names partition\(s\) 99, but topic 'src.options' "
                                        f"is in partition {p} only"):  # fmt: skip
        reader(spark, cluster, "src.options", startingOffsets='{"99": 0}').load().collect()
    with pytest.raises(Exception, match=f"option 'endingOffsets': offset {offsets[0] + 1000} of partition {p} is past"):
        reader(spark, cluster, "src.options", endingOffsets=json.dumps({str(p): offsets[0] + 1000})).load().collect()


def test_a_bad_streaming_option_stops_the_query_with_a_message_naming_it(spark, cluster):
    q = (reader(spark, cluster, "t", stream=True, endingOffsets="latest").load().writeStream.format("memory")
         .queryName("src_bad").start())  # fmt: skip
    with pytest.raises(Exception, match="option 'endingOffsets' is for batch reads"):
        q.awaitTermination(60)


def test_a_cluster_that_is_not_partitioned_or_not_there_is_named_in_the_error(spark, tmp_path):
    plain = LocalCluster(tmp_path, n=1)  # (replicated: no map, no durable topics)
    plain.start()
    try:
        with pytest.raises(Exception, match="sent no cluster map: durable topics need a partitioned cluster"):
            spark.read.format("roost").option("nodes", plain.addr("n1")).option("topic", "t").load().collect()
    finally:
        plain.stop()
    with pytest.raises(Exception, match=r"no node answered \(option 'nodes' = 127.0.0.1:\d+\)"):
        spark.read.format("roost").option("nodes", plain.addr("n1")).option("topic", "t").load().collect()
