"""Test hosts: N network namespaces joined by a bridge, one 127.77.0.N address each.

    python scripts/netns.py up 3        # roost-h1..roost-h3 at 127.77.0.1..3
    python scripts/netns.py status      # what exists now
    python scripts/netns.py down        # remove all of it (exit 0 when nothing exists)
    python scripts/netns.py ensure-tools   # apt-get install iproute2 nftables if missing (root)

Why namespaces: a member in its own namespace has its own sockets, routes and
firewall, so cutting it off, dropping its packets or killing its links is what
a real host sees, and every peer link it dials leaves from its own address
(on plain loopback all members share 127.0.0.1 and dial from ephemeral ports).

Layout (everything named ``roost-*`` so that ``down`` finds exactly ours):

    normal namespace:  bridge roost-br0 (no address), ports roost-v1..roost-vN
    roost-hI:          lo up, eth0 (the other end of roost-vI) = 127.77.0.I/24

Why 127.77.0.0/24 and route_localnet: see ../shared/ENVIRONMENT.md. Addresses
in 127/8 are never routed off the machine: a packet sent to 127.77.0.I from
the wrong namespace lands on that namespace's loopback, never on the real
network. The kernel refuses such an address on a non-loopback device unless
``route_localnet`` is set (RTNETLINK answers: Invalid argument). Inside a
namespace the /24 on eth0 is a longer prefix than lo's 127.0.0.0/8, so
127.77.0.J goes out through eth0 while 127.0.0.1 stays local.

Also a library (``from scripts import netns``): ``up(n)``, ``down()``,
``addr(i)``, ``exec_prefix(ns)``, ``veth_of(ns)``, ``ensure_tools()``.

``up`` is idempotent (it converges on exactly N hosts) and a failed or
interrupted ``up`` (an error, Ctrl-C, SIGTERM) removes whatever it created
before re-raising. ``down`` blocks SIGINT/SIGTERM while it runs (about 0.2 s)
so that it cannot be interrupted half-way.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

BRIDGE = "roost-br0"
NS_PREFIX = "roost-h"
VETH_PREFIX = "roost-v"
INSIDE_DEV = "eth0"
SUBNET_PREFIX = "127.77.0."
MAX_HOSTS = 254
INSTALL_CMD = "apt-get install -y iproute2 nftables"
TOOLS = {"ip": "iproute2", "nft": "nftables"}

_NS_RE = re.compile(rf"^{re.escape(NS_PREFIX)}(\d+)$")
_VETH_RE = re.compile(rf"^{re.escape(VETH_PREFIX)}(\d+)$")


class NetnsError(RuntimeError):
    """A command failed; the message names the command and what it printed."""


class ToolsMissing(NetnsError):
    """``ip`` or ``nft`` is not installed; the message says what to install."""


# ------------------------------------------------------------------ names


def ns_name(i: int) -> str:
    """The namespace of host ``i`` (1-based)."""
    return f"{NS_PREFIX}{i}"


def addr(i: int) -> str:
    """The address of host ``i`` (1-based): 127.77.0.i."""
    if not 1 <= i <= MAX_HOSTS:
        raise ValueError(f"host index {i}: must be 1..{MAX_HOSTS}")
    return f"{SUBNET_PREFIX}{i}"


def index_of(ns: str) -> int:
    """1-based host index of a namespace name made by ``up`` (roost-h3 -> 3)."""
    m = _NS_RE.match(ns)
    if not m:
        raise ValueError(f"{ns!r} is not a namespace made by scripts/netns.py ({NS_PREFIX}N)")
    return int(m.group(1))


def addr_of(ns: str) -> str:
    """The address of a namespace made by ``up``."""
    return addr(index_of(ns))


def veth_of(ns: str) -> str:
    """The bridge-side end (in the normal namespace) of a namespace's veth pair.

    Faults that must be silent for both ends (drops, duplicates) hook here:
    a packet dropped on its way into the bridge was already "sent" as far as
    the sender's kernel knows.
    """
    return f"{VETH_PREFIX}{index_of(ns)}"


def exec_prefix(ns: str) -> list[str]:
    """Prefix a command with this to run it inside namespace ``ns``."""
    return ["ip", "netns", "exec", ns]


# ------------------------------------------------------------------ tools


def missing_tools() -> list[str]:
    """Commands among ``ip`` and ``nft`` that are not on PATH (nor in /usr/sbin, /sbin)."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])
    return [tool for tool in TOOLS if shutil.which(tool, path=path) is None]


