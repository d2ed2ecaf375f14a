"""Real `roost` processes on free loopback ports, for tests: the CLI, subscriber
processes and a cluster of `roost node` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from roost.cluster.config import load_cluster_config
from roost.cluster.launcher import Launcher, write_local_config
from roost.node.procs import free_udp_port, wait_listening
from tests.polling import wait_until

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOST = [sys.executable, "-m", "roost"]


def roost(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    kw.setdefault("timeout", 120)
    return subprocess.run([*ROOST, *args], cwd=ROOT, capture_output=True, text=True, **kw)


def start_sub(node: str, topic: str, count: int, timeout: float = 60, mode: str = "reliable",
              key: str | None = None, extra: list[str] | None = None) -> subprocess.Popen[Any]:  # fmt: skip
    """A `roost sub` process, returned once it has subscribed (its stdout in bytes with ``extra`` flags)."""
    args = ["sub", topic, "--node", node, "--count", str(count), "--mode", mode, "--timeout", str(timeout)]
    if key is not None:
        args += ["--key", key]
    p = subprocess.Popen([*ROOST, *args, *(extra or [])], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=extra is None)  # fmt: skip
    assert p.stderr is not None
    line = p.stderr.readline()
    line = line if isinstance(line, str) else line.decode()
    assert "subscribed to" in line, line + str(p.stderr.read())
    return p


def read_lines(p: subprocess.Popen[str], n: int) -> list[str]:
    """The next ``n`` messages a `roost sub` prints (it exits by its --timeout at the latest)."""
    assert p.stdout is not None
    return [p.stdout.readline().rstrip("\n") for _ in range(n)]


def sub_lines(p: subprocess.Popen[str], timeout: float = 60) -> list[str]:
    """The rest of what a `roost sub` prints, once it has exited with 0.

    It reads through the same buffered pipe as ``read_lines`` (``communicate``
    would skip what that buffer already holds)."""
    assert p.stdout is not None and p.stderr is not None
    out = p.stdout.read()  # to EOF: the subscriber exits after --count messages or its --timeout
    assert p.wait(timeout) == 0, p.stderr.read()
    return out.splitlines()


class Node:
    """A `roost node` process on a free loopback port (``host`` "::1" for IPv6), started and logging."""

    def __init__(self, tmp_path, extra: str = "", host: str = "127.0.0.1") -> None:
        self.port = free_udp_port(host)
        self.addr = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        self.cfg = tmp_path / "node.toml"
        self.cfg.write_text(f'[node]\nid = "e2e"\nclient_addr = "{self.addr}"\n{extra}')
        self.log = tmp_path / "node.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen([*ROOST, "node", "--config", str(self.cfg)], cwd=ROOT, stderr=log)

        def started() -> bool:
            assert self.proc.poll() is None, self.log.read_text()
            return "node_started" in self.log.read_text()

        wait_until(started, what="node_started in the node's log")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        return self.proc.wait(10)


class LocalCluster:
    def __init__(self, tmp: Path, n: int = 3, secret: str = "test-secret-0123456789", limits: str = "",
                 cluster_extra: str = "", monitor: bool = False) -> None:  # fmt: skip
        self.tmp = tmp
        self.config = tmp / "cluster.toml"
        ports = write_local_config(
            self.config, n, secret,
            cluster_extra="heartbeat_interval = 0.1\nsuspect_after = 0.3\ndown_after = 0.8\n"
            "anti_entropy_interval = 1.0\nsnapshot_interval = 1.0\n" + cluster_extra,
            node_extra='[node]\nlog_level = "info"\n[timeouts]\nsubscriber_timeout = 5.0\n'
            + (f"[limits]\n{limits}\n" if limits else ""), monitor=monitor,
        )  # fmt: skip
        self.ids = list(ports)
        self.client_ports = {m: p[0] for m, p in ports.items()}
        self.peer_ports = {m: p[1] for m, p in ports.items()}
        self.cc = load_cluster_config(self.config)
        self.launcher = Launcher(str(tmp / "run"))

    def addr(self, member: str) -> str:
        return f"127.0.0.1:{self.client_ports[member]}"

    def monitor(self, member: str) -> str:
        """The member's monitoring endpoint, ``http://HOST:PORT`` (with ``monitor=True``)."""
        m = self.cc.member(member).monitor_addr
        assert m is not None, "LocalCluster(monitor=True) gives members a monitoring endpoint"
        return f"http://{m[0]}:{m[1]}"

    def start(self, *members: str) -> None:
        procs = [self.launcher.start(self.cc, str(self.config), m, wait=False) for m in members or self.ids]
        try:
            for p, m in zip(procs, members or self.ids, strict=True):
                wait_listening(p, "127.0.0.1", self.client_ports[m], timeout=60)
        except BaseException:
            self.launcher.down()  # (a fixture that fails in set-up gets no tear-down: stop what started)
            raise

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

    def subscriptions(self, members: list[str] | None = None) -> list[int]:
        """Each member's own count of subscriptions, as `roost status` shows it."""
        return [self.status(m)["subscriptions"] for m in members or self.ids]

    def wait_subscriptions(self, counts: list[int], members: list[str] | None = None) -> None:
        wait_until(lambda: self.subscriptions(members) == counts,
                   what=f"subscriptions {counts} at {members or self.ids}")  # fmt: skip


@pytest.fixture(name="node")
def node_process(tmp_path: Path) -> Any:
    """A `roost node` process, for modules that import this fixture: it stands in for the
    in-process ``node`` of tests/conftest.py where a test needs a real process."""
    n = Node(tmp_path)
    yield n
    n.stop()
