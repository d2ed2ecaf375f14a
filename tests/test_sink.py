"""The `roost` Spark data source on a real Spark (local mode) and real `roost node` processes:
every row reaches a reliable subscriber once, in batch and streaming queries, also when Spark
retries a task it failed on purpose; mistakes fail the job with a message that names them."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from roost.pipeline.sink import producer_id
from tests.clusterkit import LocalCluster, start_sub, sub_lines


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Any:
    # A `roost sub` prints slower than four Spark tasks publish: its mailbox holds the whole
    # burst (at the default 50,000 the member would cancel it, out_of_capacity, as documented).
    c = LocalCluster(tmp_path_factory.mktemp("sink"), n=2, limits="mailbox_capacity = 250000")
    c.start()
    yield c
    c.stop()


def nodes(c: LocalCluster) -> str:
    return ",".join(c.addr(m) for m in c.ids)


def counter(c: LocalCluster, name: str) -> int:
    return sum(c.status(m)["metrics"].get(name, 0) for m in c.ids)


def test_a_batch_job_writes_100000_rows_and_a_reliable_subscriber_gets_each_once(spark, cluster):
    sub = start_sub(cluster.addr("n2"), "sink.batch", count=100_000, timeout=120)
    df = (
        spark.range(100_000)
        .selectExpr(
            "concat('row-', id) AS payload", "cast(id % 7 AS string) AS key", "map('n', cast(id AS string)) AS tags"
        )
        .repartition(4)
    )
    df.write.format("roost").option("nodes", nodes(cluster)).option("topic", "sink.batch").mode("append").save()
    got = sub_lines(sub, timeout=120)
    assert len(got) == 100_000 and set(got) == {f"row-{i}" for i in range(100_000)}


def test_a_task_failed_on_purpose_is_retried_and_no_row_is_delivered_twice(spark, cluster, tmp_path):
    """Partition 0's first attempt fails after 30,000 of its 50,000 rows have gone through the
    writer; Spark runs it again, and the member drops what the first attempt published."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    marker = tmp_path / "failed-once"

    def fail_once(v):  # (no annotations: Spark would read them as a pandas UDF)
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx.partitionId() == 0 and ctx.attemptNumber() == 0 and v == 30_000:
            Path(marker).write_text("boom")
            raise RuntimeError("a task failed on purpose")
        return f"r{v}"

    before = counter(cluster, "pub_duplicates")
    sub = start_sub(cluster.addr("n1"), "sink.retry", count=100_000, timeout=120)
    df = spark.range(0, 100_000, numPartitions=2).select(F.udf(fail_once, StringType())("id").alias("payload"))
    df.write.format("roost").option("nodes", nodes(cluster)).option("topic", "sink.retry").mode("append").save()
    got = sub_lines(sub, timeout=120)
    assert marker.exists()  # the first attempt did fail
    assert len(got) == 100_000 and set(got) == {f"r{i}" for i in range(100_000)}
    assert counter(cluster, "pub_duplicates") > before  # its rows were published again, and dropped


def test_a_streaming_query_of_a_rate_source_for_30_s_delivers_every_row_once(spark, cluster, tmp_path):
    sub = start_sub(cluster.addr("n1"), "sink.stream", count=10**9, timeout=60)
    stream = spark.readStream.format("rate").option("rowsPerSecond", 500).option("numPartitions", 2).load()
    query = (
        stream.selectExpr("cast(value AS string) AS payload", "'sink.stream' AS topic")
        .writeStream.format("roost")
        .option("nodes", nodes(cluster))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(processingTime="1 second")
        .start()
    )
    time.sleep(30)  # (the length of the run the acceptance asks for, not a wait for correctness)
    query.stop()
    progress = [p for p in query.recentProgress if p["numInputRows"]]
    written = sum(p["numInputRows"] for p in progress)
    assert written > 5_000 and query.exception() is None
    deadline = time.monotonic() + 60
    got: list[str] = []
    assert sub.stdout is not None
    while len(got) < written and time.monotonic() < deadline:  # bounded polling of a real process
        line = sub.stdout.readline()
        if not line:
            break
        got.append(line.rstrip("\n"))
    sub.kill()
    assert len(got) == written == len(set(got))
    assert set(got) == {str(i) for i in range(written)}  # the rate source counts from 0, every value once


def test_a_micro_batch_run_again_after_a_restart_is_not_delivered_twice(spark, cluster, tmp_path):
    """The query stops, its last batch's commit record is deleted (as when the driver dies between
    publishing a batch and committing it), and the restarted query runs that batch again under
    the same batch id: the member drops the copies and the subscriber sees every value once."""
    ckpt = tmp_path / "ckpt"
    sub = start_sub(cluster.addr("n2"), "sink.restart", count=10**9, timeout=60)
    before = counter(cluster, "pub_duplicates")

    def run_until(rows: int) -> int:
        q = (spark.readStream.format("rate").option("rowsPerSecond", 200).option("numPartitions", 2).load()
             .selectExpr("cast(value AS string) AS payload").writeStream.format("roost")
             .option("nodes", nodes(cluster)).option("topic", "sink.restart").option("checkpointLocation", str(ckpt))
             .trigger(processingTime="500 milliseconds").start())  # fmt: skip
        deadline = time.monotonic() + 60
        while sum(p["numInputRows"] for p in q.recentProgress) < rows and time.monotonic() < deadline:
            q.awaitTermination(0.5)  # (bounded polling of a running query)
        q.stop()
        return max(int(p.name) for p in (ckpt / "commits").iterdir() if p.name.isdigit())

    last = run_until(300)
    (ckpt / "commits" / str(last)).unlink()  # the batch ran, its commit was never recorded
    (ckpt / "commits" / f".{last}.crc").unlink(missing_ok=True)  # (and Hadoop's checksum of it)
    run_until(300)
    end = json.loads(
        (ckpt / "offsets" / str(max(int(p.name) for p in (ckpt / "offsets").iterdir() if p.name.isdigit())))
        .read_text()
        .splitlines()[-1]
    )
    assert counter(cluster, "pub_duplicates") > before  # the batch was published again
    assert sub.stdout is not None
    got: list[str] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # bounded polling of a real process: until every value came
        line = sub.stdout.readline()
        if not line:
            break
        got.append(line.rstrip("\n"))
        if len(got) >= 600 and sorted(map(int, got)) == list(range(len(got))):
            break
    sub.kill()
    assert len(got) >= 600 and sorted(map(int, got)) == list(range(len(got))), (len(got), end)


