"""The ``roost`` Spark data source: a sink that publishes each row of a DataFrame, in batch and
streaming queries, as a reliable message with acknowledgement; and (pipeline/source.py) a batch
and streaming reader of durable topics, ``spark.read.format("roost")`` and
``spark.readStream.format("roost")``.

    df.write.format("roost").option("nodes", "127.0.0.1:7401,127.0.0.1:7402") \\
        .option("topic", "t").mode("append").save()
    df.writeStream.format("roost").option("nodes", ...).option("topic", "t") \\
        .option("checkpointLocation", "/path").start()

Columns: ``payload`` (string or binary, required), ``key`` (string), ``tags``
(map<string,string>), ``topic`` (string: per row, else the ``topic`` option). Other columns are
ignored. Options: ``nodes`` (required: host:port, comma-separated; the first is dialled, the
others are failover candidates), ``topic``, ``timeout`` (seconds a task waits for every
acknowledgement, default 30).

Exactly once towards a reliable subscriber. Spark retries a failed task and re-runs a
micro-batch after a restart; each task publishes under a producer id derived from (the write's
id, the batch id, the partition id) with sequences 1, 2, ... in row order, so a retry publishes
the same (producer, sequence) pairs again and the member (or, after a failover, the subscriber)
drops the copies (docs/guarantees.md: producer de-duplication). The write's id is the streaming
query's id, stable across restarts from a checkpoint; for a batch write it is drawn once when the
write is planned, shared by every task and retry of that write. This holds when a retried
partition yields the same rows in the same order, as a deterministic plan does (a rate source, a
file, a sorted or cached DataFrame).

Each task runs its own trio client (trio.run) in the Python worker: no state is shared between
tasks, or between planning (the driver) and writing (the executors).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, MapType, StringType, StructType

from roost.pipeline.source import SCHEMA, RoostBatchReader, RoostStreamReader, check_schema, parse_nodes
from roost.pipeline.source import parse_options as parse_source_options

DEFAULT_TIMEOUT = 30.0
COLUMNS = {"payload": "string or binary", "key": "string", "tags": "map<string,string>", "topic": "string"}


class SinkError(ValueError):
    """A bad option, column or row: the message names it."""


@dataclass
class SinkOptions:
    nodes: list[tuple[str, int]]
    topic: str | None
    timeout: float
    columns: tuple[str, ...]  # which of COLUMNS the DataFrame has


def _nodes(text: str | None) -> list[tuple[str, int]]:
    return parse_nodes(text, "roost sink", SinkError)


def parse_options(options: dict[str, str], schema: StructType) -> SinkOptions:
    """Check the options and the DataFrame's columns where the write is planned (the driver), so
    that a mistake fails the job before a row is sent."""
    nodes = _nodes(options.get("nodes"))
    topic = options.get("topic")
    if topic is not None and not topic:
        raise SinkError("roost sink: option 'topic' is empty")
    try:
        timeout = float(options.get("timeout", DEFAULT_TIMEOUT))
    except ValueError:
        raise SinkError(
            f"roost sink: option 'timeout' must be a number of seconds, not {options['timeout']!r}"
        ) from None
    if not 0 < timeout < math.inf:
        raise SinkError(f"roost sink: option 'timeout' must be a number of seconds above 0, not {timeout}")
    fields = {f.name: f.dataType for f in schema.fields}
    if "payload" not in fields:
        raise SinkError(
            f"roost sink: the DataFrame has no 'payload' column (string or binary); it has: "
            f"{', '.join(fields) or 'no columns'}"
        )
    allowed = {
        "payload": (StringType(), BinaryType()),
        "key": (StringType(),),
        "topic": (StringType(),),
        "tags": (MapType(StringType(), StringType(), True), MapType(StringType(), StringType(), False)),
    }
    for name, types in allowed.items():
        if name in fields and fields[name] not in types:
            raise SinkError(f"roost sink: column {name!r} must be {COLUMNS[name]}, not {fields[name].simpleString()}")
    if topic is None and "topic" not in fields:
        raise SinkError("roost sink: no topic: set option 'topic' or give the DataFrame a 'topic' column")
    return SinkOptions(nodes, topic, timeout, tuple(c for c in COLUMNS if c in fields))


def producer_id(write_id: str, batch_id: int | str, partition: int) -> bytes:
    """The 16-byte producer id of one task's publishes: the same for every attempt of it."""
    return hashlib.blake2b(f"roost-sink/{write_id}/{batch_id}/{partition}".encode(), digest_size=16).digest()


@dataclass
class Published(WriterCommitMessage):  # type: ignore[misc]
    partition: int
    rows: int


