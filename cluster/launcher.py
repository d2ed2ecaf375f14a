"""Run a cluster's members as local processes: up, down, kill, start.

``roost cluster up CONFIG`` starts one ``roost node --config CONFIG --id X``
per member. In the foreground it forwards SIGINT/SIGTERM to them and waits;
with ``--detach`` it writes a pid file and a log per member under the run
directory and returns once every member serves. ``down`` stops the members
whose pid files it finds, ``kill ID`` sends SIGKILL (a crash drill) and
``start ID`` starts one member again. Before signalling a pid, the launcher
checks that the process is still the member it started (a pid can be reused).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from roost.cluster.config import ClusterConfig, load_cluster_config
from roost.node.procs import free_port, wait_listening

DEFAULT_RUN_DIR = "run/cluster"


def write_local_config(
    path: Path, n: int = 3, secret: str = "local-secret-0123456789", cluster_extra: str = "", node_extra: str = "",
    hosts: list[str] | None = None,
) -> dict[str, tuple[int, int]]:
    """A cluster config for ``n`` members on free loopback ports (tests, scripts);
    ``hosts``: one loopback address per member (chaos runs tell members apart by
    address), 127.0.0.1 for all by default.

    Returns {member id: (client UDP port, peer TCP port)}.
    """

    from roost.node.procs import free_udp_port

    taken: set[int] = set()  # (a port the kernel just freed may come back: never twice in one config)

    def fresh(pick: Callable[[str], int], host: str) -> int:
        port = pick(host)
        while port in taken:
            port = pick(host)
        taken.add(port)
        return port

    free_tcp = free_tcp_port
    where = hosts or ["127.0.0.1"] * n
    ports = {f"n{i + 1}": (fresh(free_udp_port, where[i]), fresh(free_tcp, where[i])) for i in range(n)}
    parts = [f'[cluster]\nsecret = "{secret}"\n{cluster_extra}']
    for (mid, (udp, tcp)), host in zip(ports.items(), where, strict=True):
        parts.append(f'[[members]]\nid = "{mid}"\nclient_addr = "{host}:{udp}"\n'
                     f'peer_addr = "{host}:{tcp}"\ndata_dir = "{path.parent}/data/{mid}"\n')  # fmt: skip
    parts.append(node_extra)
    path.write_text("\n".join(parts))
    return ports


def free_tcp_port(host: str) -> int:
    return free_port(host, socket.SOCK_STREAM)


def node_command(config: str, member_id: str) -> list[str]:
    return [sys.executable, "-m", "roost", "node", "--config", config, "--id", member_id]


class Launcher:
    def __init__(self, run_dir: str = DEFAULT_RUN_DIR) -> None:
        self.run_dir = Path(run_dir)

    # ------------------------------------------------------------ bookkeeping

    def _pidfile(self, member_id: str) -> Path:
        return self.run_dir / f"{member_id}.pid"

    def _logfile(self, member_id: str) -> Path:
        return self.run_dir / f"{member_id}.log"

    def _save_config_path(self, config: str) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "cluster.json").write_text(json.dumps({"config": os.path.abspath(config)}))

    def config_path(self) -> str:
        try:
            return str(json.loads((self.run_dir / "cluster.json").read_text())["config"])
        except (OSError, ValueError, KeyError):
            raise SystemExit(f"roost cluster: no cluster was started with run dir {self.run_dir}") from None

    def pid_of(self, member_id: str) -> int | None:
        """The pid of our running member, or None (stale pid files are removed)."""
        try:
            pid = int(self._pidfile(member_id).read_text())
        except (OSError, ValueError):
            return None
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            cmdline = []
        if b"--id" not in cmdline or member_id.encode() not in cmdline:
            self._pidfile(member_id).unlink(missing_ok=True)
            return None
        return pid

    # ------------------------------------------------------------ actions

    def start(self, cc: ClusterConfig, config: str, member_id: str, wait: bool = True) -> subprocess.Popen[bytes]:
        cc.member(member_id)
        if self.pid_of(member_id) is not None:
            raise SystemExit(f"roost cluster: {member_id} is already running (pid {self.pid_of(member_id)})")
        self._save_config_path(config)
        log = open(self._logfile(member_id), "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(node_command(config, member_id), stdout=log, stderr=log, start_new_session=True)
        log.close()
        self._pidfile(member_id).write_text(str(proc.pid))
        if wait:
            m = cc.member(member_id)
            wait_listening(proc, m.client_addr[0], m.client_addr[1], timeout=60)
        return proc

    def start_command(self, member_id: str, command: list[str], client: tuple[str, int]) -> subprocess.Popen[bytes]:
        """Start a member by its own command line (one that joined: not in the config)."""
        if self.pid_of(member_id) is not None:
            raise RuntimeError(f"{member_id} is already running (pid {self.pid_of(member_id)})")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = open(self._logfile(member_id), "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self._pidfile(member_id).write_text(str(proc.pid))
        wait_listening(proc, client[0], client[1], timeout=60)
        return proc

    def logfile(self, member_id: str) -> Path:
        return self._logfile(member_id)

    def forget(self, member_id: str) -> None:
        self._pidfile(member_id).unlink(missing_ok=True)

    def up(self, config: str, detach: bool) -> int:
        cc = load_cluster_config(config)
        procs = {m.id: self.start(cc, config, m.id, wait=False) for m in cc.members}
        for m in cc.members:
            wait_listening(procs[m.id], m.client_addr[0], m.client_addr[1], timeout=60)
            print(f"{m.id} ready: clients udp://{m.client_addr[0]}:{m.client_addr[1]}, "
                  f"pid {procs[m.id].pid}, log {self._logfile(m.id)}", flush=True)  # fmt: skip
        if detach:
            return 0

        def forward(signum: int, _frame: object) -> None:
            for p in procs.values():
                if p.poll() is None:
                    p.send_signal(signal.SIGTERM)

        signal.signal(signal.SIGINT, forward)
        signal.signal(signal.SIGTERM, forward)
        codes = [p.wait() for p in procs.values()]
        for m in cc.members:
            self._pidfile(m.id).unlink(missing_ok=True)
        return 0 if all(c == 0 for c in codes) else 1

    def signal_member(self, member_id: str, sig: int) -> int | None:
        pid = self.pid_of(member_id)
        if pid is None:
            return None
        os.kill(pid, sig)
        return pid

    def wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            if _is_zombie(pid):
                return True
            time.sleep(0.05)
        return False

    def kill(self, member_id: str) -> int:
        pid = self.signal_member(member_id, signal.SIGKILL)
        if pid is None:
            print(f"roost cluster: {member_id} is not running", file=sys.stderr)
            return 1
        self.wait_gone(pid, 5)
        self._pidfile(member_id).unlink(missing_ok=True)
        print(f"killed {member_id} (pid {pid}) with SIGKILL")
        return 0

    def down(self) -> int:
        cc = load_cluster_config(self.config_path())
        stopped = []
        # (the config's members, and members that joined: they have pid files here too)
        ids = dict.fromkeys([m.id for m in cc.members] + sorted(p.stem for p in self.run_dir.glob("*.pid")))
        for member_id in ids:
            pid = self.signal_member(member_id, signal.SIGTERM)
            if pid is not None:
                stopped.append((member_id, pid))
        for member_id, pid in stopped:
            if not self.wait_gone(pid, 15):
                os.kill(pid, signal.SIGKILL)
                self.wait_gone(pid, 5)
            self._pidfile(member_id).unlink(missing_ok=True)
            print(f"stopped {member_id} (pid {pid})")
        return 0


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
