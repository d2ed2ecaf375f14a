"""The Roost client for trio (also ``from roost import Client``): client/library.py."""

from roost.client.library import (
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
