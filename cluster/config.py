"""Cluster configuration: one TOML file lists every member and the secret.

    [cluster]   secret, mode and the cluster timeouts (table below)
    [durable]   fsync policy, segments, retention and limits of durable partition logs
    [[members]] id, client_addr (UDP), peer_addr (TCP), data_dir; optional advertise_addr (what
                clients are told, default client_addr) and monitor_addr (HTTP monitoring)
    [node] [limits] [timeouts]   node settings shared by every member

Validated at load with the same messages as a node config (file, key, what is
allowed). ``roost node --config FILE --id n2`` picks one member.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roost.client.addresses import hostport
from roost.cluster.secretfile import read_secret
from roost.node.config import (
    NODE_SECTIONS,
    ConfigError,
    NodeConfig,
    Setting,
    advertisable,
    apply_sections,
    check_consistency,
    fill_defaults,
    number,
    parse_hostport,
    read_toml,
    resolve_monitor_token,
)  # fmt: skip

CLUSTER_SETTINGS: list[Setting] = [
    Setting("cluster", "secret", "", str, "a string of at least 16 characters",
            lambda v: len(v) >= 16,
            "Shared by every member; peers prove they know it (HMAC over fresh nonces). It "
            "keys no address-validation cookie: each member draws random keys of its own. "
            "Keep it out of tracked files: use secret_file or the environment variable "
            "ROOST_CLUSTER_SECRET instead (one of the three is required)."),
    Setting("cluster", "secret_file", "", str, "a file path", lambda v: len(v) > 0,
            "A file holding the secret (its first line; relative to the config's directory; "
            "Compose and Kubernetes secrets mount such files). Instead of secret. Refused when "
            "group or others may read or change it (chmod 600). When it does not exist, "
            "ROOST_CLUSTER_SECRET is read instead, and `roost cluster up` creates it (mode 0600, "
            "a random secret) if that is not set either; ROOST_CLUSTER_SECRET is also read when "
            "neither secret nor secret_file is set."),
    Setting("cluster", "allow_insecure_secret_file", False, bool, "true or false", lambda v: True,
            "true: take secret_file even when group or others may read or change it (a mounted "
            "secret shared with a group, such as Kubernetes' fsGroup)."),
    Setting("cluster", "mode", "replicated", str, '"replicated" or "partitioned"',
            lambda v: v in ("replicated", "partitioned"),
            "replicated: every member holds every subscription. partitioned: each topic's "
            "partition lives on `replicas` members, a primary and its secondaries "
            "(docs/cluster.md)."),
    number("cluster", "partitions", 256, int, 1, 65536,
            "Partitioned mode: topics hash into this many partitions; fixed for the life of a "
            "cluster (every member must agree)."),
    number("cluster", "replicas", 2, int, 1, 8, "Partitioned mode: owners per partition, the primary included."),
    number("cluster", "max_forward_queue", 100_000, int, 100, 10_000_000,
            "Partitioned mode: reliable messages queued for another partition's primary while "
            "its link is down; beyond it new ones are dropped (counted as forward_overflow)."),
    number("cluster", "heartbeat_interval", 0.2, float, 0.01, 10, "Heartbeats on every peer link."),
    number("cluster", "suspect_after", 0.6, float, 0.02, 60, "A peer silent this long is 'suspect'."),
    number("cluster", "down_after", 1.5, float, 0.05, 300, "A peer silent this long is 'down'."),
    number("cluster", "local_pause", 0.5, float, 0.05, 60,
            "A member whose own event loop stood still this long beyond heartbeat_interval (a "
            "long state scan, SIGSTOP, a VM pause) does not count that time as its peers' "
            "silence: they and its links are credited with the pause (logged as local_pause)."),
    number("cluster", "reconnect_interval", 0.25, float, 0.01, 60,
            "Wait before dialling a peer again after a failure."),
    number("cluster", "handshake_timeout", 2.0, float, 0.05, 60, "A peer link must authenticate within this time."),
    number("cluster", "pull_timeout", 30.0, float, 1, 3600,
            "Give up a state PULL from one peer (and try another) after this."),
    number("cluster", "anti_entropy_interval", 5.0, float, 0.1, 3600,
            "How often digests of the subscription state are compared."),
    number("cluster", "tombstone_horizon", 3600.0, float, 10, 2_592_000,
            "Deleted subscriptions are remembered this long so that an old write cannot "
            "resurrect them; must exceed the longest partition you want to heal from."),
    number("cluster", "snapshot_interval", 10.0, float, 0.5, 86400,
            "How often a member writes its state to its data dir (with fsync)."),
    number("cluster", "max_frame", 8 * 1024 * 1024, int, 65536, 1 << 30,
            "Largest peer frame accepted; a bigger one closes the link."),
    number("cluster", "chunk_subscriptions", 20000, int, 100, 1_000_000,
            "Subscriptions per frame in a state dump or push."),
    number("cluster", "max_peer_queue", 1_000_000, int, 1000, 100_000_000,
            "Changes queued for an absent peer; beyond it the queue is dropped and "
            "anti-entropy repairs the peer when it is back."),
    number("cluster", "link_idle_timeout", 7.5, float, 0.1, 3600,
            "A link a peer dialled is closed after this long without a frame (the peer sends a "
            "heartbeat every heartbeat_interval); must be more than heartbeat_interval."),
    number("cluster", "leave_timeout", 30.0, float, 0.1, 3600,
            "A member whose leave is committed keeps delivering what its mailboxes hold; it "
            "stops when they are empty or after this long."),
    number("cluster", "stop_timeout", 10.0, float, 0.1, 600,
            "On SIGTERM/SIGINT a member writes a last snapshot; it gives up waiting for the "
            "write after this long."),
    # ---- [durable]: the partition logs of durable mode (docs/durable.md)
    Setting("durable", "fsync", "always", str, '"always", "interval" or "never"',
            lambda v: v in ("always", "interval", "never"),
            "always: a put is acknowledged only once it is fsynced on every owner of its partition "
            "(survives power loss). interval: once written on every owner (survives a crash of "
            "the process; a power loss within fsync_interval can lose it, of both owners or of one "
            "while the other is down, which may then take over with the shorter log); the "
            "logs are fsynced every fsync_interval. never: left to the operating system."),
    number("durable", "fsync_interval", 0.2, float, 0.001, 60, "fsync = \"interval\": how often the logs are fsynced."),
    number("durable", "segment_bytes", 64 << 20, int, 4096, 1 << 32,
            "A partition log's segment is rolled (a new file begun) past this size; retention "
            "deletes whole segments."),
    number("durable", "retention_bytes", 0, int, 0, 1 << 50,
            "Per partition: the oldest segments are deleted while the log is over this size "
            "(0: no size limit)."),
    number("durable", "retention_age", 604800.0, float, 1, 1e10,
            "Segments whose newest record is older than this are deleted (7 days, as Kafka)."),
    number("durable", "retention_check_interval", 60.0, float, 0.1, 86400,
            "How often retention runs. A durable subscription's cursor is never lost to it: "
            "the primary writes it again at the end of the log first."),
    number("durable", "max_uncommitted", 10000, int, 10, 10_000_000,
            "A primary takes no put while this many records wait for the other owners (the "
            "publisher hears 'busy' and retries)."),
    number("durable", "cache_records", 20000, int, 100, 10_000_000,
            "Committed records per partition kept in memory for readers and followers; older "
            "ones are read from disk."),
    number("durable", "fetch_records", 500, int, 1, 100_000, "Records per fetch between owners and per read."),
    number("durable", "fetch_bytes", 1 << 20, int, 4096, 1 << 28,
           "Bytes per fetch between owners (about); at most half of [cluster] max_frame."),
    number("durable", "fetch_wait", 0.5, float, 0.001, 60,
            "A follower's fetch that finds nothing new waits this long at the primary for records."),
    number("durable", "fetch_retry", 1.0, float, 0.01, 60,
            "A fetch unanswered this long is sent again (the link may have dropped it)."),
    number("durable", "replicas", 3, int, 1, 8,
            "Members holding each durable partition's log, the leader included (fewer when the "
            "cluster has fewer members)."),
    number("durable", "min_insync", 2, int, 1, 8,
            "A put is committed only once the leader and at least this many - 1 more in-sync "
            "replicas hold it on disk; with fewer in sync, puts are refused ('busy') and retried."),
    number("durable", "isr_lag_time", 10.0, float, 0.1, 3600,
            "A follower that has not caught up with its leader for this long leaves the in-sync "
            "replicas (never below min_insync), so puts go on without it."),
    Setting("durable", "quorum", [], list,
            "a list of 1, 3 or 5 member ids of [[members]] ([]: the first three by id; in a cluster of one or "
            "two members, the first)",
            lambda v: len(v) in (0, 1, 3, 5) and all(isinstance(x, str) for x in v) and len(set(v)) == len(v),
            "The voters of the metadata quorum that decides who leads each durable partition (a Raft "
            "group: a majority of them must be up and reachable for durable puts and reads). Every "
            "other member follows the quorum's decisions without a vote."),
    number("durable", "quorum_election_timeout", 1.0, float, 0.05, 60,
            "A quorum voter that hears no leader for this long (to twice as long, at random) "
            "stands for election; a member that hears none for this long stops serving durable "
            "requests (it may be on the minority side of a network partition)."),
]  # fmt: skip

_ID = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
MEMBER_KEYS = ("id", "client_addr", "peer_addr", "data_dir", "advertise_addr", "monitor_addr")


@dataclass(frozen=True)
class Member:
    id: str
    client_addr: tuple[str, int]
    peer_addr: tuple[str, int]
    data_dir: str
    advertise_addr: tuple[str, int] | None = None  # what clients are told, when not client_addr
    monitor_addr: tuple[str, int] | None = None  # this member's HTTP monitoring endpoint

    @property
    def advertised(self) -> tuple[str, int]:
        """The client address WELCOME and the cluster map name for this member."""
        return self.advertise_addr or self.client_addr


class ClusterSettings:
    secret: str
    secret_file: str
    allow_insecure_secret_file: bool
    secret_from: str  # (not a setting: "config", "file" or "environment", once the secret is read)
    mode: str
    partitions: int
    replicas: int
    max_forward_queue: int
    heartbeat_interval: float
    suspect_after: float
    down_after: float
    local_pause: float
    reconnect_interval: float
    handshake_timeout: float
    pull_timeout: float
    anti_entropy_interval: float
    tombstone_horizon: float
    snapshot_interval: float
    max_frame: int
    chunk_subscriptions: int
    max_peer_queue: int
    link_idle_timeout: float
    leave_timeout: float
    stop_timeout: float
    fsync: str
    fsync_interval: float
    segment_bytes: int
    retention_bytes: int
    retention_age: float
    retention_check_interval: float
    max_uncommitted: int
    cache_records: int
    fetch_records: int
    fetch_bytes: int
    fetch_wait: float
    fetch_retry: float
    durable_replicas: int
    min_insync: int
    isr_lag_time: float
    quorum: tuple[str, ...]  # (the TOML list; the voters once the members are known)
    quorum_election_timeout: float

    def __init__(self) -> None:
        fill_defaults(self, CLUSTER_SETTINGS)
        self.secret_from = ""


@dataclass
class ClusterConfig:
    source: str
    settings: ClusterSettings
    members: list[Member]
    node_data: dict[str, Any]  # the [node] [limits] [timeouts] tables
    # The simulator's instruments, copied into every member's NodeConfig (node/config.py says why).
    trace: bool = False
    breaks: frozenset[str] = frozenset()

    def member(self, member_id: str) -> Member:
        for m in self.members:
            if m.id == member_id:
                return m
        ids = ", ".join(m.id for m in self.members)
        raise ConfigError(f"{self.source}: no member with id {member_id!r}; members: {ids}")

    def node_config(self, member_id: str, bind_host: str | None = None) -> NodeConfig:
        """The NodeConfig one member runs with."""
        m = self.member(member_id)
        cfg = NodeConfig()
        apply_sections(cfg, self.source, self.node_data, NODE_SECTIONS)
        check_consistency(cfg, self.source)
        resolve_monitor_token(cfg, self.source)
        cfg.id = m.id
        cfg.client_addr = (bind_host or m.client_addr[0], m.client_addr[1])
        cfg.advertise_addr = hostport(*m.advertised)
        if m.monitor_addr is not None:
            cfg.monitor_addr = hostport(bind_host or m.monitor_addr[0], m.monitor_addr[1])
        cfg.source = self.source
        cfg.trace, cfg.breaks = self.trace, self.breaks
        return cfg

    def index_of(self, member_id: str) -> int:
        return [m.id for m in self.members].index(member_id)


def is_cluster_config(data: dict[str, Any]) -> bool:
    return "cluster" in data or "members" in data


def _machine(m: Member) -> str:
    """Which machine a member runs on, as far as the config tells: its peer address's host (the
    one its peers reach), every loopback address being this one."""
    host = ipaddress.ip_address(m.peer_addr[0])
    return "loopback" if host.is_loopback else str(host)


def _check_ports(source: str, members: list[Member]) -> None:
    """No two sockets of one transport on one port of one host: client ports (UDP), and peer and
    monitoring ports (TCP, which share one port space), across members and within one.

    On one machine (:func:`_machine`) the same address twice clashes, and a wildcard host (0.0.0.0,
    ::) takes the port on every address, so it clashes with the same port of anything there.
    Members of different machines clash only on one non-loopback address: ``monitor_addr =
    "0.0.0.0:8222"`` or ``"127.0.0.1:8222"`` on every machine is fine."""
    for keys in (("client_addr",), ("peer_addr", "monitor_addr")):
        by_port: dict[int, list[tuple[Member, str, tuple[str, int]]]] = {}
        for m in members:
            for key in keys:
                if (addr := getattr(m, key)) is not None and addr[1] != 0:  # (0: a free port, each its own)
                    by_port.setdefault(addr[1], []).append((m, key, addr))
        for same in by_port.values():
            for i, (ma, ka, a) in enumerate(same):
                for mb, kb, b in same[i + 1 :]:
                    ia, ib = ipaddress.ip_address(a[0]), ipaddress.ip_address(b[0])
                    wild = ia.is_unspecified or ib.is_unspecified
                    same_machine = ma is mb or _machine(ma) == _machine(mb)
                    if (same_machine and (wild or ia == ib)) or (ia == ib and not ia.is_loopback and not wild):
                        raise ConfigError(f"{source}: [[members]] {ma.id} {ka} = {hostport(*a)!r} and {mb.id} {kb} = "
                                          f"{hostport(*b)!r}: the same port on the same host; each needs its "
                                          "own")  # fmt: skip


def load_cluster_config(path: str | Path, data: dict[str, Any] | None = None, *,
                        need_secret: bool = True) -> ClusterConfig:  # fmt: skip
    """The cluster config at ``path``, validated. ``need_secret`` False (the secret is left
    empty) serves commands that only read the member list, such as ``cluster down`` from a
    shell that lacks $ROOST_CLUSTER_SECRET: stopping processes needs no secret."""
    source = str(path)
    data = read_toml(path) if data is None else data
    allowed = ("cluster", "durable", "members", *NODE_SECTIONS)
    for section in data:
        if section not in allowed:
            raise ConfigError(f"{source}: unknown section [{section}]; allowed: "
                              + ", ".join(f"[{s}]" for s in allowed))  # fmt: skip
    node, monitor = data.get("node", {}), data.get("monitor", {})  # (not tables: refused by node_config below)
    for key in ("id", "client_addr", "advertise_addr"):
        if isinstance(node, dict) and key in node:
            raise ConfigError(f"{source}: [node] {key}: set per member in [[members]], not in [node]")
    if isinstance(monitor, dict) and "addr" in monitor:  # (one address shared by every member: they would clash)
        raise ConfigError(f"{source}: [monitor] addr: set per member as monitor_addr in [[members]], not in "
                          "[monitor]")  # fmt: skip
    settings = ClusterSettings()
    apply_sections(settings, source, data, ("cluster", "durable"), CLUSTER_SETTINGS)
    settings.secret, settings.secret_from = read_secret(source, settings) if need_secret else ("", "")
    if settings.down_after <= settings.suspect_after:
        raise ConfigError(f"{source}: [cluster] down_after = {settings.down_after}: must be more than "
                          f"suspect_after ({settings.suspect_after})")  # fmt: skip
    if settings.link_idle_timeout <= settings.heartbeat_interval:
        raise ConfigError(f"{source}: [cluster] link_idle_timeout = {settings.link_idle_timeout}: must be more "
                          f"than heartbeat_interval ({settings.heartbeat_interval})")  # fmt: skip
    if settings.fetch_bytes > settings.max_frame // 2:  # (a fetch's answer is one frame, with room for framing)
        raise ConfigError(f"{source}: [durable] fetch_bytes = {settings.fetch_bytes}: must be at most half of "
                          f"[cluster] max_frame ({settings.max_frame})")  # fmt: skip
    raw = data.get("members")
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{source}: [[members]]: at least one member is required")
    if len(raw) > 255:
        raise ConfigError(f"{source}: [[members]]: at most 255 members")
    members: list[Member] = []
    for i, m in enumerate(raw):
        where = f"{source}: [[members]] #{i + 1}"
        if not isinstance(m, dict):
            raise ConfigError(f"{where}: must be a table")
        extra = set(m) - set(MEMBER_KEYS)
        if extra:
            raise ConfigError(f"{where} {sorted(extra)[0]}: unknown key; known keys: {', '.join(MEMBER_KEYS)}")
        mid = m.get("id")
        if not isinstance(mid, str) or not _ID.match(mid):
            raise ConfigError(f"{where} id = {mid!r}: must be 1..64 chars of [A-Za-z0-9_.-]")
        addrs: list[tuple[str, int] | None] = []
        for key in ("client_addr", "peer_addr"):
            try:
                addrs.append(parse_hostport(m.get(key)))  # type: ignore[arg-type]
            except (ValueError, AttributeError, TypeError):
                raise ConfigError(f"{where} {key} = {m.get(key)!r}: must be HOST:PORT with an IP address") from None
        for key in ("advertise_addr", "monitor_addr"):
            if key in m:
                try:
                    addrs.append(parse_hostport(m[key]))
                except (ValueError, AttributeError, TypeError):
                    raise ConfigError(f"{where} {key} = {m[key]!r}: must be HOST:PORT with an IP address") from None
            else:
                addrs.append(None)
        if addrs[2] is not None and not advertisable(addrs[2]):
            raise ConfigError(f"{where} advertise_addr = {m['advertise_addr']!r}: must be an address clients can "
                              "be sent to: not a wildcard, a port other than 0")  # fmt: skip
        if addrs[2] is None and addrs[0] is not None and ipaddress.ip_address(addrs[0][0]).is_unspecified:
            raise ConfigError(f"{where} client_addr = {m['client_addr']!r}: clients cannot be sent to a wildcard: "
                              "set advertise_addr to the address they reach this member at (or bind with "
                              "--bind-host)")  # fmt: skip
        dd = m.get("data_dir")
        if not isinstance(dd, str) or not dd:
            raise ConfigError(f"{where} data_dir = {dd!r}: must be a directory path")
        client, peer, advertise, monitor = addrs
        assert client is not None and peer is not None
        members.append(Member(mid, client, peer, dd, advertise, monitor))
    _check_ports(source, members)
    for key in ("id", "data_dir", "advertised"):  # (advertised: advertise_addr, else client_addr)
        seen = [getattr(m, key) for m in members]
        dup = next((v for v in seen if seen.count(v) > 1), None)
        if dup is not None:
            what = "the address advertised to clients (advertise_addr, else client_addr)" if key == "advertised" \
                else key  # fmt: skip
            raise ConfigError(f"{source}: [[members]] {what} = {dup!r}: must be unique across members")
    members.sort(key=lambda m: m.id)  # the index of a member is its position here
    ids = [m.id for m in members]
    unknown = [v for v in settings.quorum if v not in ids]
    if unknown:
        raise ConfigError(f"{source}: [durable] quorum = {list(settings.quorum)!r}: {unknown[0]!r} is not a member; "
                          f"members: {', '.join(ids)}")  # fmt: skip
    settings.quorum = tuple(sorted(settings.quorum)) if settings.quorum else tuple(ids[: 3 if len(ids) >= 3 else 1])
    if settings.min_insync > settings.durable_replicas:
        raise ConfigError(f"{source}: [durable] min_insync = {settings.min_insync}: must be at most [durable] "
                          f"replicas ({settings.durable_replicas})")  # fmt: skip
    cfg = ClusterConfig(source, settings, members, {k: data.get(k, {}) for k in NODE_SECTIONS})
    cfg.node_config(members[0].id)  # validate the shared node settings now
    return cfg
