"""The audit's judgement of runs in Spark: the report of pipeline/checker.py, computed with
DataFrames so that it scales past one machine's memory, by the rules of pipeline/rules.py.

Theory of operation. The big tables (publishes, acknowledgements, deliveries: millions of rows)
stay in Spark; the small ones (subscription events, faults, failovers, status: one row per
subscription change or fault) are collected to the driver, where rules.py builds the windows and
the fault index exactly as the reference checker does. Those go back to Spark as broadcast
tables (windows, mode ranges) or in a closure (the fault index, for the classification of the
few lost and reordered messages on the executors). So every definition exists once:

- *first* publish and acknowledgement of a (pid, seq): min_by reading order, ``ord`` =
  (file rank, line), the checker's tie-break;
- a delivery counts for every subscription of its ``sub`` whose topic and key match the
  publish: a broadcast join on (run, sub, topic) with the key condition;
- the mode of a received row: the window whose [open, next open) holds the publish time
  (a broadcast range join: rules.Subscription.mode_window);
- expected: a broadcast range join of publishes with windows, open + grace < t < close;
- reordered: first deliveries per path in (t, ord) order, below the highest seq before them
  (a window function);
- latency: nearest rank (rules.rank) over a row_number;
- fault gaps: rules.path_gap per path, on the path's delivery times (applyInPandas);
- durable mode: its events are collected to the driver and judged by the checker's own code
  (pipeline/durablerules.py). They are few next to the deliveries (a put, its acknowledgement,
  a record per subscription and a commit per batch: tens of thousands in a 120 s chaos run), so
  this does not scale past the driver's memory; a run with millions of durable events needs the
  same rules as DataFrame operations, which is not built.

`analyze` returns one report per run, with the checker's fields (its lists of lost,
duplicated and reordered messages and of violations are cut to `sample` items, with counts).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType
from pyspark.sql.window import Window as W

from roost.pipeline.durablerules import DURABLE_KINDS, DURABLE_VIOLATIONS, DurableCollector, judge
from roost.pipeline.eventlog import RunInfo
from roost.pipeline.eventsource import MALFORMED
from roost.pipeline.rules import (
    COUNT_FIELDS,
    DEFAULT_FAULT_TAIL,
    DEFAULT_GRACE,
    DEFAULT_HORIZON,
    DEFAULT_SUBSCRIBER_TIMEOUT,
    LOSS_CLASSES,
    MODES,
    VIOLATION,
    FaultIndex,
    Subscription,
    agreement,
    build_subscriptions,
    path_gap,
    placement_of,
    rank,
)

ORD_SHIFT = 1 << 40  # ord = file_rank * ORD_SHIFT + line: reading order within a run
CDF_POINTS = [i / 2 for i in range(1, 201)]  # percentiles kept for the latency CDF plot


@dataclass
class Options:
    grace: float = DEFAULT_GRACE
    subscriber_timeout: float | None = None
    fault_tail: float = DEFAULT_FAULT_TAIL
    horizon: float = DEFAULT_HORIZON
    sample: int = 100  # items kept per list (malformed lines, lost, violations...)
    rate_bins: int = 300  # bins of the delivery-rate plot


@dataclass
class RunMeta:
    """What the store knows of a converted run: its id, run.json, and how many files."""

    id: str
    info: RunInfo
    files: int


@dataclass
class Judged:
    """Driver-side state of one run: the small tables after rules.py built them."""

    meta: RunMeta
    run_end: float
    sub_timeout: float
    subs: list[Subscription]
    faults: FaultIndex
    failovers: dict[str, list[float]]
    status: dict[str, str | None]  # member -> digest of its last status event


def _rows(df: DataFrame) -> list[Any]:
    return list(df.collect())


def analyze(
    spark: SparkSession,
    events: DataFrame,
    metas: list[RunMeta],
    opts: Options,
    step: Callable[[str], None] = lambda _: None,
) -> dict[str, dict[str, Any]]:
    """One report per run id. `step` is told the name of each stage as it starts (progress)."""
    ids = [m.id for m in metas]
    ev = events.where(F.col("run").isin(ids)).withColumn(
        "ord", F.col("file_rank").cast("long") * ORD_SHIFT + F.col("line")
    )

    step("input counts")
    kinds: dict[str, dict[str, int]] = {i: {} for i in ids}
    max_t: dict[str, float] = {}
    for r in _rows(ev.groupBy("run", "ev").agg(F.count("*").alias("n"), F.max("t").alias("max_t"))):
        kinds[r.run][r.ev] = r.n
        if r.ev != MALFORMED and r.max_t is not None:
            max_t[r.run] = max(max_t.get(r.run, -math.inf), r.max_t)
    malformed: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    bad = (
        ev.where(F.col("ev") == MALFORMED)
        .withColumn("i", F.row_number().over(W.partitionBy("run").orderBy("ord")))
        .where(F.col("i") <= opts.sample)
    )
    for r in _rows(bad.select("run", "file", "line", "error", "ord").orderBy("run", "ord")):
        malformed[r.run].append({"file": r.file, "line": r.line, "error": r.error})

    step("subscriptions and faults")
    judged = _judge_small_tables(ev, metas, max_t, opts)

    step("publishes, acknowledgements, deliveries")
    p = (ev.where(F.col("ev") == "publish").groupBy("run", "pid", "seq")
         .agg(F.min_by(F.struct("t", "topic", "key", "mode", "member", "proc"), "ord").alias("p"),
              F.count("*").alias("copies"))
         .select("run", "pid", "seq", "copies", F.col("p.t").alias("pt"), F.col("p.topic").alias("ptopic"),
                 F.col("p.key").alias("pkey"), F.col("p.mode").alias("pmode"), F.col("p.member").alias("pmember"),
                 F.col("p.proc").alias("pproc"))
         .persist())  # fmt: skip
    # (a puback with a null member acknowledges all the same: `acked`, not the member, says so)
    acks = (
        ev.where(F.col("ev") == "puback")
        .groupBy("run", "pid", "seq")
        .agg(F.min_by("member", "ord").alias("ack"), F.lit(True).alias("acked"))
        .persist()
    )  # (joined twice)
    dels = ev.where(F.col("ev") == "deliver").select("run", "sub", "pid", "seq", "t", "ord", "member", "mode")
    published: dict[str, dict[str, dict[str, int]]] = {
        i: {mode: {"messages": 0, "acknowledged": 0} for mode in MODES} for i in ids
    }
    dup_pubs = dict.fromkeys(ids, 0)
    for r in _rows(
        p.join(acks, ["run", "pid", "seq"], "left")
        .groupBy("run", "pmode")
        .agg(F.count("*").alias("n"), F.count("acked").alias("acked"), F.sum(F.col("copies") - 1).alias("dups"))
    ):
        published[r.run][r.pmode] = {"messages": r.n, "acknowledged": r.acked}
        dup_pubs[r.run] += r.dups

    subs_df, windows_df, ranges_df = _subscription_tables(spark, judged, opts)
    dp = dels.join(p.drop("copies"), ["run", "pid", "seq"], "left")
    phantoms = dp.where(F.col("pt").isNull())
    ds = dp.where(F.col("pt").isNotNull()).alias("d").join(
        F.broadcast(subs_df).alias("s"),
        (F.col("d.run") == F.col("s.srun")) & (F.col("d.sub") == F.col("s.ssub"))
        & (F.col("d.ptopic") == F.col("s.stopic")) & (F.col("s.skey").isNull() | (F.col("s.skey") == F.col("d.pkey"))),
        "left")  # fmt: skip
    step("deliveries per subscription")
    counts_in: dict[str, dict[str, int]] = {i: {"phantom_deliveries": 0, "stray_deliveries": 0} for i in ids}
    for r in _rows(phantoms.groupBy("run").count()):
        counts_in[r.run]["phantom_deliveries"] = r["count"]
    for r in _rows(ds.where(F.col("sidx").isNull()).groupBy("run").count()):
        counts_in[r.run]["stray_deliveries"] = r["count"]
    got = (
        ds.where(F.col("sidx").isNotNull())
        .groupBy("run", "sidx", "pid", "seq")
        .agg(
            F.count("*").alias("cnt"),
            F.min(F.struct("t", "ord")).alias("first"),
            F.first("pt").alias("pt"),
            F.first("pmode").alias("pmode"),
            F.first("pmember").alias("pmember"),
            F.first("pproc").alias("pproc"),
            F.first("ptopic").alias("ptopic"),
        )
        .withColumn("first_t", F.col("first.t"))
        .withColumn("first_ord", F.col("first.ord"))
        .drop("first")
    )
    got = (got.alias("g").join(
        F.broadcast(ranges_df).alias("m"),
        (F.col("g.run") == F.col("m.mrun")) & (F.col("g.sidx") == F.col("m.msidx"))
        & (F.col("m.lo").isNull() | (F.col("m.lo") <= F.col("g.pt")))
        & (F.col("m.hi").isNull() | (F.col("g.pt") < F.col("m.hi"))))
        .withColumn("mode", F.when(F.col("pmode") == "fire", "fire").otherwise(F.col("wmode")))
        .select("run", "sidx", "pid", "seq", "cnt", "pt", "pmember", "pproc", "ptopic", "first_t", "first_ord",
                "mode")
        .persist())  # fmt: skip

    step("latency")
    latency, cdf = _latency(spark, got, ids)

    step("reordering")
    hw = F.max("seq").over(
        W.partitionBy("run", "sidx", "pid").orderBy("first_t", "first_ord").rowsBetween(W.unboundedPreceding, -1)
    )
    reord = got.withColumn("after", hw).where(F.col("after").isNotNull() & (F.col("seq") < F.col("after")))
    p2 = p.select(
        "run", "pid", F.col("seq").alias("after"), F.col("pt").alias("pt2"), F.col("pmember").alias("pmember2")
    )
    reord = reord.join(p2, ["run", "pid", "after"], "left")
    reord = reord.mapInPandas(_reorder_classifier(judged), _CLASSIFIED_REORDER).persist()

    step("expected and lost")
    exp = (p.alias("p").join(
        F.broadcast(windows_df).alias("w"),
        (F.col("p.run") == F.col("w.wrun")) & (F.col("p.ptopic") == F.col("w.wtopic"))
        & (F.col("w.wkey").isNull() | (F.col("w.wkey") == F.col("p.pkey")))
        & (F.col("p.pt") > F.col("w.after")) & (F.col("p.pt") < F.col("w.close")))
        .withColumn("mode", F.when((F.col("wmode") == "fire") | (F.col("pmode") == "fire"), "fire")
                    .otherwise("reliable"))
        .select("run", "sidx", "widx", "pid", "seq", "pt", "mode"))  # fmt: skip
    exp = (exp.join(acks, ["run", "pid", "seq"], "left")
           .withColumn("acked", F.when(F.col("mode") == "reliable", F.col("acked")))
           .join(got.select("run", "sidx", "pid", "seq", F.lit(True).alias("got")), ["run", "sidx", "pid", "seq"],
                 "left")
           .persist())  # fmt: skip
    lost = (exp.where(F.col("acked").isNotNull() & F.col("got").isNull())
            .select("run", "sidx", "widx", "pid", "seq", "pt", "ack", "mode")
            .mapInPandas(_loss_classifier(judged), _CLASSIFIED_LOSS).persist())  # fmt: skip

    step("paths")
    keys = ["run", "mode", "pid", "sidx"]
    recv = got.groupBy(*keys).agg(
        F.count("*").alias("received"), F.count(F.when(F.col("cnt") > 1, 1)).alias("duplicated")
    )
    expd = exp.groupBy(*keys).agg(
        F.count("*").alias("expected"),
        F.count("acked").alias("acknowledged"),
        F.count("got").alias("delivered"),
        F.count(F.when(F.col("acked").isNotNull() & F.col("got").isNull(), 1)).alias("lost"),
    )
    reor = reord.groupBy(*keys).agg(F.count("*").alias("reordered"))
    paths = recv.join(expd, keys, "full").join(reor, keys, "full").fillna(0)
    reports = {m.id: _empty_report(m, judged[m.id], opts) for m in metas}
    for r in _rows(paths):
        j = judged[r.run]
        s = j.subs[r.sidx]
        row = {
            "pid": r.pid,
            "sub": s.sub,
            "topic": s.topic,
            "key": s.key,
            "expected": r.expected,
            "acknowledged": r.acknowledged,
            "delivered": r.delivered,
            "missing": r.expected - r.delivered,
            "lost": r.lost,
            "received": r.received,
            "unexpected": r.received - r.delivered,
            "duplicated": r.duplicated,
            "reordered": r.reordered,
        }
        mode = reports[r.run]["modes"][r.mode]
        mode["paths"].append(row)
        for f in COUNT_FIELDS:
            mode["totals"][f] += row[f]
    for rep in reports.values():
        for mode in MODES:
            rep["modes"][mode]["paths"].sort(key=lambda x: (x["pid"], x["sub"], x["topic"], x["key"] or ""))
    for r in _rows(lost.groupBy("run", "mode", "cls").count()):
        reports[r.run]["modes"][r.mode]["lost_by_class"][r.cls] = r["count"]

    step("fault gaps")
    _fault_gaps(dels, judged, opts, reports)
    step("delivery rate")
    rates = _rates(dels, judged, opts)

    step("violations")
    samples = _violations(spark, reports, judged, lost, reord, got, phantoms, opts)
    step("durable")
    _durable(ev, judged, opts, reports, samples)
    for i in ids:
        rep = reports[i]
        rep["input"].update(
            {
                "events": sum(n for k, n in kinds[i].items() if k != MALFORMED),
                "malformed": kinds[i].get(MALFORMED, 0),
                "malformed_lines": malformed[i],
                "duplicate_publishes": dup_pubs[i],
                **counts_in[i],
                "by_kind": dict(sorted((k, n) for k, n in kinds[i].items() if k != MALFORMED)),
            }
        )
        rep["published"] = published[i]
        for mode in MODES:
            rep["modes"][mode]["latency"] = latency[i][mode]
        rep["plots"] = {"latency_cdf": cdf[i], "rate": rates[i]}
        rep.update(samples[i])
    for df in (p, acks, got, reord, exp, lost):
        df.unpersist()
    return reports


def _durable(ev: DataFrame, judged: dict[str, Judged], opts: Options, reports: dict[str, Any],
             samples: dict[str, Any]) -> None:  # fmt: skip
    """Durable mode: every durable event to the driver, judged there by pipeline/durablerules.py
    exactly as the checker judges it (module docstring: it does not scale out). Adds each run's
    ``durable`` section and its violation counts to ``samples``, and its verdict to ``reports``."""
    cols = ("run", "ev", "t", "ord", "proc", "pid", "seq", "topic", "member", "sub", "client", "durable", "start",
            "log_partition", "log_offset")  # fmt: skip
    collectors = {run: DurableCollector() for run in judged}
    for r in _rows(ev.where(F.col("ev").isin(*sorted(DURABLE_KINDS))).select(*cols)):
        e = {"proc": r.proc, "pid": r.pid, "seq": r.seq, "topic": r.topic, "member": r.member, "sub": r.sub,
             "client": r.client, "durable": r.durable, "start": r.start, "partition": r.log_partition,
             "offset": r.log_offset}  # fmt: skip
        collectors[r.run].add(r.ev, e, r.t, r.ord)
    for run, j in judged.items():
        section, violations = judge(collectors[run], j.faults, opts.fault_tail, limit=opts.sample)
        out = samples[run]
        out["durable"] = section
        counts = out["violations"]["by_kind"]
        for kind in DURABLE_VIOLATIONS:
            counts[kind] = sum(v["kind"] == kind for v in violations)
        out["violations"]["total"] = sum(counts.values())
        reports[run]["ok"] = reports[run]["ok"] and not violations


def _judge_small_tables(
    ev: DataFrame, metas: list[RunMeta], max_t: dict[str, float], opts: Options
) -> dict[str, Judged]:
    small = ev.where(F.col("ev").isin("subscribe", "unsubscribe", "cancel", "fault", "failover", "status")).select(
        "run",
        "ev",
        "t",
        "ord",
        "sub",
        "topic",
        "key",
        "mode",
        "member",
        "reason",
        "fault",
        "target",
        "phase",
        "params",
        "client",
        "digest",
        "subscriptions",
        "state",
    )
    subevs: dict[str, list[Any]] = {m.id: [] for m in metas}
    faults: dict[str, list[Any]] = {m.id: [] for m in metas}
    failovers: dict[str, dict[str, list[float]]] = {m.id: {} for m in metas}
    status: dict[str, dict[str, tuple[float, int, Any]]] = {m.id: {} for m in metas}
    for r in _rows(small):
        if r.ev in ("subscribe", "unsubscribe", "cancel"):
            extra = r.member if r.ev == "subscribe" else r.reason
            subevs[r.run].append(
                (r.t, r.ord, r.ev, r.sub, r.topic, r.key, r.mode if r.ev == "subscribe" else None, extra)
            )
        elif r.ev == "fault":
            faults[r.run].append(
                (r.t, r.ord, r.fault, r.target, r.phase, json.loads(r.params) if r.params is not None else None)
            )
        elif r.ev == "failover":
            failovers[r.run].setdefault(r.client, []).append(r.t)
        else:
            prev = status[r.run].get(r.member)
            if prev is None or (r.t, r.ord) >= prev[:2]:
                status[r.run][r.member] = (r.t, r.ord, r.digest)
    judged = {}
    for m in metas:
        run_end = m.info.ended if m.info.ended is not None else max_t.get(m.id, 0.0)
        sub_timeout = opts.subscriber_timeout
        if sub_timeout is None:
            sub_timeout = m.info.subscriber_timeout
        if sub_timeout is None:
            sub_timeout = DEFAULT_SUBSCRIBER_TIMEOUT
        for lst in failovers[m.id].values():
            lst.sort()
        judged[m.id] = Judged(
            m,
            run_end,
            sub_timeout,
            build_subscriptions(subevs[m.id], run_end),
            FaultIndex(faults[m.id], run_end, sub_timeout, opts.grace, opts.horizon, placement_of(m.info)),
            failovers[m.id],
            {k: v[2] for k, v in sorted(status[m.id].items())},
        )
    return judged


def _subscription_tables(
    spark: SparkSession, judged: dict[str, Judged], opts: Options
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """Broadcast tables: subscriptions (for deliveries), windows (for expectations) and the mode
    ranges [open_i, open_i+1) of rules.Subscription.mode_window."""
    subs, wins, ranges = [], [], []
    for run, j in judged.items():
        for s in j.subs:
            subs.append((run, s.idx, s.sub, s.topic, s.key))
            for wi, w in enumerate(s.windows):
                wins.append((run, s.idx, wi, s.topic, s.key, w.open + opts.grace, w.close, w.mode))
                lo = s.opens[wi] if wi > 0 else None
                hi = s.opens[wi + 1] if wi + 1 < len(s.opens) else None
                ranges.append((run, s.idx, lo, hi, w.mode))
    subs_df = spark.createDataFrame(subs, "srun string, sidx int, ssub string, stopic string, skey string")
    windows_df = spark.createDataFrame(
        wins, "wrun string, wsidx int, widx int, wtopic string, wkey string, after double, close double, wmode string"
    )
    windows_df = windows_df.withColumnRenamed("wsidx", "sidx")
    ranges_df = spark.createDataFrame(ranges, "mrun string, msidx int, lo double, hi double, wmode string")
    return subs_df, windows_df, ranges_df


_CLASSIFIED_REORDER = StructType(
    [
        StructField("run", StringType()),
        StructField("sidx", LongType()),
        StructField("pid", StringType()),
        StructField("seq", LongType()),
        StructField("after", LongType()),
        StructField("mode", StringType()),
        StructField("first_t", DoubleType()),
        StructField("pmember", StringType()),
        StructField("cls", StringType()),
    ]
)
_CLASSIFIED_LOSS = StructType(
    [
        StructField("run", StringType()),
        StructField("sidx", LongType()),
        StructField("pid", StringType()),
        StructField("seq", LongType()),
        StructField("pt", DoubleType()),
        StructField("ack", StringType()),
        StructField("mode", StringType()),
        StructField("cls", StringType()),
    ]
)


def _reorder_classifier(judged: dict[str, Judged]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """rules.FaultIndex.classify_reorder on the executors (the index travels in the closure)."""
    index = {run: (j.faults, j.failovers) for run, j in judged.items()}

    def classify(frames: Iterator[Any]) -> Iterator[Any]:
        for df in frames:
            cls = []
            for run, pt, member, proc, topic, pt2, member2, first_t, mode in zip(
                df["run"],
                df["pt"],
                df["pmember"],
                df["pproc"],
                df["ptopic"],
                df["pt2"],
                df["pmember2"],
                df["first_t"],
                df["mode"],
                strict=True,
            ):
                faults, failovers = index[run]
                m = (float(pt), topic, None, "", member, proc)  # (the topic: partitioned mode's primary)
                m2 = (float(pt2), "", None, "", member2, "")
                cls.append(faults.classify_reorder(mode, m, m2, float(first_t), failovers))
            out = df[["run", "sidx", "pid", "seq", "after", "mode", "first_t", "pmember"]].copy()
            out["cls"] = cls
            yield out

    return classify


def _loss_classifier(judged: dict[str, Judged]) -> Callable[[Iterator[Any]], Iterator[Any]]:
    """rules.FaultIndex.classify_loss on the executors, with the window each loss was expected in."""
    index = {run: (j.faults, j.subs) for run, j in judged.items()}

    def classify(frames: Iterator[Any]) -> Iterator[Any]:
        for df in frames:
            cls = []
            for run, sidx, widx, pt, ack in zip(df["run"], df["sidx"], df["widx"], df["pt"], df["ack"], strict=True):
                faults, subs = index[run]
                cls.append(faults.classify_loss(ack, float(pt), subs[int(sidx)].windows[int(widx)]))
            out = df[["run", "sidx", "pid", "seq", "pt", "ack", "mode"]].copy()
            out["cls"] = cls
            yield out

    return classify


def _latency(spark: SparkSession, got: DataFrame, ids: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Nearest-rank percentiles per run and mode (rules.rank), and the CDF points for the plot."""
    lat = got.select("run", "mode", (F.col("first_t") - F.col("pt")).alias("lat"))
    sizes = {
        (r.run, r.mode): (r.n, r.max)
        for r in _rows(lat.groupBy("run", "mode").agg(F.count("*").alias("n"), F.max("lat").alias("max")))
    }
    wanted = []
    for (run, mode), (n, _) in sizes.items():
        for p in {50.0, 90.0, 99.0, *CDF_POINTS}:
            wanted.append((run, mode, rank(p, n), p))
    ranks = spark.createDataFrame(wanted, "run string, mode string, rn long, p double")
    ranked = lat.withColumn("rn", F.row_number().over(W.partitionBy("run", "mode").orderBy("lat")))
    values: dict[tuple[str, str], dict[float, float]] = {}
    for r in _rows(ranked.join(F.broadcast(ranks), ["run", "mode", "rn"])):
        values.setdefault((r.run, r.mode), {})[r.p] = r.lat
    latency: dict[str, Any] = {i: {} for i in ids}
    cdf: dict[str, Any] = {i: {} for i in ids}
    for i in ids:
        for mode in MODES:
            n, mx = sizes.get((i, mode), (0, None))
            v = values.get((i, mode), {})
            latency[i][mode] = {"n": n, "p50": v.get(50.0), "p90": v.get(90.0), "p99": v.get(99.0), "max": mx}
            cdf[i][mode] = [[p, v[p]] for p in CDF_POINTS if p in v]
    return latency, cdf