def _rows(opts: SinkOptions, batches: Iterator[Any], where: str) -> Iterator[tuple[int, str, bytes, str | None, Any]]:
    """(row number, topic, payload, key, tags) for every row, checked one by one."""
    n = 0
    for batch in batches:
        cols = {c: batch.column(c).to_pylist() for c in opts.columns}
        size = batch.num_rows
        payloads = cols["payload"]
        keys = cols.get("key", [None] * size)
        tags = cols.get("tags", [None] * size)
        topics = cols.get("topic", [None] * size)
        for i in range(size):
            n += 1
            payload = payloads[i]
            if payload is None:
                raise SinkError(f"roost sink: row {n} of {where} has a null payload")
            topic = topics[i] or opts.topic
            if not topic:
                raise SinkError(f"roost sink: row {n} of {where} has no topic (null 'topic', no option)")
            t = tags[i]
            yield (
                n,
                topic,
                payload.encode() if isinstance(payload, str) else bytes(payload),
                keys[i],
                (dict(t) if t is not None else None),
            )


def publish_partition(opts: SinkOptions, batches: Iterator[Any], pid: bytes, where: str) -> int:
    """Publish every row with acknowledgement; returns the count. Runs on an executor."""
    import trio

    from roost.client.library import Client, NodeLost
    from roost.client.wire import WireError

    nodes = opts.nodes
    names = ",".join(f"{h}:{p}" for h, p in nodes)
    stalled = SinkError(
        f"roost sink: {where}: the publish window stayed full for {opts.timeout:g} s: no "
        "acknowledgement (option 'timeout')"
    )

    async def run() -> int:
        count = 0
        try:
            async with Client(nodes[0], members=nodes[1:], producer_id=pid) as c:
                for n, topic, payload, key, tags in _rows(opts, batches, where):
                    scope = None
                    try:
                        if c.router.window_full(topic):  # publish waits for room: for `timeout` at most
                            with trio.move_on_after(opts.timeout) as scope:
                                await c.publish(topic, payload, key, tags)
                        else:
                            await c.publish(topic, payload, key, tags)
                    except (ValueError, WireError) as e:
                        raise SinkError(
                            f"roost sink: row {n} of {where} (key {key!r}, {len(payload)} bytes payload): {e}"
                        ) from None
                    if scope is not None and scope.cancelled_caught:
                        raise NodeLost("no node answered") if c.router.lost else stalled
                    count = n
                if not await c.flush(opts.timeout):
                    if c.router.lost:
                        raise NodeLost("every node stopped answering")
                    raise SinkError(
                        f"roost sink: {where}: not every row was acknowledged within {opts.timeout:g} s "
                        "(option 'timeout')"
                    )
        except NodeLost as e:
            raise SinkError(f"roost sink: {where}: no node answered (option 'nodes' = {names}): {e}") from None
        return count

    return trio.run(run)


def _task() -> tuple[int, int, Any]:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        return 0, 0, None
    return ctx.partitionId(), ctx.attemptNumber(), ctx


class RoostBatchWriter(DataSourceArrowWriter):  # type: ignore[misc]
    def __init__(self, opts: SinkOptions, write_id: str) -> None:
        self.opts, self.write_id = opts, write_id

    def write(self, iterator: Iterator[Any]) -> Published:
        partition, attempt, _ = _task()
        pid = producer_id(self.write_id, 0, partition)
        rows = publish_partition(self.opts, iterator, pid, f"partition {partition} (attempt {attempt})")
        return Published(partition, rows)


class RoostStreamWriter(DataSourceStreamArrowWriter):  # type: ignore[misc]
    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Any]) -> Published:
        partition, attempt, ctx = _task()
        query = ctx.getLocalProperty("sql.streaming.queryId") if ctx is not None else None
        batch = ctx.getLocalProperty("streaming.sql.batchId") if ctx is not None else None
        if not query or batch is None:
            raise SinkError("roost sink: a streaming write without a query id or batch id")
        pid = producer_id(query, batch, partition)
        rows = publish_partition(self.opts, iterator, pid, f"batch {batch} partition {partition} (attempt {attempt})")
        return Published(partition, rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Every row of the batch is acknowledged already (write() waited for it)."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Published rows cannot be taken back; a re-run of the batch publishes them under the
        same producer ids, so a subscriber still gets each once."""


class RoostSink(DataSource):  # type: ignore[misc]
    """The ``roost`` data source: this module's writers, and the readers of pipeline/source.py."""

    @classmethod
    def name(cls) -> str:
        return "roost"

    def schema(self) -> StructType:
        """The rows a read gives (a write sees the DataFrame's own columns instead)."""
        return SCHEMA

    def reader(self, schema: StructType) -> RoostBatchReader:
        check_schema(schema)
        return RoostBatchReader(parse_source_options(dict(self.options), streaming=False))

    def streamReader(self, schema: StructType) -> RoostStreamReader:
        check_schema(schema)
        return RoostStreamReader(parse_source_options(dict(self.options), streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> RoostBatchWriter:
        return RoostBatchWriter(parse_options(dict(self.options), schema), os.urandom(16).hex())

    def streamWriter(self, schema: StructType, overwrite: bool) -> RoostStreamWriter:
        return RoostStreamWriter(parse_options(dict(self.options), schema))
