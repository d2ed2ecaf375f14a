"""Network faults for chaos runs: loss, duplication, isolation, cuts and delay, with nft.

Library (what scripts/chaos.py uses)::

    with FaultTable() as ft:                      # loopback: rules scoped to ports / addresses on lo
        h = ft.loss(10, ports=[7401, 7501])       # 10% of packets to or from those ports dropped
        ft.heal(h)
    with FaultTable(netns=["roost-h1", "roost-h2", "roost-h3"]) as ft:   # hosts of scripts/netns.py
        h = ft.isolate(ns="roost-h2")             # roost-h2 cut off from every other host
        ft.clear()                                # every fault healed, our tables gone

Manual use (each command leaves its rule in place until ``clear`` or ``heal``)::

    python scripts/faults.py loss 10 --ports 7701,7702
    python scripts/faults.py isolate --ports 7401,7501
    python scripts/faults.py delay 50 --jitter 20 --ports 7401   # runs until Ctrl-C
    python scripts/faults.py list
    python scripts/faults.py heal 3
    python scripts/faults.py clear

Where the rules live, and why
-----------------------------
Every drop lives in one nft table of ours, ``inet roost_chaos``, created on
first use; deleting it heals everything at once, and nothing else on the
machine is touched. Each fault is one regular chain ``fN`` plus one jump rule
to it from a base chain; ``heal`` deletes exactly those (by rule handle), so
faults overlap and heal independently.

Several processes may hold faults in the table at once (a chaos run beside
another script's partition): a ``FaultTable`` heals only its own faults, and
``clear()`` (and the exit of ``with``) deletes the table only once no fault
chain of anyone is left in it; ``fN`` numbers are taken with ``create chain``,
which fails rather than share a chain another process made first (the next
free number is tried then). ``scripts/faults.py clear`` (``clear_all``) still
deletes everything of ours, whoever made it: the cleanup after a crash. Two faults cannot live in that table,
and get a table of the same name in another family, deleted by the same
``clear()``:

* duplication: the kernel has ``dup`` only for the ip, ip6 and netdev
  families (``dup`` in an inet table: "unsupported family"), so loopback
  duplicates live in ``ip roost_chaos`` and netns ones in ``netdev roost_chaos``;
* delay: nft's own ``queue`` is not in this kernel, so delay uses iptables
  ``-j NFQUEUE`` in chains ``ROOST_CHAOS_N`` of the mangle table and a handler
  thread in this process (the ``netfilterqueue`` package).

Where a drop happens decides what the sender sees: a DROP in the output path
makes sendto fail with EPERM, a DROP on the receiving path is silence, as on
a real network. So every drop is on the receiving path: loopback mode hooks
prerouting on lo (each loopback packet passes it exactly once); netns mode
hooks ingress on the bridge ends of the veths (scripts/netns.py), where every
packet between two hosts passes once, before the bridge, with no rule inside
any namespace.

Scopes: what a fault applies to
-------------------------------
* ``ports=[...]``: TCP and UDP packets whose source or destination port is in
  the list (loopback or netns).
* ``ns="roost-h2"`` (netns mode): packets from or to that host's address.
* ``addrs=["127.0.0.12"]``: packets from or to those IPv4 addresses.
* netns mode with no scope: every IPv4 packet between the hosts.

Limits of port scopes on loopback (read before trusting a loopback partition)
----------------------------------------------------------------------------
On loopback every member has the same address, and a TCP link a member
*dials* leaves from an ephemeral port, not from its peer port. So
``isolate(ports=[client, peer])`` of member M drops its client traffic and the
links others dialled *to* M, but not the links M dialled to them: M's
requests (heartbeats, pushes) still reach the others over M's own links. A
complete partition needs addresses that tell members apart: run with
``--netns`` (``isolate(ns=...)``), or give each member its own loopback
address for listening *and* dialling and use ``isolate(addrs=[...])``. For the
same reason ``cut`` takes hosts (namespaces or addresses), never ports.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import ipaddress
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from types import FrameType, TracebackType
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from scripts import netns as _netns  # noqa: E402
from scripts.delayqueue import start_handler, stop_handler  # noqa: E402

TABLE = "roost_chaos"
IPT_TABLE = "mangle"
IPT_PREFIX = "ROOST_CHAOS_"
QUEUE_BASE = 47000  # NFQUEUE numbers QUEUE_BASE + fault id
INSTALL_NFQ = "apt-get install -y libnetfilter-queue-dev && .venv/bin/pip install netfilterqueue"

_JUMP_RE = re.compile(r"\bjump (f\d+) # handle (\d+)")

Hook = tuple[str, str, int]  # (family, base chain, rule handle) of a jump rule


class FaultError(RuntimeError):
    """A fault could not be installed or removed; the message says why."""


class FaultUnavailable(FaultError):
    """This kind of fault cannot work here (kernel, missing tool or package); says what is needed."""


@dataclass
class Fault:
    """The handle of one installed fault: pass it to ``FaultTable.heal``."""

    id: int
    kind: str
    what: str
    hooks: list[Hook] = field(default_factory=list)
    chains: list[tuple[str, str]] = field(default_factory=list)  # (family, chain)
    ipt_chain: str = ""  # delay: the iptables chain and the rules jumping to it
    ipt_jumps: list[list[str]] = field(default_factory=list)
    handler: subprocess.Popen[str] | None = None  # delay: the handler process

    def __str__(self) -> str:
        return f"#{self.id} {self.kind} {self.what}"


# ------------------------------------------------------------------ commands


def _nft(script: str) -> str:
    """Run an nft batch (one atomic transaction) with echo and handles; return what it echoed."""
    try:
        r = subprocess.run(["nft", "-e", "-a", "-f", "-"], input=script, capture_output=True, text=True,
                           timeout=30, check=False)  # fmt: skip
    except FileNotFoundError:
        _netns.require_tools()
        raise
    if r.returncode != 0:
        raise FaultError(f"nft failed: {r.stderr.strip()}\n--- batch ---\n{script}")
    return r.stdout


def _nft_json(*args: str) -> list[dict[str, Any]]:
    r = subprocess.run(["nft", "-j", *args], capture_output=True, text=True, timeout=30, check=False)
    if r.returncode != 0 or not r.stdout.strip():
        return []
    data = json.loads(r.stdout).get("nftables", [])
    return data if isinstance(data, list) else []


def tables() -> list[str]:
    """Families in which a ``roost_chaos`` table exists now."""
    return [t["table"]["family"] for t in _nft_json("list", "tables")
            if "table" in t and t["table"].get("name") == TABLE]  # fmt: skip


def _ipt(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(["iptables", "-w", "-t", IPT_TABLE, *args], capture_output=True, text=True,
                           timeout=30, check=False)  # fmt: skip
    except FileNotFoundError:
        raise FaultUnavailable("delay needs iptables: apt-get install -y iptables") from None
    if check and r.returncode != 0:
        raise FaultError(f"iptables -t {IPT_TABLE} {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def _ipt_ours() -> tuple[list[list[str]], list[str]]:
    """(jump rules to our chains as -D arguments, our chain names) in the mangle table."""
    try:
        r = subprocess.run(["iptables", "-w", "-t", IPT_TABLE, "-S"], capture_output=True, text=True,
                           timeout=30, check=False)  # fmt: skip
    except FileNotFoundError:
        return [], []
    jumps, chains = [], []
    for line in r.stdout.splitlines():
        words = line.split()
        if words[:1] == ["-N"] and words[1].startswith(IPT_PREFIX):
            chains.append(words[1])
        elif words[:1] == ["-A"] and not words[1].startswith(IPT_PREFIX) and "-j" in words \
                and words[words.index("-j") + 1].startswith(IPT_PREFIX):  # fmt: skip
            jumps.append(["-D", *words[1:]])
    return jumps, chains


LOCK_FILE = "/run/lock/roost_chaos.lock"  # (every process that changes our nft table holds it meanwhile)


_held = threading.local()  # (this thread's depth in ``shared_lock`` and its open lock file)
_thread_lock = threading.RLock()


@contextlib.contextmanager
def shared_lock() -> Iterator[None]:
    """Serialise changes of our nft table across processes: a table found empty and deleted must
    not take with it a fault another process installed in between (``nft delete table`` deletes a
    table with whatever it holds), nor a base chain it counted on. Re-entrant in a process (a
    signal handler's ``clear`` may run while the main thread holds it): one flock per process,
    taken at the outermost level."""
    with _thread_lock:
        depth = getattr(_held, "depth", 0)
        if depth == 0:
            os.makedirs(os.path.dirname(LOCK_FILE), exist_ok=True)
            _held.file = open(LOCK_FILE, "a")  # noqa: SIM115 (closed below, at the outermost level)
            fcntl.flock(_held.file, fcntl.LOCK_EX)
        _held.depth = depth + 1
        try:
            yield
        finally:
            _held.depth -= 1
            if _held.depth == 0:
                fcntl.flock(_held.file, fcntl.LOCK_UN)
                _held.file.close()


def clear_all() -> list[str]:
    """Delete every ``roost_chaos`` table and ``ROOST_CHAOS_*`` iptables chain; return what was removed.

    Works without a FaultTable (``scripts/faults.py clear`` after a crash).
    """
    removed = []
    with shared_lock():
        fams = tables()
        if fams:
            _nft("".join(f"delete table {fam} {TABLE}\n" for fam in fams))
            removed += [f"table {fam} {TABLE}" for fam in fams]
    jumps, chains = _ipt_ours()
    for j in jumps:
        _ipt(*j, check=False)
    for c in chains:
        _ipt("-F", c, check=False)
        _ipt("-X", c, check=False)
        removed.append(f"iptables -t {IPT_TABLE} chain {c}")
    return removed


_FAULT_CHAIN_RE = re.compile(r"f(\d+)(_\d+)?")


def _table_objects() -> dict[str, list[dict[str, Any]]]:
    """family -> the objects (chains, rules) of our table in it, for each family it exists in."""
    return {fam: _nft_json("list", "table", fam, TABLE) for fam in tables()}


def _jump_target(rule: dict[str, Any]) -> str | None:
    """The chain an nft rule (JSON) jumps to, if it is a jump."""
    for e in rule.get("expr", []):
        if isinstance(e, dict) and "jump" in e:
            target = e["jump"].get("target")
            return target if isinstance(target, str) else None
    return None


def drop_empty_tables() -> None:
    """Delete our table in each family where no fault chain is left (another process's faults keep
    it), under ``shared_lock``: no other process installs a fault between the look and the delete."""
    with shared_lock():
        for fam, objs in _table_objects().items():
            names = [o["chain"].get("name", "") for o in objs if "chain" in o]
            if not any(_FAULT_CHAIN_RE.fullmatch(n) for n in names):
                subprocess.run(["nft", "delete", "table", fam, TABLE], capture_output=True, timeout=30, check=False)


def heal_id(fault_id: int) -> bool:
    """Heal fault ``fN`` by number (from ``list``), whoever installed it; False if there is none."""
    found = False
    for fam in tables():
        script = ""
        objs = _nft_json("list", "table", fam, TABLE)
        for o in objs:
            rule = o.get("rule")
            if rule and any(e.get("jump", {}).get("target") == f"f{fault_id}" for e in rule.get("expr", [])):
                script += f"delete rule {fam} {TABLE} {rule['chain']} handle {rule['handle']}\n"
        names = [o.get("chain", {}).get("name", "") for o in objs]
        mine = [c for c in names if re.fullmatch(rf"f{fault_id}(_\d+)?", c)]
        script += "".join(f"flush chain {fam} {TABLE} {c}\n" for c in mine)
        script += "".join(f"delete chain {fam} {TABLE} {c}\n" for c in mine)
        if script:
            _nft(script)
            found = True
    chain = f"{IPT_PREFIX}{fault_id}"
    jumps, chains = _ipt_ours()
    for j in jumps:
        if j[-1] == chain:
            _ipt(*j, check=False)
    if chain in chains:
        _ipt("-F", chain, check=False)
        _ipt("-X", chain, check=False)
        found = True
    return found


# ------------------------------------------------------------------ scopes


def _set(items: Sequence[object]) -> str:
    return "{ " + ", ".join(str(i) for i in items) + " }"


def _ports(ports: Sequence[int] | None) -> list[int]:
    out = sorted({int(p) for p in ports or []})
    for p in out:
        if not 1 <= p <= 65535:
            raise ValueError(f"port {p}: must be 1..65535")
    return out


def _percent(percent: float) -> int:
    """Percent as basis points for ``numgen random mod 10000``."""
    if not 0 < percent <= 100:
        raise ValueError(f"percent {percent}: must be more than 0 and at most 100")
    return round(percent * 100)


def _start_delay(qnum: int, ms: float, jitter_ms: float, seed: int | None) -> Any:
    try:
        return start_handler(qnum, ms, jitter_ms, seed)
    except RuntimeError as exc:
        raise FaultError(str(exc)) from None


# ------------------------------------------------------------------ the table


class FaultTable:
    """The faults of one run; ``with FaultTable(...) as ft`` heals them all on exit.

    ``netns``: None for loopback mode (members on 127.x addresses of the normal
    namespace), or the namespaces of scripts/netns.py whose traffic faults may
    touch (their bridge ends are hooked). Used as a context manager it also
    heals everything at interpreter exit (atexit) and on SIGINT/SIGTERM
    before the previous handler runs (``clear`` is idempotent).
    """

    def __init__(self, netns: Sequence[str] | None = None) -> None:
        self.netns = list(netns) if netns else None
        self.faults: dict[int, Fault] = {}
        self._lock = threading.RLock()
        self._last_id = 0  # the last fault number this table took
        self._bases: set[str] = set()  # families whose table and base chain we created
        self._old: dict[int, Any] = {}
        self._made_mangle = False  # iptables-nft made table ip mangle for our delay: drop it when empty
        if self.netns:
            for ns in self.netns:
                _netns.index_of(ns)  # a name of scripts/netns.py, or ValueError

    # ---------------------------------------------------------- lifetime

    def __enter__(self) -> FaultTable:
        _netns.require_tools()
        atexit.register(self.clear)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                if signal.getsignal(sig) != signal.SIG_IGN:  # (a process that ignores it goes on ignoring it)
                    self._old[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self.clear()
        finally:
            for sig, old in self._old.items():
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
            self._old.clear()
            atexit.unregister(self.clear)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.clear()
        old = self._old.get(signum)
        if callable(old):
            old(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)

    def clear(self) -> None:
        """Heal every fault of this table (stopping delay handlers), then delete our nft tables if
        no fault of another process is left in them; never raises for a fault already gone."""
        with self._lock:
            for f in list(self.faults.values()):
                with contextlib.suppress(FaultError):  # (a delay handler that had died: healed all the same)
                    self.heal(f)
            drop_empty_tables()
            if self._made_mangle and "-A " not in _ipt("-S", check=False).stdout:
                subprocess.run(["nft", "delete", "table", "ip", IPT_TABLE], capture_output=True, check=False)
            self._made_mangle = False
            self.faults.clear()
            self._bases.clear()

    # ---------------------------------------------------------- plumbing

    def _next_id(self) -> int:
        """A number no fault uses now, whichever process made it (they share the table): above
        every fN and ROOST_CHAOS_N there is and every number this table took."""
        used = [self._last_id]
        for objs in _table_objects().values():
            names = [o["chain"].get("name", "") for o in objs if "chain" in o]
            used += [int(m.group(1)) for m in map(_FAULT_CHAIN_RE.fullmatch, names) if m]
        used += [int(c[len(IPT_PREFIX) :]) for c in _ipt_ours()[1] if c[len(IPT_PREFIX) :].isdigit()]
        self._last_id = max(used) + 1
        return self._last_id

    def _devices(self) -> str:
        assert self.netns
        return _set([f'"{_netns.veth_of(ns)}"' for ns in self.netns])

    def _base(self, family: str) -> tuple[str, str]:
        """(batch creating our table and base chain in ``family`` if needed, base chain name)."""
        loop = self.netns is None
        chain = {"inet": "pre" if loop else "ing", "ip": "out", "netdev": "ing"}[family]
        devices = "" if loop else self._devices()
        hook = {
            ("inet", True): "type filter hook prerouting priority -300;",  # (before conntrack)
            ("inet", False): f"type filter hook ingress devices = {devices} priority -500;",
            ("ip", True): "type filter hook output priority 0;",  # (dup: see dup())
            ("netdev", False): f"type filter hook ingress devices = {devices} priority 0;",
        }[(family, loop)]
        self._bases.add(family)
        # "add" is a no-op for a table or chain that exists with the same definition.
        return f"add table {family} {TABLE}\nadd chain {family} {TABLE} {chain} {{ {hook} policy accept; }}\n", chain

    def _scope(self, ports: Sequence[int] | None, ns: str | Sequence[str] | None,
               addrs: Sequence[str] | None, family: str) -> tuple[list[list[str]], str]:  # fmt: skip
        """(groups of alternative matches, description): a packet is in scope when it matches
        one alternative of every group.

        Only positive matches: nft 1.0.6 merges two adjacent negated payload
        matches (``th sport != P th dport != P``) into one compare of both
        fields, which means something else.
        """
        hosts = self._hosts(ns, addrs)
        plist = _ports(ports)
        if self.netns is None and not hosts and not plist:
            raise FaultError("loopback mode: give ports= or addrs= (a fault on every loopback packet "
                             "would hit every program on this machine)")  # fmt: skip
        groups: list[list[str]] = []
        what = []
        if family == "netdev":
            groups.append(["meta protocol ip"])  # (netdev hooks see ARP too)
        if hosts:
            groups.append([f"ip saddr {_set(hosts)}", f"ip daddr {_set(hosts)}"])
            what.append("hosts " + ",".join(hosts))
        if plist:
            groups.append([f"meta l4proto {{ tcp, udp }} th {end} {_set(plist)}" for end in ("sport", "dport")])
            what.append("ports " + ",".join(map(str, plist)))
        return groups, " ".join(what) or "all hosts"

    def _hosts(self, ns: str | Sequence[str] | None, addrs: Sequence[str] | None) -> list[str]:
        out = []
        for name in [ns] if isinstance(ns, str) else list(ns or []):
            if self.netns is None:
                raise FaultError(f"ns={name!r} in loopback mode: make the FaultTable with netns=[...]")
            if name not in self.netns:
                raise FaultError(f"{name}: not one of this table's namespaces {self.netns}")
            out.append(_netns.addr_of(name))
        for a in addrs or []:
            try:
                out.append(str(ipaddress.IPv4Address(a)))
            except ValueError:
                raise FaultError(f"{a!r}: not an IPv4 address (nor a namespace of scripts/netns.py)") from None
        return sorted(set(out))

    def _install(self, kind: str, what: str, family: str, groups: list[list[str]], action: list[str]) -> Fault:
        """Chains fN, fN_1, ..., one per group of ``groups`` then ``action``, and one jump to fN.

        A packet goes on to the next chain (goto) when it matches one of the
        group's alternatives, else it falls off the end of the chain and
        returns to the base chain (accepted). All in one transaction.
        """
        with self._lock:
            for attempt in range(5):
                try:
                    return self._install_once(kind, what, family, groups, action)
                except FaultError as exc:  # (another process took the number between look and create)
                    if "File exists" not in str(exc) or attempt == 4:
                        raise
            raise AssertionError("unreachable")

    def _install_once(self, kind: str, what: str, family: str, groups: list[list[str]], action: list[str]) -> Fault:
        with self._lock, shared_lock():
            fid = self._next_id()
            batch, base = self._base(family)
            chains = [f"f{fid}"] + [f"f{fid}_{i}" for i in range(1, len(groups) + 1)]
            batch += "".join(f"create chain {family} {TABLE} {c}\n" for c in chains)
            for i, group in enumerate(groups):
                batch += "".join(f"add rule {family} {TABLE} {chains[i]} {alt} goto {chains[i + 1]}\n" for alt in group)
            batch += "".join(f"add rule {family} {TABLE} {chains[-1]} {r}\n" for r in action)
            lo = {"inet": 'iifname "lo" ', "ip": 'oifname "lo" ', "netdev": ""}[family] if self.netns is None else ""
            batch += f"add rule {family} {TABLE} {base} {lo}jump {chains[0]}\n"
            try:
                out = _nft(batch)
            except FaultError:
                self._bases.discard(family)
                raise
            hooks = [(family, base, int(h)) for c, h in _JUMP_RE.findall(out) if c == chains[0]]
            if len(hooks) != 1:
                raise FaultError(f"nft did not echo the handle of the jump to {chains[0]}:\n{out}")
            fault = Fault(fid, kind, what, hooks=hooks, chains=[(family, c) for c in chains])
            self.faults[fid] = fault
            return fault

    # ---------------------------------------------------------- faults

    def loss(self, percent: float, ports: Sequence[int] | None = None, ns: str | Sequence[str] | None = None,
             addrs: Sequence[str] | None = None) -> Fault:  # fmt: skip
        """Drop ``percent`` % of the packets in scope, each packet on its own random draw.

        Silent for both ends (dropped on the receiving path). TCP retransmits,
        UDP loses. Precision 0.01 %.
        """
        bp = _percent(percent)
        groups, what = self._scope(ports, ns, addrs, "inet")
        return self._install("loss", f"{percent}% {what}", "inet", groups, [f"numgen random mod 10000 < {bp} drop"])

    def isolate(self, ports: Sequence[int] | None = None, ns: str | Sequence[str] | None = None,
                addrs: Sequence[str] | None = None) -> Fault:  # fmt: skip
        """Drop everything to and from a member: a partition of it from everyone, silent both ways.

        ``ns=`` (netns mode) and ``addrs=`` are complete partitions. ``ports=``
        on loopback is NOT: the links the member dialled leave from ephemeral
        ports and still work (see the module docstring).
        """
        if ports is None and ns is None and addrs is None:
            raise FaultError("isolate what? give ports=, ns= or addrs=")
        groups, what = self._scope(ports, ns, addrs, "inet")
        return self._install("isolate", what, "inet", groups, ["drop"])

    def cut(self, a: str | Sequence[str], b: str | Sequence[str], one_way: bool = False) -> Fault:
        """Drop packets from hosts ``a`` to hosts ``b`` (and ``b`` to ``a`` unless ``one_way``).

        Hosts are namespaces (netns mode) or IPv4 addresses. Not ports: on one
        loopback address every TCP link has an ephemeral end, so which member
        dialled a link cannot be told from ports, and a cut between two of
        three members would cut the third as well, or nothing.
        """
        sides = []
        for side in (a, b):
            items = [side] if isinstance(side, str | int) else list(side)
            if any(isinstance(i, int) or str(i).isdigit() for i in items):
                raise FaultError("cut takes hosts (namespaces or addresses), not ports: on loopback a link's "
                                 "dialling end has an ephemeral port, so ports cannot tell members apart")  # fmt: skip
            names = [i for i in items if isinstance(i, str) and i.startswith(_netns.NS_PREFIX)]
            sides.append(self._hosts(names, [i for i in items if i not in names]))
        ha, hb = sides
        if not ha or not hb:
            raise FaultError("cut: both sides need at least one host")
        body = [f"ip saddr {_set(ha)} ip daddr {_set(hb)} drop"]
        if not one_way:
            body.append(f"ip saddr {_set(hb)} ip daddr {_set(ha)} drop")
        arrow = "->" if one_way else "<->"
        return self._install("cut", f"{','.join(ha)} {arrow} {','.join(hb)}", "inet", [], body)

    def dup(self, percent: float, ports: Sequence[int] | None = None, ns: str | Sequence[str] | None = None,
            addrs: Sequence[str] | None = None) -> Fault:  # fmt: skip
        """Send ``percent`` % of the packets in scope twice (each duplicated at most once).

        Loopback: ``dup to 127.0.0.1 device "lo"`` in the output path of an
        ``ip roost_chaos`` table; the copy is routed by its own destination, so
        it reaches any 127.x address. The copy passes the output hook again but
        the kernel never duplicates a duplicate, so there are exactly two.
        Netns: on the bridge end of the sender's veth (``netdev roost_chaos``),
        the copy is sent into the bridge, which forwards it like the original.
        """
        bp = _percent(percent)
        if self.netns is None:
            groups, what = self._scope(ports, ns, addrs, "ip")
            return self._install("dup", f"{percent}% {what}", "ip", groups,
                                 [f'numgen random mod 10000 < {bp} dup to 127.0.0.1 device "lo"'])  # fmt: skip
        groups, what = self._scope(ports, ns, addrs, "netdev")
        return self._install("dup", f"{percent}% {what}", "netdev", groups,
                             [f'numgen random mod 10000 < {bp} dup to "{_netns.BRIDGE}"'])  # fmt: skip

    def delay(self, ms: float, jitter_ms: float = 0.0, ports: Sequence[int] | None = None,
              ns: str | Sequence[str] | None = None, addrs: Sequence[str] | None = None,
              seed: int | None = None) -> Fault:  # fmt: skip
        """Hold each packet in scope ``ms`` +- ``jitter_ms`` (uniform); jitter reorders packets.

        iptables ``-j NFQUEUE --queue-bypass`` hands the packets to a thread of
        this process, which gives each its verdict when due (about 10,000
        packets/s on 2 cores: fine for chaos, not for throughput; past
        MAX_HELD held packets, new ones pass undelayed). Loopback: the OUTPUT
        chain on lo. Netns: the FORWARD chain of the normal namespace, which
        sees bridged packets only with br_netfilter's bridge-nf-call-iptables=1.
        If this process dies, --queue-bypass lets packets through undelayed.
        Raises FaultUnavailable when netfilterqueue or iptables is missing.
        """
        if ms < 0 or jitter_ms < 0:
            raise ValueError("delay and jitter must be >= 0 ms")
        try:
            import netfilterqueue  # noqa: F401
        except ImportError:
            raise FaultUnavailable(f"delay needs the netfilterqueue package: {INSTALL_NFQ}") from None
        had_mangle = any(t.get("table", {}).get("name") == IPT_TABLE for t in _nft_json("list", "tables", "ip"))
        _ipt("-S", "OUTPUT")  # iptables present, or FaultUnavailable
        if self.netns is not None:
            sysctl = "/proc/sys/net/bridge/bridge-nf-call-iptables"
            try:
                with open(sysctl) as f:
                    on = f.read().strip() == "1"
            except OSError:
                on = False
            if not on:
                raise FaultUnavailable(f"delay in netns mode needs br_netfilter with {sysctl} = 1")
        hosts = self._hosts(ns, addrs)
        plist = _ports(ports)
        if self.netns is None and not hosts and not plist:
            raise FaultError("loopback mode: give ports= or addrs=")
        with self._lock:
            fid = self._next_id()
            qnum = QUEUE_BASE + fid
            chain = f"{IPT_PREFIX}{fid}"
            target = ["-j", "NFQUEUE", "--queue-num", str(qnum), "--queue-bypass"]
            rules: list[list[str]] = []
            each: list[str | None] = [*hosts] or [None]
            for h in each:
                for sel in (["-s", h], ["-d", h]) if h else [[]]:
                    if plist:
                        mp = ["-m", "multiport", "--ports", ",".join(map(str, plist))]
                        rules += [[*sel, "-p", proto, *mp, *target] for proto in ("udp", "tcp")]
                    else:
                        rules.append([*sel, *target])
            jump = ["OUTPUT", "-o", "lo", "-j", chain] if self.netns is None else \
                ["FORWARD", "-i", _netns.BRIDGE, "-j", chain]  # fmt: skip
            fault = Fault(fid, "delay", f"{ms}+-{jitter_ms} ms {' '.join(hosts)} {','.join(map(str, plist))}".strip(),
                          ipt_chain=chain, ipt_jumps=[jump])  # fmt: skip
            fault.handler = _start_delay(qnum, ms, jitter_ms, seed)
            self.faults[fid] = fault
            try:
                _ipt("-N", chain)
                for r in rules:
                    _ipt("-A", chain, *r)
                _ipt("-I", *jump)
            except BaseException:
                self._made_mangle |= not had_mangle
                self.heal(fault)
                raise
            self._made_mangle |= not had_mangle
            return fault

    def heal(self, fault: Fault) -> None:
        """Remove one fault (idempotent: healing a healed fault does nothing)."""
        with self._lock:
            if self.faults.pop(fault.id, None) is None:
                return
            if fault.ipt_chain:
                for j in fault.ipt_jumps:
                    _ipt("-D", *j, check=False)
                _ipt("-F", fault.ipt_chain, check=False)
                _ipt("-X", fault.ipt_chain, check=False)
            if fault.handler is not None:
                code = fault.handler.poll()
                stop_handler(fault.handler)
                if code is not None:
                    raise FaultError(f"delay handler of {fault} had died (exit {code}): packets passed undelayed")
            # Only what is there: our table may have been deleted (and made again) by another
            # process meanwhile (an older faults.py, or `scripts/faults.py clear`).
            # A jump is ours when it is at its handle and still jumps to our first chain.
            with shared_lock():
                rules, chains = set(), set()
                for fam, objs in _table_objects().items():
                    rules |= {(fam, o["rule"].get("chain"), o["rule"].get("handle"), _jump_target(o["rule"]))
                              for o in objs if "rule" in o}  # fmt: skip
                    chains |= {(fam, o["chain"].get("name")) for o in objs if "chain" in o}
                first = f"f{fault.id}"
                script = "".join(f"delete rule {fam} {TABLE} {base} handle {h}\n" for fam, base, h in fault.hooks
                                 if (fam, base, h, first) in rules)  # fmt: skip
                script += "".join(f"flush chain {fam} {TABLE} {c}\ndelete chain {fam} {TABLE} {c}\n"
                                  for fam, c in fault.chains if (fam, c) in chains)  # fmt: skip
                if script:
                    _nft(script)


# ------------------------------------------------------------------ CLI


def _csv_ports(s: str) -> list[int]:
    return [int(p) for p in s.split(",") if p.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)

    def scoped(name: str, helptext: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--ports", type=_csv_ports, help="comma-separated ports (TCP and UDP, either end)")
        p.add_argument("--ns", help="a namespace of scripts/netns.py (netns mode)")
        p.add_argument("--addrs", help="comma-separated IPv4 addresses")
        return p

    scoped("loss", "drop a percentage of packets").add_argument("percent", type=float)
    scoped("dup", "duplicate a percentage of packets").add_argument("percent", type=float)
    scoped("isolate", "drop everything to and from the scope")
    p_delay = scoped("delay", "hold packets (runs until Ctrl-C)")
    p_delay.add_argument("ms", type=float)
    p_delay.add_argument("--jitter", type=float, default=0.0)
    p_cut = sub.add_parser("cut", help="drop packets between hosts (namespaces or addresses)")
    p_cut.add_argument("a")
    p_cut.add_argument("b")
    p_cut.add_argument("--one-way", action="store_true")
    p_heal = sub.add_parser("heal", help="remove one fault by number (see list)")
    p_heal.add_argument("id", type=int)
    sub.add_parser("list", help="print our tables and chains")
    sub.add_parser("clear", help="delete every rule of ours")
    if argv is None:
        argv = sys.argv[1:]
    args = ap.parse_args(argv)

    try:
        if args.cmd == "clear":
            for what in clear_all():
                print("removed " + what)
            return 0
        if args.cmd == "list":
            for fam in tables():
                print(subprocess.run(["nft", "list", "table", fam, TABLE], capture_output=True, text=True).stdout)
            for c in _ipt_ours()[1]:
                print(_ipt("-S", c).stdout)
            return 0
        if args.cmd == "heal":
            if not heal_id(args.id):
                print(f"no fault {args.id}", file=sys.stderr)
                return 1
            return 0
        ns = getattr(args, "ns", None)
        hosts_named = args.cmd == "cut" and any(h.startswith(_netns.NS_PREFIX) for h in (args.a, args.b))
        ft = FaultTable(netns=_netns.namespaces() if ns or hosts_named else None)
        addrs = args.addrs.split(",") if getattr(args, "addrs", None) else None
        if args.cmd == "cut":
            fault = ft.cut(args.a, args.b, one_way=args.one_way)
        elif args.cmd == "loss":
            fault = ft.loss(args.percent, ports=args.ports, ns=ns, addrs=addrs)
        elif args.cmd == "dup":
            fault = ft.dup(args.percent, ports=args.ports, ns=ns, addrs=addrs)
        elif args.cmd == "isolate":
            fault = ft.isolate(ports=args.ports, ns=ns, addrs=addrs)
        else:
            with ft:
                fault = ft.delay(args.ms, args.jitter, ports=args.ports, ns=ns, addrs=addrs)
                print(f"{fault}: Ctrl-C to stop", flush=True)
                # Until Ctrl-C / SIGTERM (the table heals) or the handler dies. Not Popen.wait(): a
                # signal handler that reaps the handler while wait() holds its lock could not.
                while fault.id in ft.faults and fault.handler is not None and fault.handler.poll() is None:
                    time.sleep(0.2)
            return 0
        print(f"{fault}  (heal: scripts/faults.py heal {fault.id}; all: scripts/faults.py clear)")
    except KeyboardInterrupt:
        return 130
    except (FaultError, ValueError) as exc:
        print(f"faults: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
