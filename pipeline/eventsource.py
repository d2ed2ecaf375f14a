"""The ``roost_events`` Spark data source: run directories' JSON-lines event logs
(docs/eventlog.md) as rows of one explicit schema, :data:`EVENT_SCHEMA`.

Untrusted input. Every line becomes exactly one row: an event in its typed columns, or a row
with ``ev`` = ``malformed`` and ``error`` saying why (bad JSON, not UTF-8, a missing field, a
wrong type), with its file and line number. Nothing is dropped and nothing crashes the job.
The parsing and validation are pipeline/eventlog.py's, the same code the reference checker
runs, so both call the same lines malformed.

Spark's own JSON reader is not used: it cannot tell a missing field from a null one, accepts
``3.0`` for an integer and ``"3"`` for a string column, and gives no line numbers; all of
which the rules of pipeline/rules.py depend on.

Splitting. Planning reads each file once (1-2 s per GB here) to cut it into chunks of about
``chunk_bytes`` at line boundaries, each with the number of its first line; the chunks are
read in parallel. Rows come out as Arrow record batches.

    spark.read.format("roost_events").option("runs", json.dumps([[run_id, run_dir], ...])).load()
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import DoubleType, IntegerType, LongType, StringType, StructField, StructType

from pipeline.eventlog import event_files, line_parser

MALFORMED = "malformed"  # the `ev` of a malformed line's row (never an event kind)
DEFAULT_CHUNK_BYTES = 64 << 20
BATCH_ROWS = 65536

# Event fields and their columns (JSON key -> column), in schema order after the fixed columns.
_FIELD_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("pid", "pid", StringType()), ("seq", "seq", LongType()), ("topic", "topic", StringType()),
    ("key", "key", StringType()), ("mode", "mode", StringType()), ("member", "member", StringType()),
    ("sub", "sub", StringType()), ("reason", "reason", StringType()), ("client", "client", StringType()),
    ("from", "from_member", StringType()), ("to", "to_member", StringType()), ("fault", "fault", StringType()),
    ("target", "target", StringType()), ("phase", "phase", StringType()), ("params", "params", StringType()),
    ("digest", "digest", StringType()), ("subscriptions", "subscriptions", LongType()),
    ("state", "state", StringType()),
)

EVENT_SCHEMA = StructType([
    StructField("run", StringType(), False),       # the run's id (pipeline/store.py: run_id)
    StructField("file", StringType(), False),      # the event file's name, e.g. sub-0.jsonl
    StructField("file_rank", IntegerType(), False),  # its place in name order within the run
    StructField("line", LongType(), False),        # 1-based line number in the file
    StructField("ev", StringType(), False),        # the event kind, or "malformed"
    StructField("t", DoubleType(), True),          # Unix seconds (null for a malformed line)
    StructField("proc", StringType(), True),
    *(StructField(col, typ, True) for _, col, typ in _FIELD_COLUMNS),
    StructField("error", StringType(), True),      # why a malformed line is malformed
])  # fmt: skip


@dataclass
class Chunk(InputPartition):  # type: ignore[misc]
    """Bytes [start, end) of one event file, beginning at line `first_line`."""

    run: str
    path: str
    file: str
    file_rank: int
    start: int
    end: int
    first_line: int

    def __init__(self, run: str, path: str, file: str, file_rank: int, start: int, end: int, first_line: int) -> None:
        super().__init__((run, path, start))
        self.run, self.path, self.file, self.file_rank = run, path, file, file_rank
        self.start, self.end, self.first_line = start, end, first_line


def plan_chunks(run: str, run_dir: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> list[Chunk]:
    """Cut every event file of `run_dir` into chunks at line boundaries (an empty file gives
    none): one sequential read per file, counting newlines."""
    chunks = []
    for rank, path in enumerate(event_files(run_dir)):
        offset, line, start, start_line = 0, 1, 0, 1
        with open(path, "rb") as f:
            while block := f.read(min(1 << 24, chunk_bytes)):
                nl = block.count(b"\n")
                if offset + len(block) - start >= chunk_bytes and nl:
                    cut = block.rfind(b"\n") + 1  # cut after the block's last newline
                    chunks.append(Chunk(run, str(path), path.name, rank, start, offset + cut, start_line))
                    start, start_line = offset + cut, line + nl
                offset += len(block)
                line += nl
        if offset > start:
            chunks.append(Chunk(run, str(path), path.name, rank, start, offset, start_line))
    return chunks


def _row_columns() -> list[str]:
    return [f.name for f in EVENT_SCHEMA.fields]


def read_chunk(chunk: Chunk, batch_rows: int = BATCH_ROWS) -> Iterator[Any]:
    """The rows of one chunk as pyarrow record batches."""
    import pyarrow as pa

    arrow_schema = pa.schema([
        pa.field(f.name, {"StringType()": pa.string(), "LongType()": pa.int64(), "IntegerType()": pa.int32(),
                          "DoubleType()": pa.float64()}[repr(f.dataType)], f.nullable)
        for f in EVENT_SCHEMA.fields
    ])  # fmt: skip
    names = _row_columns()
    parse = line_parser()
    fields = [(key, col) for key, col, _ in _FIELD_COLUMNS]
    dumps = json.dumps

    def fresh() -> dict[str, list[Any]]:
        return {n: [] for n in names}

    cols = fresh()
    n = 0
    line = chunk.first_line
    with open(chunk.path, "rb") as f:
        f.seek(chunk.start)
        remaining = chunk.end - chunk.start
        while remaining > 0:
            raw = f.readline(remaining)
            if not raw:
                break
            remaining -= len(raw)
            obj, err = parse(raw)
            cols["line"].append(line)
            line += 1
            if err is not None:
                cols["ev"].append(MALFORMED)
                cols["t"].append(None)
                cols["proc"].append(None)
                for _, col in fields:
                    cols[col].append(None)
                cols["error"].append(err[:200])
            else:
                get = obj.get
                cols["ev"].append(obj["ev"])
                cols["t"].append(float(obj["t"]))
                cols["proc"].append(obj["proc"])
                for key, col in fields:
                    v = get(key)
                    cols[col].append(dumps(v, sort_keys=True) if key == "params" and v is not None else v)
                cols["error"].append(None)
            n += 1
            if n == batch_rows:
                yield _batch(pa, arrow_schema, cols, chunk, n)
                cols, n = fresh(), 0
    if n:
        yield _batch(pa, arrow_schema, cols, chunk, n)


def _batch(pa: Any, schema: Any, cols: dict[str, list[Any]], chunk: Chunk, n: int) -> Any:
    cols["run"] = [chunk.run] * n
    cols["file"] = [chunk.file] * n
    cols["file_rank"] = [chunk.file_rank] * n
    return pa.RecordBatch.from_pydict(cols, schema=schema)


class EventLogReader(DataSourceReader):  # type: ignore[misc]
    def __init__(self, runs: list[tuple[str, str]], chunk_bytes: int) -> None:
        self.runs, self.chunk_bytes = runs, chunk_bytes

    def partitions(self) -> Sequence[Chunk]:
        chunks = [c for run, run_dir in self.runs for c in plan_chunks(run, run_dir, self.chunk_bytes)]
        return chunks or [Chunk("", "", "", 0, 0, 0, 1)]  # (Spark wants one partition at least)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, Chunk)
        if not partition.path:
            return iter(())
        return read_chunk(partition)


class EventLogSource(DataSource):  # type: ignore[misc]
    """Options: ``runs``, a JSON list of [run id, run directory]; ``chunk_bytes`` (default 64 MiB)."""

    @classmethod
    def name(cls) -> str:
        return "roost_events"

    def schema(self) -> StructType:
        return EVENT_SCHEMA

    def reader(self, schema: StructType) -> EventLogReader:
        try:
            runs = [(str(r), str(d)) for r, d in json.loads(self.options["runs"])]
        except (KeyError, ValueError, TypeError) as e:
            raise ValueError(f"roost_events: option 'runs' must be a JSON list of [run id, directory] ({e})") from None
        try:
            chunk_bytes = int(self.options.get("chunk_bytes", DEFAULT_CHUNK_BYTES))
        except ValueError:
            raise ValueError("roost_events: option 'chunk_bytes' must be an integer") from None
        if chunk_bytes < 1:
            raise ValueError("roost_events: option 'chunk_bytes' must be at least 1")
        return EventLogReader(runs, chunk_bytes)
