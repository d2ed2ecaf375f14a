"""The Roost client for plain threads: ``from roost.sync import Client`` (client/blocking.py)."""

from roost.client.blocking import (
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
