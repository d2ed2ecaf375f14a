from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio

from node.config import NodeConfig
from node.logs import EventLog
from node.server import NodeServer


@pytest.fixture
async def node(request: pytest.FixtureRequest) -> AsyncIterator[NodeServer]:
    """A real node on a free loopback UDP port, in this process."""
    overrides = getattr(request, "param", {})
    cfg = NodeConfig(client_addr=("127.0.0.1", 0), **overrides)
    server = NodeServer(cfg, EventLog("test", "warning"))
    async with trio.open_nursery() as nursery:
        await nursery.start(server.run)
        yield server
        nursery.cancel_scope.cancel()
