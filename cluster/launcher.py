"""Run a cluster's members as local processes: up, down, kill, start.

``roost cluster up CONFIG`` starts one ``roost node --config CONFIG --id X``
per member, once it has created the secret file the config names if neither
it nor $ROOST_CLUSTER_SECRET exists (cluster/secretfile.py). In the
foreground it forwards SIGINT/SIGTERM to them and waits; with ``--detach`` it
writes a pid file and a log per member under the run directory and returns
once every member serves. ``down`` stops the members
whose pid files it finds, ``kill ID`` sends SIGKILL (a crash drill) and
``start ID`` starts one member again. Before signalling a pid, the launcher
checks that the process is still the member it started (a pid can be reused).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from roost.client.addresses import hostport
from roost.cluster.config import ClusterConfig, load_cluster_config
from roost.cluster.secretfile import ensure_secret_file, shown
from roost.node.config import ConfigError
from roost.node.procs import free_port, is_ready, not_ready, wait_ready

DEFAULT_RUN_DIR = "run/cluster"
#: How long a member may take to be ready (a PULL of millions of subscriptions takes a while); a
#: member that exits is reported at once.
READY_TIMEOUT = 60.0


def write_local_config(
    path: Path,
    n: int = 3,
    secret: str = "local-secret-0123456789",
    cluster_extra: str = "",
    node_extra: str = "",
    hosts: list[str] | None = None,
    monitor: bool = False,
) -> dict[str, tuple[int, int]]:
    """A cluster config for ``n`` members on free loopback ports (tests, scripts);
    ``hosts``: one loopback address per member (chaos runs tell members apart by
    address), 127.0.0.1 for all by default; ``monitor``: each member gets a monitoring
    endpoint on a free port too (its ``monitor_addr`` in the loaded config).

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
        http = f'monitor_addr = "{host}:{fresh(free_tcp, host)}"\n' if monitor else ""
        parts.append(f'[[members]]\nid = "{mid}"\nclient_addr = "{host}:{udp}"\n'
                     f'peer_addr = "{host}:{tcp}"\ndata_dir = "{path.parent}/data/{mid}"\n{http}')  # fmt: skip
    parts.append(node_extra)
    path.write_text("\n".join(parts))
    return ports


def free_tcp_port(host: str) -> int:
    return free_port(host, socket.SOCK_STREAM)


def node_command(config: str, member_id: str) -> list[str]:
    return [sys.executable, "-m", "roost", "node", "--config", config, "--id", member_id]


