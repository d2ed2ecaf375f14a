"""What :class:`cluster.member.MemberCore` provides to its mixins (cluster/lifecycle.py,
cluster/partitioned.py, cluster/joining.py, cluster/liveness.py, cluster/durable.py,
cluster/memberstatus.py), declared once for the type
checker; nothing at run time."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from roost.cluster.config import ClusterConfig, ClusterSettings
    from roost.cluster.durable import DurableLogs
    from roost.cluster.events import Action
    from roost.cluster.forwarding import Forwarding
    from roost.cluster.lifecycle import Lifecycle
    from roost.cluster.links import Link, LinkTable
    from roost.cluster.liveness import Liveness
    from roost.cluster.membership import Membership
    from roost.cluster.partitionmap import PartitionMap
    from roost.cluster.replication import PeerQueue
    from roost.cluster.replicator import Replicator
    from roost.cluster.roster import Roster
    from roost.node.config import NodeConfig
    from roost.node.core import BrokerCore
    from roost.node.ownership import Ownership


class MemberParts:
    if TYPE_CHECKING:
        cc: ClusterConfig
        s: ClusterSettings
        id: str
        rng: random.Random
        now: float
        wall_offset: float
        phase: str
        peers: list[str]
        peer_addr: dict[str, tuple[str, int]]
        broker: BrokerCore
        membership: Membership
        links: dict[int, Link]
        out: dict[str, int | None]
        queues: dict[str, PeerQueue]
        replicator: Replicator
        forwarding: Forwarding
        _out: list[Action]
        partitioned: bool
        own: Ownership
        maps: PartitionMap
        durable: DurableLogs
        lt: LinkTable
        roster: Roster
        member_ids: set[str]
        was_up: dict[str, bool | None]
        next_dial: dict[str, float]
        unreached: set[str]
        departed: set[str]
        redial_gone: dict[str, float]
        told: set[str]
        committed: int
        pending: dict[str, set[int]]
        liveness: Liveness
        cfg: NodeConfig
        roster_changes: int
        life: Lifecycle
        admin_waiting: list[tuple[int, int | None, bytes]]

        @property
        def ready(self) -> bool: ...
        def _log(self, level: str, event: str, **fields: Any) -> None: ...
        def _close(self, link: Link, why: str) -> None: ...
        def _absorb(self, actions: list[Any]) -> None: ...
        def _remap(self) -> None: ...
        def _next_pull(self) -> None: ...
        def _gain_pull_finished(self) -> bool: ...
        def _stop(self) -> None: ...
        def _fatal(self, why: str) -> None: ...
        def _gone(self, peer: str) -> bool: ...
        def _roster_changed(self) -> None: ...
        def _pull_failed(self, why: str, close: bool) -> None: ...
        def _reply_durable(self) -> None: ...
        def _check_roster(self) -> None: ...
        @property
        def state_version(self) -> int: ...
