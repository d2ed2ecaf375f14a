"""The deterministic simulator of a whole cluster and its checkers (docs/cluster.md,
"Deterministic simulation"): it runs the real sans-IO cores under a simulated network, disk and
clock. A package of its own, beside the product: the wheel does not ship it."""
