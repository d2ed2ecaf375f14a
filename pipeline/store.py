"""The audit's Parquet store: every run's events written once, partitioned by run and event
kind, and reused while the run's files are unchanged.

    OUT/parquet/events/run=<id>/ev=<kind>/part-*.parquet   the rows of pipeline/eventsource.py
    OUT/parquet/runs/<id>.json                             the manifest: the run's directory,
                                                           its files' names, sizes and mtimes,
                                                           and what run.json said

A run's id is its directory's name and a hash of its absolute path, so two runs called `run`
in different places do not collide. The manifest is written after the run's Parquet, and a
run is converted again when its manifest is missing or its files
changed: a conversion cut short is never taken for a finished one. Each conversion writes to a
staging directory and moves the runs' partitions into place, so that what a killed conversion
left behind is never read.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from roost.pipeline.analysis import RunMeta
from roost.pipeline.eventlog import RunInfo, event_files, load_run
from roost.pipeline.eventsource import EVENT_SCHEMA  # (explicit: partition values are not typed by guess)

MANIFEST_VERSION = 2  # (2: the durable columns; a store of version 1 lacks them and is converted again)


def run_id(run_dir: str | Path) -> str:
    path = Path(run_dir).resolve()
    name = re.sub(r"[^A-Za-z0-9._-]", "_", path.name)[:40] or "run"
    return f"{name}-{hashlib.blake2b(str(path).encode(), digest_size=4).hexdigest()}"


def fingerprint(run_dir: str | Path) -> dict[str, Any]:
    """What must not change for the Parquet of a run to stand: each event file and run.json."""
    files = [[p.name, st.st_size, st.st_mtime_ns] for p in event_files(run_dir) for st in [p.stat()]]
    rj = Path(run_dir) / "run.json"
    st = rj.stat()
    return {"dir": str(Path(run_dir).resolve()), "files": files, "run_json": [st.st_size, st.st_mtime_ns]}


class Store:
    def __init__(self, out: str | Path) -> None:
        self.root = Path(out) / "parquet"
        self.events = self.root / "events"
        self.manifests = self.root / "runs"

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """One audit at a time per store: another one's conversion would delete what this one
        reads (a flock on OUT/parquet/.lock, released when the process ends)."""
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / ".lock", "w") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"roost audit: waiting for another audit using {self.root}", file=sys.stderr)
                fcntl.flock(f, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(f, fcntl.LOCK_UN)

    def manifest(self, rid: str) -> dict[str, Any] | None:
        try:
            m = json.loads((self.manifests / f"{rid}.json").read_text())
        except (OSError, ValueError):
            return None
        return m if isinstance(m, dict) and m.get("version") == MANIFEST_VERSION else None

    def fresh(self, run_dir: str | Path) -> bool:
        """Whether the Parquet of this run is complete and its files unchanged since."""
        m = self.manifest(run_id(run_dir))
        return m is not None and m.get("fingerprint") == fingerprint(run_dir)

    def convert(self, spark: Any, run_dirs: Sequence[str | Path], chunk_bytes: int | None = None) -> None:
        """Write the events of `run_dirs` to Parquet (one Spark job for all of them).

        The job writes to a staging directory of its own; each run's partition then replaces the
        old one by a rename, and its manifest follows. So files left by a conversion that was
        killed (Spark's _temporary, a half-moved run) are never read as events."""
        if not run_dirs:
            return
        prints = {run_id(d): (fingerprint(d), load_run(d)) for d in run_dirs}
        for rid in prints:
            (self.manifests / f"{rid}.json").unlink(missing_ok=True)
        for old in self.root.glob(".staging-*"):
            shutil.rmtree(old, ignore_errors=True)
        staging = self.root / f".staging-{uuid.uuid4().hex}"
        runs = json.dumps([[rid, str(Path(d).resolve())] for rid, d in zip(prints, run_dirs, strict=True)])
        reader = spark.read.format("roost_events").option("runs", runs)
        if chunk_bytes is not None:
            reader = reader.option("chunk_bytes", str(chunk_bytes))
        reader.load().write.partitionBy("run", "ev").parquet(str(staging))
        self.events.mkdir(parents=True, exist_ok=True)
        self.manifests.mkdir(parents=True, exist_ok=True)
        for rid, (fp, info) in prints.items():
            target = self.events / f"run={rid}"
            shutil.rmtree(target, ignore_errors=True)
            if (staging / f"run={rid}").is_dir():
                os.replace(staging / f"run={rid}", target)
            elif any(size for _, size, _ in fp["files"]):  # (only a run of empty files has no rows)
                raise RuntimeError(f"conversion of {rid} wrote nothing to {staging}")
            m = {
                "version": MANIFEST_VERSION,
                "id": rid,
                "fingerprint": fp,
                "files": len(fp["files"]),
                "info": asdict(info),
            }
            tmp = self.manifests / f".{rid}.json.tmp"
            tmp.write_text(json.dumps(m, indent=1))
            os.replace(tmp, self.manifests / f"{rid}.json")
        shutil.rmtree(staging, ignore_errors=True)

    def meta(self, run_dir: str | Path) -> RunMeta:
        """The stored run, named as the caller names it now (a reused run may have been converted
        from another working directory)."""
        m = self.manifest(run_id(run_dir))
        assert m is not None, run_dir
        return RunMeta(m["id"], RunInfo(**{**m["info"], "dir": str(run_dir)}), m["files"])

    def valid_events(self, spark: Any, ids: list[str]) -> dict[str, int]:
        """How many valid events each run has (a query of the partition directories' files)."""
        from pyspark.sql import functions as F

        if not self.events.is_dir():
            return {}
        df = self.read(spark).where(F.col("run").isin(ids) & (F.col("ev") != "malformed"))
        return {r.run: r["count"] for r in df.groupBy("run").count().collect()}

    def read(self, spark: Any) -> Any:
        """All stored events, typed by the explicit schema (no partition type inference: a run id
        of digits stays a string)."""
        return spark.read.schema(EVENT_SCHEMA).parquet(str(self.events))
