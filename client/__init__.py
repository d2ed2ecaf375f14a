"""Roost client: wire codec, sans-IO session and the trio client library."""

from roost.client.library import Client, ClientClosed, ClientConfig, LogRead, Message, NodeLost, Request, Subscription

__all__ = ["Client", "ClientClosed", "ClientConfig", "LogRead", "Message", "NodeLost", "Request", "Subscription"]
