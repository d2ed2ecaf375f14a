"""One place that starts Spark for Roost: the audit, the data source's tests and the examples all
get their session here, so the settings that make PySpark work in a virtualenv on a small machine
(../shared/ENVIRONMENT.md: PySpark 4.3 facts) are written once.

`master` is any Spark master URL: ``local[*]`` (the default) runs in this process's JVM; a
``spark://host:7077`` master runs the same job on a cluster, whose workers need the same Python
packages (``pip install roost[pipeline]``) and the run directories and output directory at the
same paths (shared storage).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

DEFAULT_MASTER = "local[*]"
LOG4J = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")


class SparkUnavailable(RuntimeError):
    """Spark cannot start here (no Java, or pyspark missing): the message says what to install."""


def java_major() -> int | None:
    """The major version of the `java` on PATH (or JAVA_HOME), None when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    for word in out.split():
        word = word.strip('"')
        if word[:1].isdigit():
            head = word.split(".")[0]
            return int(head) if head.isdigit() else None
    return None


def session(master: str = DEFAULT_MASTER, app: str = "roost", **conf: Any) -> Any:
    """The SparkSession for `master`, created once per process (getOrCreate) with Roost's data
    sources registered; `conf` adds or overrides Spark settings."""
    major = java_major()
    if major is None or major < 17:
        found = "no java on PATH" if major is None else f"java {major}"
        raise SparkUnavailable(
            f"Spark needs Java 17 or later ({found}): `make test` installs it, or "
            "apt-get install openjdk-17-jre-headless"
        )
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable("pyspark is not installed: pip install 'roost[pipeline]'") from None
    # Workers must run this interpreter (the venv's), or they cannot import our data sources and
    # Spark reports a misleading DATA_SOURCE_NOT_FOUND.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    local = master.startswith("local")
    if local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    settings: dict[str, Any] = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": "1g",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.pyspark.udf.faulthandler.enabled": "true",
        "spark.python.worker.faulthandler.enabled": "true",
        "spark.sql.sources.partitionOverwriteMode": "dynamic",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J}",
        "spark.executor.extraJavaOptions": f"-Dlog4j2.configurationFile={LOG4J}",
        **conf,
    }
    if local:  # (a few cores: few shuffle partitions; a cluster keeps its own defaults, and AQE)
        settings.setdefault("spark.sql.shuffle.partitions", "4")
    builder = SparkSession.builder.master(master).appName(app)
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from roost.pipeline.eventsource import EventLogSource
    from roost.pipeline.sink import RoostSink

    spark.dataSource.register(EventLogSource)
    spark.dataSource.register(RoostSink)
    return spark
