"""Partitioned mode: what the broker core's components know of the cluster map.

The member core (cluster/member.py) installs the partitions this member owns
(``own``, node/ownership.py) once, before any register, and each new map's epoch and
the REDIRECT frame that carries it (``BrokerCore.set_cluster_map``). The components
that route by partition (registers, producers, text protocol, sessions, forwarding)
share this one object, so an installed map is seen by all of them at once. In
replicated mode and on a single node ``own`` stays None and ``map_epoch`` 0.
"""

from __future__ import annotations

from roost.node.ownership import Ownership


class Placement:
    __slots__ = ("map_epoch", "own", "redirect_frame")

    def __init__(self) -> None:
        self.own: Ownership | None = None
        self.map_epoch = 0  # of the cluster map the member installed (0: no map)
        self.redirect_frame: bytes | None = None  # the REDIRECT frame that carries it
