"""Roost client: wire codec, sans-IO session and the trio client library."""

from roost.client.library import Client, ClientConfig, Message, NodeLost, Subscription

__all__ = ["Client", "ClientConfig", "Message", "NodeLost", "Subscription"]