def require_tools() -> None:
    """Raise ToolsMissing with the exact install command when ``ip`` or ``nft`` is missing."""
    missing = missing_tools()
    if missing:
        pkgs = " ".join(TOOLS[t] for t in missing)
        raise ToolsMissing(f"{' and '.join(missing)} not found (package {pkgs}); install with: {INSTALL_CMD}"
                           + ("" if os.geteuid() == 0 else " (as root)"))  # fmt: skip


def ensure_tools(quiet: bool = False) -> None:
    """Install iproute2 and nftables with apt-get when missing and we are root.

    Called by the project's set-up (``make``) so that a fresh Debian machine
    gets them; prints each command it runs. Not root, or no apt-get: raises
    ToolsMissing with the command to run instead (nothing is installed behind
    anyone's back).
    """
    missing = missing_tools()
    if not missing:
        if not quiet:
            print("netns: ip and nft are installed")
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        require_tools()
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "iproute2", "nftables"]):
        print("netns: " + " ".join(cmd), flush=True)
        r = subprocess.run(cmd, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"}, check=False)
        if r.returncode != 0:
            raise ToolsMissing(f"{' '.join(cmd)} failed (exit {r.returncode}); install by hand: {INSTALL_CMD}")
    require_tools()


def why_unusable(who: str) -> str | None:
    """Why namespaces cannot be made here (not root, tools missing and not installable), for
    ``who`` (a test file) to fail with, saying what to do; None when they can."""
    if os.geteuid() != 0:
        return f"{who} needs root (nft rules, namespaces); as root: {INSTALL_CMD}"
    try:
        ensure_tools(quiet=True)
    except ToolsMissing as exc:
        return str(exc)
    return None


# ------------------------------------------------------------------ commands


def _run(args: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run(args, capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        require_tools()
        raise
    if check and r.returncode != 0:
        raise NetnsError(f"`{' '.join(args)}` failed (exit {r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    return r


def _json(args: list[str]) -> list[dict[str, Any]]:
    r = _run(args, check=False)
    if r.returncode != 0 or not r.stdout.strip():
        return []
    data = json.loads(r.stdout)
    return data if isinstance(data, list) else []


def namespaces() -> list[str]:
    """Our namespaces (roost-hN) that exist now, in host order."""
    names = [str(e.get("name", "")) for e in _json(["ip", "-j", "netns", "list"])]
    return sorted((n for n in names if _NS_RE.match(n)), key=index_of)


def _links() -> set[str]:
    return {str(e.get("ifname", "")) for e in _json(["ip", "-j", "link", "show"])}


def _our_veths(links: set[str]) -> list[str]:
    return sorted(n for n in links if _VETH_RE.match(n))


def _inside_addrs(ns: str) -> list[str]:
    return [f"{a['local']}/{a['prefixlen']}"
            for e in _json(["ip", "-n", ns, "-j", "addr", "show", "dev", INSIDE_DEV])
            for a in e.get("addr_info", []) if a.get("family") == "inet"]  # fmt: skip


# ------------------------------------------------------------------ signals


@contextmanager
def _signals_raise() -> Iterator[None]:
    """SIGTERM/SIGHUP raise KeyboardInterrupt while ``up`` runs, so its rollback runs.

    (SIGINT already does.) Only the main thread may set handlers; elsewhere
    this does nothing and the caller's own handling applies.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old: dict[int, Callable[[int, FrameType | None], Any] | int | None] = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        old[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)


@contextmanager
def _signals_blocked() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP until the block ends (they are delivered afterwards)."""
    sigs = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    old = signal.pthread_sigmask(signal.SIG_BLOCK, sigs)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ------------------------------------------------------------------ up / down


def _host_up(i: int, links: set[str], made: list[tuple[str, str]]) -> None:
    """Create or repair host i; append what was created to ``made`` (for rollback)."""
    ns, veth = ns_name(i), f"{VETH_PREFIX}{i}"
    if ns not in namespaces():
        _run(["ip", "netns", "add", ns])
        made.append(("ns", ns))
    inside = {str(e.get("ifname", "")) for e in _json(["ip", "-n", ns, "-j", "link", "show"])}
    if veth in links and INSIDE_DEV not in inside:  # a half pair from an interrupted run
        _run(["ip", "link", "del", veth])
        links.discard(veth)
    if veth not in links:
        if INSIDE_DEV in inside:  # the other half without its bridge end
            _run(["ip", "-n", ns, "link", "del", INSIDE_DEV])
        _run(["ip", "link", "add", veth, "type", "veth", "peer", "name", INSIDE_DEV, "netns", ns])
        made.append(("link", veth))
        links.add(veth)
    _run(["ip", "link", "set", veth, "master", BRIDGE, "up"])
    # route_localnet first: without it the kernel refuses 127.77.0.i on eth0.
    conf = "/proc/sys/net/ipv4/conf"
    v6 = f"/proc/sys/net/ipv6/conf/{INSIDE_DEV}/disable_ipv6"  # no IPv6 chatter across the bridge
    _run([*exec_prefix(ns), "sh", "-c",
          f"echo 1 > {conf}/all/route_localnet && echo 1 > {conf}/{INSIDE_DEV}/route_localnet"
          f" && {{ [ ! -w {v6} ] || echo 1 > {v6}; }}"])  # fmt: skip
    want = f"{addr(i)}/24"
    for other in _inside_addrs(ns):
        if other != want:
            _run(["ip", "-n", ns, "addr", "del", other, "dev", INSIDE_DEV])
    _run(["ip", "-n", ns, "addr", "replace", want, "dev", INSIDE_DEV])
    _run(["ip", "-n", ns, "link", "set", "lo", "up"])
    _run(["ip", "-n", ns, "link", "set", INSIDE_DEV, "up"])


def _remove(kind: str, name: str) -> None:
    if kind == "link":
        _run(["ip", "link", "del", name], check=False)
    elif kind == "ns":
        _run(["ip", "netns", "del", name], check=False)


def up(n: int) -> list[str]:
    """Make exactly hosts roost-h1..roost-hN exist and work; return their namespace names.

    Idempotent: existing hosts are checked and repaired, extra hosts (index > N)
    are removed. On any failure or interruption, everything this call created
    is removed again (hosts that existed before are left as they were) and the
    exception propagates.
    """
    if not 1 <= n <= MAX_HOSTS:
        raise ValueError(f"number of hosts {n}: must be 1..{MAX_HOSTS}")
    require_tools()
    if os.geteuid() != 0:
        raise NetnsError("creating network namespaces needs root")
    made: list[tuple[str, str]] = []
    with _signals_raise():
        try:
            links = _links()
            if BRIDGE not in links:
                _run(["ip", "link", "add", BRIDGE, "type", "bridge"])
                made.append(("link", BRIDGE))
                v6 = f"/proc/sys/net/ipv6/conf/{BRIDGE}/disable_ipv6"
                if os.path.exists(v6):
                    with open(v6, "w") as f:
                        f.write("1")
            _run(["ip", "link", "set", BRIDGE, "up"])
            for i in range(1, n + 1):
                _host_up(i, links, made)
            for ns in namespaces():
                if index_of(ns) > n:
                    _remove_host(ns)
        except BaseException:
            with _signals_blocked():
                for kind, name in reversed(made):
                    _remove(kind, name)
            raise
    return [ns_name(i) for i in range(1, n + 1)]


def _remove_host(ns: str) -> None:
    # The bridge end first: deleting it removes both ends at once, whereas the
    # kernel frees a deleted namespace's devices asynchronously.
    _remove("link", veth_of(ns))
    _remove("ns", ns)
    shutil.rmtree(ETC_NETNS / ns, ignore_errors=True)


#: ``ip netns exec NS`` bind-mounts the files of /etc/netns/NS/ over those of /etc: a hosts file
#: there names the other hosts inside NS only (as Docker's DNS names a compose service).
ETC_NETNS = Path("/etc/netns")


def set_hosts(ns: str, names: dict[str, str]) -> None:
    """Inside ``ns``, resolve each name to its address (``down`` removes the file)."""
    d = ETC_NETNS / ns
    d.mkdir(parents=True, exist_ok=True)
    lines = ["127.0.0.1 localhost", "::1 localhost", *(f"{a} {n}" for n, a in names.items())]
    (d / "hosts").write_text("\n".join(lines) + "\n")


def pids_in(ns: str) -> list[int]:
    """Processes still running in namespace ``ns``."""
    r = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in r.stdout.split() if p.isdigit()]


def down() -> list[str]:
    """Remove every roost-h* namespace, roost-v* veth and the bridge; exit quietly if none.

    Returns warnings (processes still running in a removed namespace: they are
    not killed, since this module did not start them; the namespace lives on
    without a name until they exit, cut off from everything).
    """
    warnings: list[str] = []
    if missing_tools():
        require_tools()
    with _signals_blocked():
        for ns in namespaces():
            pids = pids_in(ns)
            if pids:
                warnings.append(f"{ns}: processes still running inside: {' '.join(map(str, pids))}")
        links = _links()
        for veth in _our_veths(links):
            _remove("link", veth)
        for ns in namespaces():
            _remove("ns", ns)
        for d in ETC_NETNS.glob(f"{NS_PREFIX}*") if ETC_NETNS.is_dir() else []:
            shutil.rmtree(d, ignore_errors=True)
        if BRIDGE in links:
            _remove("link", BRIDGE)
        left = [n for n in _links() if n == BRIDGE or _VETH_RE.match(n)] + namespaces()
    if left:
        raise NetnsError(f"could not remove: {', '.join(left)}")
    return warnings


def status() -> dict[str, Any]:
    """What exists now: bridge, namespaces with their addresses, and process counts."""
    links = _links()
    hosts: list[dict[str, Any]] = []
    for ns in namespaces():
        hosts.append({"ns": ns, "addrs": _inside_addrs(ns), "veth": veth_of(ns) if veth_of(ns) in links else None,
                      "pids": len(pids_in(ns))})  # fmt: skip
    have = {veth_of(h["ns"]) for h in hosts}
    return {"bridge": BRIDGE in links, "hosts": hosts, "stray_veths": [v for v in _our_veths(links) if v not in have]}


# ------------------------------------------------------------------ CLI


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="create hosts roost-h1..roost-hN (idempotent)")
    p_up.add_argument("n", type=int)
    sub.add_parser("down", help="remove every roost-* namespace, veth and the bridge")
    p_st = sub.add_parser("status", help="show what exists")
    p_st.add_argument("--json", action="store_true")
    p_tools = sub.add_parser("ensure-tools", help=f"run `{INSTALL_CMD}` if ip or nft is missing (root)")
    p_tools.add_argument("--best-effort", action="store_true",
                         help="when they cannot be installed (not root, no apt-get), say what to install "
                              "and exit 0 (make's set-up: the demo does not need them)")  # fmt: skip
    args = ap.parse_args(argv)
    try:
        if args.cmd == "up":
            for ns in up(args.n):
                print(f"{ns}  {addr_of(ns)}  (bridge port {veth_of(ns)})")
        elif args.cmd == "down":
            for w in down():
                print("warning: " + w, file=sys.stderr)
        elif args.cmd == "status":
            st = status()
            if args.json:
                print(json.dumps(st))
            else:
                print(f"bridge {BRIDGE}: {'up' if st['bridge'] else 'absent'}")
                for h in st["hosts"]:
                    print(f"{h['ns']}  {' '.join(h['addrs']) or '(no address)'}  veth {h['veth'] or '(missing)'}"
                          f"  {h['pids']} process(es)")  # fmt: skip
                if not st["hosts"]:
                    print("no roost-h* namespaces")
                for v in st["stray_veths"]:
                    print(f"stray veth {v} (no namespace): `scripts/netns.py down` removes it")
        else:
            try:
                ensure_tools()
            except ToolsMissing as exc:
                if not args.best_effort:
                    raise
                print(f"netns: {exc}; chaos runs with --netns and tests/test_faults.py need them", file=sys.stderr)
    except KeyboardInterrupt:
        undone = "; what this run created was removed" if args.cmd == "up" else ""
        print(f"netns: interrupted{undone}", file=sys.stderr)
        return 130
    except (NetnsError, ValueError) as exc:
        print(f"netns: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