def _fault_gaps(dels: DataFrame, judged: dict[str, Judged], opts: Options, reports: dict[str, Any]) -> None:
    """rules.path_gap for every fault on every path (publisher -> subscriber), one pandas group
    per path; the driver keeps the worst gap and recovery over the paths."""
    intervals = {
        run: [(start, j.faults.stop(start, end)) for start, end, *_ in j.faults.intervals]
        for run, j in judged.items()
        if j.faults.intervals
    }
    tail = opts.fault_tail

    def per_path(df: Any) -> Any:
        import pandas as pd

        run = df["run"].iloc[0]
        times = sorted(df["t"].tolist())
        rows = []
        for fi, (start, stop) in enumerate(intervals.get(run, ())):
            g = path_gap(times, start, stop, tail)
            if g is not None:
                rows.append((run, fi, g[0], g[1], g[2]))
        return pd.DataFrame(rows, columns=["run", "fi", "gap", "recover", "count"])

    out = {run: [[0.0, None, 0] for _ in iv] for run, iv in intervals.items()}
    if intervals:
        schema = "run string, fi long, gap double, recover double, count long"
        res = (
            dels.where(F.col("run").isin(list(intervals)))
            .select("run", "sub", "pid", "t")
            .groupBy("run", "sub", "pid")
            .applyInPandas(per_path, schema)
        )
        for r in _rows(res):
            acc = out[r.run][r.fi]
            acc[0] = max(acc[0], r.gap)
            if r.recover is not None and not math.isnan(r.recover) and (acc[1] is None or r.recover > acc[1]):
                acc[1] = r.recover
            acc[2] += r["count"]
    for run, j in judged.items():
        reports[run]["faults"] = [
            {
                "fault": kind,
                "target": target,
                "start": start,
                "end": end,
                "healed": end is not None,
                "params": params,
                "gap": acc[0],
                "recover": acc[1],
                "deliveries": acc[2],
            }
            for (start, end, kind, target, params), acc in zip(j.faults.intervals, out.get(run, []), strict=True)
        ]