class Launcher:
    def __init__(self, run_dir: str = DEFAULT_RUN_DIR, ready_timeout: float = READY_TIMEOUT) -> None:
        self.run_dir = Path(run_dir)
        self.ready_timeout = ready_timeout  # (a member is ready once synced: a big PULL takes a while)

    # ------------------------------------------------------------ bookkeeping

    def _pidfile(self, member_id: str) -> Path:
        return self.run_dir / f"{member_id}.pid"

    def _logfile(self, member_id: str) -> Path:
        return self.run_dir / f"{member_id}.log"

    def _save_config_path(self, config: str) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "cluster.json").write_text(json.dumps({"config": os.path.abspath(config)}))

    def config_path(self) -> str:
        path = _started_from(str(self.run_dir))
        if path is None:
            raise SystemExit(f"roost cluster: no cluster was started with run dir {self.run_dir}")
        return path

    def has_member(self, member_id: str) -> bool:
        """Is ``member_id`` in the config this run directory's cluster was started with?
        (ConfigError when that config no longer loads: the caller decides if it matters.)"""
        return any(m.id == member_id for m in load_cluster_config(self.config_path(), need_secret=False).members)

    def pid_of(self, member_id: str) -> int | None:
        """The pid of our running member, or None (stale pid files are removed)."""
        try:
            pid = int(self._pidfile(member_id).read_text())
        except (OSError, ValueError):
            return None
        cmdline = _cmdline(pid)
        if b"--id" not in cmdline or member_id.encode() not in cmdline:
            self._pidfile(member_id).unlink(missing_ok=True)
            return None
        return pid

    # ------------------------------------------------------------ actions

    def start(self, cc: ClusterConfig, config: str, member_id: str, wait: bool = True) -> subprocess.Popen[bytes]:
        cc.member(member_id)
        if self.pid_of(member_id) is not None:
            raise RuntimeError(f"{member_id} is already running (pid {self.pid_of(member_id)})")
        self._save_config_path(config)
        proc = self._spawn(member_id, node_command(config, member_id))
        if wait:
            self.wait_ready(proc, member_id, cc.member(member_id).client_addr)
        return proc

    def start_command(self, member_id: str, command: list[str], client: tuple[str, int]) -> subprocess.Popen[bytes]:
        """Start a member by its own command line (one that joined: not in the config)."""
        if self.pid_of(member_id) is not None:
            raise RuntimeError(f"{member_id} is already running (pid {self.pid_of(member_id)})")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        proc = self._spawn(member_id, command)
        self.wait_ready(proc, member_id, client)
        return proc

    def _spawn(self, member_id: str, command: list[str]) -> subprocess.Popen[bytes]:
        log = open(self._logfile(member_id), "ab")  # noqa: SIM115 - handed to the child
        proc = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True)
        log.close()
        self._pidfile(member_id).write_text(str(proc.pid))
        remember(self.run_dir)
        return proc

    def wait_ready(self, proc: subprocess.Popen[bytes], member_id: str, client: tuple[str, int]) -> None:
        """Until the member's own STATUS answers (its id and pid; a syncing member does not answer
        yet); RuntimeError naming it, with the end of its log, when it exits first."""
        try:
            wait_ready(proc, member_id, client, self.ready_timeout, self._logfile(member_id))
        except RuntimeError:
            if proc.poll() is not None:
                self._pidfile(member_id).unlink(missing_ok=True)
            raise

    def logfile(self, member_id: str) -> Path:
        return self._logfile(member_id)

    def forget(self, member_id: str) -> None:
        self._pidfile(member_id).unlink(missing_ok=True)

    def up(self, config: str, detach: bool) -> int:
        created = ensure_secret_file(config)  # (every member starts here: up may make their secret)
        if created is not None:
            print(f"created the cluster secret {shown(created)} (mode 0600): every member reads it; delete it to "
                  "change the secret", flush=True)  # fmt: skip
        cc = load_cluster_config(config)
        running = {m.id: pid for m in cc.members if (pid := self.pid_of(m.id)) is not None}
        if running:
            raise RuntimeError(f"already running from {self.run_dir}: "
                               + ", ".join(f"{m} (pid {p})" for m, p in running.items()))  # fmt: skip
        procs: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for m in cc.members:
                procs[m.id] = self.start(cc, config, m.id, wait=False)
            self._all_ready(cc, procs)
        except BaseException:  # (a member that exited, or Ctrl-C while waiting: none is left running)
            self._stop_all(procs)
            raise
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

    def _all_ready(self, cc: ClusterConfig, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        """Each member ready, in any order: a member that exits is reported at once (a busy port
        within a second, not after the others' time-outs)."""
        waiting = dict(procs)
        deadline = time.monotonic() + self.ready_timeout
        while waiting:
            for mid, proc in list(waiting.items()):
                m = cc.member(mid)
                if not is_ready(proc, mid, m.client_addr, self._logfile(mid)):
                    if time.monotonic() >= deadline:
                        raise not_ready(proc, mid, m.client_addr, self.ready_timeout, self._logfile(mid))
                    continue
                del waiting[mid]
                monitor = f", monitor http://{hostport(*m.monitor_addr)}" if m.monitor_addr else ""
                print(f"{mid} ready: clients udp://{hostport(*m.advertised)}{monitor}, pid {proc.pid}, "
                      f"log {self._logfile(mid)}", flush=True)  # fmt: skip
            if waiting:
                time.sleep(0.05)

    def _stop_all(self, procs: dict[str, subprocess.Popen[bytes]]) -> None:
        """``up`` failed: the members it started stop (SIGTERM, then SIGKILL) and are forgotten."""
        for p in procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for mid, p in procs.items():
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            self._pidfile(mid).unlink(missing_ok=True)
        print(f"roost cluster: stopped the {len(procs)} member(s) this up started", file=sys.stderr)

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
        cc = load_cluster_config(self.config_path(), need_secret=False)
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


# ------------------------------------------------------------ which run directory

#: Run directories ``up`` used, so that ``kill``/``start``/``down`` without --run-dir find the
#: cluster wherever it was started (another --run-dir, another working directory).
REGISTRY_MAX = 50


def registry_path() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "roost" / "run-dirs.json"


def _registered() -> list[str]:
    try:
        dirs = json.loads(registry_path().read_text())
    except (OSError, ValueError):
        return []
    return [d for d in dirs if isinstance(d, str)] if isinstance(dirs, list) else []


def remember(run_dir: Path) -> None:
    """Record ``run_dir`` (best effort: a read-only home only costs the lookup)."""
    path, me = registry_path(), str(run_dir.resolve())
    dirs = [me, *(d for d in _registered() if d != me and os.path.isdir(d))][:REGISTRY_MAX]
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dirs))
        os.replace(tmp, path)


