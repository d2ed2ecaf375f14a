"""`roost audit RUN_DIR... [--master URL] [--out DIR]`: the Spark audit of run event logs.

Converts each run's JSON-lines logs to Parquet once (pipeline/store.py), judges every run by the
rules of pipeline/rules.py (pipeline/analysis.py), and writes OUT/summary.json, OUT/report.md and
the plots (pipeline/plots.py). Exit status as scripts/check.py's: 0 when no run breaks a promise,
1 when one does, 2 when a run cannot be judged (no run.json, no event file, no valid event) or
Spark cannot start.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roost.pipeline import plots, report
from roost.pipeline.eventlog import InputError, event_files, load_run
from roost.pipeline.rules import DEFAULT_FAULT_TAIL, DEFAULT_GRACE, DEFAULT_HORIZON
from roost.pipeline.spark import DEFAULT_MASTER, SparkUnavailable

if TYPE_CHECKING:
    from roost.pipeline.analysis import Options

STEPS = 13  # analysis stages (the step calls in analysis.analyze) + the plots


class Progress:
    """A tqdm bar over the audit's stages, with the running Spark stage's tasks as its postfix
    (read from Spark's status tracker every half second)."""

    def __init__(self, total: int, quiet: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            unit="step",
            desc="audit",
            disable=quiet,
            file=sys.stderr,
            bar_format="{desc}: {n_fmt}/{total_fmt} {bar} {elapsed} {postfix}",
        )
        self.stop = threading.Event()
        self.tracker: Any = None
        self.thread: threading.Thread | None = None
        self.started = False

    def watch(self, spark: Any) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()

    def _poll(self) -> None:
        while not self.stop.wait(0.5):
            try:
                infos = [self.tracker.getStageInfo(i) for i in self.tracker.getActiveStageIds()]
            except Exception:  # (the session is stopping)
                return
            tasks = [(s.numCompletedTasks, s.numTasks) for s in infos if s is not None]
            if tasks:
                done, total = sum(t[0] for t in tasks), sum(t[1] for t in tasks)
                self.bar.set_postfix_str(f"spark tasks {done}/{total}", refresh=True)

    def step(self, name: str) -> None:
        """Stage `name` begins: the one before it is done."""
        if self.started:
            self.bar.update(1)
        self.started = True
        self.bar.set_description_str(f"audit: {name}")

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=2)
        self.bar.set_description_str("audit: done")
        if self.bar.total is not None and self.started:
            self.bar.update(self.bar.total - self.bar.n)
        self.bar.close()


def _check_input(run_dirs: list[str]) -> None:
    for d in run_dirs:
        load_run(d)  # (InputError when run.json is missing or unreadable)
        if not event_files(d):
            raise InputError(f"{Path(d) / 'events'}: no *.jsonl event files")


def audit(
    run_dirs: list[str],
    out: str | Path,
    master: str = DEFAULT_MASTER,
    opts: Options | None = None,
    quiet: bool = False,
    spark: Any = None,
    chunk_bytes: int | None = None,
) -> dict[str, Any]:
    """Run the audit; returns the summary (also written to OUT/summary.json). `spark`: an existing
    session to use (the tests share one), else one is started for `master`; `chunk_bytes`: how
    the event files are split for reading (default 64 MiB)."""
    from roost.pipeline.analysis import Options
    from roost.pipeline.store import Store, run_id

    opts = opts or Options()
    out = Path(out)
    _check_input(run_dirs)
    if len({run_id(d) for d in run_dirs}) != len(run_dirs):
        raise InputError("a run directory is given twice")
    store = Store(out)
    with store.lock():
        return _audit(run_dirs, out, store, master, opts, quiet, spark, chunk_bytes)