def _rates(dels: DataFrame, judged: dict[str, Judged], opts: Options) -> dict[str, Any]:
    """Deliveries per second over the run, per mode, in `rate_bins` bins (for the plot)."""
    out: dict[str, Any] = {}
    spans = {}
    for run, j in judged.items():
        t0 = j.meta.info.started
        if t0 is None:
            t0 = min((w.open for s in j.subs for w in s.windows), default=j.run_end)
        width = max((j.run_end - t0) / opts.rate_bins, 0.1)
        spans[run] = (t0, width)
        out[run] = {"t0": t0, "bin": width, "reliable": {}, "fire": {}}
    if not spans:
        return out
    starts = F.create_map(*[x for run, (t0, _) in spans.items() for x in (F.lit(run), F.lit(t0))])
    widths = F.create_map(*[x for run, (_, w) in spans.items() for x in (F.lit(run), F.lit(w))])
    binned = dels.withColumn("b", F.floor((F.col("t") - starts[F.col("run")]) / widths[F.col("run")]))
    for r in _rows(binned.groupBy("run", "mode", "b").count()):
        out[r.run][r.mode][int(r.b)] = r["count"] / spans[r.run][1]
    return out


def _empty_report(m: RunMeta, j: Judged, opts: Options) -> dict[str, Any]:
    info = m.info
    return {
        "version": 1, "ok": True,
        "run": {"id": m.id, "dir": info.dir, "seed": info.seed, "started": info.started, "ended": info.ended,
                "members": info.members, "config": info.config},
        "options": {"grace": opts.grace, "subscriber_timeout": j.sub_timeout, "fault_tail": opts.fault_tail},
        "input": {"files": m.files, "unpaired_fault_ends": j.faults.unpaired_ends},
        "modes": {mode: {"totals": dict.fromkeys(COUNT_FIELDS, 0), "lost_by_class": dict.fromkeys(LOSS_CLASSES, 0),
                         "latency": {}, "paths": []} for mode in MODES},
        "faults": [],
    }  # fmt: skip


