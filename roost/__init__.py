"""Roost: a replicated publish/subscribe broker over UDP.

``from roost import Client`` is the trio client; ``roost.asyncio`` and ``roost.sync`` hold the
same client for asyncio and for plain threads (README, "Which client").
"""

from importlib.metadata import PackageNotFoundError, version

from roost.client import Client, ClientClosed, ClientConfig, LogRead, Message, NodeLost, Request, Subscription

try:
    __version__ = version("roost")
except PackageNotFoundError:  # (run from a checkout that was never installed)
    __version__ = "0.0.0+unknown"

__all__ = [
    "Client",
    "ClientClosed",
    "ClientConfig",
    "LogRead",
    "Message",
    "NodeLost",
    "Request",
    "Subscription",
    "__version__",
]
