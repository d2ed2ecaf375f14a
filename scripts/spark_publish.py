"""Publish rows from Spark to a Roost topic through the `roost` data source (docs/pipeline.md).

    roost node &                                     # a node on 127.0.0.1:7400
    roost sub demo --count 1000 &                    # a reliable subscriber
    python scripts/spark_publish.py --rows 1000 --topic demo
    python scripts/spark_publish.py --stream 10 --rate 100 --topic demo   # a rate source for 10 s

Batch: `spark.range(rows)` as payloads `row-0` ... with a key and a tag. Streaming: Spark's rate
source, the value as the payload; the checkpoint (--checkpoint) lets a restarted query go on
where it stopped without publishing a row twice.
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
    ap.add_argument("--nodes", default="127.0.0.1:7400", help="host:port[,host:port] (default %(default)s)")
    ap.add_argument("--topic", default="demo", help="default %(default)s")
    ap.add_argument("--rows", type=int, default=1000, help="batch: how many rows (default %(default)s)")
    ap.add_argument("--stream", type=float, default=None, metavar="S", help="stream a rate source for S seconds")
    ap.add_argument("--rate", type=int, default=100, help="streaming: rows per second (default %(default)s)")
    ap.add_argument("--checkpoint", default=None, help="streaming: checkpoint directory (default: a temporary one)")
    ap.add_argument("--master", default=DEFAULT_MASTER, help="Spark master URL (default %(default)s)")
    a = ap.parse_args(argv)
    spark = session(a.master, "roost-publish")
    if a.stream is None:
        df = spark.range(a.rows).selectExpr(
            "concat('row-', id) AS payload", "cast(id % 10 AS string) AS key", "map('source', 'spark') AS tags"
        )
        df.write.format("roost").option("nodes", a.nodes).option("topic", a.topic).mode("append").save()
        print(f"published {a.rows} rows to {a.topic} with acknowledgement")
        return 0
    checkpoint = a.checkpoint or tempfile.mkdtemp(prefix="roost-stream-")
    query = (spark.readStream.format("rate").option("rowsPerSecond", a.rate).load()
             .selectExpr("cast(value AS string) AS payload")
             .writeStream.format("roost").option("nodes", a.nodes).option("topic", a.topic)
             .option("checkpointLocation", checkpoint).start())  # fmt: skip
    time.sleep(a.stream)  # (how long the user asked the stream to run)
    query.stop()
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    print(f"streamed {rows} rows to {a.topic} in {a.stream:g} s (checkpoint {checkpoint})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
