"""A cluster of real member processes for the durable drills (scripts/durable_restart.py,
scripts/durable_availability.py): one place for what they share.

- :func:`write_config` copies a cluster config's settings and members into a directory of its own:
  data directories and the secret under it, every port shifted by ``port_shift`` and each member
  optionally given a host of its own (so a drill does not collide with a cluster, or a chaos run,
  on the config's own ports, and so faults can tell members apart by address: a member dials its
  peers from its own peer address, cluster/server.py).
- :class:`LocalCluster` starts members with cluster/launcher.py's ``Launcher`` (pid files and logs
  in the run directory) and stops or kills only the processes it started, by PID.
- :func:`roost` runs the ``roost`` CLI as a user would.
- :func:`spread` says min / median / max of a list of figures.

The product's settings are never tuned here: a drill measures the defaults.
"""

from __future__ import annotations

import signal
import statistics
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from roost.cluster.config import ClusterConfig, load_cluster_config  # noqa: E402
from roost.cluster.launcher import Launcher  # noqa: E402
from roost.cluster.secretfile import ensure_secret_file  # noqa: E402

#: The keys of a ``[[members]]`` entry that hold a ``host:port`` address.
ADDRESS_KEYS = ("client_addr", "peer_addr", "monitor_addr")


def roost(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """The ``roost`` CLI of this tree, as a user runs it (its output captured)."""
    return subprocess.run([sys.executable, "-m", "roost", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    return str(v)


def moved_address(addr: str, port_shift: int = 0, host: str | None = None) -> str:
    """``host:port`` with the port shifted by ``port_shift`` and the host replaced by ``host``
    (when given); ValueError for a port that would leave 1..65535."""
    old_host, _, port = addr.rpartition(":")
    if not old_host or not port.isdigit():
        raise ValueError(f"{addr!r}: not host:port")
    new = int(port) + port_shift
    if not 0 < new < 65536:
        raise ValueError(f"{addr!r} shifted by {port_shift}: port {new} out of range")
    return f"{host or old_host}:{new}"


def config_text(data: Mapping[str, Any], work: Path, port_shift: int = 0,
                hosts: Mapping[str, str] | None = None) -> str:  # fmt: skip
    """The TOML of a parsed cluster config with its data directories and secret under ``work``,
    its ports shifted by ``port_shift`` and member ``m`` at ``hosts[m]`` when given."""
    lines = []
    for section, table in data.items():
        if section == "members":
            continue
        lines.append(f"[{section}]")
        for k, v in table.items():
            if k == "secret_file":
                v = str(work / "cluster.secret")
            lines.append(f"{k} = {toml_value(v)}")
    for m in data["members"]:
        lines.append("[[members]]")
        for k, v in m.items():
            if k == "data_dir":
                v = str(work / "data" / m["id"])
            elif k in ADDRESS_KEYS:
                v = moved_address(v, port_shift, (hosts or {}).get(m["id"]))
            lines.append(f"{k} = {toml_value(v)}")
    return "\n".join(lines) + "\n"


def write_config(source: Path, work: Path, port_shift: int = 0, hosts: Mapping[str, str] | None = None) -> Path:
    """``work/cluster.toml``: the source config's settings and members (:func:`config_text`)."""
    path = work / "cluster.toml"
    path.write_text(config_text(tomllib.loads(source.read_text()), work, port_shift, hosts))
    return path


def spread(xs: Sequence[float]) -> tuple[float, float, float]:
    """(min, median, max) of the figures; NaNs when there are none."""
    if not xs:
        return float("nan"), float("nan"), float("nan")
    return min(xs), statistics.median(xs), max(xs)


class LocalCluster:
    """The members of one config as local processes, started and stopped by PID through a
    ``Launcher`` whose run directory is ``work/run``."""

    def __init__(self, config: Path, work: Path, ready_timeout: float = 120.0) -> None:
        self.config = config
        ensure_secret_file(config)
        self.cc: ClusterConfig = load_cluster_config(config)
        self.ids = [m.id for m in self.cc.members]
        self.launcher = Launcher(str(work / "run"), ready_timeout=ready_timeout)

    def client_addr(self, m: str) -> str:
        host, port = self.cc.member(m).client_addr
        return f"{host}:{port}"

    def host(self, m: str) -> str:
        return self.cc.member(m).peer_addr[0]

    def start(self, *members: str) -> None:
        """Start the members (all by default) and wait until each one serves."""
        ids = list(members or self.ids)
        procs = [(m, self.launcher.start(self.cc, str(self.config), m, wait=False)) for m in ids]
        for m, p in procs:
            self.launcher.wait_ready(p, m, self.cc.member(m).client_addr)

    def pid(self, m: str) -> int | None:
        return self.launcher.pid_of(m)

    def kill9(self, m: str) -> int:
        """SIGKILL of the member's process (ours, by its pid file); returns its pid."""
        pid = self.launcher.signal_member(m, signal.SIGKILL)
        if pid is None:
            raise RuntimeError(f"{m} is not running")
        self.launcher.wait_gone(pid, 10)
        self.launcher.forget(m)
        return pid

    def log(self, m: str) -> str:
        try:
            return self.launcher.logfile(m).read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 15 s) to every member we started that still runs."""
        if (self.launcher.run_dir / "cluster.json").exists():  # (nothing was started otherwise)
            self.launcher.down()
