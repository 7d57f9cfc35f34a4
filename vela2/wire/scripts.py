"""Lua scripts run by their SHA1 (issue 42): EVALSHA sends 40 hex digits where EVAL sent the whole
text (the take script is ~2 KB) on every call, and nothing asks Redis first whether it knows the
script (redis-py's registered scripts send SCRIPT EXISTS before every pipeline that holds one).

Redis keeps every script it has run (EVAL or SCRIPT LOAD) until it restarts or is told SCRIPT
FLUSH; a call that finds its script gone gets NOSCRIPT and is sent once more with the text (EVAL,
which caches it again). In a pipeline, a NOSCRIPT call did nothing: `execute` re-sends those calls
with their text in a second round trip, in their order, followed again by any WAIT of the first
(so a WAIT still covers every write before it). Every other command of the pipeline ran once.
"""

from __future__ import annotations

import hashlib
from typing import Any

import redis

_TEXTS: dict[str, str] = {}  # sha1 -> text of every Script made in this process


class Script:
    """One Lua script: `sha` (what EVALSHA names), `text` (sent only after a NOSCRIPT)."""

    def __init__(self, text: str):
        self.text = text
        self.sha = hashlib.sha1(text.encode("utf-8")).hexdigest()
        _TEXTS[self.sha] = text

    def __call__(self, client: Any, keys: list[Any], args: list[Any]) -> Any:
        """Run it on a synchronous client (not a pipeline: `queue` then `execute` there)."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return client.eval(self.text, len(keys), *keys, *args)

    async def run_async(self, client: Any, keys: list[Any], args: list[Any]) -> Any:
        """Run it on an asyncio client."""
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            return await client.eval(self.text, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: list[Any], args: list[Any]) -> None:
        """Add a call to a pipeline (run it with `execute` / `execute_async`)."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)

    def command(self, keys: list[Any], args: list[Any]) -> tuple[Any, ...]:
        """The EVALSHA command's arguments, for a connection's send_command."""
        return ("EVALSHA", self.sha, len(keys), *keys, *args)

    def fallback(self, keys: list[Any], args: list[Any]) -> tuple[Any, ...]:
        """The EVAL command's arguments (after NOSCRIPT)."""
        return ("EVAL", self.text, len(keys), *keys, *args)


def _missing(stack: list[Any], replies: list[Any]) -> tuple[list[int], list[tuple[Any, ...]]]:
    """The positions of the replies that are NOSCRIPT, and the commands to send in their place
    (EVAL with the text, then any WAIT of the pipeline)."""
    failed = [i for i, r in enumerate(replies) if isinstance(r, redis.exceptions.NoScriptError)]
    again: list[tuple[Any, ...]] = []
    for i in failed:
        args = tuple(stack[i][0])
        again.append(("EVAL", _TEXTS[str(args[1])], *args[2:]))
    if failed:
        again += [tuple(args) for args, _ in stack if str(args[0]).upper() == "WAIT"]
    return failed, again


def _splice(replies: list[Any], failed: list[int], stack: list[Any], retried: list[Any]) -> list[Any]:
    """The first round trip's replies with the retried calls' (and the WAIT's) in their places."""
    out = list(replies)
    for i, reply in zip(failed, retried, strict=False):
        out[i] = reply
    waits = [i for i, (args, _) in enumerate(stack) if str(args[0]).upper() == "WAIT"]
    for i, reply in zip(waits, retried[len(failed):], strict=False):
        out[i] = reply
    return out


def execute(pipe: Any, raise_on_error: bool = True) -> list[Any]:
    """Execute a synchronous pipeline holding `Script.queue` calls: NOSCRIPT calls are sent again
    with their text (module docstring). Errors as `pipe.execute(raise_on_error)`."""
    stack = list(pipe.command_stack)
    replies = pipe.execute(raise_on_error=False)
    failed, again = _missing(stack, replies)
    if failed:  # a pipeline is empty again after execute: the same one sends the second round trip
        for args in again:
            pipe.execute_command(*args)
        replies = _splice(replies, failed, stack, pipe.execute(raise_on_error=False))
    return _raised(replies, raise_on_error)


async def execute_async(pipe: Any, raise_on_error: bool = True) -> list[Any]:
    """`execute` for an asyncio pipeline."""
    stack = list(pipe.command_stack)
    replies = await pipe.execute(raise_on_error=False)
    failed, again = _missing(stack, replies)
    if failed:
        for args in again:
            pipe.execute_command(*args)
        replies = _splice(replies, failed, stack, await pipe.execute(raise_on_error=False))
    return _raised(replies, raise_on_error)


def _raised(replies: list[Any], raise_on_error: bool) -> list[Any]:
    if raise_on_error:
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
    return replies
