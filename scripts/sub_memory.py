"""Memory a node's core holds per subscription, by filter size: the real BrokerCore fed CMDS
datagrams from clients on several source addresses, measured with tracemalloc (Python's own
allocations: what the core keeps, without the interpreter's baseline).

    python scripts/sub_memory.py [--subs 20000] [--filter-bytes 1000] [--clients 20]

Prints bytes per subscription, and what the node would need for ``max_subscriptions`` of them.
"""

from __future__ import annotations

import argparse
import gc
import random
import tracemalloc

from roost.client import decoding, wire
from roost.client.wire import FrameType
from roost.node.config import NodeConfig
from roost.node.core import BrokerCore


def filter_of(i: int, size: int, many: bool = True) -> str:
    """A distinct filter of about ``size`` bytes: a wildcard pattern and a query, of as many
    conditions as fit (``many``, at most 32) or of one condition with a long value."""
    if size <= 60:  # a plain topic
        return f"bench.{i}." + "x" * max(1, size - len(f"bench.{i}."))
    head = f"bench.{i}.* where "
    if not many:
        return head + f"key = '{i:07d}{'v' * max(1, size - len(head) - 16)}'"
    conds, n = [], len(head)
    j = 0
    while n < size - 20:
        c = f"key{j:02d} = 'value-{i:07d}-{j:02d}-{'z' * 8}'"  # (at most 32 conditions)
        conds.append(c)
        n += len(c) + 5
        j += 1
    return head + " AND ".join(conds) if conds else f"bench.{i}.x{'y' * max(0, size - 20)}"


def measure(subs: int, size: int, clients: int, many: bool) -> dict[str, float]:
    cfg = NodeConfig(max_per_host=10**6, max_subscriptions_per_client=10**6, max_subscriptions=10**8,
                     max_clients=10**6, max_subscriptions_per_host=10**8, max_filter_bytes=1 << 40,
                     max_filter_bytes_per_host=1 << 40)  # fmt: skip
    core = BrokerCore(cfg, random.Random(1), 1)
    addrs = [(f"127.0.{c // 250}.{c % 250 + 1}", 9000) for c in range(clients)]
    cookies = {}
    for a in addrs:
        cid = a[0].encode().ljust(16, b"_")
        (welcome,) = [decoding.decode_untrusted_frame(s.data) for s in core.handle_datagrams(
            [(wire.encode_hello(cid), a)], 0.0) if hasattr(s, "data")]  # fmt: skip
        assert welcome[0] is FrameType.WELCOME
        cookies[a] = (cid, welcome[2])
    filters = [filter_of(i, size, many) for i in range(subs)]
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    batch = 1
    per = 8  # subscriptions per CMDS datagram (1 KB filters: 8 fit in a datagram)
    for k in range(0, subs, per):
        a = addrs[(k // per) % clients]
        cid, cookie = cookies[a]
        cmds: list[tuple[int, str, str | None, int]] = [(1, f, None, 0) for f in filters[k : k + per]]
        core.handle_datagrams([(wire.encode_cmds(cid, cookie, 1, batch, cmds), a)], 1.0)
        batch += 1
    del filters
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert core.index.count == subs, core.index.count
    per_sub = (after - before) / subs
    return {"subscriptions": subs, "filter_bytes": size, "bytes_per_subscription": per_sub,
            "max_subscriptions_mb": per_sub * NodeConfig().max_subscriptions / 1e6}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subs", type=int, default=20000)
    ap.add_argument("--filter-bytes", type=int, nargs="+", default=[30, 1000])
    ap.add_argument("--clients", type=int, default=20)
    a = ap.parse_args()
    print(f"{'filter bytes':>12} {'conditions':>10} {'subscriptions':>13} {'bytes/subscription':>18} "
          f"{'x default max_subscriptions':>28}")  # fmt: skip
    for size in a.filter_bytes:
        for many in (False, True) if size > 100 else (False,):
            r = measure(a.subs, size, a.clients, many)
            shape = "up to 32" if many else "one" if size > 60 else "none"
            print(f"{size:>12} {shape:>10} {a.subs:>13} {r['bytes_per_subscription']:>18,.0f} "
                  f"{r['max_subscriptions_mb']:>25,.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
