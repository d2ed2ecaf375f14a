"""Read a durable topic with Spark through the `roost` data source (docs/pipeline.md).

    roost cluster up configs/cluster5-partitioned.toml --detach
    roost put demo.orders "order-{n}" --count 1000 --node 127.0.0.1:7411
    python scripts/spark_consume.py --nodes 127.0.0.1:7411,127.0.0.1:7412 --topic demo.orders
    python scripts/spark_consume.py --nodes 127.0.0.1:7411 --topic demo.orders --stream \\
        --starting earliest --max-per-trigger 300 --out /tmp/orders --checkpoint /tmp/orders-ckpt

Batch (default): the retained range of the topic, counted and shown, and written as Parquet with
--out. Streaming (--stream): a query writing Parquet to --out, its checkpoint in --checkpoint,
that reads what is committed when it starts in micro-batches of at most --max-per-trigger log
offsets and stops (Trigger.AvailableNow), or with --seconds S runs on for S seconds. Run it
again with the same --out and --checkpoint and it goes on where it stopped, neither skipping nor
repeating a record.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from roost.pipeline.spark import DEFAULT_MASTER, session


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="127.0.0.1:7411", help="host:port[,host:port] (default %(default)s)")
    ap.add_argument("--topic", default="demo.orders", help="default %(default)s")
    ap.add_argument("--starting", default=None, metavar="OFFSETS",
                    help='startingOffsets: earliest, latest or {"<partition>": offset} (default: earliest for a '
                         "batch, latest for a stream)")  # fmt: skip
    ap.add_argument("--ending", default=None, metavar="OFFSETS", help="batch: endingOffsets (default latest)")
    ap.add_argument("--stream", action="store_true", help="a streaming query (default: a batch read)")
    ap.add_argument(
        "--seconds",
        type=float,
        default=None,
        metavar="S",
        help="streaming: run for S seconds (default: until what was committed at the start is read)",
    )
    ap.add_argument("--max-per-trigger", type=int, default=None, help="streaming: maxRecordsPerTrigger (log offsets)")
    ap.add_argument("--out", default=None, help="Parquet directory (required for --stream)")
    ap.add_argument("--checkpoint", default=None, help="streaming: checkpoint directory (default: a temporary one)")
    ap.add_argument("--master", default=DEFAULT_MASTER, help="Spark master URL (default %(default)s)")
    a = ap.parse_args(argv)
    if a.stream and a.out is None:
        ap.error("--stream needs --out (the Parquet directory the query writes)")
    spark = session(a.master, "roost-consume")
    reader = (
        (spark.readStream if a.stream else spark.read).format("roost").option("nodes", a.nodes).option("topic", a.topic)
    )
    if a.starting is not None:
        reader = reader.option("startingOffsets", a.starting)
    if a.ending is not None:
        reader = reader.option("endingOffsets", a.ending)
    if a.max_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", a.max_per_trigger)
    df = reader.load()
    if not a.stream:
        df = df.cache()
        n = df.count()
        print(f"{n} records of {a.topic}")
        df.selectExpr("partition", "offset", "timestamp", "key", "cast(payload AS string) AS payload").orderBy(
            "offset"
        ).show(5, truncate=False)
        if a.out is not None:
            df.write.mode("overwrite").parquet(a.out)
            print(f"wrote them to {a.out}")
        return 0
    checkpoint = a.checkpoint or tempfile.mkdtemp(prefix="roost-consume-")
    writer = df.writeStream.format("parquet").option("path", a.out).option("checkpointLocation", checkpoint)
    started = time.monotonic()
    if a.seconds is None:
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
    else:
        query = writer.trigger(processingTime="1 second").start()
        time.sleep(a.seconds)  # (how long the user asked the query to run)
        query.stop()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    rows = sum(p["numInputRows"] for p in batches)
    total = spark.read.parquet(a.out).count()
    print(
        f"read {rows} records of {a.topic} in {len(batches)} micro-batches, {time.monotonic() - started:.0f} s; "
        f"{a.out} holds {total} (checkpoint {checkpoint})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
