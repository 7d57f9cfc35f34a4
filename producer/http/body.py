"""A POSTed body, read within the app's limits: at most a number of bytes (the rest is never read)
and within `--body-timeout-s` (a body that trickles in holds no connection for ever)."""

from __future__ import annotations

import asyncio

from fastapi import Request
from fastapi.responses import JSONResponse

from producer.http.responses import error
from vela2.errors import InvalidRequest, LimitExceeded


async def read_body(request: Request, limit: int) -> bytes | LimitExceeded:
    """The request body, read only up to `limit` bytes: a larger one (by its Content-Length, or
    while it streams in) is refused with what is known of its size, and the rest is never read."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        return LimitExceeded(f"request body has {int(declared):,} bytes; limit {limit:,}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return LimitExceeded(f"request body has over {limit:,} bytes (read {size:,}); limit {limit:,}")
        chunks.append(chunk)
    return b"".join(chunks)


async def receive_body(request: Request, limit: int, timeout_s: float) -> bytes | JSONResponse:
    """The request body (`read_body`), or the error response: 408 when it did not arrive within
    `timeout_s`, 413 when it has over `limit` bytes."""
    try:
        async with asyncio.timeout(timeout_s):
            body = await read_body(request, limit)
    except TimeoutError:
        return error(408, InvalidRequest(f"the request body did not arrive within {timeout_s:g} s"))
    if isinstance(body, LimitExceeded):
        return error(413, body)
    return body
