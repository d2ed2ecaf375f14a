"""The Roost client for asyncio: ``from roost.asyncio import Client`` (client/aio.py)."""

from roost.client.aio import (
    Client,
    ClientClosed,
    ClientConfig,
    LogRead,
    Message,
    NodeLost,
    Request,
    Subscription,
    durable_id,
)

__all__ = ["Client", "ClientClosed", "ClientConfig", "LogRead", "Message", "NodeLost", "Request", "Subscription",
           "durable_id"]
