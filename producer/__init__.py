"""Producers: the client library (sync and asyncio), bulk backfill and the HTTP route.

Never imports torch: a web backend installs the base package and talks to Redis only.
"""

from producer.aio import AsyncClient
from producer.client import Client

__all__ = ["AsyncClient", "Client"]
