"""A real cluster of `roost node` processes on free loopback ports, for tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from cluster.config import load_cluster_config
from cluster.launcher import Launcher, write_local_config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class LocalCluster:
    def __init__(self, tmp: Path, n: int = 3, secret: str = "test-secret-0123456789") -> None:
        self.tmp = tmp
        self.config = tmp / "cluster.toml"
        ports = write_local_config(
            self.config, n, secret,
            cluster_extra="heartbeat_interval = 0.1\nsuspect_after = 0.3\ndown_after = 0.8\n"
            "anti_entropy_interval = 1.0\nsnapshot_interval = 1.0\n",
            node_extra='[node]\nlog_level = "info"\n[timeouts]\nsubscriber_timeout = 5.0\n',
        )  # fmt: skip
        self.ids = list(ports)
        self.client_ports = {m: p[0] for m, p in ports.items()}
        self.peer_ports = {m: p[1] for m, p in ports.items()}
        self.cc = load_cluster_config(self.config)
        self.launcher = Launcher(str(tmp / "run"))

    def addr(self, member: str) -> str:
        return f"127.0.0.1:{self.client_ports[member]}"

    def start(self, *members: str) -> None:
        procs = [self.launcher.start(self.cc, str(self.config), m, wait=False) for m in members or self.ids]
        from node.procs import wait_listening

        for p, m in zip(procs, members or self.ids, strict=True):
            wait_listening(p, "127.0.0.1", self.client_ports[m], timeout=60)

    def kill(self, member: str) -> None:
        assert self.launcher.kill(member) == 0

    def stop(self) -> None:
        self.launcher.down()

    def log(self, member: str) -> str:
        return (self.tmp / "run" / f"{member}.log").read_text()

    def status(self, member: str) -> dict:
        r = roost("status", "--node", self.addr(member), "--json")
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)

    def wait_for(self, cond, timeout: float = 15.0, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if cond():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}")


def roost(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cluster.cli", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, **kw)  # fmt: skip


def start_sub(node: str, topic: str, count: int, timeout: float = 60, mode: str = "reliable") -> subprocess.Popen[str]:
    p = subprocess.Popen([sys.executable, "-m", "cluster.cli", "sub", topic, "--node", node, "--count", str(count),
                          "--mode", mode, "--timeout", str(timeout)], cwd=ROOT, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)  # fmt: skip
    assert p.stderr is not None
    line = p.stderr.readline()
    assert "subscribed to" in line, line + p.stderr.read()
    return p
