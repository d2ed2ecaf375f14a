"""The simulated world's pieces (sim/simulation.py): its configuration, members, clients and links."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from roost.client.session import ClientSession
from roost.cluster.config import ClusterConfig, load_cluster_config
from roost.cluster.member import MemberCore

WALL = 1_780_000_000.0  # simulated Unix time at t=0 (a day in 2026)
TOPICS = ("t0", "t1", "t2")
PARTITIONED_TOPICS = (*TOPICS, "t3", "t4")  # (more topics: more partitions, so more owners, under fire)
FAULTS = ("partition", "crash", "stop", "client", "cut-client", "join", "leave", "pause")
# Drawn from their own random sources (so that adding them left the other faults of a seed as
# they were): joins and leaves (partitioned mode), and a member's loop standing still.
OWN_DRAWS = ("join", "leave", "pause")


def sim_config(members: int, short: bool = False, mode: str = "replicated", partitions: int = 16) -> ClusterConfig:
    """A cluster config with timeouts sized for short simulated runs. ``short``
    (drawn for about a third of the seeds): tombstones are collected, silent
    clients time out and every member's cookie key rotates many times within a
    run, so those paths are under fire too."""
    data: dict[str, Any] = {
        "cluster": {"secret": "simulated-cluster-secret", "anti_entropy_interval": 1.0, "snapshot_interval": 1.0,
                    "tombstone_horizon": 10.0 if short else 60.0, "link_idle_timeout": 3.0, "mode": mode,
                    "partitions": partitions},
        "members": [{"id": f"m{i}", "client_addr": f"127.0.0.1:{7401 + i}", "peer_addr": f"127.0.0.1:{7501 + i}",
                     "data_dir": f"/sim/m{i}"} for i in range(members)],
    }  # fmt: skip
    if short:
        data["timeouts"] = {"subscriber_timeout": 5.0, "cookie_lifetime": 2.0}
    return load_cluster_config("<simulation>", data)


class ClientDatagram(NamedTuple):
    """A client's datagram that reached a paused member: fed later, with its accounting."""

    data: bytes
    src: tuple[str, int]


@dataclass
class SimMember:
    id: str
    addr: tuple[str, int]
    core: MemberCore | None = None
    serving: bool = False
    incarnation: int = 0  # bumped by every crash: stale disk writes and timers are ignored
    disk: bytes | None = None  # the fsynced snapshot
    tick_at: float = math.inf
    cc: ClusterConfig | None = None  # a member that joined: the config with itself in it
    roster: list[Any] = field(default_factory=list)  # ... and the roster its JOIN was answered with
    paused_until: float = 0.0  # its loop stands still (a long core call, SIGSTOP) until then
    backlog: list[Any] = field(default_factory=list)  # events that came meanwhile, in order


@dataclass
class SimClient:
    index: int
    cid: bytes
    addr: tuple[str, int]
    session: ClientSession
    number: int = 0  # session number: bumped by a restart
    publisher: bool = False
    topics: list[str] = field(default_factory=list)
    next_msg: int = 1
    tick_at: float = math.inf
    last_reached: float = 0.0  # when a datagram of this client last reached a member
    # id(subscription object) -> (it, the first register version a member wrote for it): a
    # member holding an older version holds an earlier subscription, which this one is not
    starts: dict[int, tuple[object, int]] = field(default_factory=dict)
    # partitioned: reliable producer sequence of this process -> message number, until acknowledged
    seqs: dict[int, int] = field(default_factory=dict)


@dataclass
class Conn:
    """A TCP connection: (member, link id) at each end, a delivery clock per direction."""

    ends: list[tuple[str, int]]
    last: list[float] = field(default_factory=lambda: [0.0, 0.0])
    up: bool = True


def parse_payload(payload: bytes) -> tuple[int, int]:
    """A workload message's payload names it: ``publisher index:number``."""
    a, _, b = payload.partition(b":")
    return int(a), int(b)
