"""The reading half of the ``roost`` Spark data source: a durable topic (docs/durable.md) as a
batch or streaming source. The data source itself (the class Spark registers) is in
pipeline/sink.py; this module holds everything that reads.

    spark.read.format("roost").option("nodes", "127.0.0.1:7401").option("topic", "orders").load()
    spark.readStream.format("roost").option("nodes", "127.0.0.1:7401").option("topic", "orders") \\
        .option("startingOffsets", "earliest").option("maxRecordsPerTrigger", 1000).load()

A durable topic lives in the log of one partition (cluster map: ``partition(topic)``), shared
with the partition's other topics, its EPOCH and cursor records. Offsets are that log's offsets,
so a position is ``{"<partition>": offset}``: the next log offset to read (string keys, as JSON
and so Spark's checkpoint want them). A micro-batch reads the committed records of the topic at
log offsets [start, end). Committed records never change and never move, so the same range read
again (a batch re-run after a restart) gives the same rows: with Spark's offset log, which
records a batch's range before it runs, and a sink that commits a batch once (the file sink's
``_spark_metadata``), every record reaches the output exactly once.

``maxRecordsPerTrigger`` counts log offsets, the only measure the planner has without reading
the records: a micro-batch spans at most that many offsets of the partition's log, so it holds at
most that many records of the topic (fewer when other topics share the partition).

Nothing is shared between the planner (the driver's Python worker, which resolves offsets) and
the readers (executors): each call that needs the cluster opens its own trio client.
"""

from __future__ import annotations

import json
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any, TypeVar

from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

SCHEMA = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("key", StringType(), True),
        StructField("tags", MapType(StringType(), StringType(), True), True),
        StructField("payload", BinaryType(), False),
        StructField("partition", IntegerType(), False),
        StructField("offset", LongType(), False),
        StructField("timestamp", TimestampType(), False),  # when the partition's primary stored the record
    ]
)
OPTIONS = ("nodes", "topic", "startingOffsets", "endingOffsets", "maxRecordsPerTrigger", "offsetsPerPartition",
           "timeout")  # fmt: skip
DEFAULT_TIMEOUT = 30.0
DEFAULT_PER_PARTITION = 10_000
# A read's answer is one datagram and the member does not cut it by size (a RECORDS frame too
# large to send is lost): ask for as many records as fit the session's max_datagram at the largest
# size seen so far, start small, and ask for fewer again when an answer does not come.
READ_MAX = 500  # (the member scans at most [durable] fetch_records = 500 offsets per read anyway)
READ_FIRST = 8
ATTEMPT = 1.0  # seconds one read may go unanswered before it is asked again for fewer records

LATEST = -1  # the first position of a stream that starts at "latest" (RoostStreamReader)
Row = tuple[str, str | None, dict[str, str] | None, bytes, int, int, datetime]
T = TypeVar("T")


class SourceError(ValueError):
    """A bad option, or a cluster that cannot be read: the message names it."""


def parse_nodes(text: str | None, who: str, error: type[ValueError]) -> list[tuple[str, int]]:
    """The ``nodes`` option of the reader and the writer alike."""
    if not text or not text.strip():
        raise error(f"{who}: option 'nodes' is required: host:port[,host:port...]")
    out = []
    for part in text.split(","):
        host, sep, port = part.strip().rpartition(":")
        if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise error(f"{who}: option 'nodes': {part.strip()!r} is not host:port with a port 1-65535")
        out.append((host.strip("[]"), int(port)))
    return out


Position = str | dict[int, int]  # "earliest", "latest", or {partition: offset}


@dataclass(frozen=True)
class SourceOptions:
    nodes: tuple[tuple[str, int], ...]
    topic: str
    starting: Position
    ending: Position
    max_per_trigger: int | None
    per_partition: int
    timeout: float

    @property
    def names(self) -> str:
        return ",".join(f"{h}:{p}" for h, p in self.nodes)


def _fail(text: str) -> SourceError:
    return SourceError(f"roost source: {text}")