def _violations(
    spark: SparkSession,
    reports: dict[str, Any],
    judged: dict[str, Judged],
    lost: DataFrame,
    reord: DataFrame,
    got: DataFrame,
    phantoms: DataFrame,
    opts: Options,
) -> dict[str, Any]:
    """Counts per kind (exact) and the first `sample` of each list, as the checker orders them."""
    n = opts.sample
    out: dict[str, Any] = {}
    for run in reports:
        out[run] = {
            "lost": [],
            "duplicated": [],
            "reordered": [],
            "counts": {"lost": 0, "duplicated": 0, "reordered": 0, "phantom": 0, "disagreement": 0},
        }

    names = spark.createDataFrame(
        [(run, s.idx, s.sub) for run, j in judged.items() for s in j.subs], "run string, sidx int, sub_name string"
    )

    def first(df: DataFrame) -> list[Any]:
        """The first `sample` rows per run in the checker's order: (pid, seq, subscriber name, and
        the subscription's index for a keyed and a whole-topic subscription of one subscriber)."""
        named = df.join(F.broadcast(names), ["run", "sidx"])
        order = W.partitionBy("run").orderBy("pid", "seq", "sub_name", "sidx")
        ranked = named.withColumn("i", F.row_number().over(order))
        return _rows(ranked.where(F.col("i") <= n).orderBy("run", "i"))

    for r in first(lost):
        s = judged[r.run].subs[r.sidx]
        out[r.run]["lost"].append(
            {
                "pid": r.pid,
                "seq": r.seq,
                "sub": s.sub,
                "topic": s.topic,
                "key": s.key,
                "member": r.ack,
                "t": r.pt,
                "class": r.cls,
            }
        )
    dup = got.where(F.col("cnt") > 1)
    for r in first(dup):
        out[r.run]["duplicated"].append(
            {"pid": r.pid, "seq": r.seq, "sub": judged[r.run].subs[r.sidx].sub, "mode": r.mode, "count": r.cnt}
        )
    for r in first(reord):
        out[r.run]["reordered"].append(
            {
                "pid": r.pid,
                "seq": r.seq,
                "sub": judged[r.run].subs[r.sidx].sub,
                "mode": r.mode,
                "after_seq": r.after,
                "class": r.cls,
            }
        )
    for r in _rows(lost.where(F.col("cls") == VIOLATION).groupBy("run").count()):
        out[r.run]["counts"]["lost"] = r["count"]
    for r in _rows(dup.groupBy("run").count()):
        out[r.run]["counts"]["duplicated"] = r["count"]
    for r in _rows(reord.where(F.col("cls") == VIOLATION).groupBy("run").count()):
        out[r.run]["counts"]["reordered"] = r["count"]
    for r in _rows(phantoms.groupBy("run").count()):
        out[r.run]["counts"]["phantom"] = r["count"]
    for run, rep in reports.items():
        digests = judged[run].status
        agreed = agreement(digests)
        rep["agreement"] = {
            "agreed": agreed,
            "digests": digests,
            "missing": [mm for mm in judged[run].meta.info.members if mm not in digests],
        }
        counts = out[run].pop("counts")
        counts["disagreement"] = 1 if agreed is False else 0
        out[run]["violations"] = {"total": sum(counts.values()), "by_kind": counts}
        rep["ok"] = not any(counts.values())
    return out