def test_the_producer_id_is_the_same_for_every_attempt_of_a_task_and_differs_between_tasks():
    assert producer_id("q", 3, 1) == producer_id("q", 3, 1)
    assert len({producer_id("q", 3, 1), producer_id("q", 3, 2), producer_id("q", 4, 1), producer_id("w", 3, 1)}) == 4


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(("options", "columns", "message"), [
    ({}, "cast(id AS string) AS payload", "option 'nodes' is required"),
    ({"nodes": "127.0.0.1"}, "cast(id AS string) AS payload", "option 'nodes': '127.0.0.1' is not host:port"),
    ({"nodes": "NODES", "timeout": "-1"}, "cast(id AS string) AS payload", "option 'timeout' must be"),
    ({"nodes": "NODES"}, "cast(id AS string) AS body", "has no 'payload' column"),
    ({"nodes": "NODES"}, "id AS payload", "column 'payload' must be string or binary, not bigint"),
    ({"nodes": "NODES", "topic": "t"}, "cast(id AS string) AS payload, id AS key", "column 'key' must be string"),
    ({"nodes": "NODES"}, "cast(id AS string) AS payload", "no topic: set option 'topic'"),
])  # fmt: skip
def test_a_bad_option_or_column_fails_the_job_before_a_row_is_sent(spark, cluster, options, columns, message):
    w = spark.range(3).selectExpr(*columns.split(", ")).write.format("roost").mode("append")
    for k, v in options.items():
        w = w.option(k, nodes(cluster) if v == "NODES" else v)
    with pytest.raises(Exception, match=message):
        w.save()


def test_no_node_answering_fails_the_job_naming_the_option(spark):
    addr = f"127.0.0.1:{_free_port()}"
    w = spark.range(2).selectExpr("'x' AS payload").write.format("roost").mode("append")
    with pytest.raises(Exception, match=f"no node answered \\(option 'nodes' = {addr}\\)"):
        w.option("nodes", addr).option("topic", "t").save()


def test_a_node_that_dies_mid_write_fails_the_job_instead_of_hanging(spark, tmp_path):
    """A one-member cluster is killed (from inside the job, at a known row) while a partition is
    being published: every attempt of the task ends with an error naming the option within its
    timeout; nothing waits forever for room in the publish window."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    lone = LocalCluster(tmp_path, n=1)
    lone.start()
    pid = int((tmp_path / "run" / "n1.pid").read_text())

    def kill_at(v):
        if v == 5_000:
            import contextlib
            import os
            import signal

            with contextlib.suppress(ProcessLookupError):  # (a retried task finds it dead)
                os.kill(pid, signal.SIGKILL)
        return f"r{v}"

    df = spark.range(0, 200_000, numPartitions=1).select(F.udf(kill_at, StringType())("id").alias("payload"))
    started = time.monotonic()
    try:
        with pytest.raises(Exception, match=r"no node answered \(option 'nodes' = |window stayed full for 5 s"):
            df.write.format("roost").option("nodes", lone.addr("n1")).option("topic", "t").option("timeout", "5").mode(
                "append"
            ).save()
    finally:
        lone.stop()
    assert time.monotonic() - started < 120


def test_a_row_too_large_fails_the_job_naming_the_row(spark, cluster):
    """(a row larger than one datagram goes in parts: one over max_payload, 1 MiB, is refused)"""
    df = spark.range(3).selectExpr("IF(id = 2, repeat('x', 1100000), 'small') AS payload").coalesce(1)
    with pytest.raises(Exception, match=r"row 3 of partition 0 \(attempt \d\) \(key None, 1100000 bytes payload\)"):
        df.write.format("roost").option("nodes", nodes(cluster)).option("topic", "t").mode("append").save()


def test_the_documented_example_script_publishes_its_rows(cluster):
    """scripts/spark_publish.py, as docs/pipeline.md runs it (its own Spark session)."""
    import subprocess
    import sys

    from tests.clusterkit import ROOT

    sub = start_sub(cluster.addr("n1"), "sink.example", count=500, timeout=120)
    r = subprocess.run([sys.executable, "scripts/spark_publish.py", "--rows", "500", "--topic", "sink.example",
                        "--nodes", nodes(cluster), "--master", "local[1]"], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    assert "published 500 rows to sink.example" in r.stdout
    assert sorted(sub_lines(sub, timeout=120)) == sorted(f"row-{i}" for i in range(500))