def _run_dirs() -> list[str]:
    """Run directories that hold a cluster, most recently used first (the default directory
    where the registry puts it, else last)."""
    dirs = dict.fromkeys([*_registered(), str(Path(DEFAULT_RUN_DIR).resolve())])
    return [d for d in dirs if (Path(d) / "cluster.json").exists()]


def _started_from(run_dir: str) -> str | None:
    try:
        return str(json.loads((Path(run_dir) / "cluster.json").read_text())["config"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_run_dir(member_id: str | None, running: bool, config: str | None = None) -> str:
    """The run directory of the cluster a command without --run-dir means.

    - ``down`` (no member): the cluster that runs; ``join`` (``config``): the one that runs and
      was started from that config file.
    - ``kill``/``leave`` (``running``): the one where ``member_id`` runs.
    - ``start``: the cluster that runs without ``member_id`` while its config has it; else, when
      the member runs somewhere, RuntimeError saying so; else the most recently used cluster
      whose config has the member (every member was stopped), skipping one whose config is gone.

    The default directory when none matches; RuntimeError naming them when several running
    clusters do; ConfigError when a running cluster's config no longer loads."""
    found: list[str] = []
    running_in: list[tuple[str, int]] = []  # (start: where the member already runs)
    stopped: list[str] = []  # (start: clusters that do not run, whose config has the member)
    for d in _run_dirs():
        launcher = Launcher(d)
        if config is not None and _started_from(d) != os.path.abspath(config):
            continue
        alive = any(launcher.pid_of(p.stem) is not None for p in Path(d).glob("*.pid"))
        pid = None if member_id is None else launcher.pid_of(member_id)
        if member_id is None or running:
            hit = alive if member_id is None else pid is not None
        elif pid is not None:
            running_in.append((d, pid))
            hit = False
        elif alive:
            hit = launcher.has_member(member_id)
        else:
            with contextlib.suppress(ConfigError, SystemExit):  # (a cluster long gone: its config too)
                if launcher.has_member(member_id):
                    stopped.append(d)
            hit = False
        if hit:
            found.append(d)
    if len(found) > 1:
        what = "a running cluster" if member_id is None else member_id
        raise RuntimeError(f"{what} in several run directories ({', '.join(found)}): say which with --run-dir")
    if found:
        return found[0]
    if running_in:
        d, pid = running_in[0]
        raise RuntimeError(f"{member_id} is already running (pid {pid}, run dir {d})")
    return stopped[0] if stopped else DEFAULT_RUN_DIR


def _cmdline(pid: int) -> list[bytes]:
    """The process's arguments; [] when it is gone. A process that is still in execve (its
    parent's Popen has returned, and a pid file may already name it) shows an empty command line
    for a moment: that is waited out, briefly, rather than taken for a stale pid."""
    for _ in range(50):
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return []
        if raw or _is_zombie(pid):
            return raw.split(b"\0")
        time.sleep(0.002)
    return []


def _is_zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z"
    except (OSError, IndexError):
        return True
