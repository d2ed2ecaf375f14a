from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio

from roost.node.config import NodeConfig
from roost.node.logs import EventLog
from roost.node.procs import PORT_RANGE
from roost.node.server import NodeServer
from tests.clusterkit import ROOT

# `roost cluster up` records its run directories under $XDG_STATE_HOME/roost (cluster/launcher.py):
# the tests' clusters go into a directory of this session's, not the user's.
_STATE = os.environ["XDG_STATE_HOME"] = tempfile.mkdtemp(prefix="roost-test-state-")
atexit.register(shutil.rmtree, _STATE, True)
# A node reads $ROOST_MONITOR_TOKEN when its config sets no token (node/config.py): one exported in
# the developer's shell (for roost top) would protect every test node's /varz.
os.environ.pop("ROOST_MONITOR_TOKEN", None)


# `make test` runs the tests in two parts (Makefile): those marked `alone` by themselves, then the
# rest in two processes (pytest-xdist). `alone` are the tests that share what the machine has once,
# the nft table `roost_chaos` and the iptables chains of scripts/faults.py (test_faults clears
# them all) and the network namespaces of scripts/netns.py, and the chaos runs, whose promises are
# judged against timing bounds that a machine busy with another test's Spark job can break.
ALONE_FILES = {"test_chaos.py", "test_faults.py", "test_compose_run.py"}  # (and tests marked alone where they are)
CHAOS_RUNS = {"chaos_run", "durable_chaos_run"}


# Each of the parallel processes hands out ports from its own share of the range (node/procs.py),
# and so do the processes its tests start: two processes checking the same port free at once would
# both give it to a node.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if _WORKER.startswith("gw") and "ROOST_PORT_RANGE" not in os.environ:
    _i, _n = int(_WORKER[2:]), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    _share = (PORT_RANGE[1] - PORT_RANGE[0]) // _n
    os.environ["ROOST_PORT_RANGE"] = f"{PORT_RANGE[0] + _i * _share}-{PORT_RANGE[0] + (_i + 1) * _share - 1}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ALONE_FILES or CHAOS_RUNS & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.alone)


@pytest.fixture
async def node(request: pytest.FixtureRequest) -> AsyncIterator[NodeServer]:
    """A real node on a free loopback UDP port, in this process."""
    cfg = NodeConfig(**{"client_addr": ("127.0.0.1", 0), **getattr(request, "param", {})})
    server = NodeServer(cfg, EventLog("test", "warning"))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()


@pytest.fixture(scope="session")
def chaos_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One short chaos run on real processes (scripts/chaos.py), shared by the tests that judge
    it: the checker's (test_chaos.py) and the Spark audit's (test_pipeline.py)."""
    out = tmp_path_factory.mktemp("chaos") / "run"
    proc = subprocess.run(
        [sys.executable, "scripts/chaos.py", "--duration", "20", "--faults", "kill,pause,partition,loss",
         "--seed", "7", "--rate", "50", "--settle", "5", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    return out, proc


@pytest.fixture(scope="session")
def durable_chaos_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """One short partitioned chaos run with the durable workload (scripts/chaos_durable.py),
    subscribers crashing often (--durable-crash 0.3 a batch), shared by test_chaos.py and
    test_pipeline.py. About 30 s."""
    out = tmp_path_factory.mktemp("chaosd") / "run"
    proc = subprocess.run(
        [sys.executable, "scripts/chaos.py", "--mode", "partitioned", "--duration", "12", "--faults",
         "kill,pause,partition,loss", "--seed", "5", "--rate", "30", "--durable-rate", "30", "--durable-crash",
         "0.3", "--settle", "4", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    return out, proc


@pytest.fixture(scope="session")
def spark() -> Any:
    """One local Spark session for each test process (starting one costs 5-10 s). `local[2,4]`:
    two cores, and a failed task is tried up to 4 times, as on a cluster (local mode's default
    is once), so the data source's retry test can fail a task on purpose."""
    from roost.pipeline.spark import session

    s = session("local[2,4]", "roost-tests", **{"spark.sql.shuffle.partitions": "2"})
    yield s
    s.stop()