def _audit(
    run_dirs: list[str], out: Path, store: Any, master: str, opts: Any, quiet: bool, spark: Any, chunk_bytes: int | None
) -> dict[str, Any]:
    from roost.pipeline.analysis import analyze
    from roost.pipeline.spark import session

    stale = [d for d in run_dirs if not store.fresh(d)]
    progress = Progress(STEPS + (1 if stale else 0), quiet)
    try:
        spark = spark or session(master, "roost-audit")
        progress.watch(spark)
        t0 = time.monotonic()
        if stale:
            progress.step(f"converting {len(stale)} run(s) to Parquet")
            store.convert(spark, stale, chunk_bytes)
        t1 = time.monotonic()
        metas = [store.meta(d) for d in run_dirs]
        valid = store.valid_events(spark, [m.id for m in metas])
        for m in metas:
            if not valid.get(m.id):
                raise InputError(f"{Path(m.info.dir) / 'events'}: no valid event in {m.files} file(s)")
        reports = analyze(spark, store.read(spark), metas, opts, progress.step)
        t2 = time.monotonic()
        progress.step("plots")
        out.mkdir(parents=True, exist_ok=True)
        for r in reports.values():
            r["plot_files"] = [p.name for p in plots.draw_all(r, out)]
    finally:
        progress.close()
    runs = [reports[m.id] for m in metas]
    summary = {
        "version": 1,
        "ok": all(r["ok"] for r in runs),
        "audit": {
            "master": spark.sparkContext.master,
            "out": str(out),
            "convert_s": round(t1 - t0, 3),
            "analyze_s": round(t2 - t1, 3),
            "converted": len(stale),
            "reused": len(run_dirs) - len(stale),
            "events": sum(r["input"]["events"] + r["input"]["malformed"] for r in runs),
            "parquet": str(store.events),
        },
        "runs": runs,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "report.md").write_text(report.render(summary))
    return summary


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (docs/eventlog.md)")
    ap.add_argument(
        "--master",
        default=DEFAULT_MASTER,
        help="Spark master URL: local[*], local[N] or spark://host:7077 (default %(default)s)",
    )
    ap.add_argument(
        "--out",
        default="audit",
        help="output directory: report.md, summary.json, plots and the Parquet store (default %(default)s)",
    )
    ap.add_argument("--grace", type=float, default=DEFAULT_GRACE, help="as scripts/check.py (default %(default)s)")
    ap.add_argument(
        "--subscriber-timeout", type=float, default=None, help="seconds (default: each run.json's config, else 10)"
    )
    ap.add_argument(
        "--fault-tail", type=float, default=DEFAULT_FAULT_TAIL, help="as scripts/check.py (default %(default)s)"
    )
    ap.add_argument("--horizon", type=float, default=DEFAULT_HORIZON, help="as scripts/check.py (default %(default)s)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")


def run(a: argparse.Namespace) -> int:
    """`roost audit` with parsed arguments."""
    from roost.pipeline.analysis import Options

    for name in ("grace", "fault_tail", "horizon", "subscriber_timeout"):
        v = getattr(a, name)
        if v is not None and not 0 <= v < float("inf"):
            print(f"roost audit: --{name.replace('_', '-')} must be a finite number >= 0, not {v}", file=sys.stderr)
            return 2
    opts = Options(grace=a.grace, subscriber_timeout=a.subscriber_timeout, fault_tail=a.fault_tail, horizon=a.horizon)
    try:
        summary = audit(a.run_dirs, a.out, a.master, opts, a.quiet)
    except (InputError, SparkUnavailable) as e:
        print(f"roost audit: {e}", file=sys.stderr)
        return 2
    for r in summary["runs"]:
        v = r["violations"]
        print(
            f"{r['run']['id']}: {'OK' if r['ok'] else 'FAIL'}, {r['input']['events']} events, "
            f"{r['input']['malformed']} malformed, {v['total']} violations"
        )
    print(f"wrote {Path(a.out) / 'report.md'}, {Path(a.out) / 'summary.json'} and the plots")
    return 0 if summary["ok"] else 1


DESCRIPTION = (
    "Audit chaos, failover and benchmark runs with Spark: what was lost, duplicated or reordered, "
    "latency, and the delivery gap around every fault (docs/pipeline.md)."
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="roost audit", description=DESCRIPTION)
    add_arguments(ap)
    return run(ap.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