def _positive(options: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = options.get(name.lower())
    if raw is None:
        return default
    if not raw.strip().isdigit() or int(raw) < 1:
        raise _fail(f"option '{name}' must be a whole number above 0, not {raw!r}")
    return int(raw)


def _position(raw: str, name: str, words: tuple[str, ...]) -> Position:
    allowed = " or ".join([*(f'"{w}"' for w in words), 'JSON {"<partition>": offset}'])
    if raw.strip().lower() in words:
        return raw.strip().lower()
    try:
        got = json.loads(raw)
    except ValueError:
        got = None
    if not isinstance(got, dict) or not got:
        raise _fail(f"option '{name}' must be {allowed}, not {raw!r}")
    out: dict[int, int] = {}
    for k, v in got.items():
        if not k.isdigit() or isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise _fail(f"option '{name}': {k!r}: {v!r} is not a partition number and an offset >= 0 ({allowed})")
        out[int(k)] = v
    return out


def parse_options(options: Mapping[str, str], *, streaming: bool) -> SourceOptions:
    """Check the options where the read is planned (the driver), so that a mistake stops the
    query before it starts, with a message naming the option."""
    options = {k.lower(): v for k, v in options.items()}  # (Spark's options are case-insensitive: lower case)
    for k in options:
        if k not in {o.lower() for o in OPTIONS}:
            raise _fail(f"unknown option {k!r}; the reader's options are: {', '.join(OPTIONS)}")
    nodes = parse_nodes(options.get("nodes"), "roost source", SourceError)
    topic = options.get("topic")
    if not topic:
        raise _fail("option 'topic' is required: the durable topic to read")
    raw = options.get("startingoffsets")
    starting = (
        _position(raw, "startingOffsets", ("earliest", "latest"))
        if raw is not None
        else ("latest" if streaming else "earliest")
    )  # (Kafka's defaults: a stream follows, a batch reads all)
    ending: Position = "latest"
    raw = options.get("endingoffsets")
    if raw is not None:
        if streaming:
            raise _fail("option 'endingOffsets' is for batch reads (spark.read); a stream reads on")
        ending = _position(raw, "endingOffsets", ("latest",))
    most = _positive(options, "maxRecordsPerTrigger", None)
    if most is not None and not streaming:
        raise _fail(
            "option 'maxRecordsPerTrigger' is for streaming reads (spark.readStream); a batch read "
            "reads its whole range"
        )
    per = _positive(options, "offsetsPerPartition", DEFAULT_PER_PARTITION)
    assert per is not None
    raw = options.get("timeout")
    try:
        timeout = float(raw) if raw is not None else DEFAULT_TIMEOUT
    except ValueError:
        raise _fail(f"option 'timeout' must be a number of seconds, not {raw!r}") from None
    if not 0 < timeout < math.inf:
        raise _fail(f"option 'timeout' must be a number of seconds above 0, not {raw!r}")
    return SourceOptions(tuple(nodes), topic, starting, ending, most, per, timeout)


def check_schema(schema: StructType | None) -> None:
    """The rows are the log's records: a schema the user gives must be this one."""

    def shape(s: StructType) -> list[tuple[str, str]]:
        return [(f.name, f.dataType.simpleString()) for f in s.fields]

    if schema is not None and shape(schema) != shape(SCHEMA):
        raise _fail(f"the schema is fixed: {SCHEMA.simpleString()}, not {schema.simpleString()}; drop .schema()")


# ---------------------------------------------------------------- talking to the cluster


def run(opts: SourceOptions, job: Callable[[Any], Awaitable[T]]) -> T:
    """Run ``job(client)`` in a trio client of its own; turn the ways the cluster can fail to
    answer into errors that say which, and which option is involved."""
    import trio

    from roost.client.library import Client, NodeLost

    async def main() -> T:
        entered = False
        try:
            async with Client(opts.nodes[0], members=list(opts.nodes[1:])) as c:
                entered = True
                try:
                    return await job(c)
                except NodeLost as e:
                    if c.router.cmap is None:
                        raise _fail(
                            f"the cluster at {opts.names} sent no cluster map: durable topics need a "
                            'partitioned cluster (cluster.toml: mode = "partitioned")'
                        ) from None
                    raise _fail(f"topic {opts.topic!r}: {e} (within option 'timeout' = {opts.timeout:g} s)") from None
        except NodeLost as e:
            if entered:
                raise
            raise _fail(f"no node answered (option 'nodes' = {opts.names}): {e}") from None

    return trio.run(main)


@dataclass
class Edge:
    """What the planner learns of the topic's partition: its number, first retained offset and
    commit (the end a reader can reach)."""

    partition: int
    first: int
    end: int


async def probe(c: Any, opts: SourceOptions, at: int = 0) -> Edge:
    r = await c.read(opts.topic, at, 1, timeout=opts.timeout)
    return Edge(r.partition, r.first, r.end)


def resolve(pos: Position, edge: Edge, name: str, topic: str) -> int:
    """The log offset an option's position means now."""
    if pos == "earliest":
        return edge.first
    if pos == "latest":
        return edge.end
    assert isinstance(pos, dict)
    if set(pos) != {edge.partition}:
        raise _fail(
            f"option '{name}' names partition(s) {', '.join(map(str, sorted(pos)))}, but topic {topic!r} "
            f'is in partition {edge.partition} only: {{"{edge.partition}": offset}}'
        )
    at = pos[edge.partition]
    if at < edge.first:
        raise _fail(
            f"option '{name}': offset {at} of partition {edge.partition} is no longer retained (the "
            f"first is {edge.first})"
        )
    if at > edge.end:
        raise _fail(
            f"option '{name}': offset {at} of partition {edge.partition} is past its end ({edge.end}): "
            "nothing is committed there yet"
        )
    return at


@dataclass
class OffsetRange(InputPartition):  # type: ignore[misc]
    """One Spark task's share of a batch: log offsets [start, end) of a partition."""

    partition: int
    start: int
    end: int


def split(partition: int, start: int, end: int, per: int) -> list[OffsetRange]:
    """[start, end) in ranges of at most ``per`` offsets, of even size, for parallel reads."""
    span = end - start
    if span <= 0:
        return []
    n = -(-span // per)
    cuts = [start + span * i // n for i in range(n + 1)]
    return [OffsetRange(partition, a, b) for a, b in pairwise(cuts)]


def _size(m: Any) -> int:
    return len(m.payload) + len(m.topic) + len(m.key or "") + sum(len(k) + len(v) for k, v in (m.tags or {}).items())


async def read_range(c: Any, opts: SourceOptions, rng: OffsetRange) -> list[Row]:
    """The records of the topic at offsets [start, end), read in chunks until ``next`` reaches
    the end. The range was committed when it was planned, so it is all there: a read that finds
    the commit below it (a new primary whose follower has not fetched yet) waits; a first
    retained offset above the position means retention deleted records before they were read."""
    import trio

    from roost.client.library import NodeLost

    rows: list[Row] = []
    pos, count, largest = rng.start, READ_FIRST, 1
    budget = max(1, c.session.max_datagram - 512)
    stalled_since = trio.current_time()
    while pos < rng.end:
        left = stalled_since + opts.timeout - trio.current_time()
        if left <= 0:
            raise _fail(
                f"partition {rng.partition} of topic {opts.topic!r}: offsets [{pos}, {rng.end}) were "
                f"committed when the batch was planned but could not be read within {opts.timeout:g} s "
                "(option 'timeout')"
            )
        try:
            r = await c.read(opts.topic, pos, min(count, rng.end - pos), timeout=min(ATTEMPT, left))
        except NodeLost:
            if c.router.cmap is None:
                raise
            count = max(1, count // 4)  # (an answer too large for a datagram is lost: ask for less)
            continue
        if r.partition != rng.partition:
            raise _fail(
                f"topic {opts.topic!r} is in partition {r.partition} now, not {rng.partition}: was the "
                "cluster's partition count changed?"
            )
        if r.first > pos:
            raise _fail(
                f"partition {rng.partition}: offsets [{pos}, {r.first}) were deleted (retention) before "
                f"this query read them; topic {opts.topic!r} lost records there"
            )
        for m, ms in zip(r.messages, r.times, strict=True):
            if m.sequence < pos:  # (a late answer to an earlier request: Client.read matches by partition)
                continue
            if m.sequence >= rng.end:
                break
            rows.append(
                (
                    m.topic,
                    m.key,
                    m.tags,
                    m.payload,
                    rng.partition,
                    m.sequence,
                    datetime.fromtimestamp(ms / 1000, tz=UTC),
                )
            )
            largest = max(largest, _size(m) + 32)
        if r.next > pos:
            pos, stalled_since = r.next, trio.current_time()
            count = max(1, min(READ_MAX, budget // largest))
        else:
            await trio.sleep(0.05)  # (the commit is below the range: an owner catching up)
    return rows


def read_partition(opts: SourceOptions, rng: OffsetRange) -> Iterator[Row]:
    if rng.end <= rng.start:
        return iter(())

    async def job(c: Any) -> list[Row]:
        return await read_range(c, opts, rng)

    return iter(run(opts, job))


# ---------------------------------------------------------------- Spark's readers


class RoostBatchReader(DataSourceReader):  # type: ignore[misc]
    """spark.read: the retained range [startingOffsets, endingOffsets), resolved when planned."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts

    def partitions(self) -> list[OffsetRange]:
        opts = self.opts

        async def job(c: Any) -> tuple[int, int, int]:
            edge = await probe(c, opts)
            lo = resolve(opts.starting, edge, "startingOffsets", opts.topic)
            hi = resolve(opts.ending, edge, "endingOffsets", opts.topic)
            if hi < lo:
                raise _fail(f"option 'endingOffsets' ({hi}) is before option 'startingOffsets' ({lo})")
            return edge.partition, lo, hi

        p, lo, hi = run(opts, job)
        return split(p, lo, hi, opts.per_partition) or [OffsetRange(p, lo, lo)]  # (Spark wants one at least)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, OffsetRange)
        return read_partition(self.opts, partition)


class RoostStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):  # type: ignore[misc]
    """spark.readStream: offsets ``{"<partition>": next offset}`` in the checkpoint.

    Spark keeps one instance in the planner for the query's life (initialOffset, latestOffset,
    partitions, commit) and ships copies to the executors for read(); only the planner's copy
    holds ``_target`` (Trigger.AvailableNow) and ``_latest`` (for the progress report).

    The start of the first micro-batch is not in Spark's checkpoint: after a restart before that
    batch was committed, Spark asks initialOffset again. "latest" would then mean a later offset
    and the records between would be skipped; so a query that starts at "latest" begins at
    ``{"<partition>": -1}`` (Kafka's mark for latest), and its first micro-batch is an empty one
    from -1 to the commit, whose end Spark writes to the checkpoint before anything is read."""

    def __init__(self, opts: SourceOptions) -> None:
        self.opts = opts
        self._target: int | None = None
        self._latest: dict[str, int] | None = None

    def _at(self, offset: dict[str, Any]) -> tuple[int, int]:
        """A position from Spark (the checkpoint's, or ours): its one partition and offset."""
        items = list(offset.items()) if isinstance(offset, dict) else []
        if (
            len(items) != 1
            or not str(items[0][0]).isdigit()
            or not isinstance(items[0][1], int)
            or items[0][1] < LATEST
        ):
            raise _fail(
                f'the checkpoint holds offset {offset!r}, not {{"<partition>": offset}} of a roost topic: '
                "is it another query's checkpoint?"
            )
        return int(items[0][0]), items[0][1]

    def initialOffset(self) -> dict[str, int]:
        opts = self.opts

        async def job(c: Any) -> dict[str, int]:
            edge = await probe(c, opts)
            if opts.starting == "latest":
                return {str(edge.partition): LATEST}
            return {str(edge.partition): resolve(opts.starting, edge, "startingOffsets", opts.topic)}

        return run(opts, job)

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, int]:
        """The end of the next micro-batch: the partition's commit, capped by the read limit
        (log offsets: ``maxRecordsPerTrigger`` bounds the topic's records from above) and, under
        Trigger.AvailableNow, by the commit when the query started."""
        p, pos = self._at(start)
        opts = self.opts

        async def job(c: Any) -> Edge:
            return await probe(c, opts, max(pos, 0))

        edge = run(opts, job)
        if edge.partition != p:
            raise _fail(
                f"the checkpoint's offsets are for partition {p}, but topic {opts.topic!r} is in partition "
                f"{edge.partition}: was the cluster's partition count changed?"
            )
        end = edge.end if self._target is None else min(edge.end, self._target)
        self._latest = {str(p): edge.end}
        if pos == LATEST:
            return {str(p): end}  # (the empty first micro-batch: "latest" fixed in the checkpoint)
        if isinstance(limit, ReadMaxRows):
            end = min(end, pos + limit.max_rows)
        elif isinstance(limit, ReadMinRows):
            end = end if end - pos >= limit.min_rows else pos
        elif not isinstance(limit, ReadAllAvailable):
            raise _fail(f"read limit {limit!r} is not supported (maxRecordsPerTrigger counts log offsets)")
        return {str(p): max(pos, end)}  # (never back: a commit below our position has nothing new)

    def getDefaultReadLimit(self) -> ReadLimit:
        most = self.opts.max_per_trigger
        return ReadAllAvailable() if most is None else ReadMaxRows(most)

    def reportLatestOffset(self) -> dict[str, int] | None:
        return self._latest

    def prepareForTriggerAvailableNow(self) -> None:
        opts = self.opts

        async def job(c: Any) -> Edge:
            return await probe(c, opts)

        self._target = run(opts, job).end

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[OffsetRange]:
        (p, lo), (_, hi) = self._at(start), self._at(end)
        return [] if lo == LATEST else split(p, lo, hi, self.opts.per_partition)

    def read(self, partition: InputPartition) -> Iterator[Row]:
        assert isinstance(partition, OffsetRange)
        return read_partition(self.opts, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: the position lives in Spark's checkpoint, not on the cluster (a
        plain read holds no cursor there)."""
