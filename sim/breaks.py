"""Deliberately broken builds for the simulator (``scripts/simulate.py --break NAME``).

Each one switches off a mechanism a guarantee rests on; a campaign over a broken build must
report violations with seeds that replay, which shows the checker (sim/check.py and
sim/durablecheck.py) can fail. A broken build is selected by configuration, not by patching:
the simulation puts the name in every core's ``breaks`` (node/config.py ``NodeConfig.breaks``,
client/config.py ``ClientConfig.breaks``), and the core that holds the mechanism reads it once
at construction. A shipped build never sets it (no TOML key does).
"""

from __future__ import annotations

#: Each broken build, with where it breaks and what.
BREAKS: dict[str, str] = {
    "no-dedup": "client/receive.py: subscribers keep a message they had already",
    "no-tombstones": "node/registers.py: replicas drop the tombstones that reach them",
    "no-restream": "node/streams.py: a stream goes on at a client's new address where the old one left off",
    "no-handoff": "partitioned mode, cluster/replicator.py: a partition's new owner is handed nothing",
    "no-void": "partitioned mode, node/registers.py: a client's reset ends nothing at the owners",
    "early-ack": "durable, cluster/partitionlog.py: a leader commits what is on its own disk alone",
    "no-fsync": "durable, cluster/logdisk.py: appends are counted durable and never synced",
    "commit-before-read": "durable, client/durableclient.py: a reader commits a GET's records before the "
    "application has them, so a crash in between loses them",
    "no-quorum": "durable, cluster/durable.py: a member that holds a partition's leader down takes the "
    "partition over at the next epoch on its own, the quorum unasked",
    "volatile-map-epochs": "partitioned mode, cluster/partitionmap.py: a member forgets the map epochs' ceiling "
    "its earlier lives stored, so a restarted member hands out epochs from 1 again",
    "eager-map-epochs": "partitioned mode, cluster/partitionmap.py: a member hands a map out before the "
    "ceiling that covers its epoch is on disk",
    "stale-epoch": "durable, cluster/quorum.py: the quorum's term and vote are never written, and its Raft "
    "core answers before its log is on disk: a restarted member forgets the epochs and votes it gave",
}
