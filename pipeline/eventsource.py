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

from roost.pipeline.eventlog import FIELDS, event_files, line_parser

MALFORMED = "malformed"  # the `ev` of a malformed line's row (never an event kind)
DEFAULT_CHUNK_BYTES = 64 << 20
BATCH_ROWS = 65536

# Event fields and their columns (JSON key -> column), in schema order after the fixed columns.
_FIELD_COLUMNS: tuple[tuple[str, str, Any], ...] = (
    ("pid", "pid", StringType()),
    ("seq", "seq", LongType()),
    ("topic", "topic", StringType()),
    ("key", "key", StringType()),
    ("mode", "mode", StringType()),
    ("member", "member", StringType()),
    ("sub", "sub", StringType()),
    ("reason", "reason", StringType()),
    ("client", "client", StringType()),
    ("from", "from_member", StringType()),
    ("to", "to_member", StringType()),
    ("fault", "fault", StringType()),
    ("target", "target", StringType()),
    ("phase", "phase", StringType()),
    ("params", "params", StringType()),
    ("digest", "digest", StringType()),
    ("subscriptions", "subscriptions", LongType()),
    ("state", "state", StringType()),
    # durable mode's events (pipeline/durablerules.py)
    ("durable", "durable", StringType()),
    ("start", "start", StringType()),
    ("partition", "log_partition", LongType()),
    ("offset", "log_offset", LongType()),
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


_ARROW_TYPES = {"StringType()": "string", "LongType()": "int64", "IntegerType()": "int32", "DoubleType()": "float64"}
_NONE: dict[str, Any] = {}  # what a malformed line's row reads its event fields from
# Per event kind, the fields that go to columns: those it defines. Any other field is allowed in
# the logs and ignored (as by the checker), whatever its type.
_KEEP = {
    ev: ("t", "proc", "ev", *(name for name, _ in spec), *(("params",) if ev == "fault" else ()))
    for ev, spec in FIELDS.items()
}


def read_chunk(chunk: Chunk, batch_rows: int = BATCH_ROWS) -> Iterator[Any]:
    """The rows of one chunk as pyarrow record batches. Per line only the parse and a list
    append; the columns are built per batch, one comprehension each."""
    import pyarrow as pa

    schema = pa.schema(
        [pa.field(f.name, getattr(pa, _ARROW_TYPES[repr(f.dataType)])(), f.nullable) for f in EVENT_SCHEMA.fields]
    )
    parse = line_parser()
    objs: list[dict[str, Any]] = []
    errors: list[str | None] = []
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
            if err is None:
                objs.append({k: obj[k] for k in _KEEP[obj["ev"]] if k in obj})
                errors.append(None)
            else:
                objs.append(_NONE)
                errors.append(err[:200])
            if len(objs) == batch_rows:
                yield _batch(pa, schema, objs, errors, chunk, line)
                line += len(objs)
                objs, errors = [], []
    if objs:
        yield _batch(pa, schema, objs, errors, chunk, line)


def _batch(
    pa: Any, schema: Any, objs: list[dict[str, Any]], errors: list[str | None], chunk: Chunk, first_line: int
) -> Any:
    n = len(objs)
    dumps = json.dumps
    cols: dict[str, Any] = {
        "run": [chunk.run] * n,
        "file": [chunk.file] * n,
        "file_rank": [chunk.file_rank] * n,
        "line": range(first_line, first_line + n),
        "ev": [o.get("ev", MALFORMED) for o in objs],
        "t": [None if (t := o.get("t")) is None else float(t) for o in objs],  # (float: an int past 2**53 too)
        "proc": [o.get("proc") for o in objs],
    }
    for key, col, _ in _FIELD_COLUMNS:
        if key == "params":
            cols[col] = [None if (p := o.get("params")) is None else dumps(p, sort_keys=True) for o in objs]
        else:
            cols[col] = [o.get(key) for o in objs]
    cols["error"] = errors
    return pa.RecordBatch.from_arrays([pa.array(cols[f.name], f.type) for f in schema], schema=schema)


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
